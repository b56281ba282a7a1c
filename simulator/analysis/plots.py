"""Timeline (Gantt per rank and stream) and pipeline-bubble pictures of a Trace, written as PNG.

Figures are ``matplotlib.figure.Figure`` objects rendered by Agg, never pyplot, so no global
state leaks. Bars are drawn as one
PolyCollection per colour (vectorised), which keeps 200k-event timelines to seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ..trace import Trace
from ..units import MS
from .bubbles import (compute_events, idle_intervals, schedule_actions, stage_bubble_fractions,
                      stage_ranks)

__all__ = ["plot_timeline", "plot_bubbles", "stage_bubble_fractions"]

# One colour per time-breakdown category (matplotlib's "tab10" palette); kernel classes of
# measured traces that are not simulator categories are drawn as "other".
CATEGORY_COLOURS = {
    "compute": "#1f77b4", "recompute": "#ff7f0e", "comm_tp": "#2ca02c", "comm_pp": "#d62728",
    "comm_dp": "#9467bd", "comm_ep": "#8c564b", "comm_cp": "#e377c2", "optimizer": "#bcbd22",
    "offload": "#17becf", "other": "#7f7f7f",
}
# Timeline shade per phase: forward lighter, backward full, weight-gradient (W) darker.
PHASE_SHADES = {"F": ("white", 0.45), "W": ("black", 0.35)}
PHASE_NAMES = {"F": "forward", "B": "backward", "W": "weight grad", "R": "recompute",
               "O": "optimizer"}
# Bubble chart: one colour per action phase (ColorBrewer "Blues"/"Greens"/"Oranges"/"Greys").
ACTION_COLOURS = {"F": "#6baed6", "B": "#2171b5", "W": "#41ab5d", "R": "#fd8d3c", "O": "#969696"}
ACTION_TEXT = {"B": "white", "W": "white"}
IDLE_FACE, IDLE_EDGE = "#f0f0f0", "#a0a0a0"


def _mix(colour: str, towards: str, amount: float) -> tuple[float, float, float]:
    a, b = np.array(to_rgb(colour)), np.array(to_rgb(towards))
    r, g, b_ = ((1.0 - amount) * a + amount * b).tolist()
    return float(r), float(g), float(b_)


def event_colour(category: str, phase: str) -> tuple[float, float, float]:
    base = CATEGORY_COLOURS.get(category, CATEGORY_COLOURS["other"])
    towards, amount = PHASE_SHADES.get(phase, ("white", 0.0))
    return _mix(base, towards, amount)


def _time_unit(duration_s: float) -> tuple[float, str]:
    """Axis scale: milliseconds below 10 s, seconds above."""
    return (1.0, "s") if duration_s >= 10.0 else (1.0 / MS, "ms")


def _boxes(x0, x1, y, height) -> Any:
    """(n, 4, 2) rectangle vertices for bars [x0, x1] centred on y (an array: PolyCollection takes it
    as its sequence of polygons, which matplotlib's stubs do not spell, hence Any)."""
    x0, x1, y = (np.asarray(a, dtype=float) for a in (x0, x1, y))
    lo, hi = y - height / 2.0, y + height / 2.0
    return np.stack([np.stack([x0, lo], -1), np.stack([x0, hi], -1),
                     np.stack([x1, hi], -1), np.stack([x1, lo], -1)], axis=1)


def _coalesce(x0: np.ndarray, x1: np.ndarray, lane: np.ndarray, tol: float):
    """Merge bars of one lane whose gap is at most ``tol``; returns (x0, x1, lane) arrays."""
    order = np.lexsort((x0, lane))
    x0, x1, lane = x0[order], x1[order], lane[order]
    out0: list[float] = []
    out1: list[float] = []
    outy: list[int] = []
    for a, b, y in zip(x0.tolist(), x1.tolist(), lane.tolist()):
        if outy and outy[-1] == y and a <= out1[-1] + tol:
            out1[-1] = max(out1[-1], b)
        else:
            out0.append(a)
            out1.append(b)
            outy.append(y)
    return np.array(out0), np.array(out1), np.array(outy)


def _pick_ranks(ranks: list[int], max_ranks: int) -> list[int]:
    """All ranks, or ``max_ranks`` of them evenly spaced (first and last always kept)."""
    if len(ranks) <= max_ranks:
        return ranks
    idx = np.unique(np.linspace(0, len(ranks) - 1, max_ranks).round().astype(int))
    return [ranks[i] for i in idx]


def _save(fig: Figure, path, dpi: int) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path


def _timeline_bars(trace: Trace, lane_of: dict) -> dict[tuple[str, str], tuple[list, list, list]]:
    """(category, phase shade) -> (starts, ends, lanes) of the events on the drawn lanes."""
    t0 = trace.start_s
    groups: dict[tuple[str, str], tuple[list, list, list]] = {}
    for e in trace.events:
        lane = lane_of.get((e.rank, e.stream))
        if lane is None:
            continue
        cat = e.category if e.category in CATEGORY_COLOURS else "other"
        g = groups.setdefault((cat, e.phase if e.phase in PHASE_SHADES else ""), ([], [], []))
        g[0].append(e.start_s - t0)
        g[1].append(e.end_s - t0)
        g[2].append(lane)
    return groups


def _timeline_legend(cats: set, seen: set) -> list[Patch]:
    """Category colours, then the phase key in grey (F lighter, B full colour, W darker), then idle."""
    handles = [Patch(facecolor=CATEGORY_COLOURS[c], label=c) for c in sorted(cats, key=list(CATEGORY_COLOURS).index)]
    if seen & set(PHASE_SHADES):
        handles += [Patch(facecolor=event_colour("other", "F"), label="F: lighter")] * ("F" in seen)
        handles.append(Patch(facecolor=event_colour("other", "B"), label="B: full colour"))
        handles += [Patch(facecolor=event_colour("other", "W"), label="W: darker")] * ("W" in seen)
    handles.append(Patch(facecolor="white", edgecolor="#999999", label="idle"))
    return handles


def plot_timeline(trace: Trace, path, title: str = "", max_ranks: int = 32) -> Path:
    """Gantt chart: one lane per (rank, stream), bars coloured by category and shaded by phase."""
    if max_ranks < 1:
        raise ValueError(f"max_ranks must be >= 1, got {max_ranks}")
    all_ranks = trace.ranks()
    ranks = _pick_ranks(all_ranks, max_ranks)
    stream_pos = {s: i for i, s in enumerate(trace.streams())}
    keep = set(ranks)
    lanes = sorted({(e.rank, e.stream) for e in trace.events if e.rank in keep},
                   key=lambda k: (k[0], stream_pos[k[1]]))
    scale, unit = _time_unit(trace.duration_s)
    groups = _timeline_bars(trace, {k: i for i, k in enumerate(lanes)})
    width_in, dpi = 16.0, 100
    fig = Figure(figsize=(width_in, min(2.0 + 0.2 * max(len(lanes), 4), 60.0)))
    ax = fig.add_subplot()
    # Same-colour bars closer than half a pixel are drawn as one: sub-pixel kernels would
    # otherwise leave anti-aliasing seams that read as idle time.
    half_px_s = 0.5 * max(trace.duration_s, 1e-30) / (width_in * dpi * 0.72)
    for (cat, phase), (x0, x1, y) in sorted(groups.items()):
        x0, x1, y = _coalesce(np.array(x0), np.array(x1), np.array(y), half_px_s)
        ax.add_collection(PolyCollection(_boxes(x0 * scale, x1 * scale, y, 0.8),
                                         facecolors=[event_colour(cat, phase)], linewidths=0))
    ax.set_xlim(0.0, max(trace.duration_s * scale, 1e-12))
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([f"{trace.label(r)} | {s}" for r, s in lanes],
                       fontsize=7 if len(lanes) <= 64 else 5)
    for i in range(1, len(lanes)):
        if lanes[i][0] != lanes[i - 1][0]:
            ax.axhline(i - 0.5, color="#cccccc", linewidth=0.6)
    ax.set_facecolor("white")
    ax.set_xlabel(f"time since start ({unit})")
    shown = "" if len(ranks) == len(all_ranks) else f" ({len(ranks)} of {len(all_ranks)} ranks)"
    ax.set_title((title or f"Timeline, {trace.source} run") + shown)
    ax.legend(handles=_timeline_legend(set(c for c, _ in groups), {e.phase for e in trace.events if e.rank in keep}),
              loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    # The axes take 0.72 of the width, as half_px_s above assumes.
    fig.subplots_adjust(left=0.16, right=0.88, top=1.0 - 0.6 / fig.get_figheight(),
                        bottom=0.7 / fig.get_figheight())
    return _save(fig, path, dpi=dpi)


def plot_bubbles(trace: Trace, path, title: str = "") -> Path:
    """The pipeline schedule as it ran: one row per stage, one box per action (``1F3``), idle
    slots hatched grey, each stage's bubble fraction at the row end."""
    stages = stage_ranks(trace)
    if not stages:
        raise ValueError("plot_bubbles: no compute-stream event has a pipeline stage (stage >= 0)")
    fractions = stage_bubble_fractions(trace)
    t0, t1 = trace.start_s, trace.end_s
    scale, unit = _time_unit(t1 - t0)
    by_rank = compute_events(trace)
    rows = list(stages)

    width_in, dpi, left, right = 16.0, 120, 0.07, 0.91
    fig = Figure(figsize=(width_in, 1.8 + 0.45 * len(rows)))
    ax = fig.add_subplot()
    px_per_s = width_in * dpi * (right - left) / max(t1 - t0, 1e-30)
    fontsize = 7.0
    char_px = 0.62 * fontsize * dpi / 72.0  # average glyph width of DejaVu Sans ~0.6 em

    idle_x0, idle_x1, idle_y = [], [], []
    boxes: dict[tuple[str, int], tuple[list, list, list]] = {}
    for row, stage in enumerate(rows):
        rank = stages[stage][0]  # representative: symmetric ranks of a stage run the same schedule
        for s, e in idle_intervals(by_rank[rank], t0, t1):
            idle_x0.append(s - t0)
            idle_x1.append(e - t0)
            idle_y.append(row)
        for a in schedule_actions(trace, rank):
            g = boxes.setdefault((a.phase, max(a.chunk, 0) % 2), ([], [], []))
            g[0].append(a.start_s - t0)
            g[1].append(a.end_s - t0)
            g[2].append(row)
            if (a.end_s - a.start_s) * px_per_s >= char_px * (len(a.label) + 1):
                ax.text((0.5 * (a.start_s + a.end_s) - t0) * scale, row, a.label, ha="center",
                        va="center", fontsize=fontsize, color=ACTION_TEXT.get(a.phase, "black"),
                        clip_on=True)
        ax.text(1.005, row, f"{fractions[stage]:.1%}", transform=ax.get_yaxis_transform(),
                va="center", fontsize=9)
    _draw_bubble_boxes(ax, idle_x0, idle_x1, idle_y, boxes, scale, px_per_s)
    ax.set_xlim(0.0, max((t1 - t0) * scale, 1e-12))
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"stage {s}" for s in rows], fontsize=9)
    ax.set_xlabel(f"time since start ({unit})")
    mean = sum(fractions.values()) / len(fractions)
    ax.set_title(f"{title or f'Pipeline schedule, {len(rows)} stages'} (mean bubble {mean:.1%})")
    ax.text(1.005, 1.0, "bubble", transform=ax.transAxes, va="bottom", fontsize=9)
    handles = _bubble_legend({p for p, _ in boxes})
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    fig.subplots_adjust(left=left, right=right, top=1.0 - 0.5 / fig.get_figheight(),
                        bottom=1.0 / fig.get_figheight())
    return _save(fig, path, dpi=dpi)


def _bubble_legend(phases: set) -> list[Patch]:
    ordered = sorted(phases, key=lambda p: "FRBWO".find(p))
    handles = [Patch(facecolor=ACTION_COLOURS.get(p, "#bdbdbd"),
                     label=f"{p} ({PHASE_NAMES.get(p, 'other')})") for p in ordered]
    handles.append(Patch(facecolor=IDLE_FACE, edgecolor=IDLE_EDGE, hatch="////", label="idle"))
    return handles


def _draw_bubble_boxes(ax, idle_x0: list, idle_x1: list, idle_y: list, boxes: dict, scale: float,
                       px_per_s: float) -> None:
    """Idle slots hatched grey under the action boxes, one PolyCollection per (phase, chunk parity)."""
    if idle_x0:
        ax.add_collection(PolyCollection(
            _boxes(np.array(idle_x0) * scale, np.array(idle_x1) * scale, idle_y, 0.8),
            facecolors=IDLE_FACE, edgecolors=IDLE_EDGE, hatch="////", linewidths=0.0, zorder=1))
    # White box outlines separate neighbouring actions, unless boxes are too narrow to show fill.
    widths = np.concatenate([np.subtract(g[1], g[0]) for g in boxes.values()] or [np.zeros(1)])
    edge_lw = 0.4 if np.median(widths) * px_per_s >= 8.0 else 0.0
    for (phase, odd), (x0, x1, y) in sorted(boxes.items()):
        colour = ACTION_COLOURS.get(phase, "#bdbdbd")
        ax.add_collection(PolyCollection(
            _boxes(np.array(x0) * scale, np.array(x1) * scale, y, 0.8),
            facecolors=[_mix(colour, "white", 0.3 * odd)], edgecolors="white",
            linewidths=edge_lw, zorder=2))
