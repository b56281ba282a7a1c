"""Static estimates that let the plan search skip simulations: the per-rank peak memory, computed by
the same functions as analysis/memory.py without a timeline, and a lower bound on the iteration time.

Peak memory: on one rank activations are allocated at a micro-batch's F and freed at its B (or W) in
the compute stream's program order, so walking the schedule's action list gives the timeline's peak
exactly (``strategy.schedules.max_in_flight`` counts the same sets). Lower bound: the compute stream
is serial, so the iteration is at least a rank's compute (plus its intra-node TP collectives, which
sit on the compute stream) plus the pipeline fill/drain chain before its first and after its last
backward action. Communication that the network costs (DP, PP, cross-node TP) counts as zero.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..analysis.memory import FRAGMENTATION_FRACTION, OPTIMIZER_BYTES_PER_PARAM, model_state_bytes, static_buffers
from ..cost.model import CostModel
from ..hardware.topology import build_topology
from ..model.opgraph import build_op_graph
from ..strategy.activation_memory import (embedding_activation_bytes, head_activation_bytes, layer_activation_bytes,
                                          layer_activation_split)
from ..strategy.blocks import build_blocks, split_work
from ..strategy.lower import chunk_layers
from ..strategy.schedules import schedule_actions, splits_backward
from ..strategy.sharding import params_per_rank
from ..tasks import Collective, Task
from ..units import DTYPE_BYTES

# FP8 keeps bf16 weights (analysis/memory.py MIN_PARAM_BYTES, Micikevicius et al. 2022 sec. 4).
_MIN_PARAM_BYTES = DTYPE_BYTES["bf16"]


@dataclass(frozen=True)
class StaticEstimate:
    total_bytes: float  # peak per rank on the worst pipeline stage (memory_bytes["total"])
    worst_stage: int
    stage_totals: tuple[float, ...]
    capacity_bytes: float
    time_lower_bound_s: float

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes


class EstimateCache:
    """Sub-results shared by the plans of one search: op graphs, layer blocks, cost models and their
    kernel times are built once per distinct (micro-batch, tp, sp, cp, ep) or cluster."""

    def __init__(self) -> None:
        self._graphs: dict = {}
        self._blocks: dict = {}
        self._costs: dict = {}
        self._times: dict = {}
        self._keep: list = []  # work tuples passed to CostModel, kept alive (it caches by id)

    def graph(self, scn):
        key = (repr(scn.model), scn.training.micro_batch_size, scn.training.dtype)
        if key not in self._graphs:
            self._graphs[key] = build_op_graph(scn.model, scn.training.micro_batch_size, scn.training.dtype)
        return self._graphs[key]

    def blocks(self, scn):
        p = scn.parallel
        key = (repr(scn.model), scn.training.micro_batch_size, scn.training.dtype, p.tp, p.sequence_parallel, p.cp,
               p.ep)
        if key not in self._blocks:
            self._blocks[key] = build_blocks(self.graph(scn), p.tp, p.sequence_parallel, p.cp, p.ep)
        return self._blocks[key]

    def cost(self, scn) -> CostModel:
        key = _cost_key(scn)
        if key not in self._costs:
            tables = None
            if scn.cost.compute == "calibrated":
                from ..cost.calibrated import CalibrationTables
                tables = CalibrationTables.load(scn.cost.tables)
            self._costs[key] = CostModel(scn, build_topology(scn.cluster), tables)
        return self._costs[key]

    def work_s(self, scn, work, parts: int = 1) -> float:
        """Seconds of a work tuple on the compute stream (``parts`` equal slices, as ring attention)."""
        key = (id(work), parts, _cost_key(scn))
        t = self._times.get(key)
        if t is None:
            piece = work if parts == 1 else split_work(work, parts)
            self._keep += [work, piece]
            task = Task(0, "estimate", "compute", 0, "compute", "compute", work=piece)
            t = self._times[key] = parts * self.cost(scn).duration_s(task)
        return t

    def tp_comm_s(self, scn, op: str, size_bytes: float) -> float:
        """A TP collective costed statically (inside one node), else 0 (the network decides)."""
        tp = scn.parallel.tp
        if tp == 1:
            return 0.0
        task = Task(0, "estimate", "comm", 0, "compute", "comm_tp",
                    comm=Collective(op, float(size_bytes), tuple(range(tp)), "tp"))
        return self.cost(scn).duration_s(task) or 0.0


def _cost_key(scn) -> str:
    # specs hold dicts (GPU peaks per dtype), so they are keyed by their repr
    return repr((scn.cluster, scn.training.dtype, scn.cost))


# ---- memory ---------------------------------------------------------------------------------
def _stage_params(scn, cache: EstimateCache) -> list[dict]:
    p = scn.parallel
    g = cache.graph(scn)
    return [params_per_rank(g, p.tp, p.ep, p.layers_per_stage[s], s == 0, s == p.pp - 1) for s in range(p.pp)]


def _set_sizes(scn) -> tuple[list, list, list]:
    """(actions per rank, bytes freed at B, bytes freed at W) per virtual stage, as ``lower`` sets them."""
    m, par, tr = scn.model, scn.parallel, scn.training
    v = par.virtual_stages if par.pp > 1 else 1
    schedule = par.schedule if par.pp > 1 else "1f1b"
    actions = schedule_actions(schedule, par.pp, scn.num_microbatches, v)
    layers = chunk_layers(par.layers_per_stage, v)
    args = (m, tr.micro_batch_size, par.tp, par.sequence_parallel, par.cp)
    d = tr.dtype_bytes
    layer = layer_activation_bytes(*args, par.recompute, d, par.ep)
    at_b, at_w = layer_activation_split(*args, par.recompute, d, par.ep)
    embed, head = embedding_activation_bytes(*args, d), head_activation_bytes(*args, d)
    split = splits_backward(schedule)
    nv = len(layers)
    freed_b, freed_w = [], []
    for vs, ls in enumerate(layers):
        extra = (embed if vs == 0 else 0.0) + (head if vs == nv - 1 else 0.0)
        freed_b.append(len(ls) * (at_b if split else layer) + extra)
        freed_w.append(len(ls) * at_w if split else 0.0)
    return actions, freed_b, freed_w


def activation_peaks(scn) -> list[float]:
    """Peak activation bytes of every pipeline rank: F allocates a set, B frees its B part, W the rest."""
    actions, freed_b, freed_w = _set_sizes(scn)
    peaks = []
    for acts in actions:
        live = peak = 0.0
        for a in acts:
            if a.phase == "F":
                live += freed_b[a.stage] + freed_w[a.stage]
            elif a.phase == "B":
                live -= freed_b[a.stage]
            else:
                live -= freed_w[a.stage]
            peak = max(peak, live)
        peaks.append(peak)
    return peaks


def memory_totals(scn, cache: EstimateCache | None = None) -> list[float]:
    """memory_bytes["total"] of every pipeline stage as memory_report computes it from a simulation."""
    cache = cache or EstimateCache()
    par, tr = scn.parallel, scn.training
    opt = OPTIMIZER_BYTES_PER_PARAM.get(tr.optimizer)
    if opt is None:
        raise ValueError(f"training.optimizer {tr.optimizer!r} has no memory rule; known: "
                         f"{', '.join(OPTIMIZER_BYTES_PER_PARAM)}")
    pbytes = max(DTYPE_BYTES[tr.dtype], _MIN_PARAM_BYTES)
    dense_dp = par.dp * par.cp
    expert_dp = max(1, dense_dp // par.ep)
    out = []
    for counts, act in zip(_stage_params(scn, cache), activation_peaks(scn)):
        state = model_state_bytes(counts["dense"], par.zero_stage, dense_dp, pbytes, tr.grad_dtype_bytes,
                                  par.offload_optimizer, opt)
        experts = model_state_bytes(counts["expert"], par.zero_stage, expert_dp, pbytes, tr.grad_dtype_bytes,
                                    par.offload_optimizer, opt)
        fixed = sum(static_buffers(scn, counts).values()) + FRAGMENTATION_FRACTION * act
        out.append(sum(state.values()) + sum(experts.values()) + fixed + act)
    return out


# ---- time lower bound ----------------------------------------------------------------------------
def _phase_times(scn, cache: EstimateCache) -> tuple[list, list, list]:
    """Per virtual stage and micro-batch: compute-stream seconds of F, B (B+W fused unless the schedule
    splits it, recompute included) and W, each counting only work the lowering emits on that stream."""
    par = scn.parallel
    b = cache.blocks(scn)
    work = lambda w, parts=1: cache.work_s(scn, w, parts)  # noqa: E731
    ring = par.cp if par.cp > 1 and par.cp_algorithm == "ring" else 1
    v = par.virtual_stages if par.pp > 1 else 1
    schedule = par.schedule if par.pp > 1 else "1f1b"
    split = splits_backward(schedule)
    segs = [b.attn_pre, b.attn_post, b.mlp_pre] + [s for s in (b.experts, b.mlp_post) if s is not None]
    act = (scn.training.micro_batch_size * (scn.model.seq_length // par.cp) * scn.model.hidden_size
           * scn.training.dtype_bytes)
    if par.sequence_parallel:
        tp_fwd = 2 * (cache.tp_comm_s(scn, "all_gather", act) + cache.tp_comm_s(scn, "reduce_scatter", act))
        tp_bwd = 2 * cache.tp_comm_s(scn, "reduce_scatter", act) + cache.tp_comm_s(scn, "all_gather", act)
        tp_embed = cache.tp_comm_s(scn, "reduce_scatter", act)
    else:
        tp_fwd = tp_bwd = 2 * cache.tp_comm_s(scn, "all_reduce", act)
        tp_embed = cache.tp_comm_s(scn, "all_reduce", act)
    f_layer = sum(work(s.fwd) for s in segs) + work(b.attn_core.fwd, ring) + tp_fwd
    part = (lambda s: s.bwd_b) if split else (lambda s: s.bwd)
    b_layer = sum(work(part(s)) for s in segs) + work(part(b.attn_core), ring) + tp_bwd
    if par.recompute == "full":
        b_layer += f_layer
    elif par.recompute == "selective":
        b_layer += work(b.attn_core.fwd)
    w_layer = sum(work(s.bwd_w) for s in segs + [b.attn_core]) if split else 0.0
    layers = chunk_layers(par.layers_per_stage, v)
    nv = len(layers)
    f, bw, w = [], [], []
    for vs, ls in enumerate(layers):
        n = len(ls)
        f.append(n * f_layer + (work(b.embed.fwd) + tp_embed if vs == 0 else 0.0)
                 + (work(b.head.fwd) if vs == nv - 1 else 0.0))
        extra = (work(part(b.embed)) if vs == 0 else 0.0) + (work(part(b.head)) if vs == nv - 1 else 0.0)
        bw.append(n * b_layer + extra)
        w.append(n * w_layer)
    return f, bw, w


def time_lower_bound_s(scn, cache: EstimateCache | None = None) -> float:
    """max over pipeline ranks of: forward chain into its first action + its own work up to its last B +
    max(work after that B, backward chain out of it). Valid for any communication cost >= 0."""
    cache = cache or EstimateCache()
    par = scn.parallel
    v = par.virtual_stages if par.pp > 1 else 1
    schedule = par.schedule if par.pp > 1 else "1f1b"
    actions = schedule_actions(schedule, par.pp, scn.num_microbatches, v)
    f, b, w = _phase_times(scn, cache)
    dur = {"F": f, "B": b, "W": w}
    best = 0.0
    for acts in actions:
        first = acts[0].stage
        last_b = max(i for i, a in enumerate(acts) if a.phase == "B")
        head = sum(dur[a.phase][a.stage] for a in acts[:last_b + 1])
        tail = sum(dur[a.phase][a.stage] for a in acts[last_b + 1:])
        chain_in = sum(f[:first])
        chain_out = sum(b[:acts[last_b].stage])
        best = max(best, chain_in + head + max(tail, chain_out))
    return best


def estimate(scn, cache: EstimateCache | None = None) -> StaticEstimate:
    cache = cache or EstimateCache()
    totals = memory_totals(scn, cache)
    worst = max(range(len(totals)), key=lambda s: (totals[s], -s))
    return StaticEstimate(totals[worst], worst, tuple(totals), float(scn.cluster.gpu.memory_capacity_bytes),
                          time_lower_bound_s(scn, cache))


def with_recompute(scn, recompute: str):
    """The same scenario with another recompute mode (the memory/compute trade-off the search walks)."""
    return replace(scn, parallel=replace(scn.parallel, recompute=recompute))
