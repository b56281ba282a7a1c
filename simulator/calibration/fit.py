"""``calibrate fit``: calibration tables from the user's own torch.profiler traces, without torch.

Each trace's rank is placed on its pipeline stage's simulated rank; its kernels are matched to that
rank's ops (``calibration/matching``: annotation, shapes, order). The kernels of one execution of one
op add up to that op's measured time; the median over executions is the op's row in ``kernels.csv``,
the format ``calibrate profile`` writes, so ``[cost] compute = "calibrated"`` replays the measured
kernels exactly. Per OpWork kind and pass the achieved rate (FLOPs or bytes over seconds, summed over
every matched execution) goes to ``efficiencies.csv``: it prices the shapes the trace did not run, i.e.
other plans on the same hardware. Matched NCCL kernels give ``collectives.csv`` rows (size and group
from the simulated collective, time from the kernel, which includes waiting for the slowest peer).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from statistics import median

from ..cost.calibrated import COMPUTE_KINDS, CollectiveRow, KernelRow, RateRow, work_pass
from ..cost.collectives import busbw_factor
from ..hardware.gpus import GPUSpec
from ..scenario import Scenario
from ..strategy.lower import LoweredPlan, lower
from .compare import COVERAGE_WARN, PHASE_AS_MEASURED, comm_ops_of, measured_steps, sim_rank_of
from .kineto import parse_kineto
from .matching import SimOp, coverage, coverage_fraction, kind_category, match_step, nccl_op
from .profile import pass_of


@dataclass
class FitResult:
    rows: list[KernelRow]
    rates: list[RateRow]
    collectives: list[CollectiveRow]
    classes: dict[str, dict]  # kernel class -> kernels, matched, time_s, matched_s, instances
    coverage: float
    traces: list[dict] = field(default_factory=list)


def program_ops(plan: LoweredPlan, rank: int) -> list[SimOp]:
    """The simulated rank's ops in program order, untimed (no simulation needed to match them)."""
    return [SimOp(w.name, w.kind, PHASE_AS_MEASURED.get(t.phase, t.phase), t.microbatch, t.layer, 0.0, 0.0, w,
                  pass_of(w, t.phase))
            for t in plan.graph.tasks if t.rank == rank and t.kind == "compute" for w in t.work]


class _Acc:
    """What the matched kernels of every trace add up to."""

    def __init__(self) -> None:
        self.instances: dict[tuple, list] = {}  # (trace, step, instance) -> [SimOp, seconds]
        self.comm: dict[tuple[str, int, float], list[float]] = {}  # (op, ranks, bytes) -> seconds
        self.cover: dict[str, dict] = {}

    def add_cover(self, per_class: dict[str, dict]) -> None:
        for c, v in per_class.items():
            acc = self.cover.setdefault(c, {"kernels": 0, "matched": 0, "time_s": 0.0, "matched_s": 0.0})
            for f in acc:
                acc[f] += v[f]


def _fit_trace(path: str, plan: LoweredPlan, acc: _Acc) -> dict:
    run = parse_kineto(path)
    steps = measured_steps(run)
    if not steps:
        raise ValueError(f"{path}: no kernels inside a profiler step")
    measured_rank = min(o.rank for ops in steps.values() for o in ops)
    steps = measured_steps(run, measured_rank)
    rank, placement = sim_rank_of(plan, measured_rank)
    sim = program_ops(plan, rank)
    colls = [t.comm for t in plan.graph.tasks if t.rank == rank and t.comm is not None and t.comm.axis != "host"]
    comm_ops = comm_ops_of(plan.graph, rank)
    before = {c: dict(v) for c, v in acc.cover.items()}
    for k, ops in sorted(steps.items()):
        matches = match_step(ops, sim, comm_ops)
        seen: dict[str, int] = {}
        for o, m in zip(ops, matches):
            if m is None:
                continue
            if m.sim is not None:
                acc.instances.setdefault((path, k) + m.instance, [m.sim, 0.0])[1] += o.duration_s
                continue
            op = nccl_op(o.name) or nccl_op(o.annotation) or nccl_op(o.op)
            same = [c for c in colls if c.op == op]
            if op is not None and same:
                c = same[seen.get(op, 0) % len(same)]
                seen[op] = seen.get(op, 0) + 1
                acc.comm.setdefault((op, len(c.group), c.size_bytes), []).append(o.duration_s)
        acc.add_cover(coverage(ops, matches))
    mine = {c: {f: v[f] - before.get(c, {}).get(f, 0) for f in v} for c, v in acc.cover.items()}
    return {"trace": str(path), "device": run.metadata.get("device", ""), "measured_rank": measured_rank,
            "placement": placement, "steps": sorted(steps), "coverage": coverage_fraction(mine),
            "record_shapes": run.metadata.get("record_shapes", False)}


def _amount(work) -> tuple[float, str]:
    if work.kind in COMPUTE_KINDS and work.flops > 0:
        return work.flops, "FLOP/s"
    return work.bytes, "B/s"


def _rows(acc: _Acc, dtype: str) -> list[KernelRow]:
    per_spec: dict[tuple, list[float]] = {}
    for s, t in acc.instances.values():
        w = s.work
        per_spec.setdefault((w.kind, w.name, s.pass_, tuple(w.shape), w.flops, w.bytes), []).append(t)
    return [KernelRow(kind, name, p, dtype, tuple(int(d) for d in shape), float(flops), float(nbytes),
                      median(ts), len(ts))
            for (kind, name, p, shape, flops, nbytes), ts in sorted(per_spec.items()) if median(ts) > 0 and shape]


def _rates(acc: _Acc, dtype: str, gpu: GPUSpec) -> list[RateRow]:
    sums: dict[tuple[str, str], list] = {}
    for s, t in acc.instances.values():
        amount, unit = _amount(s.work)
        if amount <= 0 or t <= 0:
            continue
        x = sums.setdefault((s.work.kind, work_pass(s.work)), [0.0, 0.0, 0, unit])
        x[0], x[1], x[2] = x[0] + amount, x[1] + t, x[2] + 1
    out = []
    for (kind, p), (amount, t, n, unit) in sorted(sums.items()):
        peak = gpu.peak(dtype) if unit == "FLOP/s" else gpu.hbm_bandwidth_Bps
        out.append(RateRow(kind, p, dtype, amount / t, unit, amount / t / peak, n))
    return out


def _collective_rows(acc: _Acc) -> list[CollectiveRow]:
    out = []
    for (op, n, size), ts in sorted(acc.comm.items()):
        t = median(ts)
        if t > 0 and size > 0:
            out.append(CollectiveRow(op, n, float(size), t, size / t, size / t * busbw_factor(op, n), len(ts)))
    return out


def fit_traces(paths: list[str], scn: Scenario) -> FitResult:
    """Match every trace to the scenario and derive its tables; ValueError (one line) when less than
    COVERAGE_WARN of the measured kernel time matched the scenario's ops."""
    plan = lower(scn)
    acc = _Acc()
    traces = [_fit_trace(p, plan, acc) for p in paths]
    cov = coverage_fraction(acc.cover)
    counts = ", ".join(f"{c} {v['matched']}/{v['kernels']}" for c, v in sorted(acc.cover.items()))
    if cov < COVERAGE_WARN or not acc.instances:
        raise ValueError(f"only {cov:.1%} of the traces' kernel time matches scenario {scn.name}'s ops ({counts}); "
                         f"fit needs {COVERAGE_WARN:.0%}: are these traces of this scenario's model and plan?")
    for s, _ in acc.instances.values():
        c = acc.cover.get(kind_category(s.kind))
        if c is not None:
            c["instances"] = c.get("instances", 0) + 1
    dtype = scn.training.dtype
    return FitResult(_rows(acc, dtype), _rates(acc, dtype, scn.cluster.gpu), _collective_rows(acc),
                     {c: acc.cover[c] for c in sorted(acc.cover)}, cov, traces)


def provenance(fit: FitResult, scn: Scenario, command: str) -> dict:
    first = fit.traces[0]
    return {"source": "calibrate fit (kernels of real torch.profiler traces matched to the scenario's ops)",
            "device": first["device"], "traces": " ".join(t["trace"] for t in fit.traces),
            "placement": "; ".join(t["placement"] for t in fit.traces), "scenario": scn.name,
            "dtype": scn.training.dtype, "coverage": f"{fit.coverage:.1%}",
            "matched": ", ".join(f"{c} {v['matched']}/{v['kernels']}" for c, v in fit.classes.items()),
            "timing": "median over the matched executions of each op (kernel durations summed per execution)",
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "command": command}


def report_lines(fit: FitResult) -> list[str]:
    """Per kernel class: matched kernels; per kind and pass: the achieved rate."""
    lines = [f"match coverage: {fit.coverage:.1%} of the measured kernel time"]
    for c, v in fit.classes.items():
        lines.append(f"  {c}: {v['matched']}/{v['kernels']} kernels matched ({v['matched_s'] * 1e3:.3f} of "
                     f"{v['time_s'] * 1e3:.3f} ms), {v.get('instances', 0)} op executions")
    for r in fit.rates:
        scale = 1e12 if r.unit == "FLOP/s" else 1e9
        unit = "TFLOP/s" if r.unit == "FLOP/s" else "GB/s"
        lines.append(f"  {r.kind} {r.pass_}: {r.rate / scale:.3f} {unit} ({r.fraction_of_peak:.1%} of the "
                     f"scenario GPU's peak), {r.instances} executions")
    return lines
