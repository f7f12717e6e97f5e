"""When a stream's next batch is due: a minimum batch size and a maximum wait, so cadence follows traffic.

Every batch is a Dagster run (a process, a Spark job, a few Delta commits): a fixed cost of seconds. A stream
that plans a batch for every handful of new records spends the machine on that cost. With a cadence, a slice
is planned once it holds `min_records`, or once `max_wait_seconds` have passed since the stream's previous
plan (so a quiet topic is still committed within the wait); a slice that reached the plan bound is always due.
High traffic: batches of at least `min_records` back to back. Low traffic: one batch per `max_wait_seconds`.
The defaults (1 record, no wait) plan every tick that sees something new. Pure logic, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Cadence:
    min_records: int = 1
    max_wait_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.min_records < 1 or self.max_wait_seconds < 0:
            raise ValueError(f"a cadence needs min_records >= 1 and max_wait_seconds >= 0, got {self}")

    @property
    def plans_every_tick(self) -> bool:
        return self.min_records <= 1 or self.max_wait_seconds <= 0

    def wait_reason(self, records: int, full: bool, seconds_since_last_plan: float | None) -> str | None:
        """Why a slice of `records` is not due yet, or None if it is. `full`: the slice reached the plan
        bound. `seconds_since_last_plan`: None when the stream never planned (due at once)."""
        if self.plans_every_tick or full or records >= self.min_records:
            return None
        if seconds_since_last_plan is None or seconds_since_last_plan >= self.max_wait_seconds:
            return None
        return (
            f"{records} new records, fewer than the batch minimum {self.min_records}: the batch is due in "
            f"{self.max_wait_seconds - seconds_since_last_plan:.0f} s at the latest (cadence: max wait {self.max_wait_seconds:g} s)"
        )


def reached_bound(range_sizes: Iterable[int], max_records_per_partition: int) -> bool:
    """Whether a planned slice (its ranges' sizes) hit the per-partition bound: more is waiting behind it."""
    return any(size >= max_records_per_partition for size in range_sizes)


def cadence_from(env: Mapping[str, str], stream: str) -> Cadence:
    """EP_BATCH_MIN_RECORDS / EP_BATCH_MAX_WAIT_SECONDS for every stream, overridden per stream by
    EP_<STREAM>_BATCH_MIN_RECORDS / EP_<STREAM>_BATCH_MAX_WAIT_SECONDS (stream name upper-cased)."""
    prefix = f"EP_{stream.upper()}_"
    min_records = env.get(f"{prefix}BATCH_MIN_RECORDS") or env.get("EP_BATCH_MIN_RECORDS") or "1"
    max_wait = env.get(f"{prefix}BATCH_MAX_WAIT_SECONDS") or env.get("EP_BATCH_MAX_WAIT_SECONDS") or "0"
    return Cadence(int(min_records), float(max_wait))
