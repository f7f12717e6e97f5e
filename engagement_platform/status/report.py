"""What `engagement-platform status` prints, from facts already read: a table for people, one JSON document
for machines, and how to resume a paused stream. Pure: no I/O, no Dagster.

A column whose service did not answer holds UNAVAILABLE (the string), so one service down never hides
what the others say. A column that does not apply to the stream (no lock, no Kafka source) holds None.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

UNAVAILABLE = "unavailable"
COORDINATOR_OFF = "off"  # EP_COORDINATOR=off: no stream takes a lock

# A batch's state, from the checkpoint store and the txn versions of the tables it writes.
NONE, PLANNED, COMMITTING, DONE = "none", "planned", "committing", "done"


@dataclass(frozen=True)
class Service:
    name: str  # lake, kafka, zookeeper, dagster
    available: bool | None  # None: not asked (no stream shown needed it)
    detail: str = ""  # where it was asked, or why it did not answer


@dataclass(frozen=True)
class Batch:
    """The stream's latest batch (batch_id None: nothing planned yet)."""

    batch_id: int | None
    state: str  # NONE, PLANNED, COMMITTING or DONE
    tables_committed: tuple[str, ...] = ()  # of an unfinished batch: the tables whose txn already holds it
    planned_at: datetime | None = None
    records: int | None = None  # records its slice holds (Kafka slices only)

    @property
    def partition_key(self) -> str | None:
        """Its Dagster partition (batch-partitioned streams), as BatchPlan.partition_key spells it."""
        return f"{self.batch_id:08d}" if self.batch_id is not None else None


@dataclass(frozen=True)
class Attempts:
    """The runs of the latest batch (of the tenant, for a tenant-partitioned stream), from Dagster's run storage."""

    failed: int  # its own code failed, or a person cancelled it: these count towards the pause
    max_attempts: int | None  # the pause threshold; None: the stream never pauses
    died: int = 0  # killed, orphaned, or met an unreachable service: not counted, retries back off
    gave_up: int = 0  # coordination give-ups: the batch waited for its turn
    in_flight: str | None = None  # the run id of a run still queued or running
    last_failed_run: str | None = None
    last_failed_job: str | None = None
    paused: bool = False
    backoff: str | None = None  # the sensor's skip reason while the retries back off


@dataclass(frozen=True)
class Lock:
    name: str
    holder: str | None = None  # the owner written by the holder ("mutation/7"); None: free
    host: str | None = None
    pid: int | None = None
    run_id: str | None = None  # the run whose liveness node names the holder's host and pid
    last_registered: str | None = None  # the predecessor znode: the last job that ran under this lock


@dataclass(frozen=True)
class Lag:
    records: int | str | None = None  # on the source, not committed by the stream
    unplanned: int | str | None = None  # on the source, not planned yet
    seconds: float | str | None = None
    seconds_from: str = ""  # what the seconds are measured from


@dataclass(frozen=True)
class StreamStatus:
    stream: str  # its checkpoint stream name
    family: str  # the stream, or its family (profile_processor, ingest, ...) for per-tenant / per-pipeline ones
    tenant: str | None
    source: str
    batch: Batch | str
    attempts: Attempts | str | None  # None: Dagster runs not asked (a stream nothing runs in Dagster)
    lock: Lock | str | None  # None: the stream takes no lock
    lag: Lag = field(default_factory=Lag)

    @property
    def paused(self) -> bool | str | None:
        """True or False from the run storage; UNAVAILABLE when it did not answer; None when not asked."""
        return self.attempts.paused if isinstance(self.attempts, Attempts) else self.attempts

    @property
    def resume(self) -> str | None:
        return how_to_resume(self) if self.paused is True else None


@dataclass(frozen=True)
class Report:
    generated_at: datetime
    services: tuple[Service, ...]
    streams: tuple[StreamStatus, ...]


def batch_state(done: bool, planned: bool, tables_committed: tuple[str, ...]) -> str:
    if not planned:
        return NONE
    if done:
        return DONE
    return COMMITTING if tables_committed else PLANNED


def how_to_resume(status: StreamStatus) -> str:
    """The action that resumes a paused stream: fix the cause, then run the batch again, in Dagster (which the
    sensor sees) or by hand (the batch is then done and the sensor plans the next one)."""
    attempts = status.attempts if isinstance(status.attempts, Attempts) else None
    run = attempts.last_failed_run if attempts else None
    job = attempts.last_failed_job if attempts else None
    where = f"run {run}" + (f" of {job}" if job else "") if run else "the latest failed run"
    if status.tenant is not None:
        partition = f"partition {status.tenant}"
    elif isinstance(status.batch, Batch) and status.batch.partition_key:
        partition = f"partition {status.batch.partition_key}"
    else:
        partition = "its partition"
    by_hand = f"engagement-platform run-batch --stream {status.stream}"
    if status.tenant is None and isinstance(status.batch, Batch) and status.batch.batch_id is not None:
        by_hand += f" --batch-id {status.batch.batch_id}"
    return (
        f"fix what failed {where} (its error in the Dagster UI, Runs), then re-execute it: Runs > {run or 'the run'} > "
        f"Re-execute > All steps ({partition}); or, outside Dagster and without the coordinator lock, `{by_hand}`"
    )


def why(e: BaseException) -> str:
    """An error as a services line shows it: its type and the start of its message."""
    return f"{type(e).__name__}: {str(e)[:200]}"


def planned_lag(batch: Batch, now: datetime, records: int | str | None) -> Lag:
    """Lag measured from when the unfinished batch was planned (None for a done or missing batch)."""
    if batch.state in ("planned", "committing") and batch.planned_at is not None:
        seconds = max((now - batch.planned_at).total_seconds(), 0.0)
        return Lag(records, records, seconds, f"batch {batch.batch_id} planned at {batch.planned_at.isoformat()}")
    return Lag(records, records, None)


# ---- JSON ---------------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, tuple):
        return list(value)
    return value


def _fields(obj: Any) -> dict:
    return {name: _plain(getattr(obj, name)) for name in obj.__dataclass_fields__}


def _column(value: Any) -> Any:
    return _fields(value) if hasattr(value, "__dataclass_fields__") else value


def stream_json(status: StreamStatus) -> dict:
    batch = _column(status.batch)
    if isinstance(status.batch, Batch):
        batch = {"id": batch.pop("batch_id"), **batch, "partition": status.batch.partition_key}
    return {
        "stream": status.stream,
        "family": status.family,
        "tenant": status.tenant,
        "source": status.source,
        "batch": batch,
        "attempts": _column(status.attempts),
        "lock": _column(status.lock),
        "lag": _fields(status.lag),
        "paused": status.paused,
        "resume": status.resume,
    }


def report_json(report: Report) -> dict:
    """The whole report as one JSON-ready document."""
    return {
        "generated_at": report.generated_at.isoformat(),
        "services": {s.name: {"available": s.available, "detail": s.detail} for s in report.services},
        "streams": [stream_json(s) for s in report.streams],
    }


# ---- text ---------------------------------------------------------------------------------------------

HEADER = ("STREAM", "BATCH", "STATE", "ATTEMPTS", "LOCK", "LAG RECORDS", "LAG SECONDS", "PAUSED")


def _state_text(batch: Batch | str) -> tuple[str, str]:
    if isinstance(batch, str):
        return batch, batch
    state = batch.state
    if batch.state == COMMITTING:
        state += f" ({', '.join(batch.tables_committed)})"
    return ("-" if batch.batch_id is None else str(batch.batch_id)), state


def _attempts_text(attempts: Attempts | str | None) -> str:
    if attempts is None or isinstance(attempts, str):
        return attempts or "-"
    text = f"{attempts.failed}/{attempts.max_attempts}" if attempts.max_attempts else str(attempts.failed)
    if attempts.died:
        text += f" +{attempts.died} died"
    return text + (" running" if attempts.in_flight else "")


def _lock_text(lock: Lock | str | None) -> str:
    if lock is None or isinstance(lock, str):
        return lock or "-"
    return f"held by {lock.holder}" if lock.holder else "free"


def _number(value: int | float | str | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return f"{round(value):,}"


def _paused_text(status: StreamStatus) -> str:
    paused = status.paused
    if paused is None or isinstance(paused, str):
        return paused or "-"
    if isinstance(status.attempts, Attempts) and not status.attempts.max_attempts:
        return "never"
    return "PAUSED" if paused else "no"


def table_rows(report: Report) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for s in report.streams:
        batch_id, state = _state_text(s.batch)
        rows.append(
            (
                s.stream,
                batch_id,
                state,
                _attempts_text(s.attempts),
                _lock_text(s.lock),
                _number(s.lag.records),
                _number(s.lag.seconds),
                _paused_text(s),
            )
        )
    return rows


def notes(status: StreamStatus) -> list[str]:
    """What a person acts on about one stream, a line each: a pause and how to resume, a backoff, an unfinished batch."""
    out = []
    attempts = status.attempts if isinstance(status.attempts, Attempts) else None
    if status.resume and attempts is not None:
        out.append(f"{status.stream}: PAUSED after {attempts.failed} failed attempts. Resume: {status.resume}")
    if attempts is not None and attempts.backoff:
        out.append(f"{status.stream}: {attempts.backoff}")
    batch = status.batch
    if isinstance(batch, Batch) and batch.state in (PLANNED, COMMITTING) and batch.planned_at is not None:
        held = f", already in {', '.join(batch.tables_committed)}" if batch.tables_committed else ""
        out.append(f"{status.stream}: batch {batch.batch_id} planned at {batch.planned_at.isoformat()}, not done{held}")
    return out


def lock_notes(report: Report) -> list[str]:
    """Each held lock once, with who holds it and the streams that wait on it."""
    held: dict[str, tuple[Lock, list[str]]] = {}
    for s in report.streams:
        if isinstance(s.lock, Lock) and s.lock.holder:
            held.setdefault(s.lock.name, (s.lock, []))[1].append(s.stream)
    out = []
    for name, (lock, streams) in held.items():
        where = ", ".join(
            part
            for part in (
                f"host {lock.host}" if lock.host else "",
                f"pid {lock.pid}" if lock.pid is not None else "",
                f"run {lock.run_id}" if lock.run_id else "",
            )
            if part
        )
        out.append(
            f"lock {name} held by {lock.holder}" + (f" ({where})" if where else "") + f"; taken by {', '.join(streams)}"
        )
    return out


def render_text(report: Report) -> str:
    """The table, then the notes, then which services answered."""
    rows = [HEADER, *table_rows(report)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    extra = [line for s in report.streams for line in notes(s)] + lock_notes(report)
    if extra:
        lines += ["", *extra]
    answers = {True: "ok", False: UNAVAILABLE, None: "not asked"}
    services = "; ".join(
        f"{s.name} {answers[s.available]}" + (f" ({s.detail})" if s.detail else "") for s in report.services
    )
    lines += ["", f"services: {services}", f"at {report.generated_at.isoformat()}"]
    return "\n".join(lines)
