"""One tenant's MERGE source from its staged changes and its stored rows: Arrow in, Arrow out.

resolution.merge_source runs this inside Spark's Python workers, once per tenant (a cogroup of the
staged changes and the stored rows by tenant, applyInArrow), so the tenants of a batch spread over
the executors' cores. It does what the processor needs per tenant in one pass:

1. per primary id, json_merge's rules (json_merge.resolve_changes is the reference; hypothesis tests
   compare): changes in CDC sequence order, those not above the stored row's sequence dropped, the
   fold restarted after the last delete, newer non-null top-level fields win;
2. the identity graph: the batch's rows and every stored row whose component touches an id of the
   batch are labelled again (union-find, identity.union_find_labels), so a new link between two
   existing components relabels both and a dropped link splits one;
3. the rows to MERGE: `upsert` (a whole new row, tombstones included) for every resolved key,
   `relink` (related_ids / component_id only) for stored rows whose component changed.

Why Python here and not Spark columns: the field-level fold over schema-on-read JSON needs a map of
variants per change and per stored row (from_json to map<string,variant>, map_zip_with, to_json), and
that plan dominated the processor's cost (BENCHMARKS.md); orjson parses and writes these small objects
cheaply.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from engagement_platform.lake.file_writes import filesystem, read_parquet
from engagement_platform.profiles.identity import union_find_labels
from engagement_platform.profiles.json_merge import DELETE
from engagement_platform.streams.gc_pause import no_cyclic_gc

ACTION, UPSERT, RELINK = "_action", "upsert", "relink"
UTC_US = pa.timestamp("us", tz="UTC")
CHANGES_SCHEMA = pa.schema(
    [
        ("tenant", pa.string()),
        ("primary_id", pa.string()),
        ("related_ids", pa.list_(pa.string())),
        ("record_type", pa.string()),
        ("op", pa.string()),
        ("cdc_seq", pa.int64()),
        ("cdc_ts", UTC_US),
        ("fields", pa.string()),
    ]
)
STORED_SCHEMA = pa.schema(
    [
        ("tenant", pa.string()),
        ("primary_id", pa.string()),
        ("record_type", pa.string()),
        ("linked_ids", pa.list_(pa.string())),
        ("related_ids", pa.list_(pa.string())),
        ("component_id", pa.string()),
        ("cdc_seq", pa.int64()),
        ("deleted", pa.bool_()),
        ("fields", pa.string()),
    ]
)
CHANGE_COLUMNS = tuple(CHANGES_SCHEMA.names)
STORED_COLUMNS = tuple(STORED_SCHEMA.names)
SOURCE_SCHEMA = pa.schema(
    [
        ("tenant", pa.string()),
        ("primary_id", pa.string()),
        ("record_type", pa.string()),
        ("linked_ids", pa.list_(pa.string())),
        ("related_ids", pa.list_(pa.string())),
        ("component_id", pa.string()),
        ("cdc_seq", pa.int64()),
        ("cdc_ts", UTC_US),
        ("deleted", pa.bool_()),
        ("fields", pa.string()),
        ("email", pa.string()),
        ("country", pa.string()),
        ("updated_at", UTC_US),
        (ACTION, pa.string()),
    ]
)
SOURCE_DDL = ", ".join(
    f"{f.name} {_t}"
    for f, _t in zip(
        SOURCE_SCHEMA,
        (
            "string",
            "string",
            "string",
            "array<string>",
            "array<string>",
            "string",
            "bigint",
            "timestamp",
            "boolean",
            "string",
            "string",
            "string",
            "timestamp",
            "string",
        ),
    )
)


# orjson reads an integer beyond 64 bits as a float (precision lost), the standard parser keeps it
# exact: a parse holding a float of that size (rare: a big integer, or a float literal that large,
# which both parsers read alike) is parsed again by the standard parser. Walking the parsed values
# costs a fraction of scanning the text for long digit runs (a regex cost more than the parse).
_INT64_MAGNITUDE = 2.0**63
_FIRST_VALUE = json.JSONDecoder()


def _read_files(
    uris: list[str], schema: pa.Schema, tenant: str, storage_options: Mapping[str, str] | None = None
) -> pa.Table:
    """The files' rows in `schema` (the tenant column set, since staged files keep it in their path), read
    through the lake's file system (local or object store). Each file is cast on its own: files rewritten
    by delta-rs may store strings as views."""
    names = [n for n in schema.names if n != "tenant"]
    tables = []
    for uri in uris:
        fs, path = filesystem(uri, storage_options)
        tables.append(read_parquet(fs, path, columns=names).select(names))
    rows = sum(t.num_rows for t in tables)
    columns = [pa.repeat(pa.scalar(tenant, pa.string()), rows)]
    for name in names:
        parts = [t[name].cast(schema.field(name).type) for t in tables]
        columns.append(pa.chunked_array([c for part in parts for c in part.chunks], schema.field(name).type))
    return pa.table(columns, schema=schema)


def read_tenant_files(
    tenant: str, staged: list[str], raw: list[str], storage_options: Mapping[str, str] | None = None
) -> tuple[pa.Table, pa.Table]:
    """(changes, stored rows) of one tenant from its staged files and its raw table's files."""
    return _read_files(staged, CHANGES_SCHEMA, tenant, storage_options), _read_files(
        raw, STORED_SCHEMA, tenant, storage_options
    )


def loads(text: str | None) -> dict | None:
    """A `fields` object as staging validated it (records.JsonShape): the first JSON value of the
    text, as Spark reads it (text after it is ignored; a lone escaped surrogate is kept)."""
    if text is None:
        return None
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError:
        return _FIRST_VALUE.raw_decode(text.lstrip())[0]
    return _FIRST_VALUE.raw_decode(text.lstrip())[0] if _rounded(obj) else obj


def _rounded(value) -> bool:
    """Holds a float at least 2**63 in magnitude (where orjson may have rounded an integer)."""
    kind = type(value)
    if kind is float:
        return not -_INT64_MAGNITUDE < value < _INT64_MAGNITUDE
    if kind is dict:
        value = value.values()
    elif kind is not list:
        return False
    for item in value:
        kind = type(item)
        if kind is not str and kind is not int and item is not None and _rounded(item):
            return True
    return False


def dumps(obj: dict) -> str:
    try:
        return orjson.dumps(obj).decode()
    except TypeError:  # orjson.JSONEncodeError: an integer beyond 64 bits or a lone surrogate (see loads)
        return json.dumps(obj, separators=(",", ":"))


def promoted_text(value) -> str | None:
    """A promoted text column as staging gives it (records.promoted_columns, a value of `fields` read
    as map<string,string>): a string as itself, any other value as its JSON text."""
    return value if value is None or isinstance(value, str) else dumps(value)


def promoted_time(value) -> datetime | None:
    """updated_at as an ISO 8601 time (UTC when it names no zone); anything else gives null."""
    if not isinstance(value, str):
        return None
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        return None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t


def _sorted_changes(changes: pa.Table) -> pa.Table:
    # Ties in sequence (a replayed record) are broken by content, so the outcome never depends on arrival.
    keys = [
        (name, "ascending", "at_start") for name in ("primary_id", "cdc_seq", "op", "cdc_ts", "record_type", "fields")
    ]
    return changes.take(pc.sort_indices(changes, sort_keys=keys))


def tenant_merge_source(changes: pa.Table, stored: pa.Table) -> pa.Table:
    """SOURCE_SCHEMA rows of one tenant. `changes`: CHANGE_COLUMNS of every staged change of the
    batch; `stored`: STORED_COLUMNS of (at least) the stored rows of the batch's keys and of the
    components they touch; more stored rows only cost time.

    (A plain function, not decorated: applyInArrow reads its argument list.)"""
    if changes.num_rows == 0:
        return SOURCE_SCHEMA.empty_table()
    with no_cyclic_gc():  # a dict per change and per stored row: the collector took ~28% of the fold
        return _merge_source(changes, stored)


def _merge_source(changes: pa.Table, stored: pa.Table) -> pa.Table:
    tenant = changes["tenant"][0].as_py()
    changes = _sorted_changes(changes)
    seqs = changes["cdc_seq"].to_pylist()
    ops = changes["op"].to_pylist()
    kinds = changes["record_type"].to_pylist()
    related = changes["related_ids"].to_pylist()
    texts = changes["fields"].to_pylist()

    s_ids = stored["primary_id"].to_pylist()
    at = {pid: i for i, pid in enumerate(s_ids)}
    s_seq = stored["cdc_seq"].to_pylist()
    s_deleted = stored["deleted"].to_pylist()
    s_kind = stored["record_type"].to_pylist()
    s_linked = stored["linked_ids"].to_pylist()
    s_fields = stored["fields"].to_pylist()

    out_id, out_kind, out_linked, out_last, out_deleted, out_fields = [], [], [], [], [], []
    out_email, out_country, out_updated = [], [], []
    # Changes are sorted by id: each id's changes are one run [i, j).
    runs = pc.run_end_encode(changes["primary_id"].combine_chunks())
    i = 0
    for pid, j in zip(runs.values.to_pylist(), runs.run_ends.to_pylist()):
        s = at.get(pid)
        start = i
        if s is not None:
            while start < j and seqs[start] <= s_seq[s]:
                start += 1  # late or replayed: never newer than what is stored
        if start < j:
            kind = s_kind[s] if s is not None else None
            last_delete = -1
            for k in range(start, j):
                if kinds[k] is not None:
                    kind = kinds[k]
                if ops[k] == DELETE:
                    last_delete = k
            deleted = last_delete == j - 1
            linked, fields, promoted = [], None, {}
            if not deleted:
                alive = s is not None and not s_deleted[s] and last_delete < 0
                fields = {}
                if alive:
                    linked = s_linked[s] or []
                    base = loads(s_fields[s])
                    if base:  # stored fields hold no nulls when the processor wrote them
                        fields = (
                            base if None not in base.values() else {key: v for key, v in base.items() if v is not None}
                        )
                for k in range(max(start, last_delete + 1), j):
                    if related[k] is not None:
                        linked = related[k]
                    change = loads(texts[k])
                    if change:
                        if None in change.values():  # null: not captured, the older value stays
                            change = {key: v for key, v in change.items() if v is not None}
                        fields.update(change)
                linked = list(dict.fromkeys(linked))
                promoted = fields
                fields = dumps(fields)
            out_id.append(pid)
            out_kind.append(kind)
            out_linked.append(linked)
            out_last.append(j - 1)
            out_deleted.append(deleted)
            out_fields.append(fields)
            out_email.append(promoted_text(promoted.get("email")))
            out_country.append(promoted_text(promoted.get("country")))
            out_updated.append(promoted_time(promoted.get("updated_at")))
        i = j

    # The identity graph over the resolved keys and the stored rows whose component they touch.
    resolved = set(out_id)
    touched = resolved.union(*out_linked)
    s_related = stored["related_ids"].to_pylist()
    s_component = stored["component_id"].to_pylist()
    untouched = [
        s
        for s, pid in enumerate(s_ids)
        if pid not in resolved and (pid in touched or not touched.isdisjoint(s_related[s] or ()))
    ]
    src, dst = [], []
    rows = [*zip(out_id, out_linked), *((s_ids[s], s_linked[s] or []) for s in untouched)]
    for pid, linked in rows:  # a self-loop per row, so a row without links is its own component
        src.extend([pid] * (len(linked) + 1))
        dst.append(pid)
        dst.extend(linked)
    label = union_find_labels(src, dst)
    members: dict[str, list[str]] = {}
    for node, root in label.items():
        members.setdefault(root, []).append(node)
    for group in members.values():
        group.sort()

    relink_id, relink_related, relink_component = [], [], []
    for s in untouched:
        pid = s_ids[s]
        root = label[pid]
        if s_related[s] != members[root] or s_component[s] != root:
            relink_id.append(pid)
            relink_related.append(members[root])
            relink_component.append(root)

    n_up, n_re = len(out_id), len(relink_id)
    nothing = [None] * n_re
    last = pa.array(out_last + nothing, pa.int64())
    return pa.table(
        [
            pa.array([tenant] * (n_up + n_re), pa.string()),
            pa.array(out_id + relink_id, pa.string()),
            pa.array(out_kind + nothing, pa.string()),
            pa.array(out_linked + nothing, pa.list_(pa.string())),
            pa.array([members[label[pid]] for pid in out_id] + relink_related, pa.list_(pa.string())),
            pa.array([label[pid] for pid in out_id] + relink_component, pa.string()),
            changes["cdc_seq"].take(last).cast(pa.int64()),
            changes["cdc_ts"].take(last).cast(UTC_US),
            pa.array(out_deleted + nothing, pa.bool_()),
            pa.array(out_fields + nothing, pa.string()),
            pa.array(out_email + nothing, pa.string()),
            pa.array(out_country + nothing, pa.string()),
            pa.array(out_updated + nothing, UTC_US),
            pa.array([UPSERT] * n_up + [RELINK] * n_re, pa.string()),
        ],
        schema=SOURCE_SCHEMA,
    )
