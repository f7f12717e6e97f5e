"""Reading segment membership: a segment's current members (or its members right after a batch), and the
entries and exits since a checkpoint, for activation. Each reads only the files it needs: the tenant's
partition of each table, and for current members the base and the log files after its compaction point;
within a file, the segment and identity columns are read as codes and only the wanted rows decoded.

    from engagement_platform.profiles.segments.read import segment_members, membership_changes
    members = segment_members(lake, "acme", "cart_abandoners")           # segment, identity, entered_at, batch_id
    changes = membership_changes(lake, "acme", since_batch=41)            # the log rows of batches 42, 43, ...
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from engagement_platform.lake.delta import DeltaLake
from engagement_platform.profiles.segments.current import LOG_COLUMNS, current_membership
from engagement_platform.profiles.segments.membership_files import MembershipFiles
from engagement_platform.profiles.segments.stored import read_stored


def segment_members(
    lake: DeltaLake,
    tenant: str,
    segments: str | Sequence[str] | None = None,
    as_of_batch: int | None = None,
    files: MembershipFiles | None = None,
    identities: Sequence[str] | None = None,
) -> pa.Table:
    """The tenant's members (segment, identity, entered_at, batch_id; sorted by segment then identity) of
    `segments` (a name, names, or None: all), now or right after evaluation batch `as_of_batch`; only of
    `identities` when given. `files`: a MembershipFiles to reuse, so that several reads load each table
    version once."""
    files = files or MembershipFiles(lake)
    wanted = (
        None if segments is None else pa.array([segments] if isinstance(segments, str) else list(segments), pa.string())
    )
    who = None if identities is None else pa.array(list(identities), pa.string())
    stored_files = files.of(tenant)
    if as_of_batch is not None and as_of_batch < stored_files.through:
        # the base already folds in later batches: the log from its start replays the state at that batch
        log = files.all_log(tenant)
        stored = read_stored((), log, lake.storage_options, identities=who, segments=wanted)
    else:
        stored = read_stored(
            stored_files.base,
            stored_files.log,
            lake.storage_options,
            identities=who,
            segments=wanted,
            after_batch=stored_files.through,
        )
    members = current_membership(stored.base, stored.log, as_of_batch)
    return members.sort_by([("segment", "ascending"), ("identity", "ascending")])


def membership_changes(
    lake: DeltaLake,
    tenant: str,
    since_batch: int,
    segments: str | Sequence[str] | None = None,
    up_to_batch: int | None = None,
) -> pa.Table:
    """The entries and exits (LOG_COLUMNS, by batch) of the tenant's evaluations after batch `since_batch`
    (and up to `up_to_batch`): what an activation consumer that last read through `since_batch` has not seen.
    Only the log files with later batches are read. A consumer takes `latest_batch` first and passes it as
    `up_to_batch`, then keeps it as its checkpoint: a batch committed in between is left for its next read
    instead of being skipped."""
    files = MembershipFiles(lake)
    wanted = (
        None if segments is None else pa.array([segments] if isinstance(segments, str) else list(segments), pa.string())
    )
    stored = read_stored(
        (), files.log_after(tenant, since_batch), lake.storage_options, segments=wanted, after_batch=since_batch
    )
    log = stored.log.select(LOG_COLUMNS)
    if up_to_batch is not None:
        log = log.filter(pc.less_equal(log["batch_id"], up_to_batch))
    return log.sort_by([("batch_id", "ascending"), ("segment", "ascending"), ("identity", "ascending")])


def latest_batch(lake: DeltaLake, tenant: str) -> int:
    """The newest evaluation batch in the tenant's log (-1: none): the checkpoint to keep after reading every
    change so far."""
    return MembershipFiles(lake).newest_logged(tenant)
