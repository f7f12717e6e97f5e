"""The membership diff on integer keys equals plain set arithmetic over (segment, identity) pairs (hypothesis),
for full runs (identities not evaluated leave) and incremental ones (they stay unless changed)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from engagement_platform.profiles.segments.membership import PREVIOUS_COLUMNS, membership_diff
from engagement_platform.profiles.segments.tables import PROFILE_SEGMENTS

IDS = [f"c{i}" for i in range(6)]
SEGMENTS = ["a", "b", "c"]


@settings(max_examples=400, deadline=None)
@given(
    old=st.sets(st.tuples(st.sampled_from(SEGMENTS + ["gone"]), st.sampled_from(IDS))),
    evaluated=st.lists(st.sampled_from(IDS), unique=True),
    verdicts=st.lists(st.booleans(), min_size=18, max_size=18),
    segments=st.lists(st.sampled_from(SEGMENTS), unique=True, min_size=1),
    changed=st.one_of(st.none(), st.sets(st.sampled_from(IDS))),
)
def test_the_diff_is_set_arithmetic(old, evaluated, verdicts, segments, changed):
    previous = pa.Table.from_pylist(
        [{"segment": s, "identity": i} for s, i in sorted(old)],
        schema=pa.schema([PROFILE_SEGMENTS.schema.field(c) for c in PREVIOUS_COLUMNS]),
    )
    results = {s: np.array([verdicts[j * 6 + k] for k in range(len(evaluated))], bool) for j, s in enumerate(segments)}
    new = {(s, i) for s in segments for i, inside in zip(evaluated, results[s]) if inside}
    if changed is None:  # full: what was not evaluated is gone
        expected = new
    else:  # incremental: the rest stays, unless changed, or of a segment no longer defined
        expected = new | {(s, i) for s, i in old if i not in evaluated and i not in changed and s in segments}

    diff = membership_diff(
        previous,
        pa.array(evaluated, pa.string()),
        results,
        None if changed is None else pa.array(sorted(changed), pa.string()),
    )

    assert set(zip(diff.entered["segment"].to_pylist(), diff.entered["identity"].to_pylist())) == expected - old
    assert set(zip(diff.exited["segment"].to_pylist(), diff.exited["identity"].to_pylist())) == old - expected
    assert diff.entered.num_rows == len(expected - old) and diff.exited.num_rows == len(old - expected)
    assert diff.sizes == {s: sum(1 for seg, _ in expected if seg == s) for s in segments}
