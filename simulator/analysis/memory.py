"""Per-rank memory: model state by precision and ZeRO stage, activations tracked along the simulated
timeline (the trace's mem_delta_bytes in schedule order), the buffer allowances of ``analysis/buffers``,
the peak breakdown of the worst rank (metrics.json ``memory_bytes``) and the out-of-memory verdict.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..model.opgraph import build_op_graph
from ..scenario import Scenario, TrainingSpec
from ..strategy.grad_sync import ADAM_MOMENTS, master_weight_bytes
from ..strategy.schedules import schedule_actions
from ..strategy.stage_units import (activation_rules, deferred_head_wgrad, rank_param_counts,  # noqa: F401
                                   scenario_layout, stage_layout,  # (rank_param_counts, stage_layout re-exported)
                                   stage_param_counts)
from ..strategy.zero_impl import state_zero_stage
from ..tasks import InternalError
from ..trace import Trace, TraceEvent
from .buffers import fp8_params_bf16_bytes, static_buffers

# ---- constants, each with its source ----------------------------------------------------------
# Mixed-precision Adam keeps an fp32 master copy of the weights and fp32 first and second moments:
# K = 12 bytes/param (Rajbhandari et al. 2020, ZeRO, sec. 3.1; Megatron-LM's optimizer the same).
# SGD with momentum keeps the fp32 master copy and one fp32 momentum buffer: 8 bytes/param. Moments per
# parameter; the master copy's bytes follow training.master_weights (strategy/grad_sync.master_weight_bytes).
OPTIMIZER_MOMENTS = {"adam": ADAM_MOMENTS, "adamw": ADAM_MOMENTS, "sgd": 1}
# Fragmentation of PyTorch's caching allocator in LLM training: a defragmenting allocator removes
# on average 15 percentage points of it (up to 33), 9.2 GB (up to 25 GB) per A100 80GB, across eight
# LLMs (Guo et al. 2024, GMLake, ASPLOS, abstract). Charged as 15% of the memory allocated and
# freed within the step (activations and transient buffers); the model state lives in a few
# persistent buffers allocated once, which do not fragment.
FRAGMENTATION_FRACTION = 0.15
# Trace events of a pipeline action (phase F / B / W, or R for recompute) carry activation deltas,
# whatever their category (the lowering may free a chunk's activations on its last task, a TP
# collective); deltas on events outside the actions (phase "" or "O", e.g. ZeRO-3 gathered
# parameters on their all-gather and release) count as buffers.
ACTIVATION_PHASES = ("F", "B", "W", "R")
BREAKDOWN_KEYS = ("params", "grads", "optimizer", "activations", "buffers", "total")


def optimizer_bytes_per_param(tr: TrainingSpec) -> int:
    """Optimizer state per parameter: its moments in ``training.optimizer_state_dtype`` (Apex
    DistributedFusedAdam keeps them in its ``dtype``, NeMo ``optim.dtype``; 12 B for fp32 Adam, 6 for bf16)
    and its master copy (``training.master_weights``: Apex's 16-bit remainders, 10 B with fp32 moments;
    none, 4 B with bf16 ones)."""
    moments = OPTIMIZER_MOMENTS.get(tr.optimizer)
    if moments is None:
        raise ValueError(f"training.optimizer {tr.optimizer!r} has no memory rule; known: "
                         f"{', '.join(OPTIMIZER_MOMENTS)}")
    return moments * tr.optimizer_state_bytes + master_weight_bytes(tr)


def model_state_bytes(params: int, zero_stage: int, dp: int, dtype_bytes: int, grad_dtype_bytes: int,
                      offload_optimizer: bool = False, optimizer_bytes_per_param: int = 12) -> dict:
    """{"params", "grads", "optimizer"} bytes on one rank holding ``params`` parameters.

    Parameters in the training dtype, gradients in ``grad_dtype_bytes`` (fp32 main grads in
    Megatron: 2 + 4 + 12 = 18 B/param; the training dtype in ZeRO's accounting: 16 B/param), the
    optimizer state ``optimizer_bytes_per_param`` (12 for Adam). ZeRO (Rajbhandari et al. 2020,
    sec. 5, Fig. 1) shards over the ``dp`` ranks: stage 1 the optimizer state, stage 2 also the
    gradients, stage 3 also the parameters; with 2-byte gradients 4P + 12P/N, 2P + 14P/N, 16P/N.
    Offload (Ren et al. 2021, ZeRO-Offload) keeps the optimizer state in host memory: 0 on the GPU.
    Expert parameters are sharded over the expert-data-parallel degree dp*cp/ep: call again.
    """
    for name, value in (("params", params), ("dp", dp), ("dtype_bytes", dtype_bytes),
                        ("grad_dtype_bytes", grad_dtype_bytes)):
        if value < (0 if name == "params" else 1):
            raise ValueError(f"model_state_bytes: {name} must be {'>= 0' if name == 'params' else '>= 1'}, "
                             f"got {value}")
    if not 0 <= zero_stage <= 3:
        raise ValueError(f"model_state_bytes: zero_stage must be 0..3, got {zero_stage}")
    n = float(dp)
    return {
        "params": params * dtype_bytes / (n if zero_stage >= 3 else 1),
        "grads": params * grad_dtype_bytes / (n if zero_stage >= 2 else 1),
        "optimizer": 0.0 if offload_optimizer else
        params * optimizer_bytes_per_param / (n if zero_stage >= 1 else 1),
    }


class Timeline(Mapping):
    """rank -> [(time_s, bytes)], a step function; each rank's list made from its two arrays when
    first read (a plot reads a few ranks; a step of GPT-3 175B has ~10^5 points, whose tuples the
    garbage collector would otherwise walk)."""

    def __init__(self, columns: dict[int, tuple[np.ndarray, np.ndarray]] | None = None) -> None:
        self._columns = dict(columns or {})
        self._lists: dict[int, list[tuple[float, float]]] = {}

    def __getitem__(self, rank: int) -> list[tuple[float, float]]:
        points = self._lists.get(rank)
        if points is None:
            times, values = self._columns[rank]
            points = self._lists[rank] = list(zip(times.tolist(), values.tolist()))
        return points

    def __iter__(self) -> Iterator[int]:
        return iter(self._columns)

    def __len__(self) -> int:
        return len(self._columns)

    def __repr__(self) -> str:
        return f"Timeline({len(self)} ranks)"


@dataclass(frozen=True, slots=True)
class MemoryReport:
    per_rank: dict  # rank -> peak breakdown {"params","grads","optimizer","activations","buffers","total"}
    peak: dict  # the worst rank's breakdown (metrics.json memory_bytes)
    capacity_bytes: float
    fits: bool
    timeline: Mapping  # rank -> [(time_s, activation + buffer bytes)], a step function (Timeline)
    worst_rank: int
    activation_timeline: Mapping = field(default_factory=dict)  # rank -> [(time_s, activation bytes)]
    buffer_detail: dict = field(default_factory=dict)  # rank -> {allowance name: bytes} at the peak
    labels: dict = field(default_factory=dict)  # rank -> "stage s (rank r)"


def is_buffer_event(event: TraceEvent) -> bool:
    return event.phase not in ACTIVATION_PHASES


def walk_memory(events: list[TraceEvent], start_s: float = 0.0) -> list[tuple[float, float, float]]:
    """[(time_s, activation bytes, buffer bytes)] after each instant's changes, in time order.

    A positive mem_delta_bytes is allocated at its event's start, a negative one freed at its end
    (tasks.Task); at equal times frees apply before allocations, as a stream frees a tensor before
    its next kernel allocates."""
    events = [e for e in events if e.mem_delta_bytes]
    times, act, buf = _walk(np.array([e.start_s for e in events], dtype=float),
                            np.array([e.end_s for e in events], dtype=float),
                            np.array([e.mem_delta_bytes for e in events], dtype=float),
                            np.array([is_buffer_event(e) for e in events], dtype=bool), start_s)
    return list(zip(times.tolist(), act.tolist(), buf.tolist()))


def _walk(start: np.ndarray, end: np.ndarray, delta: np.ndarray, is_buf: np.ndarray,
          start_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``walk_memory`` on columns (events in trace order, every delta non-zero): each change at its
    time, sorted stably by (time, allocation), summed in that order (a cumulative sum adds one term
    after the other, as the loop it replaces did), the last sums of each instant kept, after the
    step's start (start_s, 0, 0) unless a change falls on it."""
    alloc = delta > 0
    t = np.where(alloc, start, end)
    order = np.lexsort((alloc, t))
    t, d, buf = t[order], delta[order], is_buf[order]
    act, held = np.cumsum(np.where(buf, 0.0, d)), np.cumsum(np.where(buf, d, 0.0))
    last = np.flatnonzero(np.append(t[1:] != t[:-1], True)) if len(t) else np.zeros(0, np.int64)
    t, act, held = t[last], act[last], held[last]
    if not len(t) or t[0] != start_s:
        t, act, held = np.append(start_s, t), np.append(0.0, act), np.append(0.0, held)
    return t, act, held


def memory_report(scn: Scenario, stage_params: dict, trace: Trace, stages: Mapping | None = None) -> MemoryReport:
    """Peak memory of every rank in ``stage_params`` (rank -> {"dense", "expert"} parameters), each
    rank of pipeline stage ``stages[rank]`` (None: the ranks are the stages).

    Model state from ``model_state_bytes`` (dense params sharded by ZeRO over dp*cp, experts over
    dp*cp/ep). Activations: the rank's trace events applied in time order; the peak is read off that
    timeline, so it reflects the schedule (in-flight micro-batches, W deferral, recompute). Buffers:
    ``static_buffers`` plus buffer deltas carried by the trace plus the fragmentation allowance on the
    step's dynamic peak. The dynamic part must return to zero by the end of the step.
    """
    par, tr = scn.parallel, scn.training
    opt_bpp = optimizer_bytes_per_param(tr)
    if not stage_params:
        raise ValueError("memory_report: stage_params is empty (no rank to account)")
    dense_dp = par.shard_group_size or par.dp * par.cp  # HSDP shards inside its shard group
    expert_dp = par.expert_dp  # MoE parallel folding: tp·cp·dp/(ep·etp) (strategy/mesh)
    per_rank, timeline, act_timeline, detail = {}, {}, {}, {}
    stage = state_zero_stage(par)  # FSDP2 under torch's pipelining: whole parameters and gradients
    for rank, counts in stage_params.items():
        state = _add(model_state_bytes(counts.get("dense", 0), stage, dense_dp, tr.param_bytes,
                                       tr.grad_dtype_bytes, par.offload_optimizer, opt_bpp),
                     model_state_bytes(counts.get("expert", 0), stage, expert_dp,
                                       tr.param_bytes, tr.grad_dtype_bytes, par.offload_optimizer,
                                       opt_bpp))
        pipe_stage = rank if stages is None else stages[rank]
        state["params"] += fp8_params_bf16_bytes(scn, counts, pipe_stage)
        start, end, delta, phases = trace.memory_columns(rank)  # all the timeline reads: no event need be made
        is_buf = np.array([p not in ACTIVATION_PHASES for p in phases], dtype=bool)  # is_buffer_event
        times, act, held = _walk(start, end, delta, is_buf, trace.start_s)
        total = act + held
        end_dyn, peak_dyn = float(total[-1]), float(total.max())
        if abs(end_dyn) > 1e-6 * max(peak_dyn, 1.0):
            raise InternalError(f"memory_report: rank {rank} ends the step with {end_dyn:.6g} bytes of activations/"
                             f"buffers still allocated (mem_delta_bytes do not balance)")
        buffers = static_buffers(scn, counts, pipe_stage, bool(is_buf.any()))
        buffers["fragmentation"] = FRAGMENTATION_FRACTION * peak_dyn
        fixed = sum(buffers.values())
        tops = np.flatnonzero(total == total.max())  # the peak: its earliest instant
        at = int(tops[np.argmin(times[tops])])
        act_peak, buf_peak = float(act[at]), float(held[at])
        if buf_peak:
            buffers["trace_buffers"] = buf_peak
        parts = dict(state, activations=act_peak, buffers=fixed + buf_peak)
        parts["total"] = sum(parts.values())
        per_rank[rank] = {k: parts[k] for k in BREAKDOWN_KEYS}
        detail[rank] = buffers
        if times[-1] < trace.end_s:
            times, act, held = np.append(times, trace.end_s), np.append(act, act[-1]), np.append(held, held[-1])
        timeline[rank] = (times, fixed + act + held)
        act_timeline[rank] = (times, act)
    worst = max(per_rank, key=lambda r: (per_rank[r]["total"], -r))
    capacity = float(scn.cluster.gpu.memory_capacity_bytes)
    labels = {r: trace.rank_labels.get(r, f"rank {r}") for r in per_rank}
    return MemoryReport(per_rank=per_rank, peak=dict(per_rank[worst]), capacity_bytes=capacity,
                        fits=per_rank[worst]["total"] <= capacity, timeline=Timeline(timeline), worst_rank=worst,
                        activation_timeline=Timeline(act_timeline), buffer_detail=detail, labels=labels)


def _add(a: dict, b: dict) -> dict:
    return {k: a[k] + b[k] for k in a}


def schedule_trace(scn: Scenario, stages: list[int] | None = None, recompute_workspace: bool = True) -> Trace:
    """A trace of unit-length events in each stage's program order (``strategy.schedules``), one per
    activation delta of every unit of every action (embedding, each layer, head), the deltas the
    lowering puts on its tasks (``strategy.stage_units.ActivationRules``): a unit's forward allocates
    its activations; its backward frees them (B and W parts when the schedule splits the backward), a
    recomputed layer re-materialising ``layer_activation_bytes(none) - layer_activation_bytes(recompute)``
    from its recompute to the end of its backward (``recompute_workspace=False`` leaves that out: the
    stored activations alone, the quantity of Korthikanti et al.'s formulas). Rank id = stage. It has
    the schedule's order but no timing, so ``memory_report`` on it is a fast estimate (the accuracy
    benchmark); the simulated trace is the reference."""
    layout = scenario_layout(scn)  # one stage runs plain 1F1B, as the lowering does
    p = layout.p
    rules = activation_rules(scn, recompute_workspace=recompute_workspace)
    rows = schedule_actions(layout.schedule, p, scn.num_microbatches, layout.v)
    chosen = range(p) if stages is None else stages
    defer = deferred_head_wgrad(scn)  # the output layer's deferred wgrads keep their operands to the flush
    events: list[TraceEvent] = []
    for stage in chosen:
        clock, deferred = 0.0, 0
        for a in rows[stage]:
            deltas = rules.action(layout.units(a.stage), a.phase)
            if a.phase == "B" and "head" in layout.units(a.stage) and deferred < defer.microbatches:
                at = max(i for i, (u, _, _) in enumerate(deltas) if u == "head") + 1  # the head's B frees less
                deltas = deltas[:at] + [("head", defer.kept_bytes, "B")] + deltas[at:]
                deferred += 1
            for _, delta, tag in deltas:
                events.append(TraceEvent(f"{a}", "compute", stage, "compute", clock, clock + 1.0, stage=stage,
                                         microbatch=a.microbatch, chunk=a.chunk(p), phase=tag,
                                         mem_delta_bytes=delta))
                clock += 1.0
        if deferred:  # the drain after the stage's last backward
            events.append(TraceEvent("drain", "compute", stage, "compute", clock, clock + 1.0, stage=stage,
                                     phase="W", mem_delta_bytes=-deferred * defer.kept_bytes))
    return Trace(tuple(events), source="schedule", rank_labels={s: f"stage {s}" for s in chosen})


def estimate_memory(scn: Scenario) -> MemoryReport:
    """``memory_report`` of every pipeline stage on ``schedule_trace``: no simulation needed."""
    par, layout = scn.parallel, scenario_layout(scn)
    graph = build_op_graph(scn.model, 1, "bf16")  # parameters depend on neither micro-batch nor dtype
    stage_params = {s: stage_param_counts(graph, par, layout, s) for s in range(par.pp)}
    return memory_report(scn, stage_params, schedule_trace(scn))


def plot_memory(report: MemoryReport, scn: Scenario, path: str | Path) -> Path:
    """memory.png (``memory_plot.plot_memory``; imported on use so that accounting needs no matplotlib)."""
    from .memory_plot import plot_memory as _plot

    return _plot(report, scn, path)
