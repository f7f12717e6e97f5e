"""The soak's run-slot figures (benchmarks/soak/slots.py): the sweep over run moments against a second-by-second
count, and a worked example. Pure: no Dagster instance."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.soak.slots import RunSpan, slot_usage


def by_the_second(runs: list[RunSpan], slots: int, now: int) -> tuple[int, int]:
    """Obviously correct on whole seconds: for each second [t, t+1), is a run queued, and are all slots taken."""
    queued = full = 0
    for t in range(now):
        waiting = any(
            r.created <= t < (r.launched if r.launched is not None else now)
            and t < (r.ended if r.ended is not None else now)
            for r in runs
        )
        holding = sum(
            1 for r in runs if r.launched is not None and r.launched <= t < (r.ended if r.ended is not None else now)
        )
        queued += waiting
        full += waiting and holding >= slots
    return queued, full


@st.composite
def runs(draw) -> list[RunSpan]:
    out = []
    for _ in range(draw(st.integers(0, 8))):
        created = draw(st.integers(0, 50))
        launched = draw(st.one_of(st.none(), st.integers(created, 70)))
        ended = draw(st.one_of(st.none(), st.integers(launched if launched is not None else created, 90)))
        out.append(RunSpan(created, launched, ended, draw(st.booleans())))
    return out


@settings(max_examples=300, deadline=None)
@given(runs(), st.integers(1, 3))
def test_queue_time_and_full_slots_match_a_second_by_second_count(spans, slots):
    usage = slot_usage(spans, slots, now=100)
    assert (usage.queued_s, usage.queued_full_s) == by_the_second(spans, slots, 100)
    launched = [r for r in spans if r.launched is not None]
    assert usage.success_s + usage.failed_s == sum(
        (r.ended if r.ended is not None else 100) - r.launched for r in launched
    )
    assert usage.successes + usage.failures == len(launched)


def test_a_run_queued_behind_two_busy_slots_then_behind_one():
    spans = [RunSpan(0, 0, 30, True), RunSpan(0, 0, 10, False), RunSpan(5, 20, 40, True)]
    usage = slot_usage(spans, slots=2, now=40)
    # the third run waits 5 -> 20: both slots taken until 10 (a failed run leaves), then one slot free but not yet taken
    assert (usage.queued_s, usage.queued_full_s, usage.waits) == (15, 5, [0, 0, 15])
    assert (usage.success_s, usage.failed_s, usage.successes, usage.failures) == (50, 10, 2, 1)
    assert usage.lines()[0].startswith(
        "run slots 2: a run waited in the queue for 15 s of the run, all slots taken for 5 s"
    )
