"""Pictures of many runs at once: predicted against measured iteration time (``validate``) and the
Pareto front of throughput against peak memory (``search`` / ``sweep``), written as PNG.

Figures are ``matplotlib.figure.Figure`` objects rendered by Agg, never pyplot (no global state).
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..units import GiB

# The accuracy target band: every row within +-20 % (README "Accuracy").
ERROR_BAND = 0.20


def _save(fig: Figure, path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(out, dpi=120)
    return out


def plot_validation(rows: list[dict], path: str | Path, title: str = "predicted vs measured") -> Path:
    """Log-log scatter of predicted against measured seconds per iteration, with y = x and a +-20 % band.
    ``rows``: dicts with ``name``, ``measured`` and ``predicted`` (rows without a prediction are skipped)."""
    pts = [(r["measured"], r["predicted"], r["name"]) for r in rows if r.get("predicted") and r.get("measured")]
    fig = Figure(figsize=(6.4, 6.0))
    ax = fig.add_subplot()
    if pts:
        lo = min(min(m, p) for m, p, _ in pts) / 1.5
        hi = max(max(m, p) for m, p, _ in pts) * 1.5
        ax.plot([lo, hi], [lo, hi], color="black", lw=1, label="y = x")
        ax.fill_between([lo, hi], [lo * (1 - ERROR_BAND), hi * (1 - ERROR_BAND)],
                        [lo * (1 + ERROR_BAND), hi * (1 + ERROR_BAND)], color="#cccccc", alpha=0.5,
                        label=f"±{ERROR_BAND:.0%}")
        ax.scatter([m for m, _, _ in pts], [p for _, p, _ in pts], color="#1f77b4", zorder=3)
        for m, p, name in pts:
            ax.annotate(name, (m, p), textcoords="offset points", xytext=(4, -10), fontsize=7)
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.legend(loc="upper left")
    else:
        ax.text(0.5, 0.5, "no row was simulated", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("measured seconds per iteration")
    ax.set_ylabel("predicted seconds per iteration")
    ax.set_title(title)
    fig.tight_layout()
    return _save(fig, path)


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
