"""Measured-run analysis: busy/idle per stream, kernel time by category, exposed communication, and
timelines of a measured Trace alone or above its simulated counterpart (PNG, matplotlib Agg).

Works on any Trace; measured traces (``calibration/kineto``) carry kernel classes as categories, host
lanes carry "cpu_op" / "cuda_runtime" and are left out of the kernel statistics.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ..trace import Trace, TraceEvent
from ..units import MS
from .bubbles import merge_intervals
from .plots import CATEGORY_COLOURS

KERNEL_CATEGORIES = ("gemm", "attention", "norm", "elementwise", "nccl", "memcpy", "other")
HOST_CATEGORIES = ("cpu_op", "cuda_runtime")
# Kernel classes (matplotlib "tab10"/"Set2" hues distinct from the simulator categories'), host lanes grey.
KERNEL_COLOURS = {"gemm": "#1f77b4", "attention": "#17becf", "norm": "#bcbd22", "elementwise": "#ff7f0e",
                  "nccl": "#d62728", "memcpy": "#8c564b", "cpu_op": "#c7c7c7", "cuda_runtime": "#e0e0e0"}
PALETTE = {**CATEGORY_COLOURS, **KERNEL_COLOURS}


def _length(spans: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in spans)


def _clip(e: TraceEvent, lo: float, hi: float) -> tuple[float, float] | None:
    a, b = max(e.start_s, lo), min(e.end_s, hi)
    return (a, b) if b > a else None


def _window(trace: Trace, start_s: float | None, end_s: float | None) -> tuple[float, float]:
    return (trace.start_s if start_s is None else start_s, trace.end_s if end_s is None else end_s)


def stream_utilization(trace: Trace, start_s: float | None = None, end_s: float | None = None) -> list[dict]:
    """Per (rank, stream): busy seconds (union of its events), idle seconds and busy fraction of the window."""
    lo, hi = _window(trace, start_s, end_s)
    lanes: dict[tuple[int, str], list[tuple[float, float]]] = {}
    counts: dict[tuple[int, str], int] = {}
    for e in trace.events:
        c = _clip(e, lo, hi)
        if c is not None:
            lanes.setdefault((e.rank, e.stream), []).append(c)
            counts[(e.rank, e.stream)] = counts.get((e.rank, e.stream), 0) + 1
    order = {s: i for i, s in enumerate(trace.streams())}
    rows = []
    for (rank, stream), spans in sorted(lanes.items(), key=lambda kv: (kv[0][0], order[kv[0][1]])):
        busy = _length(merge_intervals(spans))
        span = hi - lo
        rows.append({"rank": rank, "stream": stream, "events": counts[(rank, stream)], "busy_s": busy,
                     "idle_s": span - busy, "busy_fraction": busy / span if span > 0 else 0.0})
    return rows


def kernel_time_by_category(trace: Trace, start_s: float | None = None,
                            end_s: float | None = None) -> dict[int, dict[str, float]]:
    """rank -> kernel category -> summed kernel seconds (host lanes excluded)."""
    lo, hi = _window(trace, start_s, end_s)
    out: dict[int, dict[str, float]] = {}
    for e in trace.events:
        if e.category in HOST_CATEGORIES:
            continue
        c = _clip(e, lo, hi)
        if c is not None:
            per = out.setdefault(e.rank, {k: 0.0 for k in KERNEL_CATEGORIES})
            per[e.category] = per.get(e.category, 0.0) + c[1] - c[0]
    return out


def exposed_communication(trace: Trace, start_s: float | None = None, end_s: float | None = None,
                          comm_categories: tuple[str, ...] = ("nccl",)) -> dict[int, dict[str, float]]:
    """rank -> {comm_s, overlapped_s, exposed_s}: communication-kernel time (union over streams) and the
    part of it during which no other kernel of the rank runs (HTA's "exposed communication")."""
    lo, hi = _window(trace, start_s, end_s)
    comm: dict[int, list] = {}
    other: dict[int, list] = {}
    for e in trace.events:
        if e.category in HOST_CATEGORIES:
            continue
        c = _clip(e, lo, hi)
        if c is not None:
            (comm if e.category in comm_categories else other).setdefault(e.rank, []).append(c)
    out = {}
    for rank in sorted(set(comm) | set(other)):
        cm = merge_intervals(comm.get(rank, []))
        ot = merge_intervals(other.get(rank, []))
        overlap, j = 0.0, 0
        for a, b in cm:
            while j < len(ot) and ot[j][1] <= a:
                j += 1
            k = j
            while k < len(ot) and ot[k][0] < b:
                overlap += min(b, ot[k][1]) - max(a, ot[k][0])
                k += 1
        total = _length(cm)
        out[rank] = {"comm_s": total, "overlapped_s": overlap, "exposed_s": total - overlap}
    return out


def _lanes(trace: Trace, max_lanes: int) -> list[tuple[int, str]]:
    order = {s: i for i, s in enumerate(trace.streams())}
    lanes = sorted({(e.rank, e.stream) for e in trace.events}, key=lambda k: (k[0], order[k[1]]))
    return lanes[:max_lanes]


def _draw(ax, trace: Trace, lanes: list[tuple[int, str]], t0: float, scale: float, lo: float, hi: float) -> set:
    """Bars of ``trace`` on ``ax``, one PolyCollection per category; returns the categories drawn."""
    row = {lane: i for i, lane in enumerate(lanes)}
    by_cat: dict[str, list] = {}
    for e in trace.events:
        y = row.get((e.rank, e.stream))
        c = _clip(e, lo, hi)
        if y is None or c is None:
            continue
        x0, x1 = (c[0] - t0) * scale, (c[1] - t0) * scale
        by_cat.setdefault(e.category, []).append(((x0, y - 0.4), (x0, y + 0.4), (x1, y + 0.4), (x1, y - 0.4)))
    for cat, boxes in by_cat.items():
        ax.add_collection(PolyCollection(boxes, facecolors=PALETTE.get(cat, PALETTE["other"]),
                                         edgecolors="none"))
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([f"{trace.label(r)} · {s}" for r, s in lanes], fontsize=7)
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    ax.set_xlim(0.0, (hi - t0) * scale)
    return set(by_cat)


def _legend(fig: Figure, cats: set) -> None:
    handles = [Patch(color=PALETTE.get(c, PALETTE["other"]), label=c) for c in sorted(cats)]
    fig.legend(handles=handles, loc="lower center", ncol=min(8, max(1, len(handles))), fontsize=7,
               frameon=False)


def plot_measured_timeline(trace: Trace, path, title: str = "", start_s: float | None = None,
                           end_s: float | None = None, max_lanes: int = 48) -> Path:
    """Gantt chart of a (measured) trace: one row per rank and stream, bars coloured by kernel class."""
    lo, hi = _window(trace, start_s, end_s)
    lanes = _lanes(trace, max_lanes)
    fig = Figure(figsize=(12, 1.8 + 0.3 * max(1, len(lanes))))
    ax = fig.add_subplot(1, 1, 1)
    cats = _draw(ax, trace, lanes, lo, 1.0 / MS, lo, hi)
    ax.set_xlabel("time (ms)")
    ax.set_title(title or "measured timeline", fontsize=9)
    _legend(fig, cats)
    _margins(fig, top_in=0.4)
    return _save(fig, path)


def plot_side_by_side(measured: Trace, simulated: Trace, path, title: str = "",
                      measured_window: tuple[float, float] | None = None,
                      simulated_window: tuple[float, float] | None = None, max_lanes: int = 16) -> Path:
    """Measured timeline (one step) above the simulated one, both from their window's start, same scale."""
    m_lo, m_hi = measured_window or (measured.start_s, measured.end_s)
    s_lo, s_hi = simulated_window or (simulated.start_s, simulated.end_s)
    m_lanes, s_lanes = _lanes(measured, max_lanes), _lanes(simulated, max_lanes)
    fig = Figure(figsize=(12, 2.8 + 0.35 * (len(m_lanes) + len(s_lanes))))
    heights = [max(1, len(m_lanes)), max(1, len(s_lanes))]
    ax_m, ax_s = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": heights})
    scale = 1.0 / MS
    cats = _draw(ax_m, measured, m_lanes, m_lo, scale, m_lo, m_hi)
    cats |= _draw(ax_s, simulated, s_lanes, s_lo, scale, s_lo, s_hi)
    span = max(m_hi - m_lo, s_hi - s_lo) * scale
    ax_m.set_xlim(0.0, span)
    ax_m.set_title(f"measured: {(m_hi - m_lo) / MS:.3f} ms", fontsize=9, loc="left")
    ax_s.set_title(f"simulated: {(s_hi - s_lo) / MS:.3f} ms", fontsize=9, loc="left")
    ax_s.set_xlabel("time from step start (ms)")
    if title:
        fig.suptitle(title, fontsize=10)
    _legend(fig, cats)
    _margins(fig, top_in=0.7, hspace=0.6)
    return _save(fig, path)


def _margins(fig: Figure, top_in: float, hspace: float = 0.2) -> None:
    """Fixed margins in inches: lane labels on the left, the x label and the legend below."""
    w, h = fig.get_size_inches()
    fig.subplots_adjust(left=min(0.4, 2.8 / w), right=0.98, bottom=0.85 / h, top=1.0 - top_in / h, hspace=hspace)


def _save(fig: Figure, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def summary_markdown(util: list[dict], by_cat: dict[int, dict[str, float]], exposed: dict[int, dict]) -> str:
    """Markdown tables of the three measured-run statistics."""
    lines = ["| rank | stream | events | busy (ms) | idle (ms) | busy |", "|---|---|---|---|---|---|"]
    lines += [f"| {u['rank']} | {u['stream']} | {u['events']} | {u['busy_s'] / MS:.3f} | {u['idle_s'] / MS:.3f} | "
              f"{u['busy_fraction']:.1%} |" for u in util]
    lines += ["", "| rank | " + " | ".join(f"{c} (ms)" for c in KERNEL_CATEGORIES) + " |",
              "|---|" + "---|" * len(KERNEL_CATEGORIES)]
    lines += [f"| {r} | " + " | ".join(f"{cats.get(c, 0.0) / MS:.3f}" for c in KERNEL_CATEGORIES) + " |"
              for r, cats in sorted(by_cat.items())]
    lines += ["", "| rank | communication (ms) | overlapped (ms) | exposed (ms) |", "|---|---|---|---|"]
    lines += [f"| {r} | {x['comm_s'] / MS:.3f} | {x['overlapped_s'] / MS:.3f} | {x['exposed_s'] / MS:.3f} |"
              for r, x in sorted(exposed.items())]
    return "\n".join(lines) + "\n"
