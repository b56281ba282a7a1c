"""The spine of the program (DESIGN.md §2) in a few lines: scenario -> tasks -> simulation -> metrics.

    plan = lower(scenario)                       # OpGraph + Strategy + DeviceMesh -> TaskGraph
    topo = build_topology(scenario.cluster)      # links: GPUs, NVSwitch, NICs, switches
    cost = CostModel(scenario, topo)             # work -> seconds (roofline or calibrated tables)
    sim  = simulate_graph(plan.graph, cost)      # simpy -> Trace
    metrics = summarize(scenario, step, memory)  # Trace + Scenario -> Metrics (typed metrics.json)
"""

from __future__ import annotations

import gc
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

from .analysis.memory import MemoryReport, memory_report
from .analysis.metrics import Metrics, StepTimes, busiest_rank, critical_rank, exposed_breakdown, summarize
from .cost.model import CostModel, memo_by_collective
from .cost.plan import CommPlan
from .cost.siblings import fast_mode_cost
from .engine.sim import SimResult, TaskCost, simulate_graph, task_durations
from .engine.sm_contention import static_times, stretched_durations
from .hardware.topology import Topology, build_topology
from .model.opgraph import build_op_graph
from .scenario import Scenario
from .strategy.lower import LoweredPlan, lower
from .strategy.sharding import imbalance_excess_flops
from .tasks import InternalError, Task, TaskGraph


@dataclass(frozen=True)
class RunResult:
    scenario: Scenario
    plan: LoweredPlan
    topology: Topology
    sim: SimResult
    memory: MemoryReport
    metrics: Metrics

    @property
    def trace(self):
        return self.sim.trace

    @property
    def graph(self):
        return self.plan.graph


def model_flops_per_iteration(scn: Scenario) -> float:
    """Model FLOPs of one step (no recompute): 3 x forward of every micro-batch of the global batch;
    for GPT this is Korthikanti et al. 2022 eq. 7 / Narayanan eq. 3 without the recompute term."""
    g = build_op_graph(scn.model, scn.training.micro_batch_size, scn.training.dtype)
    return (g.fwd_flops() + g.bwd_flops()) * scn.training.global_batch_size / scn.training.micro_batch_size


def _imbalance_excess_flops(scn: Scenario, graph: TaskGraph) -> float:
    """FLOPs the simulated ranks count beyond the mean EP rank's under routing imbalance (each stands
    for the busiest, which sets the pace): not hardware work of the cluster, left out of HFU."""
    if not scn.model.is_moe or scn.model.moe_load_imbalance == 1.0:
        return 0.0
    ops = build_op_graph(scn.model, scn.training.micro_batch_size, scn.training.dtype)
    return imbalance_excess_flops(graph.tasks, ops, scn.parallel.ep)


class PerCollective:
    """A TaskCost that asks ``cost`` for the network plan and the time alone of each distinct
    Collective once. For cost models whose answers depend on the task's Collective only, as
    CostModel's and SiblingCost's do (``cost/model``, ``cost/siblings``); they re-validate the group
    and look the plan up on every call, which was ~28% of a search plan's simulation."""

    def __init__(self, cost: TaskCost) -> None:
        self.cost = cost
        self.duration_s = cost.duration_s
        self._plans: dict = {}
        self._alone: dict = {}
        # by id(Collective): (the Collective, its answer). The tasks of one shape share a Collective
        # object; a lookup by identity skips hashing its group (~2% of a DeepSeek-V3 step)
        self._plan_of_id: dict[int, tuple] = {}
        self._alone_of_id: dict[int, tuple] = {}

    def comm_plan(self, task: Task) -> CommPlan:
        return memo_by_collective(self._plan_of_id, self._plans, task, self.cost.comm_plan)

    def isolated_s(self, task: Task) -> float:
        return memo_by_collective(self._alone_of_id, self._alone, task, self.cost.isolated_s)


class _OldestGeneration:
    """The step's objects moved straight into the collector's oldest generation (``gc_paused``), and
    the bookkeeping that keeps CPython's promise that cyclic garbage among them is still collected."""

    moved = 0       # objects moved there since the last full collection
    baseline = 0    # objects the collector tracked after the last full collection run here
    full_runs = -1  # gc.get_stats()[2]["collections"] when last looked


def _tracked_objects() -> int:
    gc.freeze()
    count = gc.get_freeze_count()
    gc.unfreeze()
    return count


@contextmanager
def gc_paused():
    """Python's cyclic garbage collector off while a step is built and simulated: it creates ~10^6
    long-lived objects and every collection would walk them (GPT-3 175B on 1,024 GPUs: trace events
    1.1 s -> 0.33 s, lowering ~10% faster). On the way out the survivors go straight to the oldest
    generation (gc.freeze + unfreeze, two list splices), so the young collection that would walk them
    all next does not run (0.17-0.22 s of that step's ~2 s CPU). CPython collects the oldest
    generation once the objects promoted into it since its last full collection exceed a quarter of
    those it held after it (gcmodule.c, long_lived_pending > long_lived_total / 4); the objects moved
    here skip that count, so the same rule is applied here, on the way in: a caller that simulates
    step after step and drops the results still has their reference cycles collected (a search
    worker's memory grew without bound without it). Skipped when someone else froze objects."""
    was = gc.isenabled()
    gc.disable()
    state = _OldestGeneration
    entry = -1  # objects the collector tracked on the way in
    if was and not gc.get_freeze_count():
        full_runs = gc.get_stats()[2]["collections"]
        if full_runs != state.full_runs:  # CPython ran one since: it walked the moved objects
            state.moved, state.full_runs = 0, full_runs
        if state.moved and state.moved >= state.baseline / 4:
            gc.collect()
            state.moved, state.baseline = 0, _tracked_objects()
            state.full_runs = gc.get_stats()[2]["collections"]
        young = len(gc.get_objects(0)) + len(gc.get_objects(1))
        entry = _tracked_objects()  # which moves the young objects to the oldest generation too
        state.moved += young
    try:
        yield
    finally:
        if was:
            if entry >= 0 and not gc.get_freeze_count():
                gc.freeze()  # the survivors (and any cyclic garbage) move to the oldest generation
                state.moved += max(0, gc.get_freeze_count() - entry)
                gc.unfreeze()
            gc.enable()


def simulate(scn: Scenario, full: bool = False, topology: Topology | None = None) -> RunResult:
    """Run ``scn``; ``topology``: one already built for ``scn.cluster`` (a search reuses it, and
    with it the collective plans and times memoised on it, across the plans of one cluster)."""
    _check_topology(scn, topology)
    with gc_paused():
        return _simulate(scn, full, topology or build_topology(scn.cluster))


def simulate_metrics(scn: Scenario, full: bool = False, topology: Topology | None = None) -> Metrics:
    """``simulate(...).metrics`` for callers that keep nothing else (search, sweep and validate
    workers, goodput): the step's objects are released while the garbage collector is still off,
    so the young collection that follows does not walk ~10^6 objects about to be freed (a search
    plan: ~0.06 s of ~2 s)."""
    _check_topology(scn, topology)
    with gc_paused():
        result = _simulate(scn, full, topology or build_topology(scn.cluster))
        result.sim.network.release()
        metrics = result.metrics
        del result  # freed here, before the survivors are counted on the way out
    return metrics


def _check_topology(scn: Scenario, topology: Topology | None) -> None:
    if topology is not None and topology.cluster != scn.cluster:
        raise InternalError("simulate: the topology given was built for another cluster")


def _simulate(scn: Scenario, full: bool, topo: Topology) -> RunResult:
    plan = lower(scn, full)
    tables = None
    if scn.cost.compute == "calibrated":
        from .cost.calibrated import CalibrationTables
        tables = CalibrationTables.load(scn.cost.tables)
    cost = CostModel(scn, topo, tables)
    engine_cost: TaskCost = cost
    if not full:  # the network also carries the sibling groups' copies of the representatives' transfers
        fast, why = fast_mode_cost(cost, plan.mesh, plan.graph, topo)
        if fast is None:
            print(f"notice: simulating every rank (--full): {why}", file=sys.stderr)
            return _simulate(scn, True, topo)
        engine_cost = fast
    # the cost models answer from a task's kind, work and collective: once per task shape
    per_collective = PerCollective(engine_cost)
    base = task_durations(plan.graph, per_collective, by_shape=True)
    # compute beside NCCL kernels runs on the SMs they leave
    durations = _contended_durations(plan.graph, per_collective, cost, base) if scn.cost.sm_contention else base
    sim = simulate_graph(plan.graph, per_collective, topo.capacity_Bps, plan.rank_labels,
                         dict(plan.graph.meta), durations=durations)
    cost.warn_missing()
    trace = sim.trace
    rank = critical_rank(trace)
    breakdown = exposed_breakdown(trace, rank, 0.0, sim.makespan_s)
    busiest = busiest_rank(trace, list(plan.graph.ranks))
    busy_breakdown = breakdown if busiest == rank else exposed_breakdown(trace, busiest, 0.0, sim.makespan_s)
    # symmetric mode: each simulated rank stands for the dp·cp·tp ranks of its stage
    replicas = 1 if full else scn.parallel.dp * scn.parallel.cp * scn.parallel.tp
    hw_flops = (trace.total_flops() - _imbalance_excess_flops(scn, plan.graph)) * replicas
    mem = memory_report(scn, plan.stage_params, trace, {r: plan.mesh.stage_of(r) for r in plan.stage_params})
    stretch_s = _stretch_s(plan.graph, base, durations, busiest) if durations is not base else 0.0
    step = StepTimes(sim.makespan_s, model_flops_per_iteration(scn), hw_flops, breakdown, busiest, busy_breakdown,
                     sim.contention_s, stretch_s)
    metrics = summarize(scn, step, mem)
    return RunResult(scn, plan, topo, sim, mem, metrics)


def _contended_durations(graph: TaskGraph, per_collective: PerCollective, cost: CostModel,
                         durations: list[float | None]) -> list[float | None]:
    """``durations`` (one per task shape, ``task_durations(by_shape=True)``) with each compute task
    stretched by the SMs the collectives beside it hold (engine/sm_contention). The overlaps come
    from a first run of the step in which every transfer takes its time alone (all tasks static: no
    network, timed without the engine, ``static_times``); the caller's run, with these durations, is
    the one reported."""
    shapes = graph.shapes or range(len(graph.tasks))
    one = graph.shape_tasks()
    # a collective on a stream that runs compute is in program order with that compute: never beside it
    compute_streams = {t.stream for t in one.values() if t.kind == "compute"}
    ctas_of = {k: 0 if t.stream in compute_streams else cost.kernel_ctas(t) for k, t in one.items()}
    if not any(ctas_of.values()):
        return durations
    static_of = {k: per_collective.isolated_s(t) if d is None else d
                 for k, t in one.items() for d in (durations[t.id],)}
    static: list = list(map(static_of.__getitem__, shapes))  # floats only
    times = static_times(graph, static)
    if times is None:
        first = simulate_graph(graph, per_collective, durations=static)
        times = first.start_s, first.end_s
        first.network.release()
    stretched = stretched_durations(graph, *times, durations, list(map(ctas_of.__getitem__, shapes)),
                                    cost.contention_ratio, one)
    return durations if stretched is None else stretched


def _stretch_s(graph: TaskGraph, base: list, stretched: list, rank: int) -> float:
    """Seconds the compute of ``rank`` runs longer than alone because collectives held SMs beside it
    (its tasks in id order, from its streams)."""
    ids = sorted(chain.from_iterable(ids for (r, _), ids in graph.streams.items() if r == rank))
    return sum(stretched[i] - base[i] for i in ids if stretched[i] != base[i])


def write_results(result: RunResult, out_dir: str | Path) -> Path:
    """results/<name>/: metrics.json, trace.json, timeline.png, bubbles.png, memory.png, links.png, report.md."""
    import json

    from .analysis.links import link_utilization, links_markdown, plot_link_heatmap
    from .analysis.memory import plot_memory
    from .analysis.plots import plot_bubbles, plot_timeline
    from .analysis.report import write_report
    from .trace import write_chrome_trace

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    scn = result.scenario
    (out / "metrics.json").write_text(json.dumps(result.metrics, indent=2) + "\n")
    write_chrome_trace(result.trace, out / "trace.json")
    plot_timeline(result.trace, out / "timeline.png", title=scn.name)
    plot_bubbles(result.trace, out / "bubbles.png", title=f"{scn.name}: pipeline schedule")
    plot_memory(result.memory, scn, out / "memory.png")
    rows = link_utilization(result.sim.link_stats, result.topology, result.sim.makespan_s)
    plot_link_heatmap(rows, result.topology, out / "links.png")
    sections = [("Busiest links", links_markdown(rows, top=10)),
                ("Network contention", _contention_markdown(result.metrics["network_contention_s"]))]
    if not result.memory.fits:
        sections.insert(0, ("Warning", "This plan does not fit in GPU memory (see the memory breakdown)."))
    write_report(out, result.metrics, ["timeline.png", "bubbles.png", "memory.png", "links.png"], sections)
    return out


def _contention_markdown(contention_s: dict) -> str:
    if not contention_s:
        return "No transfer was slowed by another: every network transfer ran at its uncontended speed."
    rows = "\n".join(f"| {cat} | {sec:.4f} |" for cat, sec in sorted(contention_s.items()))
    return ("Seconds the transfers of each category took beyond their time alone (summed over transfers; "
            "overlapped time included):\n\n| category | extra seconds |\n|---|---:|\n" + rows)
