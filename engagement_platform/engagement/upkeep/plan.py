"""When layout upkeep is due and what it reports (no Dagster): completed batches since the last
request, and the figures of a layout (lake/layout.py) as metadata and a markdown table."""

from __future__ import annotations

import pyarrow as pa

from engagement_platform.lake.checkpoints import CheckpointStore


def completed_batches(store: CheckpointStore, stream: str) -> int:
    """Id of the stream's last done batch (0 if none): batches finish strictly in id order."""
    latest, done = store.latest(stream)
    if latest is None:
        return 0
    return latest.batch_id if done else latest.batch_id - 1


def batches_since(done: dict[str, int], seen: dict[str, int]) -> int:
    """Batches completed since `seen` (per stream); a stream whose checkpoints restarted below what was
    seen (a new lake) counts from zero."""
    return sum(b - seen.get(s, 0) if b >= seen.get(s, 0) else b for s, b in done.items())


def max_of(layout: pa.Table, column: str) -> float:
    return round(max(layout[column].to_pylist(), default=0), 4)


def layout_summary(layout: pa.Table) -> dict:
    files = sum(layout["files"].to_pylist())
    total = sum(layout["total_bytes"].to_pylist())
    return {
        "mean_file_mb": round(total / files / 2**20, 3) if files else 0.0,
        "max_overlap_ratio": max_of(layout, "overlap_ratio"),
        "max_files_per_partition": int(max_of(layout, "files")),
        "max_depth": int(max_of(layout, "max_depth")),
    }


def layout_markdown(layout: pa.Table) -> str:
    lines = ["| org_id | files | mean MB | overlap | depth | dates |", "| --- | --- | --- | --- | --- | --- |"]
    for r in layout.to_pylist():
        lines.append(
            f"| {r['org_id']} | {r['files']} | {r['mean_file_bytes'] / 2**20:.2f} | {r['overlap_ratio']:.3f} "
            f"| {r['max_depth']} | {r['range_min']} .. {r['range_max']} |"
        )
    return "\n".join(lines)


def upkeep_metadata(
    result: dict, vacuumed_elsewhere: dict[str, int], retention_hours: int, worst_shown: int
) -> tuple[dict, str]:
    """(the upkeep run's figures, the markdown of its `worst_shown` worst partitions) from lake.layout.upkeep's result."""
    before, after = result["layout_before"], result["layout_after"]
    return {
        "files_before": result["files_before"],
        "files_after": result["files_after"],
        "partitions_checked": result["partitions_checked"],
        "partitions_compacted": len(result["partitions_compacted"]),
        "partitions_conflicted": len(result["partitions_conflicted"]),
        "conflicted_org_ids": ", ".join(result["partitions_conflicted"]) or "-",
        "partitions_unsettled": len(result["partitions_unsettled"]),
        "files_added": result["files_added"],
        "files_removed": result["files_removed"],
        "files_vacuumed": result["files_vacuumed"],
        "files_vacuumed_erased_tables": sum(n for n in vacuumed_elsewhere.values() if n > 0),
        "vacuum_retention_hours": retention_hours,
        "max_overlap_ratio_before": max_of(before, "overlap_ratio"),
        **layout_summary(after),
        "table_version_before": result["version_before"],
        "table_version_after": result["version_after"],
        **{f"seconds_{phase}": round(s, 3) for phase, s in result["seconds"].items()},
    }, layout_markdown(after.slice(0, worst_shown))
