"""Measured versus simulated: maps a real profiler trace's kernels onto a scenario's simulated ops and
reports the match coverage first, then per-op times, per-category times and the step-time error.

The trace's rank is placed in the scenario's device mesh: its pipeline stage's simulated representative
is the rank compared against. Steps are delimited on the GPU timeline: step k runs from its first kernel
(or its ``ProfilerStep#k`` GPU annotation) to the start of step k + 1, so that steps whose kernels
overlap on the GPU are not counted twice; the last step ends with its last kernel. Kernels are matched
to ops by ``calibration/matching`` (annotation, shape, order).
"""

from __future__ import annotations

from statistics import median
from typing import TYPE_CHECKING

from ..analysis.bubbles import merge_intervals
from ..cost.compute import RooflineCompute
from ..trace import Trace, TraceEvent
from .kineto import KinetoRun, MeasuredOp, parse_annotation
from .matching import (COMMUNICATION, UNANNOTATED, SimOp, coverage, coverage_fraction, kind_category,
                       match_step)
from .profile import pass_of

if TYPE_CHECKING:  # type-only: the lowering and the simulation load where a command runs them (cli)
    from ..pipeline import RunResult
    from ..strategy.lower import LoweredPlan
    from ..tasks import TaskGraph

# Below this fraction of the measured kernel time matched to the scenario's ops, the trace does not run
# the scenario's model and the step-time error compares different work: compare warns. One half: most
# of the time must be the scenario's kernels for the error to say something about them.
COVERAGE_WARN = 0.5
# Simulated phases as a profiler sees them: weight gradients and recomputation run inside backward.
PHASE_AS_MEASURED = {"F": "F", "B": "B", "W": "B", "R": "B", "O": "O", "": ""}
__all__ = ["COVERAGE_WARN", "COMMUNICATION", "UNANNOTATED", "SimOp", "kind_category", "simulated_ops",
           "simulated_op_trace", "measured_steps", "step_periods", "sim_rank_of", "compare_run",
           "comparison_markdown"]


def simulated_ops(result: RunResult, rank: int | None = None) -> tuple[int, list[SimOp]]:
    """(rank, ops): every OpWork of one simulated rank's compute tasks, timed within its task in
    proportion to the cost model's time for it (tables where measured, else the roofline)."""
    scn, graph, sim = result.scenario, result.graph, result.sim
    rank = rank if rank is not None and rank in graph.ranks else graph.ranks[0]
    tables = getattr(result, "tables", None)
    if tables is None and scn.cost.compute == "calibrated":
        from ..cost.calibrated import CalibrationTables
        tables = CalibrationTables.load(scn.cost.tables)
    roof = RooflineCompute(scn.cluster.gpu, scn.training.dtype, scn.training.attention)
    dtype = scn.training.dtype

    def op_s(w) -> float:
        t = tables.lookup_s(w, dtype) if tables is not None else None
        return roof.op_time_s(w) if t is None else t

    out = []
    for t in graph.tasks:
        if t.rank != rank or t.kind != "compute" or not t.work:
            continue
        times = [op_s(w) for w in t.work]
        clock, span = sim.start_s[t.id], sim.end_s[t.id] - sim.start_s[t.id]
        scale, gap = _placement(times, span)
        for w, x in zip(t.work, times):
            clock += gap
            out.append(SimOp(w.name, w.kind, PHASE_AS_MEASURED.get(t.phase, t.phase), t.microbatch, t.layer,
                             clock, clock + x * scale, w, pass_of(w, t.phase)))
            clock += x * scale
    return rank, out


def _placement(times: list[float], span_s: float) -> tuple[float, float]:
    """(scale of each op's time, idle gap before each op) that lay a task's ops over its simulated
    span: ops at their own times with the GPU waiting for the host's launches in between when the
    task took longer than its kernels (the eager host floor, cost/compute.with_host_floor_s), else
    scaled to the span."""
    total = sum(times)
    if total <= 0:
        return 0.0, 0.0
    if span_s > total:
        return 1.0, (span_s - total) / len(times)
    return span_s / total, 0.0


def sim_rank_of(plan: LoweredPlan, measured_rank: int) -> tuple[int, str]:
    """The simulated rank of a lowered plan standing for a trace's rank (its pipeline stage's
    representative unless every rank is simulated) and a note saying how it was placed."""
    mesh, graph = plan.mesh, plan.graph
    if not 0 <= measured_rank < mesh.size:
        return graph.ranks[0], (f"trace rank {measured_rank} is outside the scenario's {mesh.size} GPUs; "
                                f"compared with simulated rank {graph.ranks[0]}")
    stage = mesh.stage_of(measured_rank)
    rank = measured_rank if measured_rank in graph.ranks else mesh.representative(stage)
    return rank, f"trace rank {measured_rank} is pipeline stage {stage}: simulated rank {rank}"


def comm_ops_of(graph: TaskGraph, rank: int) -> set[str]:
    """The collectives (tasks ops) the simulated rank runs."""
    return {t.comm.op for t in graph.tasks if t.rank == rank and t.comm is not None}


def simulated_op_trace(result: RunResult, rank: int, ops: list[SimOp]) -> Trace:
    """The simulated rank with compute tasks split into ops (category = kernel class), communication kept."""
    events = [TraceEvent(o.name, kind_category(o.kind), rank, "compute", o.start_s, o.end_s,
                         microbatch=o.microbatch, phase=o.phase, layer=o.layer) for o in ops]
    events += [e for e in result.trace.events if e.rank == rank and not (e.stream == "compute" and e.category in
                                                                          ("compute", "recompute", "optimizer"))]
    events.sort(key=lambda e: (e.start_s, e.stream))
    return Trace(tuple(events), source="simulated", rank_labels={rank: f"rank {rank} (simulated)"},
                 metadata={"scenario": result.scenario.name})


def measured_steps(run: KinetoRun, rank: int | None = None) -> dict[int, list[MeasuredOp]]:
    """Profiler step -> its ops on ``rank`` (all ranks when None); the whole trace is step -1 when it
    has no ProfilerStep annotations."""
    steps: dict[int, list[MeasuredOp]] = {}
    for o in run.ops:
        if (o.step >= 0 or not run.steps) and (rank is None or o.rank == rank):
            steps.setdefault(o.step, []).append(o)
    return steps


def step_periods(run: KinetoRun, steps: dict[int, list[MeasuredOp]]) -> dict[int, tuple[float, float]]:
    """Step -> (start_s, end_s) on the GPU timeline: from the step's GPU annotation or first kernel to
    the next step's start (overlapping steps are cut there), the last step to its last kernel or the end
    of its GPU annotation."""
    starts = {k: min(run.gpu_steps[k][0], min(o.start_s for o in ops)) if k in run.gpu_steps
              else min(o.start_s for o in ops) for k, ops in steps.items()}
    order = sorted(steps, key=lambda k: (starts[k], k))
    out = {}
    for i, k in enumerate(order):
        end = max([o.end_s for o in steps[k]] + ([run.gpu_steps[k][1]] if k in run.gpu_steps else []))
        if i + 1 < len(order):
            end = starts[order[i + 1]]
        out[k] = (starts[k], end)
    return out


def compare_run(run: KinetoRun, result: RunResult) -> dict:
    """Coverage, per-op and per-category rows, the measured and simulated step times and their error."""
    steps = measured_steps(run)
    if not steps:
        raise ValueError(f"{run.metadata.get('source_file', 'trace')}: no kernels inside a profiler step")
    measured_rank = min(o.rank for ops in steps.values() for o in ops)
    steps = measured_steps(run, measured_rank)
    rank, placement = sim_rank_of(result.plan, measured_rank)
    rank, sim = simulated_ops(result, rank)
    comm = comm_ops_of(result.graph, rank)
    periods = step_periods(run, steps)
    meas_op: dict[tuple[str, str], list[float]] = {}
    meas_cat: dict[str, list[float]] = {}
    cover: dict[str, dict] = {}
    how: dict[str, int] = {}
    busy = {}
    for n, k in enumerate(sorted(steps)):
        ops = steps[k]
        matches = match_step(ops, sim, comm)
        lo, hi = periods[k]
        busy[k] = sum(b - a for a, b in merge_intervals([(max(o.start_s, lo), min(o.end_s, hi)) for o in ops
                                                          if min(o.end_s, hi) > max(o.start_s, lo)]))
        for o, m in zip(ops, matches):
            key = m.key if m else (o.phase, COMMUNICATION if o.category == "nccl" else UNANNOTATED)
            meas_op.setdefault(key, [0.0] * len(steps))[n] += o.duration_s
            meas_cat.setdefault(o.category, [0.0] * len(steps))[n] += o.duration_s
            if m:
                how[m.how] = how.get(m.how, 0) + 1
        for c, v in coverage(ops, matches).items():
            acc = cover.setdefault(c, {"kernels": 0, "matched": 0, "time_s": 0.0, "matched_s": 0.0})
            for f in acc:
                acc[f] += v[f]
    return _report(run, result, rank, measured_rank, placement, sim, periods, busy, meas_op, meas_cat, cover, how)


def _report(run, result, rank, measured_rank, placement, sim, periods, busy, meas_op, meas_cat, cover, how) -> dict:
    sim_op: dict[tuple[str, str], float] = {}
    sim_cat: dict[str, float] = {}
    counts: dict[tuple[str, str], int] = {}
    for s in sim:
        sim_op[(s.phase, s.name)] = sim_op.get((s.phase, s.name), 0.0) + s.duration_s
        counts[(s.phase, s.name)] = counts.get((s.phase, s.name), 0) + 1
        sim_cat[kind_category(s.kind)] = sim_cat.get(kind_category(s.kind), 0.0) + s.duration_s
    comm = [e for e in result.trace.events if e.rank == rank and e.category.startswith("comm_")]
    if comm:
        sim_cat["nccl"] = sum(e.duration_s for e in comm)
    order = {"F": 0, "B": 1, "O": 2}
    per_op = [_row({"phase": ph, "op": op, "simulated_ops": counts.get((ph, op), 0)},
                   _mean(meas_op.get((ph, op))), sim_op.get((ph, op), 0.0))
              for ph, op in sorted(set(meas_op) | set(sim_op), key=lambda k: (order.get(k[0], 3), k[1]))]
    per_cat = [_row({"category": c}, _mean(meas_cat.get(c)), sim_cat.get(c, 0.0))
               for c in sorted(set(meas_cat) | set(sim_cat))]
    spans = {k: b - a for k, (a, b) in periods.items()}
    measured_s = median(spans.values())
    simulated_s = result.metrics["iteration_time_s"]
    window_step = min(spans, key=lambda k: (abs(spans[k] - measured_s), k))
    cov = coverage_fraction(cover)
    return {
        "scenario": result.scenario.name, "trace": run.metadata.get("source_file", ""),
        "device": run.metadata.get("device", ""), "coverage": cov, "coverage_warning": cov < COVERAGE_WARN,
        "coverage_by_category": {c: cover[c] for c in sorted(cover)}, "matched_by": dict(sorted(how.items())),
        "rank": rank, "measured_rank": measured_rank, "placement": placement,
        "mapping": "annotation" if any(parse_annotation(o.annotation) for o in run.ops) else "shape-order",
        "steps": sorted(periods), "measured_step_s": measured_s,
        "measured_busy_s": median(busy.values()), "simulated_step_s": simulated_s,
        "step_time_error": (simulated_s - measured_s) / measured_s if measured_s > 0 else None,
        "per_op": per_op, "per_category": per_cat,
        "measured_window_s": list(periods[window_step]), "simulated_window_s": [0.0, simulated_s],
    }


def _mean(values: list[float] | None) -> float:
    return sum(values) / len(values) if values else 0.0


def _row(head: dict, measured_s: float, simulated_s: float) -> dict:
    err = (simulated_s - measured_s) / measured_s if measured_s > 0 else None
    return dict(head, measured_s=measured_s, simulated_s=simulated_s, error=err)


def coverage_line(c: dict) -> str:
    """The coverage figure as compare prints it first, with the warning below the threshold."""
    parts = ", ".join(f"{k} {v['matched']}/{v['kernels']}" for k, v in c["coverage_by_category"].items())
    line = f"match coverage: {c['coverage']:.1%} of the measured kernel time maps to the scenario's ops ({parts})"
    if c["coverage_warning"]:
        line += (f"\nwarning: coverage below {COVERAGE_WARN:.0%}: this trace does not run the scenario's model; "
                 "the step-time error compares different work")
    return line


def comparison_markdown(c: dict) -> str:
    def ms(x: float) -> str:
        return f"{x * 1e3:.3f}"

    def pct(x) -> str:
        return "n/a" if x is None else f"{x:+.1%}"

    lines = [f"# {c['scenario']}: measured vs simulated", "", f"- {coverage_line(c)}".replace("\n", "\n- "),
             f"- trace: `{c['trace']}` ({c['device']}; {c['placement']}; mapping by {c['mapping']})",
             f"- measured step (median of {len(c['steps'])}): {ms(c['measured_step_s'])} ms "
             f"(kernels busy {ms(c['measured_busy_s'])} ms)",
             f"- simulated iteration: {ms(c['simulated_step_s'])} ms",
             f"- step-time error: {pct(c['step_time_error'])}", "",
             "| phase | op | measured (ms/step) | simulated (ms) | error |", "|---|---|---|---|---|"]
    lines += [f"| {r['phase']} | {r['op']} | {ms(r['measured_s'])} | {ms(r['simulated_s'])} | {pct(r['error'])} |"
              for r in c["per_op"]]
    lines += ["", "| category | measured (ms/step) | simulated (ms) | error |", "|---|---|---|---|"]
    lines += [f"| {r['category']} | {ms(r['measured_s'])} | {ms(r['simulated_s'])} | {pct(r['error'])} |"
              for r in c["per_category"]]
    return "\n".join(lines) + "\n"
