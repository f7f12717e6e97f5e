"""Connected components: union-find against a BFS reference (hypothesis). The processor's use of it
on Spark is test_tenant_merge.py's."""

from hypothesis import given
from hypothesis import strategies as st

from engagement_platform.profiles.identity import components_reference, union_find_labels

IDS = st.sampled_from([str(i) for i in range(100, 130)])
GRAPHS = st.lists(st.tuples(IDS, IDS), max_size=40)


@given(GRAPHS)
def test_union_find_matches_bfs(edges):
    assert union_find_labels([a for a, _ in edges], [b for _, b in edges]) == components_reference(edges)


def test_the_talks_example():
    labels = union_find_labels(["789", "103", "103"], ["789", "789", "101"])
    assert labels == {"789": "101", "103": "101", "101": "101"}
