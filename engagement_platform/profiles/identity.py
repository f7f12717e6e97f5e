"""Identity graph: connected components of the ids profiles link to each other.

Every profile row declares its neighbours (`linked_ids`, from its latest CDC record); the row's
`related_ids` is then every id of its connected component (sorted, itself included) and
`component_id` the smallest of them. A record linking 789 and 101 through 103 therefore updates
related ids on every row of both old components, in the same batch (processor.py finds those rows).

GraphFrames' jar cannot be loaded here, so components run as a union-find per tenant inside Spark's
Python workers (tenant_merge.py, called through a cogroup by tenant with applyInArrow): one pass over
the affected edges, no iteration count that grows with the graph's diameter (min-label propagation
needs one join round per hop). `components_reference` is the slow, obviously correct BFS the tests
compare against.
"""

from __future__ import annotations

from collections.abc import Iterable


def union_find_labels(src: Iterable[str], dst: Iterable[str]) -> dict[str, str]:
    """id -> smallest id of its component, for the undirected edges src[i] - dst[i] (self-loops = lone nodes)."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        root = x
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:  # path compression keeps later finds flat
            parent[x], x = root, parent[x]
        return root

    for a, b in zip(src, dst):
        parent.setdefault(a, a)
        parent.setdefault(b, b)
        ra, rb = find(a), find(b)
        if ra != rb:  # the smaller id becomes the root, so a root is its component's label
            parent[max(ra, rb)] = min(ra, rb)
    return {x: find(x) for x in parent}


def components_reference(edges: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Breadth-first search over an adjacency map: the reference union_find_labels must match."""
    adjacent: dict[str, set[str]] = {}
    for a, b in edges:
        adjacent.setdefault(a, set()).add(b)
        adjacent.setdefault(b, set()).add(a)
    label: dict[str, str] = {}
    for start in adjacent:
        if start in label:
            continue
        seen, frontier = {start}, [start]
        while frontier:
            frontier = [n for x in frontier for n in adjacent[x] if n not in seen]
            seen.update(frontier)
        smallest = min(seen)
        label.update((x, smallest) for x in seen)
    return label
