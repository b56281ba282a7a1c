"""memory.png: memory over the simulated step, one small panel per pipeline rank (at most 16, picked
evenly), stacked by category (params, grads, optimizer, buffers, activations) with the capacity line.

Drawn on a ``matplotlib.figure.Figure`` rendered by Agg, never pyplot, so no global state leaks.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ..scenario import Scenario
from ..units import GiB, MS
from .memory import MemoryReport

MAX_PANELS = 16
# Stack order bottom to top; matplotlib "tab10" colours.
LAYERS = (("params", "#1f77b4"), ("grads", "#ff7f0e"), ("optimizer", "#2ca02c"),
          ("buffers", "#7f7f7f"), ("activations", "#d62728"))


def pick_ranks(ranks: list[int], limit: int = MAX_PANELS) -> list[int]:
    """At most ``limit`` ranks, evenly spread, always keeping the first and the last."""
    if len(ranks) <= limit:
        return list(ranks)
    idx = np.linspace(0, len(ranks) - 1, limit).round().astype(int)
    return [ranks[i] for i in sorted(set(idx.tolist()))]


def _stack(report: MemoryReport, rank: int) -> tuple[np.ndarray, dict]:
    """Time points and, per category, bytes at each point (step function, value after the point)."""
    total = report.timeline[rank]
    act = report.activation_timeline.get(rank) or [(t, 0.0) for t, _ in total]
    times = np.array([t for t, _ in total], dtype=float)
    row = report.per_rank[rank]
    layers = {k: np.full(len(times), row[k]) for k in ("params", "grads", "optimizer")}
    layers["activations"] = np.array([a for _, a in act], dtype=float)
    layers["buffers"] = np.array([v for _, v in total], dtype=float) - layers["activations"]
    return times, layers


def plot_memory(report: MemoryReport, scn: Scenario, path: str | Path) -> Path:
    """Write the memory chart; ``path`` is a PNG file or a directory (then ``memory.png`` in it)."""
    out = Path(path)
    if out.suffix.lower() != ".png":
        out = out / "memory.png"
    ranks = pick_ranks(sorted(report.timeline))
    if not ranks:
        raise ValueError("plot_memory: the report has no rank timeline to draw")
    cols = min(4, len(ranks))
    rows = math.ceil(len(ranks) / cols)
    fig = Figure(figsize=(3.6 * cols, 2.6 * rows + 0.8), layout="constrained")
    FigureCanvasAgg(fig)
    span = max(max(t for t, _ in report.timeline[r]) for r in ranks)
    scale, unit = (1.0, "s") if span >= 10.0 else (1.0 / MS, "ms")
    cap = report.capacity_bytes / GiB
    top = max(cap, max(report.per_rank[r]["total"] for r in ranks) / GiB) * 1.08
    axes = fig.subplots(rows, cols, squeeze=False, sharey=True)
    for ax, rank in zip(axes.flat, ranks):
        times, layers = _stack(report, rank)
        x = times * scale
        base = np.zeros(len(x))
        for name, colour in LAYERS:
            upper = base + layers[name] / GiB
            ax.fill_between(x, base, upper, step="post", color=colour, linewidth=0)
            base = upper
        ax.axhline(cap, color="black", linestyle="--", linewidth=1.0)
        mark = " (peak)" if rank == report.worst_rank else ""
        ax.set_title(f"{report.labels.get(rank, f'rank {rank}')}{mark}", fontsize=9)
        ax.set_ylim(0, top)
        ax.set_xlim(x[0], x[-1] if x[-1] > x[0] else x[0] + 1.0)
        ax.tick_params(labelsize=8)
        ax.set_xlabel(f"time ({unit})", fontsize=8)
    for ax in axes.flat[len(ranks):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("GiB", fontsize=8)
    handles = [Patch(color=c, label=n) for n, c in reversed(LAYERS)]
    handles.append(Patch(facecolor="none", edgecolor="black", linestyle="--",
                         label=f"capacity {cap:.0f} GiB"))
    verdict = "fits" if report.fits else "DOES NOT FIT"
    fig.suptitle(f"{scn.name}: memory per rank over one step, peak "
                 f"{report.peak['total'] / GiB:.1f} GiB ({verdict})", fontsize=10)
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=8, frameon=False)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out
