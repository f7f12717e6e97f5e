"""A batch's pin: the as-of time and the table versions it computes against, fixed once per batch.

A batch decides from what it reads (keys a table already holds, requests still pending, how old they
are). A re-run after a crash that read the tables as they are by then (its own earlier commits
included) or the clock could decide differently from the attempt whose commits it completes. So the
first attempt takes the time and the current versions, every commit of the batch carries them in its
metadata (`commit_batch(..., **pin.metadata())`), and a re-run reads them back from the batch's commit
of one table, the anchor: the stream's first commit, so that a pin exists as soon as any commit does.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from engagement_platform.lake.delta import DeltaLake

AS_OF = "as_of"  # commit metadata key of the pinned time (ISO text)


def version_key(table: str) -> str:
    """Commit metadata key of a table's pinned version."""
    return f"{table}_version"


def current_version(lake: DeltaLake, name: str) -> int:
    """The table's latest version; -1 when it is not created yet."""
    return lake.table(name).version() if lake.exists(name) else -1


@dataclass(frozen=True)
class Pin:
    as_of: datetime
    versions: dict[str, int]  # table name -> version the batch reads (-1: not created yet)

    def metadata(self) -> dict[str, str | int]:
        """What every commit of the batch carries, so a re-run finds the same pin."""
        return {AS_OF: self.as_of.isoformat(), **{version_key(t): v for t, v in self.versions.items()}}


def pin_batch(
    lake: DeltaLake, anchor_table: str, app_id: str, batch_id: int, tables: Iterable[str], now: datetime | None = None
) -> Pin:
    """The pin stored in the metadata of `app_id`'s commit of batch `batch_id` to `anchor_table` once that
    commit exists; before that, `now` (default: the clock) and the current versions of `tables`."""
    commit = lake.batch_commit(anchor_table, app_id, batch_id) or {}
    as_of = datetime.fromisoformat(commit[AS_OF]) if AS_OF in commit else (now or datetime.now(UTC))
    versions = {
        t: int(commit[version_key(t)]) if version_key(t) in commit else current_version(lake, t) for t in tables
    }
    return Pin(as_of, versions)


def pin_batches(
    lake: DeltaLake, anchor_table: str, batches: Iterable[tuple[str, int]], tables: Iterable[str], now: datetime
) -> dict[tuple[str, int], Pin]:
    """pin_batch of several (app_id, batch) pairs from one read of the anchor's history: the batches not
    anchored yet share `now` and the tables' current versions."""
    batches, tables = list(batches), list(tables)
    commits = lake.batch_commits(anchor_table, batches)
    current: dict[str, int] = {}
    pins = {}
    for key in batches:
        commit = commits[key] or {}
        versions = {}
        for t in tables:
            if version_key(t) in commit:
                versions[t] = int(commit[version_key(t)])
            else:
                if t not in current:
                    current[t] = current_version(lake, t)
                versions[t] = current[t]
        pins[key] = Pin(datetime.fromisoformat(commit[AS_OF]) if AS_OF in commit else now, versions)
    return pins
