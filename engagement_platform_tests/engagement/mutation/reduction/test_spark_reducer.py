"""The Spark reduction (grouped by org, on the Connect server's Python workers) against the pure one."""

from __future__ import annotations

import random
from datetime import date, datetime, timedelta, timezone

import pyarrow as pa
import pytest

from engagement_platform.engagement.mutation.reduction.fold import reduce_requests
from engagement_platform.engagement.mutation.reduction.reference import apply_one_by_one
from engagement_platform.engagement.mutation.reduction.spark_reducer import REQUEST_SCHEMA, reduce_on_spark, reduce_on_spark_frames
from engagement_platform.engagement.mutation.requests import OWNER_FIELDS, MutationRequest as R
from engagement_platform.engagement.mutation.reduction.arrow import (
    ENGAGEMENT_ACTION_COLUMNS, OWNER_ACTION_COLUMNS, record_to_json, reduction_from_rows, reduction_table,
)
from engagement_platform.engagement.mutation.reduction.row_outcome import apply_reduction

ORGS = ("00D000001", "00D000002", "00D000003")
DAYS = [date(2026, 1, day) for day in range(1, 5)]
EPOCH = datetime(2026, 2, 1, tzinfo=timezone.utc)


def random_batch(org: str, seed: int, count: int = 60) -> list[R]:
    rng = random.Random(seed)

    def some(field):
        return f"{field[0].upper()}{rng.randrange(4)}"

    def dates():
        if rng.random() < 0.7:
            return {}
        return {"date_from": rng.choice([None, *DAYS]), "date_to": rng.choice([None, *DAYS])}

    out = []
    for i in range(count):
        rid, time, kind, field = f"{org}-r{i:03d}", EPOCH + timedelta(seconds=rng.randrange(20)), rng.randrange(5), rng.choice(OWNER_FIELDS)
        if kind == 0:
            to_field = rng.choice(OWNER_FIELDS)
            out.append(R.convert(rid, org, time, field, some(field), to_field, some(to_field), **dates()))
        elif kind == 1:
            out.append(R.merge(rid, org, time, field, [some(field), some(field)], some(field), **dates()))
        elif kind == 2:
            out.append(R.delete_owner(rid, org, time, field, some(field), **dates()))
        elif kind == 3:
            out.append(R.delete_engagement(rid, org, time, f"e{rng.randrange(8)}", **dates()))
        else:
            record = {"engagement_date": rng.choice(DAYS), "subject": f"u{i}", **{name: some(name) for name in OWNER_FIELDS if rng.random() < 0.5}}
            out.append(R.update(rid, org, time, f"e{rng.randrange(8)}", record, **dates()))
    return out


def random_table(org: str, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [
        {"org_id": org, "engagement_id": f"e{i}", "engagement_date": rng.choice(DAYS), "subject": f"s{i}",
         **{name: f"{name[0].upper()}{rng.randrange(4)}" if rng.random() < 0.6 else None for name in OWNER_FIELDS}}
        for i in range(8)
    ]


def request_tuple(r: R) -> tuple:
    record = None if r.record is None else record_to_json(r.record)
    return (r.request_id, r.org_id, r.request_time, r.op, r.field, r.owner_id, list(r.from_ids) or None, r.to_field, r.to_id,
            r.engagement_id, record, r.date_from, r.date_to)


@pytest.fixture(scope="module")
def batches():
    return {org: random_batch(org, seed) for seed, org in enumerate(ORGS)}


@pytest.fixture(scope="module")
def reduced(spark, batches):
    rows = [request_tuple(r) for batch in batches.values() for r in batch]
    return reduce_on_spark_frames(spark.createDataFrame(rows, schema=REQUEST_SCHEMA))


def pure_rows(batches, kind, columns):
    rows = [row for org, batch in batches.items() for row in reduction_table(org, reduce_requests(batch)).to_pylist()]
    return sorted((tuple(row[c] for c in columns) for row in rows if row["kind"] == kind), key=repr)


def spark_rows(df, columns):
    return sorted((tuple(row[c] for c in columns) for row in df.collect()), key=repr)  # repr: None among dates


def test_spark_actions_equal_the_pure_reduction(reduced, batches):
    assert spark_rows(reduced.owner_actions, OWNER_ACTION_COLUMNS) == pure_rows(batches, "owner", OWNER_ACTION_COLUMNS)
    assert spark_rows(reduced.engagement_actions, ENGAGEMENT_ACTION_COLUMNS) == pure_rows(batches, "engagement", ENGAGEMENT_ACTION_COLUMNS)


def test_spark_stats_add_up_over_orgs(reduced, batches):
    pure = [reduce_requests(batch) for batch in batches.values()]
    stats = reduced.stats
    assert (stats.orgs, stats.requests_in) == (len(ORGS), sum(len(b) for b in batches.values()))
    assert stats.owner_actions == sum(r.stats.owner_actions for r in pure)
    assert stats.engagement_actions == sum(r.stats.engagement_actions for r in pure)
    assert stats.external_targets == reduced.external_targets.count() == sum(len(r.external_targets) for r in pure)


def test_spark_action_rows_apply_like_one_by_one(reduced, batches):
    """The flat rows carry everything: rebuilt per org, they give the one-at-a-time result."""
    owner_rows = [row.asDict() for row in reduced.owner_actions.collect()]
    engagement_rows = [row.asDict() for row in reduced.engagement_actions.collect()]
    for seed, (org, batch) in enumerate(batches.items()):
        reduction = reduction_from_rows(
            [r for r in owner_rows if r["org_id"] == org], [r for r in engagement_rows if r["org_id"] == org]
        )
        table = random_table(org, seed)
        assert apply_reduction(table, reduction) == apply_one_by_one(table, batch)


def test_reduce_on_spark_returns_the_three_parts(spark, batches):
    rows = [request_tuple(r) for r in batches[ORGS[0]]]
    owner_actions, engagement_actions, stats = reduce_on_spark(spark.createDataFrame(rows, schema=REQUEST_SCHEMA))
    assert owner_actions.columns == list(OWNER_ACTION_COLUMNS)
    assert engagement_actions.columns == list(ENGAGEMENT_ACTION_COLUMNS)
    assert stats.requests_in == len(batches[ORGS[0]]) and stats.orgs == 1


def test_reduce_to_arrow_is_the_drivers_table_row_for_row(spark, batches):
    """What the stream uses with EP_MUTATION_REDUCER=spark: the driver fold's union table, same order."""
    from engagement_platform.engagement.mutation.reduction.spark_reducer import reduce_to_arrow

    driver = pa.concat_tables([reduction_table(org, reduce_requests(batches[org]), with_external_targets=False) for org in sorted(batches)])
    on_spark = reduce_to_arrow(spark, [r for org in reversed(ORGS) for r in batches[org]], partitions=3)
    assert on_spark.equals(driver)
    assert reduce_to_arrow(spark, []).num_rows == 0
