"""JSON field resolution: the pure rules against a plain per-field reference (hypothesis)."""

from hypothesis import given
from hypothesis import strategies as st

from engagement_platform.profiles.json_merge import DELETE, Change, merge_fields, resolve_changes

KEYS = st.sampled_from(["email", "country", "tags", "address", "score", "ok"])
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.text(max_size=5)
    | st.floats(-1e6, 1e6, allow_nan=False).map(lambda f: round(f, 3))
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)
OBJECTS = st.dictionaries(KEYS, VALUES, max_size=5)


def reference_fold(base: dict | None, changes: list[dict | None]) -> dict:
    """Per key: the value of the newest change that has it non-null, else the base's; nulls dropped."""
    keys = set(base or {}) | {k for c in changes for k in (c or {})}
    out = {}
    for key in keys:
        values = [(base or {}).get(key)] + [(c or {}).get(key) for c in changes]
        present = [v for v in values if v is not None]
        if present:
            out[key] = present[-1]
    return out


@given(OBJECTS, st.lists(OBJECTS | st.none(), max_size=4))
def test_fold_of_merge_fields_is_newest_non_null_per_key(base, changes):
    merged = merge_fields(None, base)  # a stored object never holds nulls
    for c in changes:
        merged = merge_fields(merged, c)
    assert merged == reference_fold(base, changes)


def test_documented_examples():
    assert merge_fields({"a": 1, "tags": ["x", "y"]}, {"a": None, "tags": ["z"]}) == {"a": 1, "tags": ["z"]}
    assert merge_fields({"addr": {"city": "B", "zip": "1"}}, {"addr": {"city": "M"}}) == {"addr": {"city": "M"}}
    assert merge_fields({"tags": ["x"]}, {"tags": []}) == {"tags": []}


CHANGES = st.lists(
    st.builds(
        lambda seq, op, fields, rel: Change(seq, op, fields, rel),
        st.integers(0, 30),
        st.sampled_from(["upsert", "upsert", DELETE]),
        OBJECTS | st.none(),
        st.none() | st.lists(st.sampled_from("abcd"), max_size=2).map(tuple),
    ),
    max_size=6,
    unique_by=lambda c: c.seq,
)


@given(CHANGES, st.randoms())
def test_resolution_ignores_arrival_order_and_replays(changes, rnd):
    shuffled = list(changes)
    rnd.shuffle(shuffled)
    assert resolve_changes(None, changes) == resolve_changes(None, shuffled)
    state = resolve_changes(None, changes)
    if state is not None:
        assert resolve_changes(state, shuffled) is None  # nothing newer than what is stored


@given(CHANGES, CHANGES)
def test_two_batches_equal_one_batch_when_the_second_is_newer(first, second):
    # A late change is dropped whole once a newer one is stored (rule 1), so only in-order batches compose.
    newest = max((c.seq for c in first), default=-1)
    second = [c for c in second if c.seq > newest]
    stored = resolve_changes(None, first)
    after_two = resolve_changes(stored, second) or stored
    assert after_two == resolve_changes(None, first + second)


def test_delete_tombstones_and_blocks_older_changes():
    state = resolve_changes(None, [Change(1, fields={"a": 1}), Change(5, DELETE)])
    assert state.deleted and state.fields is None and state.seq == 5
    assert resolve_changes(state, [Change(3, fields={"a": 2})]) is None
    reborn = resolve_changes(state, [Change(6, fields={"b": 1})])
    assert reborn.fields == {"b": 1} and not reborn.deleted
