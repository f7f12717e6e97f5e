"""The duplicate check against the table reads only the files that may hold a key of the batch (key_files, from
the Delta log's partition values and engagement_id statistics), and finds exactly what a scan of the whole table
finds (the slow, obviously correct reference)."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from engagement_platform.engagement.ingestion.apply import existing_keys, key_files
from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY
from engagement_platform.ingest.errors import ERROR_FIELDS, ERRORS
from engagement_platform.lake.delta import BatchTxn
from engagement_platform.lake.file_writes import commit_files, write_files, writer_tag


def actions(*files) -> pa.Table:
    path, org, low, high = zip(*files)
    return pa.table(
        {
            "path": list(path),
            "partition.org_id": list(org),
            "min.engagement_id": list(low),
            "max.engagement_id": list(high),
        }
    )


def keys(*pairs) -> pa.Table:
    org, eid = zip(*pairs)
    return pa.table({"org_id": list(org), "engagement_id": list(eid)})


def planned(log: pa.Table, wanted: pa.Table) -> list[tuple[str, str]]:
    return [(f.path, f.partition_values["org_id"]) for f in key_files(log, wanted)]


def test_only_files_whose_statistics_meet_the_orgs_keys_are_read():
    log = actions(
        ("a1", "A", "e100", "e199"),
        ("a2", "A", "e200", "e299"),
        ("a3", "A", None, None),
        ("b1", "B", "e100", "e199"),
        ("c1", "C", "e000", "e999"),
    )
    assert planned(log, keys(("A", "e250"), ("A", "e260"))) == [("a2", "A"), ("a3", "A")]
    assert planned(log, keys(("A", "e150"), ("B", "e300"))) == [("a1", "A"), ("a3", "A")]
    assert planned(log, keys(("A", "e300"), ("B", "e050"))) == [
        ("a3", "A")
    ]  # new ids: only the file without statistics
    assert (
        planned(
            log.slice(0, 0),
            keys(
                ("A", "e1"),
            ),
        )
        == []
    )


def activity_rows(ids: list[tuple[str, str]], batch_id: int) -> pa.Table:
    n = len(ids)
    columns = {field.name: pa.nulls(n, field.type) for field in ENGAGEMENT_ACTIVITY.schema}
    columns.update(
        org_id=pa.array([o for o, _ in ids]),
        engagement_id=pa.array([e for _, e in ids]),
        activity_type=pa.array(["call"] * n),
        batch_id=pa.array([batch_id] * n, pa.int64()),
    )
    return pa.table(columns, schema=ENGAGEMENT_ACTIVITY.schema)


def checked(pairs: list[tuple[str, str]]) -> pa.Table:
    no_errors = pa.ListArray.from_arrays(
        pa.array(np.zeros(len(pairs) + 1, np.int32)),
        pa.array([], pa.struct([(name, pa.string()) for name in ERROR_FIELDS])),
    )
    return keys(*pairs).append_column(ERRORS, no_errors)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_existing_keys_equal_a_scan_of_the_whole_table(lake, seed):
    rng = random.Random(seed)
    lake.ensure(ENGAGEMENT_ACTIVITY)
    written = []
    for batch_id in (1, 2, 3):
        ids = [(f"org{rng.randrange(5)}", f"e{batch_id}-{rng.randrange(10**6):07d}") for _ in range(300)]
        files = write_files(
            lake.uri(ENGAGEMENT_ACTIVITY.name),
            ENGAGEMENT_ACTIVITY,
            activity_rows(ids, batch_id),
            writer_tag("t", batch_id),
        )
        commit_files(lake, ENGAGEMENT_ACTIVITY, files, BatchTxn("t", batch_id))
        written += [(o, e, batch_id) for o, e in ids]
    version = lake.table(ENGAGEMENT_ACTIVITY.name).version()
    # a batch (id 3: its own rows do not count) re-sending some ids, some under another org, and new ones
    resent = [(o, e) for o, e, _ in rng.sample(written, 40)]
    moved = [(f"org{(int(o[3:]) + 1) % 5}", e) for o, e in resent[:10]]
    fresh = [(f"org{rng.randrange(5)}", f"e9-{i:07d}") for i in range(50)]
    found = existing_keys(lake, version, checked(resent + moved + fresh), 3)
    wanted = set(resent + moved + fresh)
    reference = sorted(r for r in written if r[:2] in wanted and r[2] != 3)
    assert sorted(zip(*(found[c].to_pylist() for c in ("org_id", "engagement_id", "batch_id")))) == reference
    assert reference, "the sample re-sends rows of earlier batches"
