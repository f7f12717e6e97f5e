"""Landed files under a local folder or an object-store prefix (s3://, az://, abfss://), through pyarrow's file
systems with the lake's storage options (settings.STORAGE_ENV): listed with a glob, sized, written (the
demo), deleted (landing retention). A file is complete when it appears: writers upload under a dot-name and
rename it in (on an object store, a copy then a delete), and names starting with a dot are never listed."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow.fs as pafs

from engagement_platform.lake.file_writes import filesystem, join


@dataclass(frozen=True)
class LandedFile:
    path: str  # what a plan records: the landing root joined with the file's relative path
    size: int
    modified: float  # seconds since the epoch


def glob_regex(pattern: str) -> re.Pattern:
    """A glob over '/'-separated relative paths as pathlib reads it: `*` and `?` stay inside one folder
    level, `**` spans any number of levels (none included), `[...]` is a character class."""
    parts = pattern.strip("/").split("/")
    regex = ""
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "**":
            regex += ".*" if last else "(?:[^/]+/)*"
        else:
            regex += _segment(part) + ("" if last else "/")
    return re.compile(regex)


def _segment(part: str) -> str:
    out, j = "", 0
    while j < len(part):
        c = part[j]
        if c == "*":
            out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        elif c == "[" and "]" in part[j + 2 :]:
            end = part.index("]", j + 2)
            body = part[j + 1 : end]
            out += "[" + ("^" + body[1:] if body.startswith("!") else body).replace("\\", "\\\\") + "]"
            j = end
        else:
            out += re.escape(c)
        j += 1
    return out


def landed_files(root: str, pattern: str, storage_options: Mapping[str, str] | None = None) -> list[LandedFile]:
    """Complete files under `root` whose path relative to it matches `pattern`, sorted by path."""
    fs, base = filesystem(root, storage_options)
    regex = glob_regex(pattern)
    found = []
    for info in fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True)):
        relative = info.path[len(base) :].lstrip("/")
        if info.is_file and not any(part.startswith(".") for part in relative.split("/")) and regex.fullmatch(relative):
            found.append(LandedFile(join(root, relative), info.size, info.mtime.timestamp() if info.mtime else 0.0))
    return sorted(found, key=lambda f: f.path)


def next_batch_files(waiting: list[LandedFile], max_files: int, max_bytes: int) -> list[LandedFile]:
    """The files of the next batch: the first waiting files (in path order) up to `max_files` and `max_bytes`;
    the first file always, however big, so no file waits forever."""
    chosen, total = [], 0
    for landed in waiting[:max_files]:
        if chosen and total + landed.size > max_bytes:
            break
        chosen.append(landed)
        total += landed.size
    return chosen


def file_size(path: str, storage_options: Mapping[str, str] | None = None) -> int | None:
    """The file's size now (None: it is gone)."""
    fs, where = filesystem(path, storage_options)
    info = fs.get_file_info(where)
    return info.size if info.is_file else None


def delete_landed(path: str, storage_options: Mapping[str, str] | None = None) -> None:
    fs, where = filesystem(path, storage_options)
    if fs.get_file_info(where).is_file:
        fs.delete_file(where)


def land(folder: str, name: str, data: bytes, storage_options: Mapping[str, str] | None = None) -> str:
    """Write `data` as folder/name the way a landing file must appear: under a dot-name first, then moved in."""
    fs, base = filesystem(folder, storage_options)
    fs.create_dir(base, recursive=True)
    with fs.open_output_stream(f"{base}/.{name}.partial") as out:
        out.write(data)
    try:
        fs.move(f"{base}/.{name}.partial", f"{base}/{name}")
    except NotImplementedError:  # Blob storage without a hierarchical namespace: a server-side copy, then a delete
        fs.copy_file(f"{base}/.{name}.partial", f"{base}/{name}")
        fs.delete_file(f"{base}/.{name}.partial")
    return join(folder, name)
