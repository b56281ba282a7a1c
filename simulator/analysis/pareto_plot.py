"""The Pareto chart of a plan search or sweep: throughput against peak memory per GPU, the front of
plans that no other plan beats on both, written as PNG.

Figures are ``matplotlib.figure.Figure`` objects rendered by Agg, never pyplot (no global state).
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..units import GiB


def _save(fig: Figure, path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(out, dpi=120)
    return out


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points (memory, throughput) that no other point beats on both: less or equal
    memory and more or equal throughput, one of them strictly. Sorted by memory."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], float("-inf")
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def plot_pareto(rows: list[dict], path: str | Path, capacity_bytes: float = 0.0,
                title: str = "plans: throughput vs peak memory") -> Path:
    """Scatter of simulated plans (tokens/s against peak memory per GPU), the Pareto front joined and
    labelled, the GPU capacity as a vertical line. ``rows``: search/sweep CSV rows with status "ok"."""
    ok = [r for r in rows if r.get("status") == "ok"]
    fig = Figure(figsize=(8.0, 5.5))
    ax = fig.add_subplot()
    if ok:
        pts = [(r["memory_total_bytes"] / GiB, r["tokens_per_s"]) for r in ok]
        fits = [bool(r.get("fits_in_memory", True)) for r in ok]
        ax.scatter([p[0] for p, f in zip(pts, fits) if f], [p[1] for p, f in zip(pts, fits) if f], s=14,
                   color="#9ecae1", label="plan")
        if not all(fits):
            ax.scatter([p[0] for p, f in zip(pts, fits) if not f], [p[1] for p, f in zip(pts, fits) if not f],
                       s=14, marker="x", color="#d62728", label="does not fit")
        front = pareto_front(pts)
        ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], "-o", color="#08519c", ms=5,
                label="Pareto front")
        for i in front:
            ax.annotate(ok[i].get("label", ""), pts[i], textcoords="offset points", xytext=(4, 4), fontsize=6)
        if capacity_bytes:
            ax.axvline(capacity_bytes / GiB, color="#d62728", ls="--", lw=1, label="GPU memory")
        ax.legend(loc="lower right")
    else:
        ax.text(0.5, 0.5, "no plan was simulated", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel("tokens per second")
    ax.set_title(title)
    fig.tight_layout()
    return _save(fig, path)
