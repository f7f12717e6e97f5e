"""What a Spark task computes for its orgs (org_outcome.py), without Spark: the rows read from a few files,
the requests held back, the rewritten files and the row-level changes, against the slow reference that
applies the non-held requests one at a time; and the task's grouping of orgs into chunks."""

from __future__ import annotations

import json
from datetime import date

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engagement_platform.engagement.mutation.affected_rows import FilePlan
from engagement_platform.engagement.mutation.on_executors import task_of_org
from engagement_platform.engagement.mutation.org_outcome import (
    CANDIDATE,
    CHANGE_TYPE,
    FILE,
    ROW,
    change_rows,
    orgs_outcome,
    rewritten_file,
)
from engagement_platform.engagement.mutation.reduction.reference import apply_one_by_one
from engagement_platform.engagement.mutation.request_columns import CANONICAL_SCHEMA
from engagement_platform.engagement.mutation.requests import OWNER_FIELDS
from engagement_platform.engagement.mutation.rewrite_task import org_chunks
from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY
from engagement_platform.lake.file_writes import WrittenFile
from engagement_platform_tests.support.reduction import canonical_rows, requests, tables

COMPARED = ("engagement_id", *OWNER_FIELDS, "engagement_date", "subject")
SCHEMA = ENGAGEMENT_ACTIVITY.schema


def with_records(batch) -> list[dict]:
    """canonical_rows with each update's record as the JSON the stream stores."""
    rows = canonical_rows(batch)
    for row, r in zip(rows, batch):
        if r.record is not None:
            row["record"] = json.dumps({k: v.isoformat() if isinstance(v, date) else v for k, v in r.record.items()})
    return rows


def split_into_files(rows: list[dict], files: int) -> list[pa.Table]:
    data = pa.Table.from_pylist(rows, schema=SCHEMA)
    parts = []
    for k in range(files):
        part = data.filter(pa.array(np.arange(data.num_rows) % files == k))
        parts.append(
            part.append_column(FILE, pa.array(np.full(part.num_rows, k, dtype=np.int64))).append_column(
                ROW, pa.array(np.arange(part.num_rows, dtype=np.int64))
            )
        )
    return parts


def projected(rows) -> dict:
    return {r["engagement_id"]: tuple(r.get(c) for c in COMPARED) for r in rows}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables(), requests(), st.integers(1, 3))
def test_outcome_and_rewritten_files_equal_one_at_a_time_application(rows, batch, files):
    batch = list({r.request_id: r for r in batch}.values())  # the stream drops repeated request ids first
    table = pa.Table.from_pylist(with_records(batch), schema=CANONICAL_SCHEMA)
    table = table.append_column(CANDIDATE, pa.array(np.arange(table.num_rows, dtype=np.int64)))
    parts = split_into_files(rows, files)
    read = pa.concat_tables(parts)

    outcome = orgs_outcome(table, read)

    held = set(outcome.held)
    applied = [r for i, r in enumerate(batch) if i not in held]
    assert outcome.applied == len(applied) and set(outcome.missing) == held
    after = []
    for k, part in enumerate(parts):
        changed = outcome.source.filter(pc.equal(outcome.source[FILE], k))
        after += (rewritten_file(part, changed, SCHEMA) if changed.num_rows else part.select(SCHEMA.names)).to_pylist()
    expected = apply_one_by_one(rows, applied)
    assert projected(after) == projected(expected.values())

    changes = change_rows(read, outcome.source, SCHEMA)
    kinds = changes[CHANGE_TYPE].to_pylist()
    assert kinds.count("update_preimage") == kinds.count("update_postimage")
    assert kinds.count("delete") == len(rows) - len(expected)
    gone = {r["engagement_id"] for r in changes.filter(pc.equal(changes[CHANGE_TYPE], "delete")).to_pylist()}
    assert gone == {r["engagement_id"] for r in rows} - set(expected)
    post = changes.filter(pc.equal(changes[CHANGE_TYPE], "update_postimage")).to_pylist()
    assert projected(post) == {e: v for e, v in projected(expected.values()).items() if e in projected(post)}
    pre = changes.filter(pc.equal(changes[CHANGE_TYPE], "update_preimage")).to_pylist()
    assert projected(pre) == {e: v for e, v in projected(rows).items() if e in projected(pre)}
    assert {r["engagement_id"] for r in pre} == {r["engagement_id"] for r in post}


def test_org_chunks_keep_orgs_whole_and_bound_the_files_per_chunk():
    files = {
        org: [WrittenFile(f"{org}/{i}", 1, {"org_id": org}, "", 0) for i in range(n)]
        for org, n in (("a", 3), ("b", 1), ("c", 5), ("d", 0), ("e", 2))
    }
    chunks = org_chunks(["a", "b", "c", "d", "e"], files, limit=4)
    assert [org for chunk in chunks for org in chunk] == ["a", "b", "c", "d", "e"]
    assert chunks == [["a", "b"], ["c"], ["d", "e"]]  # an org larger than the limit gets a chunk of its own
    assert org_chunks([], files) == []


def test_orgs_are_spread_over_tasks_by_planned_bytes_and_requests_heaviest_first():
    requests = pa.table({"org_id": ["a"] * 6 + ["b"] * 2 + ["c"] * 2 + ["d"] * 2})
    files = FilePlan({org: [WrittenFile(f"{org}/f", 100, {"org_id": org}, "", 0)] for org in "abcd"}, 4)
    placed = task_of_org(requests, files, 2)
    tasks = {}
    for org, index in placed.items():
        tasks.setdefault(index, set()).add(org)
    assert sorted(map(sorted, tasks.values())) == [["a", "d"], ["b", "c"]]  # a (0.75) + d (0.42) vs b + c (0.42 each)
    assert set(task_of_org(requests, files, 8).values()) == {0, 1, 2, 3}, (
        "one org per task when there are more tasks than orgs"
    )
