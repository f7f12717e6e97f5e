"""What a Delta commit file says it changed, read from its JSON actions (no Dagster, no I/O).

Both the table cache (which answers a commit leaves valid) and partition commits (whether a concurrent commit
touched this commit's partitions) ask it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

# Actions that add or remove no data file and change neither the schema nor the protocol.
NO_FILE_CHANGE = frozenset({"commitInfo", "txn", "cdc", "domainMetadata"})
FILE_ACTIONS = ("add", "remove")


@dataclass(frozen=True)
class PartitionScope:
    """The partitions an answer was computed from: `column` holds one of `values`."""

    column: str
    values: frozenset[str]


@dataclass
class Touched:
    """What a run of commits changed: everything (`everything`), else the partition values of each file they
    added or removed."""

    everything: bool = False
    files: list[dict[str, str | None]] = field(default_factory=list)

    def reaches(self, scope: PartitionScope) -> bool:
        """Whether the commits may have changed what was read from `scope`'s partitions."""
        if self.everything:
            return True
        missing = object()
        return any(f.get(scope.column, missing) is missing or f[scope.column] in scope.values for f in self.files)


def commit_touches(commit: bytes, touched: Touched) -> None:
    """Add one commit file's actions (newline-delimited JSON, one action per line) to `touched`."""
    for line in commit.splitlines():
        if not line.strip():
            continue
        action = json.loads(line)
        for kind, body in action.items():
            if kind in NO_FILE_CHANGE:
                continue
            values = body.get("partitionValues") if kind in FILE_ACTIONS and isinstance(body, dict) else None
            if values is None:  # metadata, protocol, an unknown action, or a file without its partition values
                touched.everything = True
            else:
                touched.files.append(dict(values))


def partition_values_touched(touched: Touched, column: str) -> set[str | None] | None:
    """The values of `column` of every file the commits added or removed; None when they did more than that
    (metadata, protocol, an unknown action) or a file has no value of that column."""
    if touched.everything or any(column not in values for values in touched.files):
        return None
    return {values[column] for values in touched.files}


def commit_digest(commit: bytes) -> bytes:
    """A commit file's identity by content (a table replaced under the same path writes other content)."""
    return hashlib.blake2b(commit, digest_size=16).digest()
