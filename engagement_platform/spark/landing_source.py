"""Spark Python data sources for landing files, read through pyarrow's file systems (local, S3, ADLS):

- `landing_lines`: a file's records with their line numbers. Spark's own text and CSV readers do not say
  which line a row came from, and a quarantine row must point at its source position. This source splits
  each file into byte ranges that start on a line boundary (so both cores read), numbers lines exactly,
  and returns (line, raw bytes) as Arrow. One record per line: CSV with embedded newlines is not
  supported by this path (JSON lines never has them).
- `landing_document`: a whole-file JSON document (an object, or an array of objects), one record per
  element with its index; a document that does not parse is one record, its whole text, flagged. Spark's
  JSON reader would need Hadoop's connectors for an object store (not installed here).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, cast

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

if TYPE_CHECKING:
    import pyarrow as pa

SCHEMA = "_source_offset long, _raw binary"
SPLIT_BYTES = 16 << 20  # a lines file is read in byte ranges of about this size, a task each


class LineSpan(InputPartition):
    def __init__(self, path: str, start: int, end: int, first_line: int, skip_lines: int):
        self.path, self.start, self.end, self.first_line, self.skip_lines = path, start, end, first_line, skip_lines


class LandingLinesDataSource(DataSource):
    """Options: path (one file: a local path or an object-store URI), split_bytes (default 16 MiB), skip_lines
    (header lines, default 0), storage_options (JSON: the lake's, for an object store)."""

    @classmethod
    def name(cls) -> str:
        return "landing_lines"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return LandingLinesReader(dict(self.options))


def line_spans(data: bytes, split_bytes: int) -> list[tuple[int, int, int]]:
    """(start, end, number of the first line) per span; spans end just after a newline."""
    if split_bytes < 1:
        raise ValueError(f"split_bytes must be positive, not {split_bytes}")  # 0 would never advance
    spans, start, line = [], 0, 1
    while start < len(data):
        end = data.find(b"\n", min(start + split_bytes, len(data)) - 1)
        end = len(data) if end < 0 else end + 1
        spans.append((start, end, line))
        line += data.count(b"\n", start, end)
        start = end
    return spans


def open_file(path: str, storage_options: dict) -> pa.NativeFile:
    from engagement_platform.lake.file_writes import filesystem

    fs, where = filesystem(path, storage_options)
    return fs.open_input_file(where)


def balanced_split(size: int, slots: int) -> int:
    """A split size near SPLIT_BYTES that cuts `size` bytes into a multiple of `slots` ranges: every wave of
    tasks keeps every slot busy (5 ranges on 2 cores would leave one idle while the last one runs)."""
    waves = max(1, -(-size // (SPLIT_BYTES * slots)))
    return max(1, -(-size // (waves * slots)))


def file_spans(
    path: str, storage_options: dict, split_bytes: int | None, skip_lines: int, slots: int = 1
) -> list[LineSpan]:
    """The byte ranges a lines file is read in, one task each (at least one, for an empty file); without a
    `split_bytes`, balanced over `slots` task slots."""
    with open_file(path, storage_options) as f:
        data = f.read()
    split_bytes = split_bytes or balanced_split(len(data), slots)
    spans = [LineSpan(path, s, e, line, skip_lines) for s, e, line in line_spans(data, split_bytes)]
    return spans or [LineSpan(path, 0, 0, 1, 0)]


BLANK = rb"^[ \t\n\r\x0b\x0c]*$"  # what bytes.strip() removes: a line of only these is not a record


def span_lines(span: LineSpan, storage_options: dict) -> pa.RecordBatch:
    """_source_offset (the line number), _raw: a span's records, a trailing CR dropped, blank lines and the
    first `skip_lines` lines of the file left out (pyarrow kernels over the span's bytes, no loop per line)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    with open_file(span.path, storage_options) as f:
        f.seek(span.start)
        data = f.read(span.end - span.start)
    lines = pc.split_pattern(pa.array([data], pa.binary()), pattern=b"\n")[0].values
    if len(lines) and len(lines[-1].as_py()) == 0:
        lines = lines.slice(0, len(lines) - 1)  # the span's final newline ends the last line, it starts none
    numbers = pa.array(np.arange(span.first_line, span.first_line + len(lines), dtype=np.int64))
    lines = pc.if_else(pc.ends_with(lines, pattern=b"\r"), pc.binary_slice(lines, 0, -1), lines)
    records = pc.and_(pc.greater(numbers, span.skip_lines), pc.invert(pc.match_substring_regex(lines, pattern=BLANK)))
    return pa.RecordBatch.from_arrays(
        [numbers.filter(records), lines.filter(records)], names=["_source_offset", "_raw"]
    )


class LandingLinesReader(DataSourceReader):
    def __init__(self, options: dict[str, str]):
        self.path = options["path"]
        self.split_bytes = int(options.get("split_bytes", str(SPLIT_BYTES)))
        self.skip_lines = int(options.get("skip_lines", "0"))
        self.storage_options = json.loads(options.get("storage_options") or "{}")

    def _open(self, path: str) -> pa.NativeFile:
        return open_file(path, self.storage_options)

    def partitions(self) -> list[LineSpan]:
        return file_spans(self.path, self.storage_options, self.split_bytes, self.skip_lines)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield span_lines(cast(LineSpan, partition), self.storage_options)  # one of those partitions() returned


DOCUMENT_SCHEMA = "_source_offset long, _raw binary, _document_error boolean"


class LandingDocumentDataSource(DataSource):
    """Options: path (one file), storage_options (JSON: the lake's, for an object store)."""

    @classmethod
    def name(cls) -> str:
        return "landing_document"

    def schema(self) -> str:
        return DOCUMENT_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return LandingDocumentReader(dict(self.options))


def document_elements(data: bytes) -> tuple[list[bytes], bool]:
    """(each element's own bytes, False) of a document: an array's elements, or the one value it holds, sliced
    out of the file as they are (numbers keep their digits, and the parse stage applies the pipeline's JSON
    options to each); ([the whole text], True) when it is not JSON. An empty document holds no element. An
    element that is not an object is left to the parse stage, which rejects it like any record that is not one
    JSON object. The document is read whole (as one task): land very large documents as JSON lines."""
    decoder = json.JSONDecoder()
    try:
        text = data.decode("utf-8")
        start = _skip_space(text, 0)
        if start == len(text):
            return [], False
        if text[start] != "[":
            _, end = decoder.raw_decode(text, start)
            if _skip_space(text, end) != len(text):
                raise ValueError("text after the document")
            return [text[start:end].encode()], False
        elements, at = [], _skip_space(text, start + 1)
        if at < len(text) and text[at] == "]":
            at += 1
        else:
            while True:
                _, end = decoder.raw_decode(text, at)
                elements.append(text[at:end].encode())
                at = _skip_space(text, end)
                if at < len(text) and text[at] == ",":
                    at = _skip_space(text, at + 1)
                    continue
                if at < len(text) and text[at] == "]":
                    at += 1
                    break
                raise ValueError("expected ',' or ']'")
        if _skip_space(text, at) != len(text):
            raise ValueError("text after the document")
        return elements, False
    except (UnicodeDecodeError, ValueError, RecursionError):  # JSONDecodeError is a ValueError
        return [data], True


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\r\n":
        at += 1
    return at


class LandingDocumentReader(LandingLinesReader):
    def partitions(self) -> list[LineSpan]:
        return [LineSpan(self.path, 0, 0, 0, 0)]  # a JSON document is not split

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        span = cast(LineSpan, partition)  # the one partitions() returned
        with self._open(span.path) as f:
            elements, broken = document_elements(f.read())
        yield pa.RecordBatch.from_arrays(
            [
                pa.array(range(len(elements)), pa.int64()),
                pa.array(elements, pa.binary()),
                pa.array([broken] * len(elements), pa.bool_()),
            ],
            names=["_source_offset", "_raw", "_document_error"],
        )


def options(
    path: str, skip_lines: int = 0, split_bytes: int | None = None, storage_options: dict | None = None
) -> dict[str, str]:
    opts = {"path": path, "skip_lines": str(skip_lines), "file_version": file_version(path, storage_options)}
    if storage_options and "://" in path:  # executors do not share the driver's environment
        opts["storage_options"] = json.dumps(storage_options)
    if split_bytes:
        opts["split_bytes"] = str(split_bytes)
    return opts


def file_version(path: str, storage_options: dict | None = None) -> str:
    """The file's size and modification time, as a read option: a Spark Connect server caches what it made of a
    read with the same options (its plan cache keeps a data source's partitions, and with them the old byte
    ranges), so a file rewritten at the same path must be read with other options to be read whole."""
    from engagement_platform.lake.file_writes import filesystem

    fs, where = filesystem(path, storage_options)
    info = fs.get_file_info(where)
    return f"{info.size}:{info.mtime_ns}"
