"""The fixed slice of a source that one batch reads, typed by the kind of source. Pure logic, no I/O.

- KafkaSlice: offset ranges of one topic (ingestion, mutation, retention, the CDC dumper);
- FileSlice: one landing file, identified by path and size (files are complete when they appear);
- FileSetSlice: landing files read as one batch (a backlog of files is one run, not one run per file);
- TableVersionsSlice: the commits (after, up_to] of an append-only table (the profile processor's staging);
- SnapshotSlice: a snapshot export's files up to a time boundary (the profile backfill).

Each slice is stored in the checkpoint store's `topic` and `ranges` columns (`to_columns`/`from_columns`).
A Kafka slice keeps the original format (the topic; a JSON list of [partition, start, end]), so every row
written before the other kinds existed reads back as a Kafka slice; the other kinds store a JSON object
naming their kind and fields in `ranges`, and their source (path, table, folder) in `topic` for a reader.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar, TypeVar

from engagement_platform.streams.kafka import OffsetRange


@dataclass(frozen=True)
class KafkaSlice:
    topic: str
    ranges: tuple[OffsetRange, ...]

    KIND: ClassVar[str] = "kafka"

    @property
    def source(self) -> str:
        return self.topic

    @property
    def key(self) -> str:
        return f"{self.topic}[{','.join(f'{r.partition}:{r.start}-{r.end}' for r in self.ranges)}]"

    @property
    def record_count(self) -> int:
        return sum(r.size for r in self.ranges)

    def ranges_json(self) -> str:
        return json.dumps([[r.partition, r.start, r.end] for r in self.ranges])

    @staticmethod
    def ranges_from_json(text: str) -> tuple[OffsetRange, ...]:
        return tuple(OffsetRange(int(p), int(s), int(e)) for p, s, e in json.loads(text))

    def ends(self) -> dict[int, int]:
        return {r.partition: r.end for r in self.ranges}


@dataclass(frozen=True)
class FileSlice:
    path: str
    size: int  # bytes: a file that changed since it was planned is refused

    KIND: ClassVar[str] = "file"

    @property
    def source(self) -> str:
        return self.path

    @property
    def key(self) -> str:
        return f"{self.path}[{self.size} bytes]"

    @classmethod
    def from_kafka_shape(cls, old: KafkaSlice) -> FileSlice | None:
        """A file plan stored as Kafka offsets (path as topic, one range 0:0-size), as landing wrote them first."""
        if len(old.ranges) == 1 and (old.ranges[0].partition, old.ranges[0].start) == (0, 0):
            return cls(old.topic, old.ranges[0].end)
        return None


@dataclass(frozen=True)
class FileSetSlice:
    files: tuple[FileSlice, ...]  # in path order, at least one

    KIND: ClassVar[str] = "files"

    def __post_init__(self) -> None:
        if not self.files:
            raise ValueError("a file set slice needs at least one file")
        if len({f.path for f in self.files}) != len(self.files):
            raise ValueError("a file set slice names a file twice: its rows would be appended twice")

    @property
    def source(self) -> str:
        """The folder the files share (the one file's path when there is one)."""
        if len(self.files) == 1:
            return self.files[0].path
        prefix = os.path.commonprefix([f.path for f in self.files])
        return prefix[: prefix.rfind("/") + 1] if "/" in prefix else prefix

    @property
    def key(self) -> str:
        if len(self.files) == 1:
            return self.files[0].key
        return f"{self.files[0].path}..{self.files[-1].path}[{len(self.files)} files, {self.size} bytes]"

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @classmethod
    def from_file(cls, old: FileSlice) -> FileSetSlice:
        """A plan of one file, as landing wrote them before it read a backlog of files in one batch."""
        return cls((old,))

    @classmethod
    def from_kafka_shape(cls, old: KafkaSlice) -> FileSetSlice | None:
        one = FileSlice.from_kafka_shape(old)
        return None if one is None else cls((one,))


@dataclass(frozen=True)
class TableVersionsSlice:
    table: str
    after: int  # the versions (after, up_to]: -1 = from the table's first commit
    up_to: int

    KIND: ClassVar[str] = "table_versions"

    @property
    def source(self) -> str:
        return self.table

    @property
    def key(self) -> str:
        return f"{self.table}({self.after}..{self.up_to}]"

    @classmethod
    def from_kafka_shape(cls, old: KafkaSlice) -> TableVersionsSlice | None:
        """Versions stored as Kafka offsets (one range 0:after+1-up_to+1), as the processor wrote them first."""
        if len(old.ranges) == 1 and old.ranges[0].partition == 0:
            return cls(old.topic, old.ranges[0].start - 1, old.ranges[0].end - 1)
        return None


@dataclass(frozen=True)
class SnapshotSlice:
    path: str  # the export: a folder of files, or one file
    until: datetime  # rows with a CDC timestamp after it are left out
    # (name, size, modification time in ns) of each data file, in read order; the time is None where the store
    # reports none or the plan was stored before times were recorded
    files: tuple[tuple[str, int, int | None], ...]

    KIND: ClassVar[str] = "snapshot"

    @property
    def source(self) -> str:
        return self.path

    @property
    def key(self) -> str:
        size = sum(f[1] for f in self.files)
        return f"{self.path}?until={self.until.isoformat()}[{len(self.files)} files, {size} bytes]"

    def same_export(self, other: SnapshotSlice) -> bool:
        """The same export: path, boundary, and each file's name and size, and its modification time where both
        know it. A file rewritten since (same name, another time) makes it another export."""
        if (self.path, self.until, len(self.files)) != (other.path, other.until, len(other.files)):
            return False
        return all(
            a[:2] == b[:2] and (a[2] is None or b[2] is None or a[2] == b[2]) for a, b in zip(self.files, other.files)
        )


Slice = KafkaSlice | FileSlice | FileSetSlice | TableVersionsSlice | SnapshotSlice
S = TypeVar("S", KafkaSlice, FileSlice, FileSetSlice, TableVersionsSlice, SnapshotSlice)


def to_columns(slice_: Slice) -> tuple[str, str]:
    """(topic, ranges): the slice in the checkpoint row's two columns."""
    if isinstance(slice_, KafkaSlice):
        return slice_.topic, slice_.ranges_json()
    if isinstance(slice_, FileSlice):
        fields = {"path": slice_.path, "size": slice_.size}
    elif isinstance(slice_, FileSetSlice):
        fields = {"files": [[f.path, f.size] for f in slice_.files]}
    elif isinstance(slice_, TableVersionsSlice):
        fields = {"table": slice_.table, "after": slice_.after, "up_to": slice_.up_to}
    elif isinstance(slice_, SnapshotSlice):
        fields = {"path": slice_.path, "until": slice_.until.isoformat(), "files": [list(f) for f in slice_.files]}
    else:
        raise TypeError(f"not a slice: {slice_!r}")
    return slice_.source, json.dumps({"kind": slice_.KIND, **fields})


def from_columns(topic: str, ranges: str) -> Slice:
    """The slice a checkpoint row stores (a JSON list in `ranges`: a Kafka slice, whenever it was written)."""
    value = json.loads(ranges)
    if isinstance(value, list):
        return KafkaSlice(topic, KafkaSlice.ranges_from_json(ranges))
    kind = value.get("kind")
    if kind == FileSlice.KIND:
        return FileSlice(value["path"], int(value["size"]))
    if kind == FileSetSlice.KIND:
        return FileSetSlice(tuple(FileSlice(str(p), int(n)) for p, n in value["files"]))
    if kind == TableVersionsSlice.KIND:
        return TableVersionsSlice(value["table"], int(value["after"]), int(value["up_to"]))
    if kind == SnapshotSlice.KIND:
        return SnapshotSlice(
            value["path"],
            datetime.fromisoformat(value["until"]),
            tuple(
                (str(f[0]), int(f[1]), int(f[2]) if len(f) > 2 and f[2] is not None else None) for f in value["files"]
            ),
        )
    raise ValueError(f"unknown slice kind {kind!r} in a checkpoint row")


def as_kind(slice_: Slice, kind: type[S]) -> S:
    """`slice_` as a `kind` slice (a plan stored before typed slices is converted); TypeError otherwise."""
    if isinstance(slice_, kind):
        return slice_
    converted = None
    if isinstance(slice_, KafkaSlice) and hasattr(kind, "from_kafka_shape"):
        converted = kind.from_kafka_shape(slice_)
    elif isinstance(slice_, FileSlice) and hasattr(kind, "from_file"):
        converted = kind.from_file(slice_)
    if converted is None:
        raise TypeError(f"expected a {kind.__name__}, the plan holds {slice_!r}")
    return converted
