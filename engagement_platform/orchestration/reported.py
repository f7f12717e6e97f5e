"""What a sensor reports on its ticks (asset observations, check evaluations) goes to Dagster's event log only when
its figures differ from the ones the sensor reported last.

A stream sensor ticks every 5-10 s and mostly finds nothing new: an observation of the same watermarks on every
tick is a write to the event log (and a row in the asset's history) that says nothing. The sensor's JSON cursor
keeps, under REPORTED, a fingerprint of the last figures reported per asset (and check), so the comparison
survives a restart of the daemon or of its code server. A cursor written before this field existed (or none)
reports once, then compares. Other fields of the cursor are kept as they are.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any, TypeVar

from dagster import AssetCheckEvaluation, AssetObservation

REPORTED = "reported"  # the cursor's field: what was reported -> fingerprint of its figures
Event = TypeVar("Event", AssetObservation, AssetCheckEvaluation)


def cursor_fields(cursor: str | None) -> dict[str, Any]:
    """The JSON cursor's fields ({} for no cursor, or one that is not a JSON object)."""
    try:
        fields = json.loads(cursor) if cursor else {}
    except ValueError:
        return {}
    return fields if isinstance(fields, dict) else {}


def subject(event: AssetObservation | AssetCheckEvaluation) -> str:
    """What the event reports on: the asset, or the asset's check."""
    if isinstance(event, AssetCheckEvaluation):
        return f"{event.asset_key.to_user_string()}:{event.check_name}"
    return event.asset_key.to_user_string()


def fingerprint(event: AssetObservation | AssetCheckEvaluation) -> str:
    """A short digest of the event's figures: its metadata values (and a check's outcome)."""
    figures: dict[str, Any] = {k: v.value for k, v in event.metadata.items()}
    if isinstance(event, AssetCheckEvaluation):
        figures = {"passed": event.passed, "severity": event.severity.value, "metadata": figures}
    text = json.dumps(figures, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def unreported(cursor: str | None, events: Sequence[Event]) -> tuple[list[Event], str | None]:
    """(the events whose figures differ from the last ones reported, the cursor that records them; None when it
    would not change)."""
    fields = cursor_fields(cursor)
    last = fields.get(REPORTED)
    last = dict(last) if isinstance(last, dict) else {}
    now = {subject(e): fingerprint(e) for e in events}
    changed = [e for e in events if last.get(subject(e)) != now[subject(e)]]
    if not changed:
        return [], None
    return changed, json.dumps({**fields, REPORTED: {**last, **now}}, sort_keys=True)
