"""What a package adds to the Definitions (assets, checks, jobs, sensors, schedules), so definitions.py
assembles the platform one line per stream. A `KafkaStream` has the same attributes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

KINDS = ("assets", "asset_checks", "jobs", "sensors", "schedules")


@dataclass(frozen=True)
class Parts:
    assets: Sequence[Any] = ()
    asset_checks: Sequence[Any] = ()
    jobs: Sequence[Any] = ()
    sensors: Sequence[Any] = ()
    schedules: Sequence[Any] = ()


def combine(*parts: Any) -> dict[str, list[Any]]:
    """Keyword arguments of Definitions: each kind of definition of every part, in order."""
    return {kind: [d for p in parts for d in getattr(p, kind, ())] for kind in KINDS}
