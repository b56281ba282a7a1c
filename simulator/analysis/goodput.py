"""What a goodput simulation means: the checkpoint size of a scenario (the memory accounting's model
state), the spread of a run's figures over seeds, the optimum of a checkpoint-interval sweep, and the
goodput.json / goodput.md / console summaries of ``simulator goodput``.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from ..engine.goodput_sim import BREAKDOWN_KEYS, GoodputRun
from .memory import OPTIMIZER_BYTES_PER_PARAM, model_state_bytes

SECONDS_PER_DAY = 86400.0


def checkpoint_bytes(scn) -> float:
    """Bytes of one full checkpoint: the weights in the training precision and the optimizer state
    (fp32 master weights and Adam moments, 2 + 12 bytes per parameter for bf16 Adam), counted once over
    the data-parallel replicas (each shard is written by one rank) and without gradients: the model
    state of memory.model_state_bytes on an unsharded rank holding every parameter."""
    t = scn.training
    state = model_state_bytes(scn.model.num_params(), 0, 1, t.dtype_bytes, t.grad_dtype_bytes,
                              optimizer_bytes_per_param=OPTIMIZER_BYTES_PER_PARAM[t.optimizer])
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
             f"{c['read_s']:.1f} s, every {c['interval_steps']} steps ({c['interval_s']:.0f} s; Young "
             f"{c['young_interval_s']:.0f} s, Daly {c['daly_interval_s']:.0f} s)",
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
