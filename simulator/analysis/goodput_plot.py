"""Charts of ``simulator goodput``: training progress over wall-clock days with every interruption
marked by its component, and the checkpoint-interval sweep against the Young/Daly optimum.
Figures are ``matplotlib.figure.Figure`` objects rendered by Agg (no pyplot state).
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ..engine.goodput_sim import GoodputRun

SECONDS_PER_DAY = 86400.0
# One colour per component class (matplotlib's "tab10" palette).
COMPONENT_COLORS = {"gpu": "tab:red", "hbm": "tab:orange", "network": "tab:blue", "host": "tab:brown",
                    "software": "tab:purple", "planned": "tab:gray"}


def plot_progress(runs: list[GoodputRun], tokens_per_step: float, path: str | Path, title: str = "",
                  ideal_tokens_per_s: float | None = None) -> Path:
    """Tokens trained against days for each seed (the first drawn bold), the first seed's interruptions
    as ticks coloured by component, and the failure-free line for comparison."""
    fig = Figure(figsize=(10, 5))
    ax = fig.add_subplot(1, 1, 1)
    for k, run in enumerate(runs):
        t = [p[0] / SECONDS_PER_DAY for p in run.progress]
        y = [p[1] * tokens_per_step / 1e12 for p in run.progress]
        ax.plot(t, y, color="black" if k == 0 else "0.6", lw=1.2 if k == 0 else 0.6,
                label=f"seed {run.seed}" if k < 2 else None, zorder=3 if k == 0 else 2)
    end = max(r.wall_s for r in runs) / SECONDS_PER_DAY if runs else 1.0
    if ideal_tokens_per_s:
        ax.plot([0, end], [0, ideal_tokens_per_s * end * SECONDS_PER_DAY / 1e12], ls="--", color="tab:green",
                lw=1, label="no failures, no checkpoints, no stragglers")
    if runs:
        top = max(p[1] for p in runs[0].progress) * tokens_per_step / 1e12 or 1.0
        for i in runs[0].interruptions:
            ax.plot([i.time_s / SECONDS_PER_DAY] * 2, [0, top * 0.03], color=COMPONENT_COLORS.get(i.component, "k"),
                    lw=0.8, zorder=4)
    handles, labels = ax.get_legend_handles_labels()
    used = sorted({i.component for i in runs[0].interruptions}) if runs else []
    handles += [Line2D([], [], color=COMPONENT_COLORS.get(c, "k"), lw=2) for c in used]
    labels += [f"interruption: {c}" for c in used]
    ax.legend(handles, labels, loc="upper left", fontsize=8)
    ax.set_xlabel("wall-clock days")
    ax.set_ylabel("tokens trained (T)")
    ax.set_title(title or "training progress")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    return out


def plot_sweep(rows: list[dict], young_s: float, daly_s: float, optimum_s: float | None, path: str | Path,
               title: str = "") -> Path:
    """Mean goodput (min-max band over seeds) against the checkpoint interval, log scale, with the
    Young and Daly intervals and the sweep's own optimum."""
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot(1, 1, 1)
    x = [r["interval_s"] for r in rows]
    ax.fill_between(x, [r["goodput"]["min"] * 100 for r in rows], [r["goodput"]["max"] * 100 for r in rows],
                    color="tab:blue", alpha=0.2, label="min-max over seeds")
    ax.plot(x, [r["goodput"]["mean"] * 100 for r in rows], "o-", color="tab:blue", label="simulated goodput")
    ax.axvline(young_s, color="tab:red", ls="--", lw=1, label=f"Young sqrt(2CM) = {young_s:.0f} s")
    ax.axvline(daly_s, color="tab:orange", ls=":", lw=1, label=f"Daly = {daly_s:.0f} s")
    if optimum_s:
        ax.axvline(optimum_s, color="black", lw=1, label=f"sweep optimum = {optimum_s:.0f} s")
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval (s of compute)")
    ax.set_ylabel("goodput (%)")
    ax.set_title(title or "checkpoint interval sweep")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    return out
