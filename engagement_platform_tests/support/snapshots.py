"""Snapshot exports for the profile backfill: rows as the hot store exports them, written as JSON lines
or Parquet, and the time boundary the tests load them up to."""

from __future__ import annotations

import json
from datetime import datetime

import pyarrow as pa
import pyarrow.parquet as pq

UNTIL = "2026-01-05T12:00:00Z"


def snap(pid, seq, fields=None, related=None, ts="2026-01-05T09:00:00Z", **extra) -> dict:
    row = {"primary_id": pid, "record_type": "person", "cdc_seq": seq, "cdc_ts": ts, **extra}
    if fields is not None:
        row["fields"] = fields
    if related is not None:
        row["related_ids"] = related
    return row


def write_jsonl(path, rows) -> None:
    path.write_bytes(b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in rows))


def write_parquet(path, rows) -> None:
    """The hot store's Parquet layout: fields as JSON text, related ids as a list, a real timestamp."""
    table = pa.table(
        {
            "primary_id": [r["primary_id"] for r in rows],
            "record_type": [r["record_type"] for r in rows],
            "related_ids": pa.array([r.get("related_ids") for r in rows], pa.list_(pa.string())),
            "cdc_seq": pa.array([r["cdc_seq"] for r in rows], pa.int64()),
            "cdc_ts": pa.array(
                [datetime.fromisoformat(r["cdc_ts"].replace("Z", "+00:00")) for r in rows], pa.timestamp("us", tz="UTC")
            ),
            "fields": [json.dumps(r["fields"]) if "fields" in r else None for r in rows],
        }
    )
    pq.write_table(table, path)
