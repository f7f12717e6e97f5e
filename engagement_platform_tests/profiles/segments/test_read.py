"""Reading segment membership from a Delta lake (no Spark): a base compacted through batch T (its txn in
`profile_segments`) and a change log appended one commit per tenant and batch. segment_members equals a plain
replay of the log, now and right after any batch (before T from the log alone, from T on from the base and
the log files after T); membership_changes returns the log rows after a checkpoint; latest_batch the newest
batch logged. The README's DuckDB query, run by DuckDB's own Delta reader over both tables, gives the same
members, and so do the CLI's `segment-members` and `segment-changes`."""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engagement_platform import cli
from engagement_platform.lake.delta import BatchTxn, DeltaLake
from engagement_platform.profiles.segments.apply import segments_app_id
from engagement_platform.profiles.segments.membership_files import compaction_app_id
from engagement_platform.profiles.segments.read import latest_batch, membership_changes, segment_members
from engagement_platform.profiles.segments.tables import PROFILE_SEGMENT_CHANGES, PROFILE_SEGMENTS
from engagement_platform_tests.support.duckdb_reader import extension_path

README = Path(__file__).resolve().parents[3] / "README.md"
START = datetime(2026, 3, 1, tzinfo=UTC)

Pair = tuple[str, str]


def evaluated_at(batch: int) -> datetime:
    return START + timedelta(hours=batch)


def change(tenant: str, batch: int, kind: str, segment: str, identity: str) -> dict:
    return {
        "tenant": tenant,
        "segment": segment,
        "identity": identity,
        "change": kind,
        "evaluated_at": evaluated_at(batch),
        "raw_version": batch + 10,
        "batch_id": batch,
    }


# Two tenants' logs as evaluations write them: a row only where a pair's membership flips. acme re-enters
# ("x", "a") after leaving, and its base is compacted through batch 2; globex shares identity and segment
# names with acme and was never compacted.
ACME_LOG = [
    change("acme", 0, "entered", "x", "a"),
    change("acme", 0, "entered", "x", "b"),
    change("acme", 0, "entered", "y", "a"),
    change("acme", 1, "entered", "x", "c"),
    change("acme", 1, "entered", "y", "b"),
    change("acme", 1, "exited", "x", "a"),
    change("acme", 2, "entered", "x", "a"),
    change("acme", 2, "exited", "y", "a"),
    change("acme", 2, "entered", "x", "d"),
    change("acme", 3, "exited", "x", "b"),
    change("acme", 3, "entered", "y", "c"),
    change("acme", 4, "exited", "x", "a"),
    change("acme", 4, "entered", "y", "a"),
    change("acme", 5, "entered", "x", "b"),
]
GLOBEX_LOG = [
    change("globex", 0, "entered", "x", "a"),
    change("globex", 0, "entered", "z", "q"),
    change("globex", 1, "exited", "x", "a"),
    change("globex", 1, "entered", "x", "r"),
]
ACME_THROUGH = 2


def replay(log: list[dict], as_of_batch: int | None = None) -> list[tuple]:
    """The members (segment, identity, entered_at, batch_id) after the log's batches up to `as_of_batch`:
    an entry adds a pair with its time and batch, an exit removes it."""
    members: dict[Pair, tuple[datetime, int]] = {}
    for row in sorted(log, key=lambda r: r["batch_id"]):
        if as_of_batch is not None and row["batch_id"] > as_of_batch:
            break
        pair = (row["segment"], row["identity"])
        if row["change"] == "entered":
            members[pair] = (row["evaluated_at"], row["batch_id"])
        else:
            members.pop(pair, None)
    return [(s, i, at, b) for (s, i), (at, b) in sorted(members.items())]


def base_rows(tenant: str, log: list[dict], through: int) -> list[dict]:
    """What a compaction through batch `through` writes: the members after it."""
    return [
        {"tenant": tenant, "segment": s, "identity": i, "entered_at": at, "batch_id": b}
        for s, i, at, b in replay(log, through)
    ]


def write_lake(root: str, logs: dict[str, list[dict]], through: dict[str, int]) -> DeltaLake:
    """Each tenant's log appended one commit per batch (with the evaluation's txn), then its base written
    with the compaction's txn when `through` names it."""
    lake = DeltaLake(root)
    lake.ensure(PROFILE_SEGMENT_CHANGES)  # as the first evaluation does, changes or not
    for tenant, log in logs.items():
        for batch in sorted({r["batch_id"] for r in log}):
            rows = [r for r in log if r["batch_id"] == batch]
            lake.append(PROFILE_SEGMENT_CHANGES, pa.Table.from_pylist(rows), BatchTxn(segments_app_id(tenant), batch))
    lake.ensure(PROFILE_SEGMENTS)
    for tenant, point in through.items():
        rows = base_rows(tenant, logs[tenant], point)
        table = pa.Table.from_pylist(rows, schema=PROFILE_SEGMENTS.schema)
        lake.append(PROFILE_SEGMENTS, table, BatchTxn(compaction_app_id(tenant), point))
    return lake


def in_order(log: list[dict], since_batch: int) -> list[dict]:
    """The log rows after `since_batch`, by batch, segment and identity (a pair changes once per batch)."""
    later = [r for r in log if r["batch_id"] > since_batch]
    return sorted(later, key=lambda r: (r["batch_id"], r["segment"], r["identity"]))


def as_tuples(table: pa.Table) -> list[tuple]:
    return [(r["segment"], r["identity"], r["entered_at"], r["batch_id"]) for r in table.to_pylist()]


def readme_query() -> str:
    """The DuckDB query the README shows under "Reading segment membership"."""
    section = README.read_text().split("## Reading segment membership", 1)[1]
    found = re.search(r"```sql\n(.*?)```", section, re.DOTALL)
    assert found, "README: no ```sql block under 'Reading segment membership'"
    return found.group(1)


@pytest.fixture(scope="module")
def duck() -> Iterator[duckdb.DuckDBPyConnection]:
    """One DuckDB connection with the delta extension loaded (loading takes most of a query's time)."""
    with duckdb.connect() as con:
        con.execute(f"LOAD '{extension_path()}'")
        yield con


def duckdb_members(con: duckdb.DuckDBPyConnection, lake: DeltaLake, tenant: str) -> list[Pair]:
    """The README's query, run by DuckDB's Delta reader (delta-kernel-rs), with the lake and tenant bound."""
    query = (
        readme_query()
        .replace("'<lake>/profile_segments'", "$base")
        .replace("'<lake>/profile_segment_changes'", "$log")
        .replace("'tenant01'", "$tenant")
    )
    assert "<lake>" not in query and "$tenant" in query, "the README's query names other tables or tenants"
    params = {"base": lake.uri(PROFILE_SEGMENTS.name), "log": lake.uri(PROFILE_SEGMENT_CHANGES.name), "tenant": tenant}
    return sorted(con.execute(query, params).fetchall())


def test_members_changes_and_checkpoint_of_a_compacted_base_and_its_log(tmp_path, duck):
    lake = write_lake(str(tmp_path), {"acme": ACME_LOG, "globex": GLOBEX_LOG}, {"acme": ACME_THROUGH})

    for tenant, log in (("acme", ACME_LOG), ("globex", GLOBEX_LOG)):
        assert as_tuples(segment_members(lake, tenant)) == replay(log)
        assert as_tuples(segment_members(lake, tenant, segments="x")) == [m for m in replay(log) if m[0] == "x"]
        assert as_tuples(segment_members(lake, tenant, segments=["x", "z"])) == [
            m for m in replay(log) if m[0] in ("x", "z")
        ]
        last = max(r["batch_id"] for r in log)
        for batch in range(-1, last + 2):  # before the compaction point, at it, after it, past the last batch
            assert as_tuples(segment_members(lake, tenant, as_of_batch=batch)) == replay(log, batch), (tenant, batch)
        for since in range(-1, last + 1):
            changes = membership_changes(lake, tenant, since_batch=since)
            assert changes.to_pylist() == [{c: r[c] for c in changes.column_names} for r in in_order(log, since)]
        assert latest_batch(lake, tenant) == last
    assert as_tuples(segment_members(lake, "acme", identities=["a"])) == [m for m in replay(ACME_LOG) if m[1] == "a"]
    assert segment_members(lake, "acme", segments=[]).num_rows == 0  # no segment asked: no member
    assert membership_changes(lake, "acme", 3, segments="y").to_pylist() == [
        {c: r[c] for c in ("segment", "identity", "change", "evaluated_at", "batch_id")}
        for r in in_order(ACME_LOG, 3)
        if r["segment"] == "y"
    ]
    assert latest_batch(lake, "initech") == -1 and segment_members(lake, "initech").num_rows == 0

    for tenant, log in (("acme", ACME_LOG), ("globex", GLOBEX_LOG)):
        assert duckdb_members(duck, lake, tenant) == [(s, i) for s, i, _, _ in replay(log)]


def test_the_base_speaks_for_the_batches_it_folds_in(tmp_path, duck):
    """The log files up to the compaction point are not read. A base that, unlike a real one, leaves out a
    pair the log up to its point holds shows it: the readers then miss the pair, while the DuckDB query,
    which reads the whole log, still finds it (both are right only for a base that is exactly the log
    replayed through its point, which is what a compaction writes)."""
    log = [r for r in ACME_LOG if r["batch_id"] <= 1]
    lake = write_lake(str(tmp_path), {"acme": log}, {})
    assert ("y", "b") in [(s, i) for s, i, _, _ in as_tuples(segment_members(lake, "acme"))]

    wrong = [r for r in base_rows("acme", log, 1) if (r["segment"], r["identity"]) != ("y", "b")]
    base = pa.Table.from_pylist(wrong, schema=PROFILE_SEGMENTS.schema)
    lake.append(PROFILE_SEGMENTS, base, BatchTxn(compaction_app_id("acme"), 1))

    assert as_tuples(segment_members(lake, "acme")) == [m for m in replay(log) if m[:2] != ("y", "b")]
    assert ("y", "b") in duckdb_members(duck, lake, "acme")
    assert as_tuples(segment_members(lake, "acme", as_of_batch=0)) == replay(log, 0)  # from the log alone


SEGMENTS = ["x", "y"]
IDENTITIES = ["a", "b", "c"]


def random_log(tenant: str, verdicts_per_batch: list[set[Pair]]) -> list[dict]:
    """Evaluations as they run: batch b finds the pairs in `verdicts_per_batch[b]` members and logs only the
    pairs whose membership flips."""
    log, members = [], set()
    for batch, verdicts in enumerate(verdicts_per_batch):
        log += [change(tenant, batch, "entered", s, i) for s, i in sorted(verdicts - members)]
        log += [change(tenant, batch, "exited", s, i) for s, i in sorted(members - verdicts)]
        members = set(verdicts)
    return log


verdicts = st.lists(st.sets(st.tuples(st.sampled_from(SEGMENTS), st.sampled_from(IDENTITIES))), min_size=1, max_size=5)


@settings(max_examples=30, deadline=None)
@given(acme=verdicts, globex=verdicts, data=st.data())
def test_reads_and_the_duckdb_query_equal_a_replay_for_any_history_and_compaction_point(duck, acme, globex, data):
    logs = {"acme": random_log("acme", acme), "globex": random_log("globex", globex)}
    through = {
        tenant: point
        for tenant, batches in (("acme", acme), ("globex", globex))
        if (point := data.draw(st.integers(-1, len(batches) - 1), label=f"{tenant} compacted through")) >= 0
    }
    with tempfile.TemporaryDirectory() as root:
        lake = write_lake(root, logs, through)
        for tenant, log in logs.items():
            assert as_tuples(segment_members(lake, tenant)) == replay(log)
            for batch in range(-1, len(acme if tenant == "acme" else globex)):
                assert as_tuples(segment_members(lake, tenant, as_of_batch=batch)) == replay(log, batch)
                changes = membership_changes(lake, tenant, batch)
                assert changes.to_pylist() == [{c: r[c] for c in changes.column_names} for r in in_order(log, batch)]
            assert duckdb_members(duck, lake, tenant) == [(s, i) for s, i, _, _ in replay(log)]
            assert latest_batch(lake, tenant) == max([-1, *(r["batch_id"] for r in log)])


def test_the_cli_prints_members_and_changes_with_the_next_checkpoint(tmp_path, monkeypatch, capsys):
    lake = write_lake(str(tmp_path), {"acme": ACME_LOG, "globex": GLOBEX_LOG}, {"acme": ACME_THROUGH})
    monkeypatch.setenv("EP_LAKE_ROOT", lake.root)

    cli.main(["segment-members", "--tenant", "acme", "--segment", "x", "--json"])
    document = json.loads(capsys.readouterr().out)
    assert [(m["segment"], m["identity"]) for m in document["members"]] == [
        (s, i) for s, i, _, _ in replay(ACME_LOG) if s == "x"
    ]
    cli.main(["segment-members", "--tenant", "acme", "--as-of-batch", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert [tuple(line.split()[:2]) for line in lines[1:]] == [(s, i) for s, i, _, _ in replay(ACME_LOG, 1)]

    cli.main(["segment-changes", "--tenant", "acme", "--since-batch", "3", "--json"])
    document = json.loads(capsys.readouterr().out)
    assert [(c["batch_id"], c["segment"], c["identity"], c["change"]) for c in document["changes"]] == sorted(
        (r["batch_id"], r["segment"], r["identity"], r["change"]) for r in ACME_LOG if r["batch_id"] > 3
    )
    assert document["checkpoint"] == 5
    assert cli.compaction_tenants(lake) == ["acme", "globex"]  # no raw tables here: the log's partitions
    cli.main(["segment-changes", "--tenant", "globex", "--since-batch", "1"])
    assert capsys.readouterr().out.splitlines()[-1] == "checkpoint 1"
