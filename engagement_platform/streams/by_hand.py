"""How one batch of a stream runs by hand: the `run-batch` command, which is also the crash tests' harness.

Each stream's definition (streams/definition.py) names its adapter: given what run-batch was asked (a
`BatchRequest`), it checks the request and returns the batch's run, a callable of BatchContext, before
anything runs. A stream whose sensor plans runs the stored plan `--batch-id` names (`stored_batch`); a
stream that plans per tenant itself plans its next batch, or resumes the unfinished one `--batch-id`
names (`check_resumed`). Runs by hand take no coordinator lock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.streams.planning import BatchPlan
from engagement_platform.streams.spec import BatchContext, BatchResult, StreamSpec


@dataclass(frozen=True)
class BatchRequest:
    """What run-batch was asked: the stream as named, the family member it names and the options."""

    stream: str  # "mutation", "profile_processor/tenant01", "ingest/rewards_members"
    member: str  # the member of a family it names ("tenant01"); "" for a stream of its own
    checkpoints: CheckpointStore
    batch_id: int | None = None
    path: str | None = None  # --path: a backfill's snapshot export
    until: str | None = None  # --until: the export's time boundary


BatchRun = Callable[[BatchContext], BatchResult | None]  # None: nothing to do (the processor found nothing staged)
BatchAdapter = Callable[[BatchRequest], BatchRun]


class BatchRequestError(ValueError):
    """Arguments that name no batch run-batch can run (unknown stream, no such plan, a missing option)."""


def stored_batch(spec: StreamSpec) -> BatchAdapter:
    """The adapter of a stream whose sensor plans: the stored plan `--batch-id` names, run by the spec."""

    def adapter(request: BatchRequest) -> BatchRun:
        plan = stored_plan(request.checkpoints, spec.name, request.batch_id)
        return lambda ctx: spec.run_batch(ctx, plan)

    return adapter


def stored_plan(checkpoints: CheckpointStore, stream: str, batch_id: int | None) -> BatchPlan:
    if batch_id is None:
        raise BatchRequestError(f"{stream} needs --batch-id (a batch its sensor planned)")
    try:
        return checkpoints.plan(stream, batch_id)
    except LookupError as exc:
        raise BatchRequestError(str(exc)) from exc


def member_stream(name_of: Callable[[str], str], member: str) -> str:
    """The checkpoint stream of a family's member (`processor_stream(tenant)`), or why the member is no valid name."""
    try:
        return name_of(member)
    except ValueError as exc:  # not a valid tenant name
        raise BatchRequestError(str(exc)) from exc


def check_resumed(checkpoints: CheckpointStore, stream: str, batch_id: int | None) -> None:
    """A self-planning stream's run resumes its unfinished batch, else plans the next one: a given
    batch id must be that unfinished batch."""
    if batch_id is None:
        return
    latest, done = checkpoints.latest(stream)
    if latest is not None and not done and latest.batch_id == batch_id:
        return
    state = (
        "nothing planned yet" if latest is None else f"batch {latest.batch_id} is {'done' if done else 'unfinished'}"
    )
    raise BatchRequestError(
        f"{stream} batch {batch_id} is not an unfinished batch ({state}); run without --batch-id to plan the next one"
    )
