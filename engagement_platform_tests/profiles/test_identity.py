"""Connected components: union-find against a BFS reference (hypothesis), and the Spark version
(applyInArrow per tenant) against the same reference on random multi-tenant graphs."""

from hypothesis import given, settings
from hypothesis import strategies as st

from engagement_platform.profiles.identity import components_reference, connected_components, union_find_labels

IDS = st.sampled_from([str(i) for i in range(100, 130)])
GRAPHS = st.lists(st.tuples(IDS, IDS), max_size=40)


@given(GRAPHS)
def test_union_find_matches_bfs(edges):
    assert union_find_labels([a for a, _ in edges], [b for _, b in edges]) == components_reference(edges)


def test_the_talks_example():
    labels = union_find_labels(["789", "103", "103"], ["789", "789", "101"])
    assert labels == {"789": "101", "103": "101", "101": "101"}


@settings(max_examples=4, deadline=None)
@given(st.dictionaries(st.sampled_from(["acme", "globex", "initech"]), GRAPHS, min_size=1))
def test_spark_components_match_the_reference(spark, graphs):
    rows = [(t, a, b) for t, edges in graphs.items() for a, b in edges] + [("acme", "999", "999")]
    df = spark.createDataFrame(rows, "tenant string, src string, dst string")
    got = {}
    for r in connected_components(df).collect():
        got.setdefault(r["tenant"], {})[r["id"]] = (r["component_id"], r["related_ids"])
    graphs.setdefault("acme", []).append(("999", "999"))
    for tenant, edges in graphs.items():
        if not edges:
            continue
        labels = components_reference(edges)
        members = {}
        for node, label in labels.items():
            members.setdefault(label, []).append(node)
        assert got[tenant] == {node: (label, sorted(members[label])) for node, label in labels.items()}
