"""A batch's mutation requests as one Arrow table: the driver-side checks, the canonical columns and the
MutationRequest objects the fold needs, computed column by column (their JSON text: request_text.py).

The ingest framework has already checked types, required fields and enums in Spark. What depends
on the op (convert needs from_field/from_id/to_field/to_id, ...), the JSON shapes of from_ids and
record, the date order and duplicate request ids are checked here. Only the JSON texts of merges
and updates are parsed in Python (one call each); every other check is an Arrow mask, because a
Python dict per request would dominate the cost of a large batch.

Canonical form: a column an op does not use is null, from_ids is a list, record is its JSON text
with sorted keys; `request_json` is the whole request as JSON with sorted keys and no null values
(request_time in UTC with a `Z`, dates as ISO days).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from engagement_platform.engagement.mutation.requests import OWNER_FIELDS, MutationRequest
from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY
from engagement_platform.ingest.errors import ERRORS, SOURCE_OFFSET, SOURCE_PARTITION, VALIDATE

CHECKS = "mutation_request"  # plugin name of the driver-side request checks
# Columns an update's record may set (the rest are the row's identity or ingestion bookkeeping).
RECORD_COLUMNS = tuple(
    n
    for n in ENGAGEMENT_ACTIVITY.schema.names
    if n not in ("org_id", "engagement_id", "ingestion_time", "source_partition", "source_offset", "batch_id")
)
_TS = pa.timestamp("us", tz="UTC")
CANONICAL_SCHEMA = pa.schema(
    [
        ("request_id", pa.string()),
        ("org_id", pa.string()),
        ("request_time", _TS),
        ("op", pa.string()),
        ("from_field", pa.string()),
        ("from_id", pa.string()),
        ("to_field", pa.string()),
        ("to_id", pa.string()),
        ("field", pa.string()),
        ("from_ids", pa.list_(pa.string())),
        ("id", pa.string()),
        ("engagement_id", pa.string()),
        ("record", pa.string()),
        ("date_from", pa.date32()),
        ("date_to", pa.date32()),
    ]
)
CHECKED_SCHEMA = CANONICAL_SCHEMA.append(pa.field(SOURCE_PARTITION, pa.int32())).append(
    pa.field(SOURCE_OFFSET, pa.int64())
)
OP_REQUIRED = {
    "convert": ("from_field", "from_id", "to_field", "to_id"),
    "merge": ("field", "from_ids", "to_id"),
    "update": ("engagement_id", "record"),
}
OP_COLUMNS = {**OP_REQUIRED, "delete": ("engagement_id", "field", "id")}  # the columns each op keeps


# ---- values ------------------------------------------------------------------------------------


def iso(value: Any) -> str | None:
    """A timestamp as UTC ISO text ending in Z, a date as an ISO day."""
    if value is None:
        return None
    if isinstance(value, datetime):
        value = value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
        return value.isoformat().replace("+00:00", "Z")
    return value.isoformat() if isinstance(value, date) else str(value)


def parse_timestamp(text: str) -> datetime:
    value = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)


def _kind(name: str, type_: pa.DataType) -> str:
    if pa.types.is_date(type_):
        return "date"
    if pa.types.is_timestamp(type_):
        return "timestamp"
    if pa.types.is_integer(type_):
        return "integer"
    return "payload" if name == "payload" else "text"


# Column -> (how its value is typed, its Arrow type), looked up once per value: an update batch types
# hundreds of thousands of values, and walking the schema per record cost more than the typing itself.
_RECORD_KINDS = {
    f.name: (_kind(f.name, f.type), f.type) for f in ENGAGEMENT_ACTIVITY.schema if f.name in RECORD_COLUMNS
}


def typed_record(record: dict) -> dict:
    """An update's record with engagement_activity types; ValueError naming the bad column."""
    out = {}
    for name, value in record.items():
        kind_and_type = _RECORD_KINDS.get(name)
        if kind_and_type is None:
            raise ValueError(f"record.{name}: not a column an update can set (allowed: {', '.join(RECORD_COLUMNS)})")
        kind, type_ = kind_and_type
        try:
            if value is None:
                out[name] = None
            elif kind == "text" and isinstance(value, str):
                out[name] = value
            elif kind == "date":
                out[name] = date.fromisoformat(str(value))
            elif kind == "timestamp":
                out[name] = parse_timestamp(value)
            elif kind == "integer":
                if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                    raise ValueError(value)
                out[name] = int(value)
            elif kind == "payload":
                out[name] = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
            elif isinstance(value, (dict, list)):
                raise ValueError(value)
            else:
                out[name] = str(value)
        except (TypeError, ValueError):
            raise ValueError(f"record.{name}: {value!r} is not a valid {type_}") from None
    return out


def _loads(text: str) -> tuple[Any, bool]:
    """(value, exact): orjson where it reads the text as the standard parser does; the standard parser
    for what orjson refuses (NaN, numbers beyond 64 bits), whose value only json.dumps writes back."""
    try:
        return orjson.loads(text), True
    except orjson.JSONDecodeError:
        return json.loads(text), False


def canonical_json(value: Any, exact: bool = True) -> str:
    if exact:
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
        except TypeError:  # an integer beyond 64 bits
            pass
    return json.dumps(value, sort_keys=True)


def _error(column: str | None, code: str, message: str, value: Any = None) -> dict:
    return {
        "stage": VALIDATE,
        "plugin": CHECKS,
        "column_name": column,
        "error_code": code,
        "message": message,
        "value": None if value is None else str(value),
    }


def bool_mask(array) -> np.ndarray:
    """A boolean Arrow column as numpy, null as False."""
    return np.asarray(pc.fill_null(array, False).to_numpy(zero_copy_only=False), dtype=bool)


# ---- the checks -----------------------------------------------------------------------------------


@dataclass
class CheckedRequests:
    """The slice's requests that passed every check, canonical (CANONICAL_SCHEMA + source position), the
    typed update records aligned with them, and the driver's errors of the rows it rejected."""

    requests: pa.Table
    records: list[dict | None]
    errors: dict[int, list[dict]]  # row index in the validated slice -> errors


def check_requests(validated: pa.Table) -> CheckedRequests:
    """`validated`: the framework's output in source order, every error so far in `_errors`."""
    n = validated.num_rows
    ok = np.asarray(
        pc.equal(pc.fill_null(pc.list_value_length(validated[ERRORS]), 0), 0).to_numpy(zero_copy_only=False), dtype=bool
    )
    op = validated["op"]
    errors: dict[int, list[dict]] = {}

    from_ids: list = [None] * n
    for i, text in zip(*_texts(validated, "from_ids", ok)):
        try:
            ids = orjson.loads(text)
        except orjson.JSONDecodeError:
            ids = None
        if _is_id_list(ids):
            from_ids[i] = ids
        else:
            errors.setdefault(i, []).append(
                _error("from_ids", "wrong_type", "from_ids must be a non-empty JSON array of ids", text)
            )
    records: list = [None] * n
    record_texts: list = [None] * n
    for i, text in zip(*_texts(validated, "record", ok)):
        try:
            try:
                record, exact = _loads(text)
            except ValueError:
                raise ValueError("record must be a JSON object of column values") from None
            if not isinstance(record, dict):
                raise ValueError("record must be a JSON object of column values")
            records[i] = typed_record(record)
            record_texts[i] = canonical_json(record, exact)
        except ValueError as exc:
            message = str(exc) if str(exc).startswith("record") else "record must be a JSON object of column values"
            errors.setdefault(i, []).append(_error("record", "wrong_type", message, text))

    # What each op requires (an engagement delete needs engagement_id, an owner delete field + id).
    is_op = {name: bool_mask(pc.equal(op, name)) for name in OP_COLUMNS}
    present = {c: bool_mask(pc.is_valid(validated[c])) for c in ("engagement_id", "field", "id")}
    ambiguous = is_op["delete"] & present["engagement_id"] & (present["field"] | present["id"])
    owner_delete = is_op["delete"] & ~present["engagement_id"]
    missing = {}
    for column in {c for cs in OP_COLUMNS.values() for c in cs}:
        values = validated[column]
        missing[column] = ~bool_mask(pc.is_valid(values)) | bool_mask(pc.equal(pc.utf8_trim_whitespace(values), ""))
    bad_range = bool_mask(pc.greater(validated["date_from"], validated["date_to"]))
    required = [(name, is_op[name], OP_REQUIRED[name]) for name in OP_REQUIRED] + [
        ("delete", owner_delete, ("field", "id"))
    ]
    found = np.zeros(n, dtype=bool)
    found[list(errors)] = True
    found |= ok & (ambiguous | bad_range)
    for _, of_op, columns in required:
        for column in columns:
            found |= ok & of_op & missing[column]
    for i in np.flatnonzero(found).tolist():  # the rare rejected rows: messages in the checks' order
        row_errors = errors.setdefault(i, [])
        if ambiguous[i]:
            row_errors.append(
                _error("engagement_id", "ambiguous_target", "delete takes engagement_id or field + id, not both")
            )
        for name, of_op, columns in required:
            if of_op[i]:
                row_errors += [
                    _error(c, "missing_required", f"op '{name}' requires '{c}'") for c in columns if missing[c][i]
                ]
        if bad_range[i]:
            date_from, date_to = validated["date_from"][i].as_py(), validated["date_to"][i].as_py()
            row_errors.append(
                _error(
                    "date_to",
                    "invalid_date_range",
                    f"date_to {iso(date_to)} is before date_from {iso(date_from)}",
                    iso(date_to),
                )
            )

    # A request id seen earlier in this batch (among the requests that passed): the first one wins.
    passed = np.flatnonzero(ok & ~found)
    keys = pa.table(
        {
            "org_id": validated["org_id"].take(passed),
            "request_id": validated["request_id"].take(passed),
            "i": pa.array(np.arange(len(passed))),
        }
    )
    first = np.zeros(len(passed), dtype=bool)
    first[keys.group_by(["org_id", "request_id"]).aggregate([("i", "min")])["i_min"].to_numpy()] = True
    for i, rid in zip(passed[~first].tolist(), validated["request_id"].take(passed[~first]).to_pylist()):
        errors[i] = [
            _error("request_id", "duplicate_in_batch", f"request_id '{rid}' already appears earlier in this batch", rid)
        ]
    accepted = passed[first]

    take = pa.array(accepted)
    table = validated.select([*CANONICAL_SCHEMA.names, SOURCE_PARTITION, SOURCE_OFFSET]).take(take)
    ops = table["op"]
    for column in ("from_field", "from_id", "to_field", "to_id", "field", "id", "engagement_id"):
        users = pa.array([o for o, cs in OP_COLUMNS.items() if column in cs])
        table = table.set_column(
            table.schema.get_field_index(column),
            column,
            pc.if_else(pc.is_in(ops, value_set=users), table[column], pa.nulls(len(table), pa.string())),
        )
    picked = accepted.tolist()
    table = (
        table.set_column(
            table.schema.get_field_index("from_ids"),
            "from_ids",
            pa.array([from_ids[i] for i in picked], pa.list_(pa.string())),
        )
        .set_column(
            table.schema.get_field_index("record"), "record", pa.array([record_texts[i] for i in picked], pa.string())
        )
        .set_column(table.schema.get_field_index("request_time"), "request_time", table["request_time"].cast(_TS))
    )
    return CheckedRequests(table.cast(CHECKED_SCHEMA), [records[i] for i in picked], errors)


def _is_id_list(value: Any) -> bool:
    """A non-empty list of non-empty strings. In C calls only: a batch checks hundreds of thousands of
    these, and a generator over each list cost more than parsing it (str.join refuses anything but str)."""
    if type(value) is not list or not value or not all(value):
        return False
    try:
        "".join(value)
    except TypeError:
        return False
    return True


def _texts(validated: pa.Table, column: str, ok: np.ndarray) -> tuple[list[int], list[str]]:
    """(row indices, texts) of the rows that passed the framework and carry `column`."""
    index = np.flatnonzero(ok & bool_mask(pc.is_valid(validated[column])))
    return index.tolist(), validated[column].take(pa.array(index)).to_pylist()


def canonical_from_json(texts: list[str]) -> tuple[pa.Table, list[dict | None]]:
    """Canonical columns and typed records of requests stored as request_json (the pending table)."""
    rows, records = [], []
    for text in texts:
        d = json.loads(text)
        row = {k: d.get(k) for k in CANONICAL_SCHEMA.names}
        row["request_time"] = parse_timestamp(d["request_time"])
        for k in ("date_from", "date_to"):
            row[k] = date.fromisoformat(d[k]) if d.get(k) else None
        record = d.get("record")
        row["record"] = None if record is None else canonical_json(record)
        records.append(None if record is None else typed_record(record))
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=CANONICAL_SCHEMA), records


# ---- the fold's objects -----------------------------------------------------------------------------


def mutation_requests(table: pa.Table, records: list[dict | None]) -> list[MutationRequest]:
    """One MutationRequest per canonical row (request_time as epoch micros: the fold only compares it)."""
    times = table["request_time"].cast(pa.int64()).to_pylist()
    columns = [
        table[c].to_pylist()
        for c in ("request_id", "org_id", "op", "to_field", "to_id", "engagement_id", "date_from", "date_to")
    ]
    fields = pc.coalesce(
        table["from_field"], table["field"]
    ).to_pylist()  # convert: from_field, merge/owner delete: field
    owners = pc.coalesce(table["from_id"], table["id"]).to_pylist()  # convert: from_id, owner delete: id
    from_ids = table["from_ids"].to_pylist()
    return [
        MutationRequest(
            rid, org, at, op, f, owner, tuple(ids) if ids else (), to_field, to_id, eid, record, date_from, date_to
        )
        for at, f, owner, ids, record, (rid, org, op, to_field, to_id, eid, date_from, date_to) in zip(
            times, fields, owners, from_ids, records, zip(*columns)
        )
    ]


def owner_ids_of_records(records: list[dict | None]) -> list[tuple[int, str, str]]:
    """(row, owner field, id) of every owner id an update's record sets."""
    return [
        (i, name, r[name])
        for i, r in enumerate(records)
        if r is not None
        for name in OWNER_FIELDS
        if r.get(name) is not None
    ]
