"""A tenant's entries and exits from its old membership and an evaluation (pure: no Spark, no Dagster, no I/O).

Memberships are compared as integers (segment index * identities + identity index), not by joining
strings: a tenant of 20,000 profiles and 1,000 segments can have close to a million memberships, and the
diff runs in every evaluation. Only the changes are produced: the membership itself is the base merged
with the log of changes (current.py), never rewritten by an evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

PREVIOUS_COLUMNS = ["segment", "identity"]


def _np(values, dtype) -> np.ndarray:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    return np.asarray(values.to_numpy(zero_copy_only=False), dtype)


def _within(ordered: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per value: is it in `ordered` (sorted)? A binary search each (np.isin hashes the larger side)."""
    if not len(ordered) or not len(values):
        return np.zeros(len(values), bool)
    at = np.minimum(np.searchsorted(ordered, values), len(ordered) - 1)
    return ordered[at] == values


@dataclass
class Diff:
    entered: pa.Table  # (segment, identity)
    exited: pa.Table  # (segment, identity)
    sizes: dict[str, int]  # segment -> members after the evaluation, of the identities `previous` held


def membership_diff(
    previous: pa.Table,
    keys: pa.Array,
    results: dict[str, np.ndarray],
    kept_unless: pa.Array | None,
) -> Diff:
    """`previous`: the membership the batch starts from (PREVIOUS_COLUMNS); `keys` the evaluated identities and
    `results` each segment's verdict for them. Identities not evaluated keep their rows when `kept_unless` is
    given (an incremental run), except those it names (changed, e.g. gone); a full run (None) drops them.
    Rows of a segment that is not in `results` any more leave."""
    names = list(results)
    n = max(len(keys), 1)
    verdicts = np.stack([results[name] for name in names]) if names else np.zeros((0, len(keys)), bool)
    in_segment, of_identity = np.nonzero(verdicts)  # row-major: segment by segment, identities ascending
    new_keys = in_segment.astype(np.int64) * n + of_identity  # sorted

    previous = previous.combine_chunks()
    segment = _np(pc.index_in(previous["segment"], value_set=pa.array(names, pa.string())).fill_null(-1), np.int64)
    identity = (
        _np(pc.index_in(previous["identity"], value_set=keys).fill_null(-1), np.int64)
        if len(keys)
        else np.full(previous.num_rows, -1, np.int64)
    )
    known = segment >= 0
    evaluated = known & (identity >= 0)
    old_keys = np.where(evaluated, segment * n + identity, -1)
    stay = evaluated & _within(new_keys, old_keys)
    if kept_unless is not None:
        untouched = known & (identity < 0) & ~_np(pc.is_in(previous["identity"], value_set=kept_unless), bool)
        stay |= untouched
    entering = new_keys[~_within(np.sort(old_keys[evaluated]), new_keys)]

    entered = (
        pa.table(
            {
                "segment": pa.array(names, pa.string()).take(pa.array(entering // n)),
                "identity": keys.take(pa.array(entering % n)),
            }
        )
        if len(entering)
        else pa.table({"segment": pa.array([], pa.string()), "identity": pa.array([], pa.string())})
    )
    exited = previous.filter(pa.array(~stay)).select(["segment", "identity"])
    counts = np.bincount(np.concatenate([segment[stay], entering // n]), minlength=len(names)) if names else []
    return Diff(entered, exited, {name: int(c) for name, c in zip(names, counts)})
