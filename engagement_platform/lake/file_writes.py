"""Data files written where the rows are (a Spark task, or any process), committed by one driver commit.

A writer turns Arrow rows into Parquet files inside a table's folder, one per partition value, with the
Delta statistics data skipping needs (`numRecords`, `minValues`, `maxValues`, `nullCount`), and returns
what a Delta `add` action records (`WrittenFile`). The driver collects them and commits all of a batch's
adds and removes in ONE commit with the batch's txn (`commit_files`), so readers see all of the batch or
none of it.

A file no commit references is invisible to every reader. The files an attempt wrote but never committed
carry the writer's app id and batch id in their names, so the batch's next attempt deletes them
(`delete_uncommitted`) before it writes its own; a full vacuum also removes them after the retention.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake.transaction import AddAction, RemoveAction

from engagement_platform.lake.delta import BatchTxn, DeltaLake, TableSpec, batches_commit_properties, holds_txn
from engagement_platform.lake.file_stats import partition_stats
from engagement_platform.lake.partition_commits import commit_over_other_partitions

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
DEFAULT_STATS_COLUMNS = 32  # Delta's default: statistics on the first 32 columns


@dataclass(frozen=True)
class WrittenFile:
    """One Parquet file in a table's folder, as its Delta `add` action records it."""

    path: str  # relative to the table root, '/'-separated
    size: int
    partition_values: dict[str, str | None]
    stats: str  # Delta statistics JSON
    modification_time: int  # ms since the epoch
    rows: int = 0
    extra: dict = field(default_factory=dict)  # what the writer wants the driver to know (e.g. an org's key range)

    def add_action(self) -> AddAction:
        return AddAction(self.path, self.size, self.partition_values, self.modification_time, True, self.stats)

    def remove_action(self) -> RemoveAction:
        # A remove without its size and partition values makes change-feed reads fail later.
        return RemoveAction(self.path, True, int(time.time() * 1000), self.size, self.partition_values)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> WrittenFile:
        return WrittenFile(**json.loads(text))


def writer_tag(app_id: str, batch_id: int) -> str:
    """The part of a file name that says which writer and batch wrote it (file names of other writers differ)."""
    return f"{re.sub(r'[^A-Za-z0-9]+', '_', app_id)}-b{batch_id:010d}"


def filesystem(uri: str, storage_options: Mapping[str, str] | None = None) -> tuple[pafs.FileSystem, str]:
    """(pyarrow file system, path in it) of a table folder: a local path or an object-store URI, with the
    lake's storage options (the same ones delta-rs gets: endpoint, region, credentials, plain HTTP)."""
    if "://" not in uri:
        import os

        return pafs.LocalFileSystem(), os.path.abspath(uri)
    if uri.startswith("s3://"):
        return s3_filesystem(storage_options or {}), uri[len("s3://") :].rstrip("/")
    if uri.startswith(("az://", "abfs://", "abfss://")):
        scheme, rest = uri.split("://", 1)
        container, _, path = rest.partition("/")
        return azure_filesystem(storage_options or {}), f"{container.split('@', 1)[0]}/{path}".rstrip("/")
    return pafs.FileSystem.from_uri(uri)


def join(root: str, relative: str) -> str:
    """`relative` under `root`, a local folder or an object-store URI."""
    import os

    return os.path.join(root, relative) if "://" not in root else f"{root.rstrip('/')}/{relative}"


def azure_filesystem(storage_options: Mapping[str, str]) -> pafs.AzureFileSystem:
    """pyarrow's Azure (Blob / ADLS Gen2) file system configured from delta-rs's storage option names; an
    AZURE_ENDPOINT (an emulator, "http://host:port/<account>") serves both the blob and the dfs API."""
    opts = {k.upper(): v for k, v in storage_options.items()}
    kwargs = {
        "account_name": opts.get("AZURE_STORAGE_ACCOUNT_NAME"),
        "account_key": opts.get("AZURE_STORAGE_ACCOUNT_KEY"),
    }
    endpoint = opts.get("AZURE_ENDPOINT")
    if endpoint:
        scheme, _, rest = endpoint.partition("://")
        authority = rest.split("/", 1)[0]
        kwargs.update(
            blob_storage_authority=authority,
            blob_storage_scheme=scheme,
            dfs_storage_authority=authority,
            dfs_storage_scheme=scheme,
        )
    return pafs.AzureFileSystem(**{k: v for k, v in kwargs.items() if v})


def s3_filesystem(storage_options: Mapping[str, str]) -> pafs.S3FileSystem:
    """pyarrow's S3 file system configured from delta-rs's storage option names."""
    opts = {k.upper(): v for k, v in storage_options.items()}
    kwargs = {
        "access_key": opts.get("AWS_ACCESS_KEY_ID"),
        "secret_key": opts.get("AWS_SECRET_ACCESS_KEY"),
        "session_token": opts.get("AWS_SESSION_TOKEN"),
        "region": opts.get("AWS_REGION"),
    }
    endpoint = opts.get("AWS_ENDPOINT_URL")
    if endpoint:
        scheme, _, host = endpoint.partition("://")
        kwargs.update(endpoint_override=host.rstrip("/"), scheme=scheme)
    # Delayed open: a file smaller than one upload part is written with one PUT instead of a multipart upload's
    # three requests (initiate, part, complete); an error such as a missing bucket then surfaces when the file
    # is closed, which every writer here does before it reports the file written.
    return pafs.S3FileSystem(**{k: v for k, v in kwargs.items() if v}, allow_delayed_open=True)


def stats_columns(spec: TableSpec) -> list[str]:
    data = [n for n in spec.schema.names if n not in spec.partition_by]
    return [c for c in spec.stats_columns if c in data] if spec.stats_columns else data[:DEFAULT_STATS_COLUMNS]


def partition_slices(rows: pa.Table, partition_by: Iterable[str]) -> list[tuple[dict[str, str | None], pa.Table]]:
    """`rows` split by their partition values: (partition values as Delta writes them, the rows)."""
    partition_by = list(partition_by)
    if not partition_by:
        return [({}, rows)] if rows.num_rows else []
    if rows.num_rows == 0:
        return []
    if all(len(pc.unique(rows[c])) == 1 for c in partition_by):  # one partition (a tenant's files): no sort, no copy
        return [({c: _partition_value(rows[c][0].as_py()) for c in partition_by}, rows)]
    rows = rows.sort_by([(c, "ascending") for c in partition_by])
    change = np.zeros(rows.num_rows, dtype=bool)
    change[0] = True
    for name in partition_by:
        codes = pc.fill_null(pc.dictionary_encode(rows[name]).combine_chunks().indices, -1).to_numpy(
            zero_copy_only=False
        )
        change[1:] |= codes[1:] != codes[:-1]
    starts = np.flatnonzero(change).tolist() + [rows.num_rows]
    out = []
    for start, end in zip(starts, starts[1:]):
        part = rows.slice(start, end - start)
        values = {c: _partition_value(part[c][0].as_py()) for c in partition_by}
        out.append((values, part))
    return out


def _partition_value(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def _partition_dir(values: Mapping[str, str | None]) -> str:
    return "/".join(f"{k}={HIVE_NULL if v is None else quote(v, safe='')}" for k, v in values.items())


def write_files(
    table_uri: str,
    spec: TableSpec,
    rows: pa.Table,
    tag: str,
    storage_options: Mapping[str, str] | None = None,
    row_group_size: int | None = None,
    footer: Mapping[str, str] | None = None,
) -> list[WrittenFile]:
    """Write `rows` (the table's columns) into the table's folder: one Parquet file per partition value,
    named after `tag` (writer_tag), without the partition columns (Delta keeps them in the log).
    `row_group_size`: rows per row group, so that a reader filtering on a column the rows are sorted by
    skips the groups outside its range (default: pyarrow's, one group for most files). `footer`: key-value
    metadata written into each file's footer (a summary its readers can use instead of counting)."""
    fs, root = filesystem(table_uri, storage_options)
    rows = rows.select(spec.schema.names).cast(spec.schema)
    columns = stats_columns(spec)
    stats = partition_stats(rows, list(spec.partition_by), columns) if rows.num_rows else {}
    written = []
    for values, part in partition_slices(rows, spec.partition_by):
        data = part.drop_columns(list(spec.partition_by))
        if footer:
            data = data.replace_schema_metadata(dict(footer))
        folder = _partition_dir(values)
        relative = (
            f"{folder}/part-{tag}-{uuid.uuid4().hex}.snappy.parquet"
            if folder
            else f"part-{tag}-{uuid.uuid4().hex}.snappy.parquet"
        )
        sink = pa.BufferOutputStream()
        pq.write_table(data, sink, compression="snappy", row_group_size=row_group_size)
        payload = sink.getvalue()
        if folder and isinstance(
            fs, pafs.LocalFileSystem
        ):  # object stores have no folders: a marker would cost requests
            fs.create_dir(f"{root}/{folder}", recursive=True)
        with fs.open_output_stream(f"{root}/{relative}") as out:
            out.write(payload)
        written.append(
            WrittenFile(
                relative,
                payload.size,
                values,
                stats[tuple(part[c][0].as_py() for c in spec.partition_by)],
                int(time.time() * 1000),
                part.num_rows,
            )
        )
    return written


def commit_files(
    lake: DeltaLake,
    spec: TableSpec,
    adds: list[WrittenFile],
    txn: BatchTxn,
    removes: Sequence[WrittenFile] = (),
    metadata: Mapping[str, str] | None = None,
) -> int | None:
    """One commit of the batch's adds and removes with its txn (and `metadata` in its commit info); None when
    the batch was already committed (its files from this attempt are then orphans: `delete_uncommitted` removes them)."""
    table = lake.ensure(spec)
    if lake.already_committed(spec.name, txn):
        return None
    actions = [f.add_action() for f in adds] + [f.remove_action() for f in removes]
    fs, root = filesystem(lake.uri(spec.name), lake.storage_options)
    commit_over_other_partitions(
        table,
        fs,
        f"{root}/_delta_log",
        actions,
        schema=spec.schema,
        partition_by=spec.partition_by,
        commit_properties=txn.commit_properties(dict(metadata or {})),
        committed=lambda: lake.already_committed(spec.name, txn),
    )
    # The commit's own version, found by its txn: another writer may have committed right after it.
    return lake.find_batch_commit(spec.name, txn.app_id, txn.version)


def commit_files_of_batches(
    lake: DeltaLake,
    spec: TableSpec,
    batches: list[tuple[BatchTxn, list[WrittenFile], list[WrittenFile]]],
    metadata: Mapping[str, str] | None = None,
) -> tuple[int | None, list[bool]]:
    """Several batches' (txn, adds, removes) in ONE commit carrying every batch's txn; a batch whose txn the
    table already has is left out (its files from this attempt are orphans for `delete_uncommitted`).
    Returns (the version written, None when nothing was left; for each batch, whether it was written)."""
    table = lake.ensure(spec)
    fresh = [not holds_txn(table, txn) for txn, _, _ in batches]
    todo = [b for b, new in zip(batches, fresh) if new]
    if not todo:
        return None, fresh
    actions = [f.add_action() for _, adds, _ in todo for f in adds] + [
        f.remove_action() for _, _, removes in todo for f in removes
    ]
    fs, root = filesystem(lake.uri(spec.name), lake.storage_options)
    commit_over_other_partitions(
        table,
        fs,
        f"{root}/_delta_log",
        actions,
        schema=spec.schema,
        partition_by=spec.partition_by,
        commit_properties=batches_commit_properties([txn for txn, _, _ in todo], dict(metadata or {})),
        committed=lambda: lake.already_committed(spec.name, todo[0][0]),
    )
    return lake.find_batch_commit(spec.name, todo[0][0].app_id, todo[0][0].version), fresh


def delete_uncommitted(
    lake: DeltaLake,
    spec: TableSpec,
    tag: str,
    partition: Mapping[str, str | None] | None = None,
    written_by: Callable[[str], bool] | None = None,
) -> int:
    """Delete the files named with `tag` that the table's current version does not reference: what an
    attempt of that writer's batch wrote before it died (only in `partition`'s folder, when given: a writer
    of one partition lists only its own). `written_by(file name)`, when given, replaces the tag test (a writer
    whose dead attempts may have had other batch numbers). Returns how many were deleted. The table's live
    files are read only when such a file is there: a batch's first attempt costs one listing."""
    fs, root = filesystem(lake.uri(spec.name), lake.storage_options)
    folder = f"{root}/{_partition_dir(partition)}" if partition else root
    infos = fs.get_file_info(pafs.FileSelector(folder, recursive=True, allow_not_found=True))
    mine = written_by or (lambda name: name.startswith(f"part-{tag}-"))
    tagged = [
        i.path[len(root) + 1 :] for i in infos if i.is_file and mine(i.base_name) and "/_delta_log/" not in i.path
    ]
    if not tagged:
        return 0
    live = {p.rsplit("/", 1)[-1] for p in lake.table(spec.name).file_uris()} if lake.exists(spec.name) else set()
    stale = [path for path in tagged if path.rsplit("/", 1)[-1] not in live]
    for path in stale:
        fs.delete_file(f"{root}/{path}")
    return len(stale)


def tagged_batch(file_name: str, app_id: str) -> int | None:
    """The batch in a data file's name when `app_id`'s writer wrote it (writer_tag), else None."""
    match = re.match(rf"part-{re.escape(writer_tag(app_id, 0)[:-10])}(\d{{10}})-", file_name)
    return int(match.group(1)) if match else None


def read_parquet(
    fs: pafs.FileSystem, path: str, columns: list[str] | None = None, dictionary: list[str] | None = None
) -> pa.Table:
    """A Parquet file's rows. On an object store the whole object comes in one GET (after the HEAD that opening
    it makes) instead of a footer read and then a read per column chunk: the files are a few MB, and each request
    costs a round trip. A random-access file, not an input stream: a stream reads a multi-MB object in several
    GETs (measured on the local S3 endpoint). `dictionary`: string columns read dictionary-encoded (codes and
    the distinct values, several times faster to read and to filter when values repeat)."""
    # ParquetFile, not read_table: read_table builds a dataset around the one file, which costs more than
    # reading a small file (0.6 ms against 0.2 ms for a checkpoint row's file)
    if isinstance(fs, pafs.LocalFileSystem):
        return pq.ParquetFile(path, read_dictionary=dictionary).read(columns=columns)
    with fs.open_input_file(path) as source:
        return pq.ParquetFile(pa.BufferReader(source.read()), read_dictionary=dictionary).read(columns=columns)


def read_file(
    table_uri: str,
    spec: TableSpec,
    written: WrittenFile,
    storage_options: Mapping[str, str] | None = None,
    columns: list[str] | None = None,
) -> pa.Table:
    """A written file's rows with its partition columns put back, in the table's column order (only `columns`,
    in that order, when given: the others are not read). A column added to the table after the file was
    written reads null, as Delta readers read it."""
    fs, root = filesystem(table_uri, storage_options)
    names = list(columns) if columns is not None else spec.schema.names
    data = read_parquet(
        fs, f"{root}/{written.path}", [n for n in names if n not in spec.partition_by] if columns is not None else None
    )
    for name in [n for n in names if n not in data.column_names]:
        value = written.partition_values.get(name) if name in spec.partition_by else None
        data = data.append_column(
            name, pa.array([value] * data.num_rows, pa.string()).cast(spec.schema.field(name).type)
        )
    return data.select(names).cast(pa.schema([spec.schema.field(n) for n in names]))


def rewrite_files(
    table_uri: str,
    spec: TableSpec,
    files: list[WrittenFile],
    keep: Callable[[pa.Table], pa.Array],
    tag: str,
    storage_options: Mapping[str, str] | None = None,
) -> list[WrittenFile]:
    """Files of an uncommitted batch without the rows `keep(rows) -> boolean mask` rejects: each file is read,
    filtered and written anew, then deleted (nothing references it yet). Returns the new files."""
    return transform_files(table_uri, spec, files, lambda rows: rows.filter(keep(rows)), tag, storage_options)


def transform_files(
    table_uri: str,
    spec: TableSpec,
    files: list[WrittenFile],
    change: Callable[[pa.Table], pa.Table],
    tag: str,
    storage_options: Mapping[str, str] | None = None,
) -> list[WrittenFile]:
    """Files of an uncommitted batch with their rows passed through `change(rows) -> rows`: each file is
    read, changed and written anew, then deleted (nothing references it yet). Returns the new files."""
    fs, root = filesystem(table_uri, storage_options)
    out = []
    for written in files:
        changed = change(read_file(table_uri, spec, written, storage_options))
        if changed.num_rows:
            out.extend(write_files(table_uri, spec, changed, tag, storage_options))
        fs.delete_file(f"{root}/{written.path}")
    return out


def unreferenced_files(lake: DeltaLake, spec: TableSpec) -> list[str]:
    """Data files in the table's folder that its current version does not reference (orphans and files
    removed but not vacuumed yet), relative to the table root."""
    fs, root = filesystem(lake.uri(spec.name), lake.storage_options)
    live = {p.rsplit("/", 1)[-1] for p in lake.table(spec.name).file_uris()} if lake.exists(spec.name) else set()
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    return sorted(
        i.path[len(root) + 1 :]
        for i in infos
        if i.is_file and i.base_name.endswith(".parquet") and "/_delta_log/" not in i.path and i.base_name not in live
    )
