"""What a goodput simulation means: the checkpoint size of a scenario (the memory accounting's model
state), the spread of a run's figures over seeds, the optimum of a checkpoint-interval sweep, the
goodput.json / goodput.md / console summaries of ``simulator goodput`` and its two charts (progress
over days with the interruptions marked; the interval sweep against Young/Daly), rendered by Agg.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ..engine.goodput_sim import BREAKDOWN_KEYS, GoodputRun
from ..reliability import SECONDS_PER_DAY
from ..scenario import Scenario
from .memory import model_state_bytes, optimizer_bytes_per_param


def checkpoint_bytes(scn: Scenario) -> float:
    """Bytes of one full checkpoint: the weights in the training precision and the optimizer state
    (master weights and Adam moments, 2 + 12 bytes per parameter for bf16 Adam with fp32 state), counted once over
    the data-parallel replicas (each shard is written by one rank) and without gradients: the model
    state of memory.model_state_bytes on an unsharded rank holding every parameter."""
    t = scn.training
    state = model_state_bytes(scn.model.num_params(), 0, 1, t.dtype_bytes, t.grad_dtype_bytes,
                              optimizer_bytes_per_param=optimizer_bytes_per_param(t))
    return state["params"] + state["optimizer"]


def spread(values) -> dict:
    """Mean, standard deviation, min and max over seeds."""
    a = np.asarray(list(values), dtype=float)
    if a.size == 0:
        return {"mean": None, "std": None, "min": None, "max": None}
    return {"mean": float(a.mean()), "std": float(a.std()), "min": float(a.min()), "max": float(a.max())}


def summarize_runs(runs: list[GoodputRun], tokens_per_step: float) -> dict:
    """Figures of the runs of several seeds: goodput, effective training time, interruptions per day,
    by cause and by component (mean count per run), where the wall time went, days and tokens."""
    n = len(runs)
    by_cause: Counter = Counter()
    by_component: Counter = Counter()
    for r in runs:
        by_cause.update(i.cause for i in r.interruptions)
        by_component.update(i.component for i in r.interruptions)
    return {
        "seeds": n,
        "goodput": spread(r.goodput for r in runs),
        "effective_training_fraction": spread(r.effective_training_fraction for r in runs),
        "interruptions_per_day": spread(len(r.interruptions) / (r.wall_s / SECONDS_PER_DAY) for r in runs),
        "unexpected_interruptions_per_day": spread(
            sum(i.component != "planned" for i in r.interruptions) / (r.wall_s / SECONDS_PER_DAY) for r in runs),
        "days": spread(r.wall_s / SECONDS_PER_DAY for r in runs),
        "tokens": spread(r.steps * tokens_per_step for r in runs),
        "reached_target": all(r.reached_target for r in runs),
        "checkpoints": spread(r.checkpoints for r in runs),
        "lost_steps_per_interruption": spread(
            float(np.mean([i.lost_steps for i in r.interruptions])) if r.interruptions else 0.0 for r in runs),
        "breakdown_fraction": {k: float(np.mean([r.breakdown_s[k] / r.wall_s for r in runs])) for k in BREAKDOWN_KEYS},
        "interruptions_by_cause": {k: v / n for k, v in by_cause.most_common()},
        "interruptions_by_component": {k: v / n for k, v in by_component.most_common()},
    }


def sweep_optimum(rows: list[dict]) -> float | None:
    """Interval (s) of the best mean goodput of a sweep, refined by a parabola in log(interval) through
    the best point and its neighbours; None when the best point is at an end of the sweep."""
    if len(rows) < 3:
        return None
    g = [r["goodput"]["mean"] for r in rows]
    i = int(np.argmax(g))
    if i in (0, len(rows) - 1):
        return None
    x = np.log([rows[j]["interval_s"] for j in (i - 1, i, i + 1)])
    a, b, _ = np.polyfit(x, [g[j] for j in (i - 1, i, i + 1)], 2)
    if a >= 0:
        return rows[i]["interval_s"]
    return float(math.exp(min(max(-b / (2 * a), x[0]), x[2])))


def _fmt(s: dict, scale: float = 1.0, digits: int = 2, unit: str = "") -> str:
    if s["mean"] is None:
        return "-"
    m, lo, hi = (s[k] * scale for k in ("mean", "min", "max"))
    return f"{m:.{digits}f}{unit} (min {lo:.{digits}f}, max {hi:.{digits}f})"


def format_summary(data: dict) -> str:
    """The console summary of ``simulator goodput``."""
    s, c = data["summary"], data["checkpoint"]
    lines = [f"{data['scenario']}: {data['num_gpus']} GPUs, step {data['step_time_s']:.3f} s, "
             f"{data['tokens_per_step'] / 1e6:.2f}M tokens/step, {s['seeds']} seed(s)",
             f"checkpoint {c['bytes'] / 1e12:.2f} TB, write {c['write_s']:.1f} s ({c['mode']}), read "
             f"{c['read_s']:.1f} s, " + (f"every {c['interval_steps']} steps ({c['interval_s']:.0f} s; Young "
                                         f"{c['young_interval_s']:.0f} s, Daly {c['daly_interval_s']:.0f} s)"
                                         if c["interval_steps"] else "never (nothing fails)"),
             f"goodput                {_fmt(s['goodput'], 100, 1, '%')}",
             f"effective training     {_fmt(s['effective_training_fraction'], 100, 1, '%')}",
             f"interruptions per day  {_fmt(s['interruptions_per_day'])} (unexpected "
             f"{s['unexpected_interruptions_per_day']['mean']:.2f})",
             f"wall days              {_fmt(s['days'])}" + ("" if s["reached_target"] or data.get("target_tokens")
                                                            is None else "  (target NOT reached)"),
             f"tokens trained         {_fmt(s['tokens'], 1e-12, 3, 'T')}",
             "where the time goes    " + ", ".join(f"{k} {v * 100:.1f}%" for k, v in s["breakdown_fraction"].items()),
             "by component (per run) " + ", ".join(f"{k} {v:.1f}" for k, v in s["interruptions_by_component"].items())]
    if data.get("closed_form_goodput") is not None:
        lines.append(f"closed form (Daly 2006, no stragglers/spares/planned): goodput "
                     f"{data['closed_form_goodput'] * 100:.1f}%")
    if data.get("sweep"):
        opt = data.get("sweep_optimum_interval_s")
        lines.append("checkpoint interval sweep: " + ", ".join(
            f"{r['interval_s']:.0f}s {r['goodput']['mean'] * 100:.2f}%" for r in data["sweep"]))
        lines.append(f"sweep optimum {opt:.0f} s vs Young {c['young_interval_s']:.0f} s"
                     if opt else "sweep optimum at an end of the sweep")
    return "\n".join(lines)


def goodput_markdown(data: dict, images: list[str]) -> str:
    """report: the summary as a fenced block, the interruptions by cause, the charts."""
    s = data["summary"]
    rows = "\n".join(f"| {k} | {v:.2f} |" for k, v in s["interruptions_by_cause"].items())
    pics = "\n\n".join(f"![{p}]({p})" for p in images)
    return (f"# Goodput: {data['scenario']}\n\n```\n{format_summary(data)}\n```\n\n"
            f"## Interruptions by cause (mean per run)\n\n| cause | count |\n|---|---:|\n{rows}\n\n"
            f"Failure data: {data['failures']['source']}\n\n{pics}\n")


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
