"""Segments that read an array as one value (pure: no Spark, no Dagster).

`=`, `in`, `contains` and the other scalar ops are false on a JSON array, so `{path: fields.tags, op:
contains, value: gold}` over records whose tags are lists selects nobody, without an error: the definition
is valid, only the data tells. The evaluation counts, per path a scalar op reads, the records where that
path held an array (the count comes from the columns the evaluation builds anyway, no second pass over
the rows), and the run's metadata turns every non-zero count into a warning naming the segments and ops.
"""

from __future__ import annotations

from engagement_platform.profiles.segments.columns import Profiles
from engagement_platform.profiles.segments.definitions import SCALAR_OPS, Aggregate, Cmp, Profile, Segment
from engagement_platform.profiles.segments.evaluate import by_definitions, nodes

ARRAY_HINT = "use has, has_any, has_all or size= size!= size< size<= size> size>= for arrays"


@by_definitions
def scalar_reads(segments: list[Segment]) -> dict[str, dict[str, set[str]]]:
    """JSON path -> segment name -> the scalar ops (false on an array) the segment applies to the path."""
    reads: dict[str, dict[str, set[str]]] = {}
    for segment in segments:
        for node in nodes([segment]):
            cmp = node.cmp if isinstance(node, Profile) else node
            if isinstance(cmp, Cmp) and cmp.op in SCALAR_OPS:
                path, op = cmp.path, cmp.op
            elif isinstance(node, Aggregate) and node.path:  # min / max: an array is never the extreme
                path, op = node.path, f"{node.kind} {node.op}"
            else:
                continue
            if path.startswith("fields."):  # the only paths an array can be at
                reads.setdefault(path, {}).setdefault(segment.name, set()).add(op)
    return reads


def array_rows(profiles: Profiles, segments: list[Segment], records: slice = slice(None)) -> dict[str, int]:
    """Path a scalar op reads -> how many records of `profiles` (of its `records` only, when given) held an
    array there (paths that held none left out)."""
    counts = {}
    for path in sorted(scalar_reads(segments)):
        arrays = profiles.columns[path].arrays
        held = int(arrays.held[records].sum()) if arrays is not None else 0
        if held:
            counts[path] = held
    return counts


def array_warnings(segments: list[Segment], rows: dict[str, int]) -> list[str]:
    """One line per path that held an array where a segment compares it as one value."""
    reads = scalar_reads(segments)
    lines = []
    for path, held in sorted(rows.items()):
        uses = ", ".join(f"{name} ({' '.join(sorted(ops))})" for name, ops in sorted(reads.get(path, {}).items()))
        lines.append(
            f"{path} held an array in {held} of the records evaluated, and segments {uses} compare it as one "
            f"value, which is false on an array: {ARRAY_HINT}"
        )
    return lines
