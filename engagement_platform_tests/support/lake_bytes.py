"""Byte-level scans of a lake folder: what the erasure-window tests use to show an id is nowhere on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from engagement_platform.engagement.retention.requests import mentions


def parquet_cells(path: Path) -> list:
    """Every cell of a Parquet file (data, change data, checkpoint), nested values flattened to text."""
    return [json.dumps(v, default=str) for row in pq.read_table(path).to_pylist() for v in row.values()]


def files_holding(root: Path, ids: tuple[str, ...]) -> list[str]:
    """Files under `root` whose bytes hold an id, or whose Parquet cells do once decoded (compression can hide bytes)."""
    found = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        hit = any(i.encode() in data for i in ids)
        if not hit and path.suffix == ".parquet":
            hit = any(mentions(cell, i) for cell in parquet_cells(path) for i in ids)
        if hit:
            found.append(str(path.relative_to(root)))
    return found
