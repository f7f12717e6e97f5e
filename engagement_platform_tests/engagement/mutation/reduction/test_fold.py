"""The cascade reduction against the one-at-a-time reference: named cases, then random batches."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engagement_platform.engagement.mutation.outcome_table import ACTION, outcome_table
from engagement_platform.engagement.mutation.reduction.arrow import reduction_table
from engagement_platform.engagement.mutation.reduction.fold import external_targets, reduce_requests
from engagement_platform.engagement.mutation.reduction.model import OwnerFate
from engagement_platform.engagement.mutation.reduction.reference import apply_one_by_one
from engagement_platform.engagement.mutation.reduction.row_outcome import apply_reduction
from engagement_platform.engagement.mutation.requests import DELETE, OWNER_FIELDS, REPLACE
from engagement_platform.engagement.mutation.requests import MutationRequest as R
from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY
from engagement_platform_tests.support.reduction import D1, D2, D3, D4, EIDS, ORG, rename, requests, row, tables


def assert_exact(rows, requests):
    reduction = reduce_requests(requests)
    expected = apply_one_by_one(rows, requests)
    assert apply_reduction(rows, reduction) == expected
    assert_same_rows(apply_outcome_table(rows, reduction), expected)
    return reduction


COMPARED = ("engagement_id", "engagement_date", *OWNER_FIELDS)


def assert_same_rows(actual: dict, expected: dict) -> None:
    """Owner ids and date of every row, and the subject where the reference has one: its update drops
    the columns a record does not name, the stream keeps them."""
    assert actual.keys() == expected.keys()
    for eid, want in expected.items():
        got = actual[eid]
        assert [got.get(c) for c in COMPARED] == [want.get(c) for c in COMPARED], eid
        assert want.get("subject") is None or got["subject"] == want["subject"], eid


def apply_outcome_table(rows, reduction) -> dict:
    """Apply the column-wise MERGE source (outcome_table) to the rows, as the Delta MERGE does."""
    arrow = pa.Table.from_pylist(rows, schema=ENGAGEMENT_ACTIVITY.schema)
    source, _ = outcome_table(arrow, reduction_table(ORG, reduction))
    table = {r["engagement_id"]: r for r in arrow.to_pylist()}
    for r in source.to_pylist():
        if r.pop(ACTION) == DELETE:
            del table[r["engagement_id"]]
        else:
            table[r["engagement_id"]] = r
    return table


def owner_map(reduction):
    return {(a.field, a.id): a.fate for a in reduction.owner_actions}


# ---------------------------------------------------------------- named cases


def test_chain_collapses_to_one_hop_per_id():
    requests = [rename("r1", 1, "L1", "L2"), rename("r2", 2, "L2", "L3"), rename("r3", 3, "L3", "L4")]
    reduction = assert_exact([row("e1", lead_id="L1"), row("e2", lead_id="L2"), row("e3", lead_id="L9")], requests)
    # Every id that the chain passes through goes straight to L4: rows are rewritten once.
    assert {key: fate.new_id for key, fate in owner_map(reduction).items()} == {
        ("lead_id", "L1"): "L4",
        ("lead_id", "L2"): "L4",
        ("lead_id", "L3"): "L4",
    }
    assert [t.id for t in reduction.external_targets] == ["L1"]  # L2, L3 were produced by the batch


def test_chain_of_one_id_is_one_action():
    requests = [
        rename("r1", 1, "L1", "L2"),
        rename("r2", 2, "L2", "L3"),
        rename("r3", 3, "L3", "L1"),
        rename("r4", 4, "L1", "L5"),
    ]
    reduction = assert_exact([row("e1", lead_id="L1")], requests)
    assert owner_map(reduction)[("lead_id", "L1")] == OwnerFate(None, "lead_id", "L5", ())


def test_merges_point_every_source_at_the_survivor():
    requests = [
        R.merge("r1", ORG, 1, "account_id", ["A1", "A2"], "A3"),
        R.merge("r2", ORG, 2, "account_id", ["A3", "A4"], "A5"),
    ]
    reduction = assert_exact([row(f"e{i}", account_id=f"A{i}") for i in range(1, 6)], requests)
    assert {key[1]: fate.new_id for key, fate in owner_map(reduction).items()} == {
        "A1": "A5",
        "A2": "A5",
        "A3": "A5",
        "A4": "A5",
    }


def test_rename_then_revert_is_dropped():
    reduction = assert_exact([row("e1", lead_id="L1")], [rename("r1", 1, "L1", "L2"), rename("r2", 2, "L2", "L1")])
    assert owner_map(reduction) == {("lead_id", "L2"): OwnerFate(None, "lead_id", "L1", ())}  # rows already holding L2
    assert reduce_requests([rename("r1", 1, "L1", "L2"), rename("r2", 2, "L2", "L1")]).stats.owner_actions == 1


def test_delete_after_renames_deletes_original_and_final_ids():
    requests = [rename("r1", 1, "L1", "L2"), rename("r2", 2, "L2", "L3"), R.delete_owner("r3", ORG, 3, "lead_id", "L3")]
    reduction = assert_exact([row("e1", lead_id="L1"), row("e2", lead_id="L3"), row("e3", lead_id="L4")], requests)
    assert {key[1] for key, fate in owner_map(reduction).items() if fate.deleted_at == 2} == {"L1", "L2", "L3"}


def test_rename_of_deleted_id_does_nothing():
    requests = [R.delete_owner("r1", ORG, 1, "lead_id", "L1"), rename("r2", 2, "L1", "L2")]
    reduction = assert_exact([row("e1", lead_id="L1")], requests)
    assert owner_map(reduction) == {("lead_id", "L1"): OwnerFate(0, None, None, ())}


def test_convert_across_fields_erases_the_overwritten_id():
    requests = [
        R.convert("r1", ORG, 1, "lead_id", "L1", "contact_id", "C1"),
        R.delete_owner("r2", ORG, 2, "contact_id", "C9"),  # e1's C9 was overwritten by r1: e1 survives
    ]
    rows = [row("e1", lead_id="L1", contact_id="C9"), row("e2", contact_id="C9")]
    assert apply_one_by_one(rows, requests).keys() == {"e1"}
    reduction = assert_exact(rows, requests)
    assert owner_map(reduction)[("lead_id", "L1")].moves == ((0, "contact_id"),)


def test_update_record_follows_later_renames():
    requests = [
        R.update("r1", ORG, 1, "e1", {"engagement_date": D2, "contact_id": "C1", "subject": "new"}),
        R.convert("r2", ORG, 2, "contact_id", "C1", "contact_id", "C2"),
    ]
    reduction = assert_exact([row("e1", lead_id="L1")], requests)
    [branch] = reduction.engagement_actions
    assert (branch.action, branch.record["contact_id"], branch.record["subject"]) == (REPLACE, "C2", "new")


def test_owner_delete_before_update_wins():
    requests = [
        R.delete_owner("r1", ORG, 1, "lead_id", "L1"),
        R.update("r2", ORG, 2, "e1", {"engagement_date": D1, "lead_id": "L2"}),
    ]
    assert assert_exact([row("e1", lead_id="L1"), row("e2", lead_id="L2")], requests) is not None
    assert apply_one_by_one([row("e1", lead_id="L1")], requests) == {}


def test_update_then_owner_delete_of_the_new_owner():
    requests = [
        R.update("r1", ORG, 1, "e1", {"engagement_date": D1, "lead_id": "L2"}),
        R.delete_owner("r2", ORG, 2, "lead_id", "L2"),
    ]
    reduction = assert_exact([row("e1", lead_id="L1")], requests)
    assert [(b.action, b.record) for b in reduction.engagement_actions] == [(DELETE, None)]


def test_update_of_missing_engagement_does_nothing():
    requests = [R.update("r1", ORG, 1, "e404", {"engagement_date": D1, "lead_id": "L2"})]
    assert_exact([row("e1", lead_id="L1")], requests)
    assert reduce_requests(requests).external_targets[0].kind == "engagement"


def test_date_ranges_split_and_merge_back():
    requests = [
        rename("r1", 1, "L1", "L2", date_from=D2, date_to=D3),
        rename("r2", 2, "L1", "L2", date_to=D1),
        rename("r3", 3, "L1", "L2", date_from=D4),
    ]
    rows = [row(f"e{day.day}", day, lead_id="L1") for day in (D1, D2, D3, D4)] + [row("e0", None, lead_id="L1")]
    reduction = assert_exact(rows, requests)
    # Three ranged renames cover every date: the pieces merge back into one unranged action.
    assert [(a.date_from, a.date_to, a.fate.new_id) for a in reduction.owner_actions] == [(None, None, "L2")]


def test_ranged_pieces_with_a_gap_stay_apart():
    requests = [rename("r1", 1, "L1", "L2", date_to=D1), rename("r2", 2, "L1", "L2", date_from=D3)]
    reduction = assert_exact([row(f"e{day.day}", day, lead_id="L1") for day in (D1, D2, D3)], requests)
    assert [(a.date_from, a.date_to) for a in reduction.owner_actions] == [(None, D1), (D3, None)]


def test_update_moves_the_row_to_another_date():
    requests = [
        rename("r0", 0, "L1", "L3", date_from=D3),  # L1 is already split by date when r1 reuses it
        R.update("r1", ORG, 1, "e1", {"engagement_date": D3, "lead_id": "L1"}),
        rename("r2", 2, "L1", "L2", date_from=D3),
        R.delete_engagement("r3", ORG, 3, "e1", date_to=D1),  # e1 is on D3 by now
    ]
    assert_exact([row("e1", D1, lead_id="L1"), row("e2", D1, lead_id="L1")], requests)


def test_equal_request_times_break_ties_by_request_id():
    requests = [rename("b", 1, "L1", "L3"), rename("a", 1, "L1", "L2")]  # "a" runs first
    reduction = assert_exact([row("e1", lead_id="L1")], requests)
    assert owner_map(reduction)[("lead_id", "L1")].new_id == "L2"


def test_stats_count_requests_and_actions():
    requests = [rename(f"r{i}", i, "L1", "L2") for i in range(10)]  # nine of them find nothing
    stats = reduce_requests(requests).stats
    assert (stats.requests_in, stats.owner_actions, stats.engagement_actions, stats.reduction_ratio) == (10, 1, 0, 10.0)


# ---------------------------------------------------------------- random batches (support/reduction.py)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables(), requests())
def test_reduction_equals_one_by_one(rows, batch):
    assert_exact(rows, batch)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables(), requests(kinds=("convert", "convert", "merge", "delete_owner"), fields=OWNER_FIELDS[:3]))
def test_reduction_equals_one_by_one_across_fields(rows, batch):
    """Converts that overwrite an id, then requests about the overwritten id."""
    assert_exact(rows, batch)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables(), requests(kinds=("update", "update", "delete_engagement", "delete_owner", "convert"), eids=EIDS[:2]))
def test_reduction_equals_one_by_one_per_engagement(rows, batch):
    """Several updates and deletes of the same engagements, mixed with owner deletes and converts."""
    assert_exact(rows, batch)


@st.composite
def chains(draw):
    """Renames of one field that form chains and cycles (1->2->3->1) over a handful of ids."""
    ids = [f"L{i}" for i in range(5)]
    return [
        rename(f"r{i}", i, draw(st.sampled_from(ids)), draw(st.sampled_from(ids)))
        for i in range(draw(st.integers(1, 12)))
    ]


@settings(max_examples=200, deadline=None)
@given(chains())
def test_renames_reduce_to_one_action_per_id(batch):
    rows = [row(f"e{i}", lead_id=f"L{i}") for i in range(5)]
    reduction = reduce_requests(batch)
    assert apply_reduction(rows, reduction) == apply_one_by_one(rows, batch)
    keys = [(a.field, a.id) for a in reduction.owner_actions]
    assert len(keys) == len(set(keys)) <= len({r.owner_id for r in batch} | {r.to_id for r in batch})
    assert all(a.fate.moves == () and a.date_from is None and a.date_to is None for a in reduction.owner_actions)


@settings(max_examples=300, deadline=None)
@given(requests())
def test_external_targets_scan_equals_the_fold(batch):
    assert external_targets(batch) == list(reduce_requests(batch).external_targets)
