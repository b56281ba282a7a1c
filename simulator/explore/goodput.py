"""``simulator goodput SCENARIO.toml [--days D | --tokens T] [--seeds N]``: the goodput of a whole
training run. The scenario's simulated step time, its checkpoint size (model state) and its
``[reliability]`` settings become a GoodputConfig; engine/goodput_sim runs it for each seed, and a
sweep of checkpoint intervals around the Young/Daly optimum shows where the best one lies.
Results go to results/<name>/ (goodput.json, goodput.md, goodput_progress.png, goodput_sweep.png).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from ..analysis.goodput import (checkpoint_bytes, format_summary, goodput_markdown, plot_progress, plot_sweep,
                                summarize_runs, sweep_optimum)
from ..engine.goodput_sim import GoodputConfig, GoodputRun, simulate_goodput
from ..reliability import (FLEETS, SECONDS_PER_DAY, SECONDS_PER_HOUR, cause_rates, daly_interval_s,
                           expected_goodput, unexpected_rate_per_s, young_interval_s)
from ..scenario import Scenario
from ..units import GB

# Checkpoint intervals of the sweep, as multiples of the Young/Daly optimum (log-spaced, x4 either side).
SWEEP_FACTORS = (0.25, 0.35, 0.5, 0.7, 1.0, 1.4, 2.0, 2.8, 4.0)
MAX_DAYS = 3650.0  # a --tokens run that has not reached its target after ten years stops
MAX_SEEDS = 1000
# bounds on one run's size, far beyond real runs (``_check_run_size``), that keep the simulation finite
MAX_STEPS = 1e9
MAX_FAILURES = 1e6
NO_CHECKPOINTS = 1 << 62  # the interval when nothing fails and none is set: the run never checkpoints


def tokens_per_step(scn: Scenario) -> float:
    return float(scn.training.global_batch_size * scn.model.seq_length)


def checkpoint_costs(scn: Scenario) -> dict:
    """Checkpoint bytes and the seconds to write, read, and (async) snapshot them: writes and reads at the
    storage's aggregate bandwidth; the asynchronous snapshot copies each GPU's share over its PCIe link."""
    r, c = scn.reliability, scn.cluster
    size = checkpoint_bytes(scn)
    return {"bytes": size, "write_s": size / (r.storage_write_GBps * GB), "read_s": size / (r.storage_read_GBps * GB),
            "block_s": size / c.num_gpus / c.pcie_bandwidth_Bps, "mode": r.checkpoint_mode}


def build_config(scn: Scenario, step_s: float) -> tuple[GoodputConfig, dict]:
    """The run's settings and the closed-form figures (MTBF, Young and Daly intervals) they imply."""
    r = scn.reliability
    costs = checkpoint_costs(scn)
    rates = cause_rates(r, scn.cluster)
    lam = unexpected_rate_per_s(rates)
    asynchronous = r.checkpoint_mode == "async"
    overhead_s = costs["block_s"] + r.async_step_slowdown * costs["write_s"] if asynchronous else costs["write_s"]
    mtbf_s = 1.0 / lam if lam > 0 else math.inf
    young = young_interval_s(overhead_s, mtbf_s) if lam > 0 else math.inf
    daly = daly_interval_s(overhead_s, mtbf_s) if lam > 0 else math.inf
    optimum = max(1, round(young / step_s)) if math.isfinite(young) else None
    interval = r.checkpoint_interval_steps or optimum or NO_CHECKPOINTS  # no failures: no reason to save
    cfg = GoodputConfig(step_s=step_s, interval_steps=max(1, interval), checkpoint_write_s=costs["write_s"],
                        checkpoint_read_s=costs["read_s"], causes=rates, asynchronous=asynchronous,
                        checkpoint_block_s=costs["block_s"], async_step_slowdown=r.async_step_slowdown,
                        detection_s=r.detection_s, reschedule_s=r.reschedule_s, warmup_s=r.warmup_s,
                        hot_spares=r.hot_spares, spare_repair_s=r.spare_repair_h * SECONDS_PER_HOUR,
                        straggler_jitter=r.straggler_jitter, straggler_probability=r.straggler_probability,
                        straggler_slowdown=r.straggler_slowdown)
    unexpected = [c for c in rates if not c.graceful]
    replace_share = sum(c.rate_per_s for c in unexpected if c.replace_node) / lam if lam > 0 else 0.0
    restart_s = r.detection_s + replace_share * r.reschedule_s + r.warmup_s + costs["read_s"]
    info = {"costs": costs, "mtbf_s": mtbf_s, "young_s": young, "daly_s": daly, "optimum_steps": optimum,
            "overhead_s": overhead_s, "restart_s": restart_s, "rate_per_s": lam,
            "planned_per_day": sum(c.rate_per_s for c in rates if c.graceful) * SECONDS_PER_DAY}
    return cfg, info


def run_seeds(cfg: GoodputConfig, seeds: int, horizon_s: float | None, target_steps: int | None) -> list[GoodputRun]:
    return [simulate_goodput(cfg, seed, horizon_s, target_steps) for seed in range(seeds)]


def sweep_intervals(cfg: GoodputConfig, optimum_steps: int, seeds: int, horizon_s: float) -> list[dict]:
    """Mean goodput (and its spread over seeds) for intervals around the optimum; the same seeds at every
    interval, so every point meets the same failure times (common random numbers)."""
    steps = sorted({max(1, round(f * optimum_steps)) for f in SWEEP_FACTORS})
    rows = []
    for k in steps:
        runs = run_seeds(replace(cfg, interval_steps=k), seeds, horizon_s, None)
        s = summarize_runs(runs, 1.0)
        rows.append({"interval_steps": k, "interval_s": k * cfg.step_s, "goodput": s["goodput"],
                     "effective_training_fraction": s["effective_training_fraction"]})
    return rows


def simulate_step_s(scn: Scenario) -> float:
    from ..pipeline import simulate_metrics
    return float(simulate_metrics(scn)["iteration_time_s"])


def run_goodput(scn: Scenario, step_s: float, days: float | None, tokens: float | None, seeds: int,
                sweep_seeds: int) -> tuple[dict, list[GoodputRun], list[dict]]:
    """Everything ``simulator goodput`` reports, as a JSON-ready dict, with the runs and the sweep rows."""
    for name, v in (("--days", days), ("--tokens", tokens), ("--step-time-s", step_s)):
        if v is not None and not (v > 0 and math.isfinite(v)):
            raise ValueError(f"goodput: {name} must be a positive number, got {v}")
    if not 1 <= seeds <= MAX_SEEDS:
        raise ValueError(f"goodput: --seeds must be 1..{MAX_SEEDS}, got {seeds}")
    if days is not None and days > MAX_DAYS:
        raise ValueError(f"goodput: --days must be at most {MAX_DAYS:g} (ten years), got {days:g}")
    cfg, info = build_config(scn, step_s)
    per_step = tokens_per_step(scn)
    target = math.ceil(tokens / per_step) if tokens is not None else None
    horizon = days * SECONDS_PER_DAY if days is not None else (MAX_DAYS * SECONDS_PER_DAY if target else None)
    _check_run_size(horizon or MAX_DAYS * SECONDS_PER_DAY, step_s, info["rate_per_s"])
    runs = run_seeds(cfg, seeds, horizon, target)
    summary = summarize_runs(runs, per_step)
    rows = []
    if sweep_seeds and info["optimum_steps"]:
        rows = sweep_intervals(cfg, info["optimum_steps"], sweep_seeds, summary["days"]["mean"] * SECONDS_PER_DAY)
    costs = info["costs"]
    fleet = FLEETS[scn.reliability.failure_data]
    data = {
        "scenario": scn.name, "num_gpus": scn.num_gpus, "step_time_s": step_s, "tokens_per_step": per_step,
        "horizon_days": days, "target_tokens": tokens,
        "checkpoint": {**costs, **_interval(cfg.interval_steps, step_s),
                       "young_interval_s": info["young_s"], "daly_interval_s": info["daly_s"]},
        "failures": {"source": fleet.source if fleet else "none", "mtbf_s": info["mtbf_s"],
                     "expected_unexpected_per_day": info["rate_per_s"] * SECONDS_PER_DAY,
                     "expected_planned_per_day": info["planned_per_day"], "mean_restart_s": info["restart_s"]},
        "closed_form_goodput": expected_goodput(cfg.interval_steps * step_s, info["overhead_s"], info["restart_s"],
                                                info["rate_per_s"]),
        "summary": summary, "sweep": rows, "sweep_optimum_interval_s": sweep_optimum(rows),
    }
    return data, runs, rows


def _check_run_size(horizon_s: float, step_s: float, failures_per_s: float) -> None:
    """Refuse a run whose simulation would not end: more steps or failures than any real run has (the
    Llama 3 405B run: ~0.7 M steps and 466 interruptions in 54 days)."""
    steps, failures = horizon_s / step_s, horizon_s * failures_per_s
    if steps > MAX_STEPS:
        raise ValueError(f"goodput: {steps:.3g} steps of {step_s:g} s in {horizon_s / SECONDS_PER_DAY:g} days; at most "
                         f"{MAX_STEPS:g} (raise --step-time-s or lower --days / --tokens)")
    if failures > MAX_FAILURES:
        raise ValueError(f"goodput: {failures:.3g} expected failures in {horizon_s / SECONDS_PER_DAY:g} days; at most "
                         f"{MAX_FAILURES:g} (check reliability.failure_rate_scale)")


def write_goodput_results(out: Path, data: dict, runs: list[GoodputRun]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "goodput.json").write_text(json.dumps(_finite(data), indent=2) + "\n")
    images = ["goodput_progress.png"]
    plot_progress(runs, data["tokens_per_step"], out / images[0], title=f"{data['scenario']}: training progress",
                  ideal_tokens_per_s=data["tokens_per_step"] / data["step_time_s"])
    if data["sweep"]:
        images.append("goodput_sweep.png")
        c = data["checkpoint"]
        plot_sweep(data["sweep"], c["young_interval_s"], c["daly_interval_s"], data["sweep_optimum_interval_s"],
                   out / images[1], title=f"{data['scenario']}: checkpoint interval")
    (out / "goodput.md").write_text(goodput_markdown(data, images))
    return out


def _interval(steps: int, step_s: float) -> dict:
    if steps >= NO_CHECKPOINTS:
        return {"interval_steps": None, "interval_s": None}
    return {"interval_steps": steps, "interval_s": steps * step_s}


def _finite(x):
    """JSON has no infinity: an infinite MTBF or interval (no failures) is written as null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


def goodput_command(args) -> int:
    from ..scenario import load_scenario
    scn = load_scenario(args.scenario, args.set)
    step_s = args.step_time_s if args.step_time_s is not None else simulate_step_s(scn)
    days = args.days if args.days is not None or args.tokens is not None else DEFAULT_DAYS
    data, runs, _ = run_goodput(scn, step_s, days, args.tokens, args.seeds, 0 if args.no_sweep else args.seeds)
    out = Path(args.out) if args.out else Path("results") / scn.name
    write_goodput_results(out, data, runs)
    if args.json:
        print(json.dumps(_finite(data)))
    else:
        print(format_summary(data))
        print(f"results written to {out}/")
    return 0


DEFAULT_DAYS = 54.0  # without --days or --tokens: the length of the Llama 3 failure snapshot
