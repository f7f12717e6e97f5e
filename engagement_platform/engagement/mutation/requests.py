"""The ID mutation request model shared by the fold, the reference and the stream: one request, the
owner fields it can act on, how a row's engagement_date orders against request date ranges, and rows
as a table keyed by engagement_id (as_table), the form the per-row outcome and the reference share."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date
from typing import Any

OWNER_FIELDS = ("lead_id", "contact_id", "account_id", "user_id")
FIRST_DAY = date.min.toordinal()  # also the day of a null engagement_date
END_OF_TIME = date.max.toordinal() + 1
DELETE = "delete"
REPLACE = "replace"

Row = dict[str, Any]


@dataclass(frozen=True, slots=True)
class MutationRequest:
    """One ID mutation request; use the op constructors below. Columns match the Spark input."""

    request_id: str
    org_id: str
    request_time: Any  # datetime or epoch micros: only compared
    op: str
    field: str | None = None  # convert: from_field; merge and owner delete: the owner field
    owner_id: str | None = None  # convert: from_id; owner delete: the id
    from_ids: tuple[str, ...] = ()  # merge
    to_field: str | None = None  # convert
    to_id: str | None = None  # convert, merge
    engagement_id: str | None = None  # update, delete by engagement
    record: Mapping[str, Any] | None = None  # update: every column but org_id, engagement_id
    date_from: date | None = None  # inclusive, None = open
    date_to: date | None = None

    @classmethod
    def convert(
        cls, request_id, org_id, request_time, from_field, from_id, to_field, to_id, **dates
    ) -> MutationRequest:
        return cls(
            request_id,
            org_id,
            request_time,
            "convert",
            field=from_field,
            owner_id=from_id,
            to_field=to_field,
            to_id=to_id,
            **dates,
        )

    @classmethod
    def merge(cls, request_id, org_id, request_time, field, from_ids, to_id, **dates) -> MutationRequest:
        return cls(
            request_id, org_id, request_time, "merge", field=field, from_ids=tuple(from_ids), to_id=to_id, **dates
        )

    @classmethod
    def delete_owner(cls, request_id, org_id, request_time, field, owner_id, **dates) -> MutationRequest:
        return cls(request_id, org_id, request_time, "delete", field=field, owner_id=owner_id, **dates)

    @classmethod
    def delete_engagement(cls, request_id, org_id, request_time, engagement_id, **dates) -> MutationRequest:
        return cls(request_id, org_id, request_time, "delete", engagement_id=engagement_id, **dates)

    @classmethod
    def update(cls, request_id, org_id, request_time, engagement_id, record, **dates) -> MutationRequest:
        return cls(
            request_id, org_id, request_time, "update", engagement_id=engagement_id, record=dict(record), **dates
        )

    @property
    def order(self) -> tuple:
        return (self.request_time, self.request_id)


def day_key(day: date | None) -> int:
    return FIRST_DAY if day is None else day.toordinal()


def in_date_range(day: date | None, date_from: date | None, date_to: date | None) -> bool:
    key = day_key(day)
    return (date_from is None or key >= date_from.toordinal()) and (date_to is None or key <= date_to.toordinal())


def as_table(rows: Iterable[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]]) -> dict[str, Row]:
    """engagement_id -> row copy with every owner column and the date present."""
    values = rows.values() if isinstance(rows, Mapping) else rows
    table = {}
    for row in values:
        copy = dict(row)
        for name in (*OWNER_FIELDS, "engagement_date"):
            copy.setdefault(name, None)
        table[copy["engagement_id"]] = copy
    return table


def full_record(record: Mapping[str, Any]) -> Row:
    """A replacement record with every owner column and the date present (missing = null)."""
    out = {name: None for name in (*OWNER_FIELDS, "engagement_date")}
    out.update((k, v) for k, v in record.items() if k not in ("org_id", "engagement_id"))
    return out
