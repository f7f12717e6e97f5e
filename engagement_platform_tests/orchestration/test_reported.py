"""A sensor reports an observation or a check evaluation only when its figures differ from the ones it reported
last, as its cursor records them; a cursor without the record (or none) reports once; other fields are kept."""

from __future__ import annotations

import json

from dagster import AssetCheckEvaluation, AssetCheckSeverity, AssetKey, AssetObservation
from hypothesis import given, settings
from hypothesis import strategies as st

from engagement_platform.orchestration.reported import REPORTED, cursor_fields, unreported

TOPIC = AssetKey(["kafka", "clicks"])


def observation(**figures: int) -> AssetObservation:
    return AssetObservation(asset_key=TOPIC, metadata=figures)


def evaluation(passed: bool, lag: float) -> AssetCheckEvaluation:
    return AssetCheckEvaluation(
        asset_key=AssetKey("progress"),
        check_name="lag_under_threshold",
        passed=passed,
        metadata={"worst_lag_seconds": lag},
        severity=AssetCheckSeverity.ERROR,
    )


def test_the_first_tick_reports_then_only_a_change_is_reported():
    first, cursor = unreported(None, [observation(messages_total=5)])
    assert len(first) == 1 and cursor is not None
    again, unchanged = unreported(cursor, [observation(messages_total=5)])
    assert again == [] and unchanged is None, "nothing moved: nothing written, the cursor stays"
    moved, cursor2 = unreported(cursor, [observation(messages_total=6)])
    assert [e.metadata["messages_total"].value for e in moved] == [6] and cursor2 != cursor


def test_a_cursor_from_before_the_record_reports_once_and_keeps_its_fields():
    old = json.dumps({"batch_id": 7, "next_offsets": {"0": 70}})
    events, cursor = unreported(old, [observation(messages_total=70)])
    assert len(events) == 1
    fields = json.loads(cursor)
    assert (
        fields["batch_id"] == 7 and fields["next_offsets"] == {"0": 70} and TOPIC.to_user_string() in fields[REPORTED]
    )
    assert unreported(cursor, [observation(messages_total=70)]) == ([], None)
    assert cursor_fields("not json") == {} and cursor_fields("[1]") == {} and cursor_fields(None) == {}


def test_each_subject_is_compared_on_its_own_and_a_check_by_its_outcome_too():
    _, cursor = unreported(None, [observation(messages_total=1), evaluation(True, 3.0)])
    events, cursor = unreported(cursor, [observation(messages_total=1), evaluation(False, 3.0)])
    assert [type(e) for e in events] == [AssetCheckEvaluation], "same figures, other outcome: reported"
    events, _ = unreported(cursor, [observation(messages_total=2), evaluation(False, 3.0)])
    assert [type(e) for e in events] == [AssetObservation]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(["high", "low", "lag"]), st.integers(0, 3), min_size=1), max_size=8))
def test_a_report_is_made_exactly_when_the_figures_differ_from_the_last_report(ticks: list[dict[str, int]]):
    cursor, last = None, None
    for figures in ticks:
        events, new = unreported(cursor, [observation(**figures)])
        assert bool(events) == (figures != last)
        if events:
            last = figures
        cursor = new if new is not None else cursor
