"""A commit of data files that does not fail because another writer committed to other partitions (no Dagster).

delta-rs checks a transaction of raw actions as if it had read the whole table: a commit that removes files
fails against any commit that removed files meanwhile, in whatever partition ("a concurrent transaction deleted
data this operation read"). Writers that own disjoint partitions (the profile lake's runs, one per tenant, each
under its tenant's lock, rewriting that tenant's files of a shared table) then fail each other whenever they
commit at the same moment, which runs started together do.

`commit_over_other_partitions` commits; on such a failure it reads the commits that won (a few small JSON files of
the log) and commits again on top of them when none of them added or removed a file of this commit's partitions
(by the table's first partition column) and none changed the table's metadata or protocol. That is the check a
partition-aware writer makes (Delta's own conflict checker, given the transaction's partition predicate): the files
this commit removes are still there and nothing it read from its partitions changed. Any other conflict is raised.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, CommitProperties, RemoveAction

from engagement_platform.lake.delta_log import Touched, commit_touches, partition_values_touched

CONFLICT_RETRIES = 8  # commits again this often at most: each time another writer won the race


def partitions_touched(commit: bytes, column: str) -> set[str | None] | None:
    """The values of `column` of every file the commit added or removed; None when it did more than add and remove
    files of partitions (metadata, protocol, an unknown action, a file without that partition value)."""
    touched = Touched()
    try:
        commit_touches(commit, touched)
    except (ValueError, TypeError, AttributeError):  # a commit not understood is not known to spare our partitions
        return None
    return partition_values_touched(touched, column)


def commit_over_other_partitions(
    table: DeltaTable,
    fs: pafs.FileSystem,
    log_dir: str,
    actions: Sequence[AddAction | RemoveAction],
    *,
    schema: pa.Schema,
    partition_by: Sequence[str],
    commit_properties: CommitProperties,
    committed: Callable[[], bool],
) -> None:
    """Commit `actions` to `table` (its `_delta_log` at `log_dir` in `fs`); see the module docstring. `committed()`
    says whether this commit's txn is in the table already (then a retry would write it twice: it returns)."""
    ours = {_partition(action, partition_by[0]) for action in actions} if partition_by else None
    for attempt in range(CONFLICT_RETRIES + 1):
        read_version = table.version()
        try:
            table.create_write_transaction(
                list(actions),
                mode="append",
                schema=schema,
                partition_by=list(partition_by) or None,
                commit_properties=commit_properties,
            )
            return
        except CommitFailedError:
            if ours is None or attempt == CONFLICT_RETRIES:
                raise
            table.update_incremental()
            if committed():
                return
            for version in range(read_version + 1, table.version() + 1):
                with fs.open_input_stream(f"{log_dir}/{version:020d}.json") as stream:
                    touched = partitions_touched(stream.readall(), partition_by[0])
                if touched is None or touched & ours:
                    raise
        time.sleep(random.uniform(0.02, 0.2) * (attempt + 1))  # the writers that collided do not collide again


def _partition(action: AddAction | RemoveAction, column: str) -> str | None:
    values: Mapping[str, Any] | None = action.partition_values
    return None if values is None else values.get(column)
