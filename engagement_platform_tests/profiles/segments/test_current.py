"""Merge-on-read membership against a replay of evaluations (hypothesis): random histories of evaluation
batches are replayed into a change log (a row only where a pair's membership flips) and the membership after
each batch (plain Python dicts). For a base compacted through any batch T (or none) and the log kept whole or only
after T, current_membership gives the members after the last batch, each with the time and batch of its latest
entry; as_of_batch gives the members after any earlier batch; net_sizes gives the members per segment; and
read_stored, reading base and log from several Parquet files (plain, large and view strings), returns exactly
the wanted identities' and segments' rows of batches after T, with sizes counted over all of them."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from engagement_platform.profiles.segments.current import (
    BASE_COLUMNS,
    CODES,
    ENTERED,
    EXITED,
    LOG_COLUMNS,
    current_membership,
    net_sizes,
)
from engagement_platform.profiles.segments.stored import SIZES_KEY, read_stored, sizes_footer
from engagement_platform.profiles.segments.tables import PROFILE_SEGMENT_CHANGES, PROFILE_SEGMENTS

SEGMENTS = ["churned", "germans", "vip"]
IDENTITIES = ["u1", "u10", "u2", "U3", "ü"]  # in string order U3 < u1 < u10 < u2 < ü: not numeric, not case-blind
START = datetime(2026, 3, 1, tzinfo=UTC)
BASE_SCHEMA = pa.schema([PROFILE_SEGMENTS.schema.field(c) for c in BASE_COLUMNS])
LOG_SCHEMA = pa.schema([PROFILE_SEGMENT_CHANGES.schema.field(c) for c in LOG_COLUMNS])

Pair = tuple[str, str]


def evaluated_at(batch: int) -> datetime:
    return START + timedelta(hours=batch)


@dataclass
class History:
    """A replayed history: `log` every change row; `members_after[b]` each member pair after
    batch b (0: before the first) mapped to the batch of its latest entry."""

    log: list[dict]
    members_after: list[dict[Pair, int]]

    @property
    def last_batch(self) -> int:
        return len(self.members_after) - 1

    def log_after(self, batch: int) -> list[dict]:
        return [r for r in self.log if r["batch_id"] > batch]

    def base_rows(self, through: int) -> list[dict]:
        """The base a compaction through batch `through` writes (-1: no compaction yet, no base)."""
        members = self.members_after[through] if through >= 0 else {}
        return [
            {"segment": s, "identity": i, "entered_at": evaluated_at(b), "batch_id": b}
            for (s, i), b in sorted(members.items())
        ]


def replay(verdicts_per_batch: list[set[Pair]]) -> History:
    """Evaluations as they run: batch b (1, 2, ...) finds the pairs in `verdicts_per_batch[b - 1]` members and
    logs an entry or exit only for the pairs whose membership flips."""
    log: list[dict] = []
    members: dict[Pair, int] = {}
    members_after = [dict(members)]
    for batch, verdicts in enumerate(verdicts_per_batch, start=1):
        for change, pairs in ((ENTERED, verdicts - members.keys()), (EXITED, members.keys() - verdicts)):
            log += [
                {"segment": s, "identity": i, "change": change, "evaluated_at": evaluated_at(batch), "batch_id": batch}
                for s, i in sorted(pairs)
            ]
        members = {pair: members.get(pair, batch) for pair in verdicts}
        members_after.append(dict(members))
    return History(log, members_after)


def with_log_shuffled(history: History) -> st.SearchStrategy[History]:
    """The same history with its log rows in any order: files are listed, and rows read, in no batch order."""
    return st.permutations(history.log).map(lambda log: History(log, history.members_after))


histories = (
    st.lists(st.sets(st.tuples(st.sampled_from(SEGMENTS), st.sampled_from(IDENTITIES))), min_size=1, max_size=8)
    .map(replay)
    .flatmap(with_log_shuffled)
)


def base_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=BASE_SCHEMA)


def log_table(rows: list[dict]) -> pa.Table:
    """The rows in chunks of three, as several log files read one after another give them."""
    chunks = [rows[n : n + 3] for n in range(0, len(rows), 3)] or [[]]
    return pa.concat_tables([pa.Table.from_pylist(chunk, schema=LOG_SCHEMA) for chunk in chunks])


def as_members(table: pa.Table) -> dict[Pair, tuple[datetime, int]]:
    """Members read back, each once, in (identity, segment) order, with their entered_at and batch_id."""
    rows = table.to_pylist()
    pairs = [(r["identity"], r["segment"]) for r in rows]
    assert pairs == sorted(set(pairs)), "members come once each, by identity then segment"
    return {(r["segment"], r["identity"]): (r["entered_at"], r["batch_id"]) for r in rows}


def expected(members: dict[Pair, int]) -> dict[Pair, tuple[datetime, int]]:
    return {pair: (evaluated_at(batch), batch) for pair, batch in members.items()}


def compaction_points(history: History) -> list[int]:
    return [-1, *range(1, history.last_batch + 1)]


@settings(max_examples=300, deadline=None)
@given(history=histories)
def test_the_newest_row_of_base_and_log_is_the_membership_after_the_last_batch(history):
    now = expected(history.members_after[-1])
    for through in compaction_points(history):
        base = base_table(history.base_rows(through))
        assert as_members(current_membership(base, log_table(history.log))) == now
        assert as_members(current_membership(base, log_table(history.log_after(through)))) == now


@settings(max_examples=200, deadline=None)
@given(history=histories)
def test_as_of_batch_is_the_membership_right_after_that_batch(history):
    log = log_table(history.log)
    for batch in range(history.last_batch + 1):
        then = expected(history.members_after[batch])
        assert as_members(current_membership(base_table([]), log, as_of_batch=batch)) == then
        for through in [t for t in compaction_points(history) if t <= batch]:
            base = base_table(history.base_rows(through))
            assert as_members(current_membership(base, log, as_of_batch=batch)) == then


@settings(max_examples=300, deadline=None)
@given(history=histories)
def test_net_sizes_count_the_members_per_segment(history):
    counted = Counter(s for s, _ in history.members_after[-1])
    for through in compaction_points(history):
        base = base_table(history.base_rows(through))
        sizes = net_sizes(base["segment"], log_table(history.log_after(through)))
        assert {s: sizes.get(s, 0) for s in SEGMENTS} == {s: counted[s] for s in SEGMENTS}
        assert set(sizes) <= set(SEGMENTS)


STRING_TYPES = [pa.string(), pa.large_string(), pa.string_view()]


def write_files(
    folder: Path, name: str, rows: list[dict], schema: pa.Schema, files: int, footer: str = "none"
) -> list[str]:
    """`rows` spread round-robin over `files` Parquet files (some may be empty), the i-th with its string
    columns written as STRING_TYPES[i % 3]. `footer`: "true" writes each file's members per segment in its
    footer, as a compaction does; "stale" writes counts that are not the file's (one more of its first
    segment, as a file rewritten without a row but with its footer kept would have)."""
    paths = []
    for n in range(files):
        strings = STRING_TYPES[n % len(STRING_TYPES)]
        typed = pa.schema([f.with_type(strings) if f.type == pa.string() else f for f in schema])
        path = str(folder / f"{name}-{n}.parquet")
        table = pa.Table.from_pylist(rows[n::files], schema=typed)
        if footer != "none":
            said = json.loads(sizes_footer(table["segment"])[SIZES_KEY.decode()])
            if footer == "stale":
                said[rows[n]["segment"] if n < len(rows) else "s0"] = (
                    said.get(rows[n]["segment"] if n < len(rows) else "s0", 0) + 1
                )
            table = table.replace_schema_metadata({SIZES_KEY: json.dumps(said)})
        pq.write_table(table, path)
        paths.append(path)
    return paths


def narrowed(rows: list[dict], identities: set[str] | None, segments: set[str] | None) -> list[dict]:
    return [
        r
        for r in rows
        if (identities is None or r["identity"] in identities) and (segments is None or r["segment"] in segments)
    ]


def row_tuples(rows: list[dict], columns: list[str]) -> list[tuple]:
    return sorted(tuple(r[c] for c in columns) for r in rows)


@settings(max_examples=80, deadline=None)
@given(
    history=histories,
    data=st.data(),
    identities=st.none() | st.sets(st.sampled_from(IDENTITIES)),
    segments=st.none() | st.sets(st.sampled_from(SEGMENTS)),
    file_count=st.integers(1, 4),
    encoded=st.booleans(),
    footer=st.sampled_from(["none", "true", "stale"]),
    pairs_only=st.booleans(),
)
def test_read_stored_narrows_the_rows_read_and_sizes_count_all_of_them(
    tmp_path_factory, history, data, identities, segments, file_count, encoded, footer, pairs_only
):
    through = data.draw(st.sampled_from(compaction_points(history)), label="through")
    old = [r for r in history.log if r["batch_id"] <= through]
    keeps = data.draw(st.lists(st.booleans(), min_size=len(old), max_size=len(old)), label="old log rows kept")
    kept_old = [r for r, keep in zip(old, keeps) if keep]
    base_rows, after = history.base_rows(through), history.log_after(through)
    log_rows = kept_old + after  # the log files of batches up to T may still be listed: the reader skips those rows
    folder = tmp_path_factory.mktemp("stored")
    log_schema = LOG_SCHEMA.append(pa.field("raw_version", pa.int64()))  # a stored column nobody reads
    stored = read_stored(
        write_files(folder, "base", base_rows, BASE_SCHEMA, file_count, footer),
        write_files(folder, "log", [{**r, "raw_version": 7} for r in log_rows], log_schema, file_count),
        None,
        identities=None if identities is None else pa.array(sorted(identities), pa.string()),
        segments=None if segments is None else pa.array(sorted(segments), pa.string()),
        after_batch=through,
        sizes=True,
        encoded=encoded,  # segment and identity as codes, as a compaction reads them
        pairs_only=pairs_only,  # the base without entered_at and batch_id, as an evaluation's diff reads it
    )
    if pairs_only and through >= 0:  # what a merge needs of a base row: that every log row read is newer
        assert stored.base["entered_at"].null_count == stored.base.num_rows
        assert set(stored.base["batch_id"].to_pylist()) <= {through}
        base_rows = [{**r, "entered_at": None, "batch_id": through} for r in base_rows]

    strings = CODES if encoded else pa.string()
    expected_base = [strings if f.name in ("segment", "identity") else f.type for f in BASE_SCHEMA]
    expected_log = [strings if f.name in ("segment", "identity") else f.type for f in LOG_SCHEMA]
    assert stored.base.schema.types == expected_base and stored.log.schema.types == expected_log
    assert row_tuples(stored.base.to_pylist(), BASE_COLUMNS) == row_tuples(
        narrowed(base_rows, identities, segments), BASE_COLUMNS
    )
    assert row_tuples(stored.log.to_pylist(), LOG_COLUMNS) == row_tuples(
        narrowed(after, identities, segments), LOG_COLUMNS
    )
    unnarrowed = net_sizes(base_table(base_rows)["segment"], log_table(after))
    assert stored.sizes == {s: n for s, n in unnarrowed.items() if n}
    assert stored.sizes == Counter(s for s, _ in history.members_after[-1])
    members_now = narrowed(history.base_rows(history.last_batch), identities, segments)
    merged = current_membership(stored.base, stored.log)
    if pairs_only and through >= 0:
        pairs = list(zip(merged["segment"].to_pylist(), merged["identity"].to_pylist()))
        assert sorted(pairs) == sorted((r["segment"], r["identity"]) for r in members_now)
    else:
        assert as_members(merged) == {
            (r["segment"], r["identity"]): (r["entered_at"], r["batch_id"]) for r in members_now
        }
