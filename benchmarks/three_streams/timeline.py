"""Run windows of the three-stream simulation as a timeline PNG: one panel per run, one lane per stream.

The reference drew the same picture (time.graphics) to show that, with the coordinator, no two
streams' windows overlap and, without it, they do. Committed windows are solid bars in the
stream's colour, conflicts red hatched bars (the attempt ran, its commit was refused), give-ups
black crosses at the moment the stream gave up, idle keep-alive registrations thin grey ticks.
A thin line before a bar is the wait for the lock.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and in CI

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from benchmarks.three_streams.simulation import STREAMS, SimulationResult  # noqa: E402

COLOURS = {"ingestion": "tab:blue", "mutation": "tab:orange", "retention": "tab:green"}
LANE_HEIGHT = 0.6


def _title(result: SimulationResult) -> str:
    s = result.summary()
    mode = "with the coordinator" if result.coordinated else "without the coordinator"
    extra = f", give-ups {s['gave_up']}, order violations {s['order_violations']}" if result.coordinated else ""
    return (
        f"{mode}: {s['batches_committed']} batches in {s['elapsed_s']:.1f} s, overlapping window pairs "
        f"{s['overlaps']}, commit conflicts {s['conflicts']}{extra}, content exact: {s['content_matches']}"
    )


def _panel(ax, result: SimulationResult) -> None:
    lanes = {name: i for i, name in enumerate(STREAMS)}
    for w in result.windows:
        y = lanes[w.stream]
        if w.outcome == "committed":
            ax.broken_barh(
                [(w.start, max(w.end - w.start, 1e-3))],
                (y - LANE_HEIGHT / 2, LANE_HEIGHT),
                facecolors=COLOURS[w.stream],
                edgecolors="black",
                linewidth=0.4,
            )
        elif w.outcome == "conflict":
            ax.broken_barh(
                [(w.start, max(w.end - w.start, 1e-3))],
                (y - LANE_HEIGHT / 2, LANE_HEIGHT),
                facecolors="mistyrose",
                edgecolors="red",
                hatch="////",
                linewidth=0.8,
            )
        elif w.outcome in ("gave_up", "lease_lost"):
            ax.plot([w.end], [y], marker="x", color="black", markersize=6, linestyle="none")
        elif w.outcome == "idle":
            ax.plot([w.start, w.start], [y - 0.15, y + 0.15], color="grey", linewidth=0.8)
        if w.start - w.requested > 0.01 and w.outcome in ("committed", "conflict", "idle"):
            ax.plot([w.requested, w.start], [y, y], color=COLOURS[w.stream], linewidth=0.8, alpha=0.6)
    ax.set_yticks(range(len(STREAMS)), labels=list(STREAMS))
    ax.invert_yaxis()
    ax.set_title(_title(result), fontsize=9)
    ax.grid(True, axis="x", alpha=0.3)


def draw_timeline(results: list[SimulationResult], out: str | Path) -> Path:
    """Write one panel per result (coordinated first, as passed) to `out` (PNG)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(len(results), 1, figsize=(14, 2.4 * len(results) + 0.8), sharex=True, squeeze=False)
    for ax, result in zip(axes[:, 0], results):
        _panel(ax, result)
    axes[-1, 0].set_xlabel("seconds since the streams started")
    legend = [Patch(facecolor=COLOURS[s], edgecolor="black", label=f"{s} batch committed") for s in STREAMS]
    legend += [
        Patch(facecolor="mistyrose", edgecolor="red", hatch="////", label="commit conflict (re-run)"),
        Line2D([], [], marker="x", color="black", linestyle="none", label="gave up (retry next tick)"),
        Line2D([], [], color="grey", label="idle registration"),
        Line2D([], [], color="grey", alpha=0.6, label="waiting for the lock"),
    ]
    fig.legend(handles=legend, loc="lower center", ncol=len(legend), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
