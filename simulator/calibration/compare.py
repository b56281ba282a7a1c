"""Measured versus simulated: maps a real profiler trace's kernels onto a scenario's simulated ops and
reports per-op times, per-category times and the step-time error.

Kernels are mapped to ops by their ``sim:<microbatch>:<layer>:<op>`` annotation when the trace comes from
our tiny model (backward kernels through the autograd sequence number of their forward op); any other
trace is mapped by kernel category and order within a profiler step.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median

from ..analysis.bubbles import merge_intervals
from ..cost.compute import RooflineCompute
from ..trace import Trace, TraceEvent
from .kineto import KinetoRun, MeasuredOp, parse_annotation

# Kernel class of each OpWork kind (tasks.OpWork): the vector kinds are elementwise kernels.
KIND_CATEGORY = {"gemm": "gemm", "attention": "attention", "memcpy": "memcpy"}
# Simulated phases as a profiler sees them: weight gradients and recomputation run inside backward.
PHASE_AS_MEASURED = {"F": "F", "B": "B", "W": "B", "R": "B", "O": "O", "": ""}
UNANNOTATED = "(unannotated)"
COMMUNICATION = "(communication)"
OPTIMIZER_OP = "adam"  # strategy/grad_sync's optimizer OpWork, the tiny model's optimizer annotation


def kind_category(kind: str) -> str:
    return KIND_CATEGORY.get(kind, "elementwise")


@dataclass(frozen=True, slots=True)
class SimOp:
    name: str
    kind: str
    phase: str
    microbatch: int
    layer: int
    start_s: float
    end_s: float

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


def simulated_ops(result, rank: int | None = None) -> tuple[int, list[SimOp]]:
    """(rank, ops): every OpWork of one simulated rank's compute tasks, timed within its task in
    proportion to the cost model's time for it (tables where measured, else the roofline)."""
    scn, graph, sim = result.scenario, result.graph, result.sim
    ranks = graph.ranks
    rank = rank if rank in ranks else ranks[0]
    tables = getattr(result, "tables", None)
    if tables is None and scn.cost.compute == "calibrated":
        from ..cost.calibrated import CalibrationTables
        tables = CalibrationTables.load(scn.cost.tables)
    roof = RooflineCompute(scn.cluster.gpu, scn.training.dtype)
    dtype = scn.training.dtype

    def op_s(w) -> float:
        t = tables.lookup_s(w, dtype) if tables is not None else None
        return roof.op_time_s(w) if t is None else t

    out = []
    for t in graph.tasks:
        if t.rank != rank or t.kind != "compute" or not t.work:
            continue
        times = [op_s(w) for w in t.work]
        total = sum(times)
        clock, span = sim.start_s[t.id], sim.end_s[t.id] - sim.start_s[t.id]
        for w, x in zip(t.work, times):
            d = span * x / total if total > 0 else 0.0
            out.append(SimOp(w.name, w.kind, PHASE_AS_MEASURED.get(t.phase, t.phase), t.microbatch, t.layer,
                             clock, clock + d))
            clock += d
    return rank, out


def simulated_op_trace(result, rank: int, ops: list[SimOp]) -> Trace:
    """The simulated rank with compute tasks split into ops (category = kernel class), communication kept."""
    events = [TraceEvent(o.name, kind_category(o.kind), rank, "compute", o.start_s, o.end_s,
                         microbatch=o.microbatch, phase=o.phase, layer=o.layer) for o in ops]
    events += [e for e in result.trace.events if e.rank == rank and not (e.stream == "compute" and e.category in
                                                                          ("compute", "recompute", "optimizer"))]
    events.sort(key=lambda e: (e.start_s, e.stream))
    return Trace(tuple(events), source="simulated", rank_labels={rank: f"rank {rank} (simulated)"},
                 metadata={"scenario": result.scenario.name})


def measured_steps(run: KinetoRun) -> dict[int, list[MeasuredOp]]:
    """Profiler step -> its ops (the whole trace as step -1 when it has no ProfilerStep annotations)."""
    steps: dict[int, list[MeasuredOp]] = {}
    for o in run.ops:
        if o.step >= 0 or not run.steps:
            steps.setdefault(o.step, []).append(o)
    return steps


def _op_key(o: MeasuredOp) -> tuple[str, str]:
    if o.category == "nccl":  # communication is compared per category, against the simulated collectives
        return o.phase, COMMUNICATION
    parsed = parse_annotation(o.annotation)
    if parsed is None:
        return o.phase, UNANNOTATED
    # the optimizer region also holds the gradient and weight copies around Optimizer.step
    return ("O" if parsed[2] == OPTIMIZER_OP else o.phase), parsed[2]


def _order_keys(step_ops: list[MeasuredOp], sim: list[SimOp]) -> dict[int, tuple[str, str]]:
    """Foreign traces: the i-th kernel of a category in the step is the i-th simulated op of that
    category, where both have the same count; index -> (phase, op) key."""
    out: dict[int, tuple[str, str]] = {}
    by_cat_sim: dict[str, list[SimOp]] = {}
    for s in sim:
        by_cat_sim.setdefault(kind_category(s.kind), []).append(s)
    by_cat_meas: dict[str, list[int]] = {}
    for i, o in enumerate(step_ops):
        by_cat_meas.setdefault(o.category, []).append(i)
    for cat, idx in by_cat_meas.items():
        ss = by_cat_sim.get(cat, [])
        if len(ss) == len(idx):
            for i, s in zip(idx, ss):
                out[i] = (s.phase, s.name)
    return out


def compare_run(run: KinetoRun, result) -> dict:
    """Per-op and per-category rows, the measured and simulated step times and the step-time error."""
    steps = measured_steps(run)
    if not steps:
        raise ValueError(f"{run.metadata.get('source_file', 'trace')}: no kernels inside a profiler step")
    rank = next(iter(steps.values()))[0].rank
    rank, sim = simulated_ops(result, rank)
    annotated = any(parse_annotation(o.annotation) for o in run.ops)
    meas_op: dict[tuple[str, str], list[float]] = {}
    meas_cat: dict[str, list[float]] = {}
    spans, busy = {}, {}
    for k, ops in steps.items():
        ops = [o for o in ops if o.rank == rank]
        spans[k] = max(o.end_s for o in ops) - min(o.start_s for o in ops)
        busy[k] = sum(b - a for a, b in merge_intervals([(o.start_s, o.end_s) for o in ops]))
        keys = {i: _op_key(o) for i, o in enumerate(ops)} if annotated else _order_keys(ops, sim)
        per_op: dict[tuple[str, str], float] = {}
        per_cat: dict[str, float] = {}
        for i, o in enumerate(ops):
            key = keys.get(i) or (o.phase, COMMUNICATION if o.category == "nccl" else UNANNOTATED)
            per_op[key] = per_op.get(key, 0.0) + o.duration_s
            per_cat[o.category] = per_cat.get(o.category, 0.0) + o.duration_s
        for key, v in per_op.items():
            meas_op.setdefault(key, [0.0] * len(steps))[len(spans) - 1] = v
        for key, v in per_cat.items():
            meas_cat.setdefault(key, [0.0] * len(steps))[len(spans) - 1] = v
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
    measured_s = median(spans.values())
    simulated_s = result.metrics["iteration_time_s"]
    window_step = min(spans, key=lambda k: (abs(spans[k] - measured_s), k))
    w_ops = [o for o in steps[window_step] if o.rank == rank]
    return {
        "scenario": result.scenario.name, "trace": run.metadata.get("source_file", ""),
        "device": run.metadata.get("device", ""), "rank": rank, "mapping": "annotation" if annotated else
        "category-order", "steps": sorted(steps), "measured_step_s": measured_s,
        "measured_busy_s": median(busy.values()), "simulated_step_s": simulated_s,
        "step_time_error": (simulated_s - measured_s) / measured_s if measured_s > 0 else None,
        "per_op": per_op, "per_category": per_cat,
        "measured_window_s": [min(o.start_s for o in w_ops), max(o.end_s for o in w_ops)],
        "simulated_window_s": [0.0, simulated_s],
    }


def _mean(values: list[float] | None) -> float:
    return sum(values) / len(values) if values else 0.0


def _row(head: dict, measured_s: float, simulated_s: float) -> dict:
    err = (simulated_s - measured_s) / measured_s if measured_s > 0 else None
    return dict(head, measured_s=measured_s, simulated_s=simulated_s, error=err)


def comparison_markdown(c: dict) -> str:
    def ms(x: float) -> str:
        return f"{x * 1e3:.3f}"

    def pct(x) -> str:
        return "n/a" if x is None else f"{x:+.1%}"

    lines = [f"# {c['scenario']}: measured vs simulated", "",
             f"- trace: `{c['trace']}` ({c['device']}, rank {c['rank']}, mapping by {c['mapping']})",
             f"- measured step (median of {len(c['steps'])}): {ms(c['measured_step_s'])} ms "
             f"(ops busy {ms(c['measured_busy_s'])} ms)",
             f"- simulated iteration: {ms(c['simulated_step_s'])} ms",
             f"- step-time error: {pct(c['step_time_error'])}", "",
             "| phase | op | measured (ms/step) | simulated (ms) | error |", "|---|---|---|---|---|"]
    lines += [f"| {r['phase']} | {r['op']} | {ms(r['measured_s'])} | {ms(r['simulated_s'])} | {pct(r['error'])} |"
              for r in c["per_op"]]
    lines += ["", "| category | measured (ms/step) | simulated (ms) | error |", "|---|---|---|---|"]
    lines += [f"| {r['category']} | {ms(r['measured_s'])} | {ms(r['simulated_s'])} | {pct(r['error'])} |"
              for r in c["per_category"]]
    return "\n".join(lines) + "\n"
