"""The parse -> convert -> validate pipeline for plain records, in the Python worker that read them.

Spark's JVM JSON parse and validation of a Kafka slice costs several times the read itself, and the
rows then cross from the JVM to a Python worker again to be written. Most records are plain: a compact
JSON object whose fields are strings (or whole numbers, or small nested objects for text columns),
with ISO timestamps and nothing wrong with them. For those the outcome is easy to compute exactly, so
a record is *decided* here (its typed target row) only when this module can be sure Spark's pipeline
(sources.parse_text + pipeline.Pipeline) would give the same row with no error; every other record
(bad ones included) is *undecided* and goes through the Spark pipeline, which owns every error
message. Equality on the decided records is what engagement_platform_tests/ingest/test_fast_path.py
checks against Spark itself.

Only pipelines that use what is implemented here take this path (`FastPath.for_pipeline` is None
otherwise): a kafka or jsonl source of text columns without options, target types string, int/long,
date and timestamp without formats, `cast` converters without formats, and the target schema's
required / enum constraints.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone

import orjson
import pyarrow as pa

from engagement_platform.ingest.config import PipelineConfig
from engagement_platform.ingest.errors import SOURCE_OFFSET, SOURCE_PARTITION
from engagement_platform.ingest.fast_columns import decide_columns
from engagement_platform.ingest.sources import CORRUPT

TEXT_TYPES = ("string",)
INT_TYPES = {"int": (pa.int32(), 2**31), "integer": (pa.int32(), 2**31), "long": (pa.int64(), 2**63), "bigint": (pa.int64(), 2**63)}
ARROW_TYPES = {"string": pa.string(), "date": pa.date32(), "timestamp": pa.timestamp("us", tz="UTC"),
               **{name: arrow for name, (arrow, _) in INT_TYPES.items()}}
# The forms whose Spark cast is certain: Spark also takes "2026-1-5", a space for the T, surrounding
# blanks, "+12", more fraction digits...; those records are left to Spark.
TIMESTAMP = re.compile(r"[1-8]\d{3}-\d{2}-\d{2}T([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?(Z|[+-](0\d|1[0-7]):[0-5]\d|[+-]18:00)?")
DATE = re.compile(r"[1-8]\d{3}-\d{2}-\d{2}")  # years far from the calendar's ends: Spark and Python agree there
INTEGER = re.compile(r"-?\d{1,18}")  # fits a long whatever its digits
# What Spark writes back otherwise inside a nested value: a float the Java way (1e7 -> 1.0E7; in compact JSON a
# number follows ':', ',' or '[', and a string holding such text only sends its record to Spark, which is safe),
# a character beyond the BMP (4-byte UTF-8) as an escaped surrogate pair.
WRITTEN_BACK_OTHERWISE = re.compile(rb"[:,\[]-?\d+[.eE]|[\xf0-\xf4]")
MAX_OFFSET = timedelta(hours=18)
UNDECIDED = object()  # a value (or record) this module leaves to Spark


@dataclass(frozen=True)
class CastStep:
    """The `cast` converter: `column` typed into `to`; a missing value may come from `default_from`."""

    column: str
    to: str
    type: str
    default_from: tuple[str, ...]


@dataclass(frozen=True)
class FastPath:
    fields: tuple[str, ...]  # the source's columns, in order
    max_record_bytes: int
    casts: tuple[CastStep, ...]
    target: dict  # column -> ColumnSpec
    enums: dict  # column -> frozenset of allowed values
    required: tuple[str, ...]

    @classmethod
    def for_pipeline(cls, config: PipelineConfig) -> FastPath | None:
        """The fast path of `config`, or None when it uses something only the Spark pipeline does."""
        source, target = config.source, config.target.columns
        if source.format not in ("kafka", "jsonl") or source.options or config.validators:
            return None
        if any(type_ != "string" for type_ in source.columns.values()):
            return None
        casts = []
        for ref in config.converters:
            params = ref.params
            if ref.plugin != "cast" or params.get("formats") or params.get("type") not in ARROW_TYPES:
                return None
            casts.append(CastStep(params["column"], params.get("to") or params["column"], params["type"],
                                  tuple(params.get("default_from") or ())))
        for name, spec in target.items():
            if spec.type not in ARROW_TYPES or spec.formats or spec.min is not None or spec.max is not None or spec.regex:
                return None
        if any(c.to in target and ARROW_TYPES[c.type] != ARROW_TYPES[target[c.to].type] for c in casts):
            return None  # the conform step would cast between types
        produced = set(source.columns) | {c.to for c in casts}
        if any(name not in produced for name in target):
            return None  # the Spark pipeline reports the build error
        return cls(tuple(source.columns), source.max_record_bytes, tuple(casts), dict(target),
                   {name: frozenset(spec.enum) for name, spec in target.items() if spec.enum},
                   tuple(name for name, spec in target.items() if spec.required))

    def schema(self) -> pa.Schema:
        """The decided rows: source position, then the target columns typed as Spark's pipeline types them."""
        return pa.schema([(SOURCE_PARTITION, pa.int32()), (SOURCE_OFFSET, pa.int64()),
                          *[(name, ARROW_TYPES[spec.type]) for name, spec in self.target.items()]])

    def decide(self, partition: int, offsets: list[int], values: list[bytes | None]) -> tuple[pa.Table, list[int]]:
        """(the decided records' rows in `schema()`, the indexes of the undecided records): decide_record's
        rules applied column by column (fast_columns.py)."""
        return decide_columns(self, partition, offsets, values)

    def decide_reference(self, partition: int, offsets: list[int], values: list[bytes | None]) -> tuple[pa.Table, list[int]]:
        """`decide` one record at a time with decide_record: slow and plain, what `decide` is tested against."""
        columns: dict[str, list] = {name: [] for name in self.schema().names}
        undecided = []
        for index, (offset, value) in enumerate(zip(offsets, values)):
            row = self.decide_record(value)
            if row is UNDECIDED:
                undecided.append(index)
                continue
            columns[SOURCE_PARTITION].append(partition)
            columns[SOURCE_OFFSET].append(offset)
            for name, item in row.items():
                columns[name].append(item)
        return pa.table(columns, schema=self.schema()), undecided

    def decide_record(self, value: bytes | None):
        """The record's typed target row (column -> value), or UNDECIDED."""
        if not value or len(value) > self.max_record_bytes:
            return UNDECIDED
        try:
            record = orjson.loads(value)
        except orjson.JSONDecodeError:
            return UNDECIDED
        if type(record) is not dict or CORRUPT in record:  # Spark would take that key for its corrupt-record column
            return UNDECIDED
        canonical: bool | None = None  # computed once, if a nested value needs it
        text: dict[str, str | None] = {}
        for name in self.fields:
            item = record.get(name)
            if item is None or type(item) is str:
                text[name] = item
            elif type(item) is int:
                text[name] = str(item)
            elif type(item) is bool:
                text[name] = "true" if item else "false"
            elif type(item) in (dict, list):
                if canonical is None:
                    canonical = _canonical(record, value)
                nested = orjson.dumps(item)
                if not canonical or WRITTEN_BACK_OTHERWISE.search(nested):
                    return UNDECIDED
                text[name] = nested.decode()
            else:
                return UNDECIDED  # a float at the top level: Spark writes it back the Java way
        return self._typed(text)

    def _typed(self, text: dict[str, str | None]):
        row: dict = dict(text)
        for cast in self.casts:
            converted = _convert(row.get(cast.column), cast.type)
            if converted is UNDECIDED:
                return UNDECIDED
            if row.get(cast.column) is None and cast.default_from:
                for source in cast.default_from:
                    if row.get(source) is None:
                        continue
                    converted = _as_type(row[source], cast.type)
                    if converted is UNDECIDED:
                        return UNDECIDED
                    break
            if cast.to != cast.column:
                row.pop(cast.column, None)
            row[cast.to] = converted
        out = {}
        for name, spec in self.target.items():
            item = row.get(name)
            if type(item) is str and spec.type != "string":
                item = _convert(item, spec.type)
                if item is UNDECIDED:
                    return UNDECIDED
            out[name] = item
        for name in self.required:
            item = out[name]
            if item is None or (type(item) is str and item.strip(" ") == ""):
                return UNDECIDED  # Spark's trim removes spaces only
        for name, allowed in self.enums.items():
            item = out[name]
            if item is not None and item not in allowed:
                return UNDECIDED
        return out


def _canonical(record: dict, value: bytes) -> bool:
    """The record's bytes are exactly its compact JSON: no whitespace, no duplicate keys, no escapes
    Spark would write back differently (\\/, \\u00XX)."""
    return b"\\u" not in value and orjson.dumps(record) == value


def _convert(text: str | None, type_: str):
    """Text -> `type_` where Spark's try_cast is certain to give the same, else UNDECIDED (None stays None)."""
    if text is None:
        return None
    if type(text) is not str:
        return UNDECIDED  # typed by an earlier converter: Spark's cast between types is not repeated here
    if type_ == "string":
        return text
    if type_ == "timestamp":
        return _timestamp(text)
    if type_ == "date":
        if not DATE.fullmatch(text):
            return UNDECIDED
        try:
            return date.fromisoformat(text)
        except ValueError:
            return UNDECIDED
    if not INTEGER.fullmatch(text):
        return UNDECIDED
    number, bound = int(text), INT_TYPES[type_][1]
    return number if -bound <= number < bound else UNDECIDED  # Spark's cast overflows to null


def _timestamp(text: str):
    if not TIMESTAMP.fullmatch(text):
        return UNDECIDED
    try:
        parsed = datetime.fromisoformat(text)
        if parsed.tzinfo is None:
            return parsed.replace(tzinfo=timezone.utc)  # the session time zone (spark/session.py)
        if abs(parsed.utcoffset()) > MAX_OFFSET:
            return UNDECIDED  # Java's zone offsets stop at 18 hours
        return parsed.astimezone(timezone.utc)
    except (ValueError, OverflowError):
        return UNDECIDED


def _as_type(text: str, type_: str):
    """builtin._as: a date is the UTC day of a timestamp (or of a bare date)."""
    if type(text) is not str:
        return UNDECIDED
    if type_ != "date":
        return _convert(text, type_)
    if DATE.fullmatch(text):
        return _convert(text, "date")
    stamp = _timestamp(text)
    return stamp if stamp is UNDECIDED else stamp.date()
