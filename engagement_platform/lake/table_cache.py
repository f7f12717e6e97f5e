"""Answers read from Delta tables, computed again only when the table's log moved: a per-process cache for the
questions sensor ticks ask every few seconds (no Dagster).

A tick that finds nothing to do still asks the checkpoint table where its stream stands; loading the table's log
and scanning its files costs tens to hundreds of milliseconds of CPU, every tick, for an answer that changes only
when somebody commits. Here each table (by URI and storage options) keeps a `LogMark`: the newest version seen and
a digest of that version's commit file. Whether the table moved is then two small reads on the log
(`TableCache.mark`; microseconds on local disk, two GET requests on an object store): that commit file still has
the content seen (a lake reset, or a log cleanup past it, replaces or deletes it) and the next version's commit
file does not exist (Delta writes version n + 1 only as a new file, after n). While both
hold, the table is at the marked version, and an answer computed at it is what a fresh read would return now.

Three kinds of answer, each exact:
- `version(lake, name)`: the table's newest version.
- `memo(lake, names, key, compute)`: any answer computed from whole tables. The marks are taken before
  `compute()` runs, so the answer (computed at those versions or later ones) is served only while every table
  is still at its mark, that is, at the versions it was computed at; any commit to any of them computes it again.
- `answer(lake, name, key, compute, scope)`: an answer computed from some partitions of one table, such as one
  stream's rows of the checkpoint table. After the table moved, the new commits' actions are read (a few small
  JSON files); commits that add or remove no file of `scope`'s partitions and change neither the metadata nor the
  protocol leave the answer as it was, since the partitions then hold the same files and rows. Any other action,
  an action without partition values, a log that moved by more than MAX_FORWARD commits or a commit that cannot be
  read computes it again. Delta promises no row order, so such an answer must not depend on the files' order
  (CheckpointStore.rows_of sorts its rows).

Threads: every table has a lock held only while its log is checked (and, the first time, while its version is
loaded); `compute()` runs outside it. A forked child starts with an empty cache, and never uses or frees
the file systems its parent opened.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pyarrow.fs as pafs
from deltalake.exceptions import TableNotFoundError

from engagement_platform.lake.delta import DeltaLake
from engagement_platform.lake.delta_log import PartitionScope, Touched, commit_digest, commit_touches
from engagement_platform.lake.file_writes import filesystem

T = TypeVar("T")
MAX_FORWARD = 32  # commits read to carry partition answers forward; past that, a fresh read is cheaper
MAX_ANSWERS = 256  # answers kept per table, and memos in all (the oldest go first)

TableKey = tuple[str, tuple[tuple[str, str], ...]]  # (table URI, storage options)


@dataclass(frozen=True)
class LogMark:
    """The newest version of a table seen, and the identity of its commit file: a digest of its content (an object
    store's modification times have whole seconds, and a table reset within one second can write a commit file of
    the same version and size)."""

    version: int
    digest: bytes


@dataclass
class _Table:
    """One table's cache: its log folder, the newest mark, and the partition answers valid at that mark."""

    fs: pafs.FileSystem
    log: str  # the _delta_log folder in `fs`
    lock: threading.Lock = field(default_factory=threading.Lock)
    mark: LogMark | None = None
    answers: dict[Hashable, tuple[PartitionScope, Any]] = field(default_factory=dict)

    def commit_file(self, version: int) -> str:
        return f"{self.log}/{version:020d}.json"


class TableCache:
    """See the module docstring; `TABLES` is the process's one instance."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tables: dict[TableKey, _Table] = {}
        self._memos: dict[Hashable, tuple[tuple[LogMark, ...], Any]] = {}

    def clear(self) -> None:
        """Forget every answer (new locks too: a lock held by another thread when the process forked stays held)."""
        self._lock = threading.Lock()
        self._tables, self._memos = {}, {}

    def after_fork(self) -> None:
        """In a forked child: start empty, and never free the parent's file systems (an object store's client
        joins threads the child does not have when it is freed)."""
        for table in self._tables.values():
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(table.fs))
        self.clear()

    # ---- answers -----------------------------------------------------------------------------------

    def version(self, lake: DeltaLake, name: str) -> int | None:
        """The table's newest version; None when there is no table."""
        mark = self.mark(lake, name)
        if mark is not None:
            return mark.version
        return lake.table(name).version() if lake.exists(name) else None

    def memo(self, lake: DeltaLake, names: Sequence[str], key: Hashable, compute: Callable[[], T]) -> T:
        """`compute()`'s answer from the tables `names`, computed again when any of them moved (or is absent)."""
        marks = [self.mark(lake, name) for name in names]
        whole_key = (tuple(table_key(lake, name) for name in names), key)
        known = tuple(m for m in marks if m is not None)
        if len(known) == len(marks):
            with self._lock:
                hit = self._memos.get(whole_key)
            if hit is not None and hit[0] == known:
                return hit[1]
        value = compute()
        if len(known) == len(marks):
            with self._lock:
                self._memos.pop(whole_key, None)
                self._memos[whole_key] = (known, value)
                _bound(self._memos)
        return value

    def answer(self, lake: DeltaLake, name: str, key: Hashable, compute: Callable[[], T], scope: PartitionScope) -> T:
        """`compute()`'s answer from `scope`'s partitions of the table, computed again when a commit since it was
        computed added or removed files there (or changed the table's metadata)."""
        table = self._table(lake, name)
        with table.lock:
            mark = self._current(table, lake, name)
            hit = table.answers.get(key) if mark is not None else None
        if hit is not None:
            return hit[1]
        value = compute()
        if mark is not None:
            with table.lock:
                if table.mark == mark:  # else the log moved on meanwhile: the next call reads again
                    table.answers.pop(key, None)
                    table.answers[key] = (scope, value)
                    _bound(table.answers)
        return value

    def mark(self, lake: DeltaLake, name: str) -> LogMark | None:
        """The table's newest mark (None: no table, or its newest commit file cannot be found)."""
        table = self._table(lake, name)
        with table.lock:
            return self._current(table, lake, name)

    # ---- the log -----------------------------------------------------------------------------------

    def _table(self, lake: DeltaLake, name: str) -> _Table:
        key = table_key(lake, name)
        with self._lock:
            table = self._tables.get(key)
            if table is None:
                fs, path = filesystem(lake.uri(name), lake.storage_options)
                table = self._tables[key] = _Table(fs, f"{path.rstrip('/')}/_delta_log")
            return table

    def _current(self, table: _Table, lake: DeltaLake, name: str) -> LogMark | None:
        """Bring `table` to the newest version (its lock held): carry forward the answers the new commits left
        alone, or start over from a fresh load."""
        if table.mark is not None:
            moved = self._moved(table, table.mark)
            if moved is not None:
                mark, touched = moved
                table.answers = {k: a for k, a in table.answers.items() if not touched.reaches(a[0])}
                table.mark = mark
                return mark
        table.answers = {}
        table.mark = self._fresh_mark(table, lake, name)
        return table.mark

    def _moved(self, table: _Table, mark: LogMark) -> tuple[LogMark, Touched] | None:
        """(the newest mark, what the commits after `mark` changed), or None when the log cannot be followed from
        `mark` (its commit file replaced or gone, too many commits, one unreadable or not understood)."""
        touched, newest, version = Touched(), mark, mark.version
        try:
            if commit_digest(_read(table, mark.version)) != mark.digest:
                return None
            while (commit := _read_if_there(table, version + 1)) is not None:
                if version - mark.version >= MAX_FORWARD:
                    return None
                version += 1
                if table.answers and not touched.everything:
                    commit_touches(commit, touched)
                newest = LogMark(version, commit_digest(commit))
            # The marked commit once more: a table reset while the newer ones were read would have replaced it.
            if version > mark.version and commit_digest(_read(table, mark.version)) != mark.digest:
                return None
        except Exception:  # noqa: BLE001 - a commit deleted, unreadable or not understood: a fresh read is exact
            return None
        if version > mark.version and not table.answers:
            touched.everything = True
        return newest, touched

    @staticmethod
    def _fresh_mark(table: _Table, lake: DeltaLake, name: str) -> LogMark | None:
        try:
            version = lake.table(name).version()
            return LogMark(version, commit_digest(_read(table, version)))
        except (TableNotFoundError, OSError):
            return None


def table_key(lake: DeltaLake, name: str) -> TableKey:
    return lake.uri(name), tuple(sorted((lake.storage_options or {}).items()))


def _read(table: _Table, version: int) -> bytes:
    with table.fs.open_input_stream(table.commit_file(version)) as commit:
        return bytes(commit.readall())


def _read_if_there(table: _Table, version: int) -> bytes | None:
    """The commit's content, None when it does not exist: one GET on an object store (a missing object's stat is
    a HEAD and a listing)."""
    try:
        return _read(table, version)
    except FileNotFoundError:
        return None


def _bound(entries: dict) -> None:
    while len(entries) > MAX_ANSWERS:
        del entries[next(iter(entries))]


TABLES = TableCache()
os.register_at_fork(after_in_child=TABLES.after_fork)
