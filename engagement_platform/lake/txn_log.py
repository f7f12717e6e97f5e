"""Every app's txn version of a Delta table at one of its versions, read from the log in one pass (no Dagster).

delta-rs answers `transaction_version(app_id)` by replaying the table's log on every call: 10-30 ms on the
checkpoint table of a lake with a thousand tenants, whose commits each carry a hundred batches' txns. A commit of
many batches asks it for each of them (which rows are not written yet), so a run of a hundred tenants paid seconds
per commit. Here the txn actions are read once per table version and kept per process: the newest checkpoint's
`txn` column and the JSON commits after it, then only the commits a later version adds.

Exact or nothing: the answer at version v is the newest txn action per app id in commits 0..v (the checkpoint
stands for the commits it covers), as the Delta protocol defines it. A table replaced under the same URI is
noticed by the digest of the cached version's commit file. Whatever cannot be read this way (a multi-part
checkpoint, a commit file gone, a checkpoint newer than the version asked) gives None, and the caller asks delta-rs.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow.fs as pafs

from engagement_platform.lake.delta_log import commit_digest

MAX_FORWARD = 256  # commits read to bring a kept answer forward; past that, start from the newest checkpoint
MAX_TABLES = 256  # tables kept per process (the oldest go first)


@dataclass(frozen=True)
class Known:
    version: int
    digest: bytes  # of the version's commit file: a table replaced under the same URI has other content
    txns: dict[str, int]


def commit_txns(commit: bytes, txns: dict[str, int]) -> None:
    """Fold one commit file's txn actions into `txns` (the newest action of an app wins)."""
    for line in commit.splitlines():
        if line.startswith(b'{"txn"'):
            txn = json.loads(line)["txn"]
            txns[txn["appId"]] = int(txn["version"])


class TxnLog:
    """See the module docstring; `TXN_LOG` is the process's one instance."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[tuple[str, tuple[tuple[str, str], ...]], Known] = {}

    def clear(self) -> None:
        self._lock = threading.Lock()
        self._known = {}

    def versions(self, uri: str, storage_options: Mapping[str, str] | None, version: int) -> dict[str, int] | None:
        """app id -> txn version of the table at `version`; None when the log cannot answer exactly."""
        from engagement_platform.lake.file_writes import filesystem  # file_writes imports delta, which imports this

        key = (uri, tuple(sorted((storage_options or {}).items())))
        with self._lock:
            known = self._known.get(key)
        try:
            fs, path = filesystem(uri, storage_options)
            log = f"{path.rstrip('/')}/_delta_log"

            def read(v: int) -> bytes:
                with fs.open_input_stream(f"{log}/{v:020d}.json") as stream:
                    return bytes(stream.readall())

            if known is not None and known.version <= version and version - known.version <= MAX_FORWARD:
                if commit_digest(read(known.version)) != known.digest:
                    known = None
            else:
                known = None
            if known is not None:
                start, txns = known.version, dict(known.txns)
            else:
                start, txns = _from_checkpoint(fs, log, version)
            commit = b""
            for v in range(start + 1, version + 1):
                commit = read(v)
                commit_txns(commit, txns)
            if version > start:
                digest = commit_digest(commit)
            elif known is not None:
                digest = known.digest
            else:
                digest = commit_digest(read(version))
        except (OSError, ValueError, KeyError, NotFound):
            return None
        with self._lock:
            self._known[key] = Known(version, digest, txns)
            while len(self._known) > MAX_TABLES:
                del self._known[next(iter(self._known))]
        return dict(txns)


class NotFound(Exception):
    """The log has no single-file checkpoint at or before the version asked, and not every commit from 0."""


def _from_checkpoint(fs: pafs.FileSystem, log: str, version: int) -> tuple[int, dict[str, int]]:
    """(the version the txns stand at, their map) from the newest checkpoint at or before `version`, named by
    `_last_checkpoint`; (-1, {}) when the table has none (its commits are read from 0)."""
    import pyarrow.parquet as pq

    try:
        with fs.open_input_stream(f"{log}/_last_checkpoint") as stream:
            last = json.loads(bytes(stream.readall()))
    except FileNotFoundError:
        return -1, {}
    checkpoint = int(last["version"])
    if checkpoint > version or last.get("parts"):
        raise NotFound(f"checkpoint {checkpoint} (parts {last.get('parts')}) for version {version}")
    with fs.open_input_file(f"{log}/{checkpoint:020d}.checkpoint.parquet") as file:
        table = pq.read_table(file, columns=["txn"])
    txns: dict[str, int] = {}
    for txn in table.column("txn").to_pylist():
        if txn is not None:
            txns[txn["appId"]] = int(txn["version"])
    return checkpoint, txns


TXN_LOG = TxnLog()
os.register_at_fork(after_in_child=TXN_LOG.clear)
