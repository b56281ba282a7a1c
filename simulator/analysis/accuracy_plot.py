"""Predicted-vs-measured scatter of `simulator validate` (log-log, with the ±10% and ±20% bands)."""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure


def plot_predicted_vs_measured(results: list[dict], path: str | Path) -> Path:
    fig = Figure(figsize=(6.5, 6))
    ax = fig.add_subplot()
    meas = [r["measured_s"] for r in results]
    pred = [r["predicted_s"] for r in results]
    lo, hi = min(meas + pred) * 0.7, max(meas + pred) * 1.4
    ax.plot([lo, hi], [lo, hi], color="black", lw=1, label="exact")
    for band, style in ((0.1, "--"), (0.2, ":")):
        ax.plot([lo, hi], [lo * (1 + band), hi * (1 + band)], style, color="grey", lw=0.8, label=f"±{band:.0%}")
        ax.plot([lo, hi], [lo * (1 - band), hi * (1 - band)], style, color="grey", lw=0.8)
    gpus = sorted({r["name"].endswith("h100") for r in results})
    for is_h100 in gpus:
        sel = [r for r in results if r["name"].endswith("h100") == is_h100]
        ax.scatter([r["measured_s"] for r in sel], [r["predicted_s"] for r in sel], s=28, zorder=3,
                   label="H100 runs" if is_h100 else "A100 runs")
    for r in results:
        ax.annotate(r["name"], (r["measured_s"], r["predicted_s"]), fontsize=6, xytext=(3, -3),
                    textcoords="offset points")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured iteration time (s)",
           ylabel="predicted iteration time (s)", title="simulator validate: published runs")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    return Path(path)
