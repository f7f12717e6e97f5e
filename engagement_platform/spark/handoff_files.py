"""Arrow IPC files that hand tables between the driver and Spark tasks through storage, in per-run folders
under the lake (`<lake>/_handoff/<stream>/<UTC time>-<token>`): for tables too large to travel inside a Spark
plan or a job's result. A run deletes its folder once read; a crash can leave one behind, so each run first
sweeps folders older than a day (`sweep_handoffs`). Local paths and object-store URIs alike (pyarrow
file systems).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.fs as pafs

from engagement_platform.lake.file_writes import filesystem as lake_filesystem


def write_handoff(uri: str, source: pa.Table, storage_options: Mapping[str, str] | None = None) -> None:
    """`source` as an Arrow IPC file at `uri` (its folder created)."""
    filesystem, path = lake_filesystem(uri, storage_options)
    filesystem.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with filesystem.open_output_stream(path) as sink, pa.ipc.new_file(sink, source.schema) as writer:
        writer.write_table(source)


def read_handoff(uri: str, storage_options: Mapping[str, str] | None = None) -> pa.Table:
    filesystem, path = lake_filesystem(uri, storage_options)
    with filesystem.open_input_file(path) as f:
        return pa.ipc.open_file(f).read_all()


def delete_handoff(uri: str, storage_options: Mapping[str, str] | None = None) -> None:
    filesystem, path = lake_filesystem(uri, storage_options)
    filesystem.delete_dir(path)


def handoff_parent(lake_root: str, stream: str) -> str:
    """Where `stream`'s runs put their handoff folders: `<lake root>/_handoff/<stream>`, a local root made
    absolute (Spark tasks run elsewhere, and pyarrow wants absolute paths)."""
    root = lake_root if "://" in lake_root else os.path.abspath(lake_root)
    return f"{root}/_handoff/{stream}"


HANDOFF_STAMP = "%Y%m%dT%H%M%SZ"  # a handoff folder's name starts with its creation time (UTC)


def new_handoff(parent: str, now: datetime, token: str) -> str:
    """The folder one run hands its tables over in: `parent`/<UTC time>-<token>."""
    return f"{parent}/{now.astimezone(UTC).strftime(HANDOFF_STAMP)}-{token}"


def sweep_handoffs(
    parent: str, now: datetime, older_than: timedelta, storage_options: Mapping[str, str] | None = None
) -> list[str]:
    """Delete the handoff folders under `parent` created more than `older_than` before `now`: what a run
    that crashed between writing and deleting its folder left behind (nothing else reads them). The age
    comes from the folder's name, which object stores keep (they have no directory mtime); a folder
    named otherwise (written before names carried the time) falls back to its mtime where the
    filesystem has one. Returns the folders deleted."""
    filesystem, path = lake_filesystem(parent, storage_options)
    try:
        infos = filesystem.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    except FileNotFoundError:
        return []
    swept = []
    for info in infos:
        if info.type != pafs.FileType.Directory:
            continue
        created: datetime | None
        try:
            created = datetime.strptime(info.base_name.split("-", 1)[0], HANDOFF_STAMP).replace(tzinfo=UTC)
        except ValueError:
            created = info.mtime.astimezone(UTC) if info.mtime is not None else None
        if created is not None and now - created > older_than:
            try:
                filesystem.delete_dir(info.path)
            except FileNotFoundError:  # another run's sweep got there first
                continue
            swept.append(info.path)
    return swept


def sweep_all_handoffs(
    lake_root: str, older_than: timedelta, storage_options: Mapping[str, str] | None = None
) -> list[str]:
    """sweep_handoffs over every stream's folder under `<lake root>/_handoff` (the upkeep's pass: erased
    subjects' requests in a crashed run's handoff leave within the erasure window)."""
    parent = handoff_parent(lake_root, "").rstrip("/")
    filesystem, path = lake_filesystem(parent, storage_options)
    try:
        streams = filesystem.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    except FileNotFoundError:
        return []
    now = datetime.now(UTC)
    swept = []
    for info in streams:
        if info.type == pafs.FileType.Directory:
            swept += sweep_handoffs(f"{parent}/{info.base_name}", now, older_than, storage_options)
    return swept
