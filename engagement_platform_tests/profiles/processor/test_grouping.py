"""Which tenants share a processor run, against slow references: groups are stretches of consecutive ready
tenants of the partition order, cut at the size bound; a tenant whose newest run failed is retried alone;
a run's tenants come from its partition or its range tags."""

from itertools import groupby

from hypothesis import given
from hypothesis import strategies as st

from engagement_platform.profiles.assets import PARTITION_TAG, RANGE_END_TAG, RANGE_START_TAG, run_tenants
from engagement_platform.profiles.processor.grouping import newest_failed, tenant_groups

TENANTS = [f"t{i:02d}" for i in range(30)]


def reference_groups(ready: set[str], order: list[str], per_run: int) -> list[list[str]]:
    """Each maximal stretch of ready tenants, cut into chunks of `per_run` from its start."""
    groups = []
    for is_ready, stretch in groupby(order, key=lambda t: t in ready):
        stretch = list(stretch)
        if is_ready:
            groups += [stretch[i : i + per_run] for i in range(0, len(stretch), per_run)]
    return groups


@given(
    order=st.permutations(TENANTS).map(lambda p: p[: len(p) // 2 + 3]),
    picks=st.lists(st.booleans(), min_size=30, max_size=30),
    per_run=st.integers(1, 8),
)
def test_groups_are_the_stretches_of_ready_tenants_cut_at_the_bound(order, picks, per_run):
    ready = {t for t, pick in zip(order, picks) if pick}
    groups = tenant_groups(ready, order, per_run)
    assert groups == reference_groups(ready, order, per_run)
    assert [t for g in groups for t in g] == [t for t in order if t in ready]
    for group in groups:
        start = order.index(group[0])
        assert group == order[start : start + len(group)] and len(group) <= per_run


def test_a_tenant_not_ready_ends_a_stretch_and_the_bound_cuts_one():
    order = ["a", "b", "c", "d", "e", "f"]
    assert tenant_groups({"a", "b", "d", "e", "f"}, order, 2) == [["a", "b"], ["d", "e"], ["f"]]
    assert tenant_groups({"a", "b", "c"}, order, 100) == [["a", "b", "c"]]
    assert tenant_groups(set(), order, 3) == []


def reference_newest_failed(runs: list[tuple[list[str], bool]]) -> set[str]:
    tenants = {t for covered, _ in runs for t in covered}
    return {t for t in tenants if next(failed for covered, failed in runs if t in covered)}


@given(
    st.lists(
        st.tuples(st.lists(st.sampled_from(TENANTS[:8]), max_size=5, unique=True), st.booleans()),
        max_size=12,
    )
)
def test_a_tenant_is_retried_alone_when_its_newest_run_failed(runs):
    assert newest_failed(runs) == reference_newest_failed(runs)


def test_a_failed_run_of_many_sends_its_tenants_to_runs_of_their_own_until_one_succeeds():
    runs = [(["b"], False), (["a", "b", "c"], True), (["a"], True)]  # newest first
    assert newest_failed(runs) == {"a", "c"}


def test_a_run_covers_its_partition_or_every_tenant_of_its_range():
    keys = ["a", "b", "c", "d"]
    assert run_tenants({PARTITION_TAG: "c"}, keys) == ["c"]
    assert run_tenants({RANGE_START_TAG: "b", RANGE_END_TAG: "d"}, keys) == ["b", "c", "d"]
    assert run_tenants({RANGE_START_TAG: "b", RANGE_END_TAG: "x"}, keys) == []  # a partition since deleted
    assert run_tenants({}, keys) == []
