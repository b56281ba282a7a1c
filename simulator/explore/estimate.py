"""Static estimates that let the plan search skip simulations: the per-rank peak memory without a
timeline, and a lower bound on the iteration time. Peak memory: ``analysis.memory.estimate_memory`` walks
one event per unit (embedding, layer, head) of every action; here the same deltas (the lowering's
``strategy.stage_units.ActivationRules``) are folded into one (peak offset, net change) pair per (virtual
stage, phase), so the walk costs one step per action (a stage whose deferred head wgrads keep buffers,
``deferred_head_wgrad``, is walked unit by unit); parameters, model state and static buffers come from
``memory_report``'s functions. Lower bound: a rank's compute stream is serial, so the step takes at least
its compute and blocking TP collectives (each at its uncontended time), plus the pipeline chain before
its first action and after its last backward; other communication counts as zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..analysis.buffers import fp8_params_bf16_bytes, static_buffers
from ..analysis.memory import FRAGMENTATION_FRACTION, model_state_bytes, optimizer_bytes_per_param, schedule_trace
from ..cost.collectives import collective_time_s
from ..cost.model import CostModel
from ..hardware.topology import build_topology
from ..model.opgraph import OpGraph, build_op_graph
from ..scenario import Scenario
from ..strategy import cp_te
from ..strategy.actions import Action
from ..strategy.blocks import LayerBlocks, Work, build_blocks, core_works, layer_blocks
from ..strategy.blocking_tp import blocking_tp, tp_traffic
from ..strategy.embed_grad import weight_grad_bytes
from ..strategy.lower import graph_args
from ..strategy.recompute import layer_recompute_modes, recomputed_forward
from ..strategy.schedules import schedule_actions, splits_backward
from ..strategy.stage_units import (StageLayout, activation_rules, deferred_head_wgrad, scenario_layout,
                                   stage_param_counts)
from ..strategy.zero_impl import state_zero_stage
from ..tasks import Collective, Task
from ..units import DTYPE_BYTES
from .estimate_streams import ds2021_host_s, dp_stream_s, pp_stream_s


@dataclass(frozen=True)
class StaticEstimate:
    total_bytes: float  # memory_bytes["total"] of the worst pipeline stage
    worst_stage: int
    stage_totals: tuple[float, ...]
    capacity_bytes: float
    time_lower_bound_s: float
    tp_comm_bound_s: float  # the blocking TP communication inside the bound (on its critical rank)

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes


class EstimateCache:
    """Sub-results shared by the plans of one search: action lists, op graphs, layer blocks, cost
    models and kernel times are built once per distinct key (specs hold dicts: keyed by repr)."""

    def __init__(self) -> None:
        self._memo: dict = {}
        self._keep: list = []  # work tuples handed to a CostModel, which caches by id(): kept alive
        self._reprs: dict = {}  # (what, id(scenario)) -> (the scenario, its key): a repr once per plan

    def _get(self, key, build):
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]

    def layout(self, scn: Scenario) -> StageLayout:
        """The plan's stage layout (``strategy.stage_units.scenario_layout``)."""
        return self._get(("layout", scn.parallel, scn.model.mtp_layers), lambda: scenario_layout(scn))

    def actions(self, scn: Scenario) -> list[list[Action]]:
        lay = self.layout(scn)
        return self._get(("actions", lay.schedule, lay.p, scn.num_microbatches, lay.v),
                         lambda: schedule_actions(lay.schedule, lay.p, scn.num_microbatches, lay.v))

    def profiles(self, scn: Scenario) -> list[RankProfile]:
        lay = self.layout(scn)
        key = ("profiles", lay.schedule, lay.p, scn.num_microbatches, lay.v)
        return self._get(key, lambda: [_profile(acts) for acts in self.actions(scn)])

    def blocks(self, scn: Scenario) -> LayerBlocks:
        """The main layer's blocks (embedding and head included)."""
        return self._blocks(scn, build_blocks, "blocks")

    def layer_blocks(self, scn: Scenario) -> tuple[LayerBlocks, ...]:
        """Every layer's blocks by its kind (``strategy.blocks.layer_blocks``, as the lowering)."""
        return self._blocks(scn, layer_blocks, "layer_blocks")

    def graph(self, scn: Scenario) -> OpGraph:
        return self._get(self._graph_key(scn), lambda: build_op_graph(scn.model, *graph_args(scn)))

    def _by_scenario(self, what: str, scn: Scenario, make: Callable[[Scenario], Any]) -> Any:
        """``make(scn)`` once per scenario object (the keys below repr the specs, which hold dicts)."""
        hit = self._reprs.get((what, id(scn)))
        if hit is None or hit[0] is not scn:
            hit = self._reprs[what, id(scn)] = (scn, make(scn))
        return hit[1]

    def _graph_key(self, scn: Scenario) -> tuple:
        return self._by_scenario("graph", scn, lambda s: ("graph", repr(s.model), *graph_args(s)))

    def _blocks(self, scn: Scenario, build: Callable[..., Any], what: str) -> Any:
        p = scn.parallel
        graph = self.graph(scn)
        acc, emb = weight_grad_bytes(scn)
        return self._get(self._graph_key(scn) + (what, p.tp, p.sequence_parallel, p.cp, p.ep, p.etp, acc, emb),
                         lambda: build(graph, p.tp, p.sequence_parallel, p.cp, p.ep, acc, p.etp, emb))

    def by_activations(self, scn: Scenario, build: Callable[[], Any], *extra: Any) -> Any:
        """``build()`` once per activation key (and ``extra``): everything the activation deltas of a
        plan's units (``strategy.stage_units.activation_rules``) and its stage layout read, i.e. the op
        graph's key and the parallelism fields other than dp, ZeRO, sharding and the overlap flags."""
        p, t = scn.parallel, scn.training
        key = self._graph_key(scn) + ("activations", t.dtype_bytes, p.tp, p.sequence_parallel, p.cp, p.ep, p.etp,
                                      p.pp, p.schedule, p.virtual_stages, p.layers_per_stage, p.recompute,
                                      p.recompute_modules, p.recompute_method, p.recompute_num_layers) + extra
        return self._get(key, build)

    def stage_counts(self, scn: Scenario, stage: int, build: Callable[[], dict]) -> dict:
        """``build()`` (``stage_param_counts`` of ``stage``, read only) once per op graph, TP/EP degrees
        and stage layout."""
        p = scn.parallel
        return self._get(self._graph_key(scn) + ("stage_counts", p.tp, p.ep, p.etp, p.pp, p.schedule,
                                                 p.virtual_stages, p.layers_per_stage, stage), build)

    def _cost_key(self, scn: Scenario) -> str:
        return self._by_scenario("cost", scn, lambda s: repr((s.cluster, s.training.dtype, s.training.attention,
                                                              s.cost)))

    def cost(self, scn: Scenario) -> CostModel:
        def build():
            tables = None
            if scn.cost.compute == "calibrated":
                from ..cost.calibrated import CalibrationTables
                tables = CalibrationTables.load(scn.cost.tables)
            return CostModel(scn, build_topology(scn.cluster), tables)
        return self._get(("cost", self._cost_key(scn)), build)

    def work_s(self, scn: Scenario, work: Work, times: int = 1) -> float:
        """Seconds of a compute task with this work, ``times`` over."""
        def build():
            self._keep.append(work)
            return self.cost(scn).duration_s(Task(0, "estimate", "compute", 0, "compute", "compute", work=work))
        return times * self._get(("work", id(work), self._cost_key(scn)), build) if work else 0.0

    def collective_s(self, scn: Scenario, op: str, size_bytes: float, group: tuple[int, ...]) -> float:
        """Uncontended time of a collective (``cost.collectives.collective_time_s``)."""
        cost = self.cost(scn)
        return self._get(("coll", op, float(size_bytes), group, self._cost_key(scn)), lambda: collective_time_s(
            Collective(op, float(size_bytes), group, "pp" if op == "send_recv" else "dp"), cost.topo,
            cost.algorithms.get(op)))

    def tp_s(self, scn: Scenario, op: str, overlap: tuple = (), site: str = "") -> float:
        """Uncontended time of one TP collective of the hidden-state tensor b·(s/cp)·h; with ``overlap``
        (strategy.blocking_tp.overlap_site, via blocking_tp) what its GEMM overlap leaves exposed, as the
        engine costs it; ``site``: the TE gather it is, sized and preceded as the lowering does (TPTraffic)."""
        p = scn.parallel
        if p.tp == 1:
            return 0.0
        traffic = tp_traffic(scn)
        size = traffic.bytes(site)
        amax = traffic.amax_before(site)
        cost = self.cost(scn)

        def one(op: str, size: float, overlap: tuple) -> float:
            coll = Collective(op, float(size), tuple(range(p.tp)), "tp", overlap)
            t_s = cost.duration_s(Task(0, "estimate", "comm", 0, "compute", "comm_tp", comm=coll))
            return collective_time_s(coll, cost.topo, cost.algorithms.get(op)) if t_s is None else t_s
        return self._get(("tp", op, size, amax, p.tp, overlap, self._cost_key(scn)),
                         lambda: one(op, size, overlap) + (one("all_reduce", amax, ()) if amax else 0.0))


# ---- per-rank profiles of an action list (shared by every plan with the same schedule shape) -----------
@dataclass(frozen=True)
class RankProfile:
    """What the estimates need from one rank's action list.

    ``states``: (the rank's virtual stages, (FB, FW, action)) over the distinct (in-flight sets before an
    action, that action) pairs: row i of FB / FW counts, per virtual stage, F - B and F - W so far (a
    set's B part is alive from its F to its B, its W part from its F to its W; non-split schedules have
    no W: F - W counts F), action[i] = 3 * column + "FBW".index(phase). ``head`` / ``tail``:
    action counts per (virtual stage, phase) up to and including the last B, and after it."""

    first_stage: int
    last_b_stage: int
    states: tuple
    head: tuple
    tail: tuple


def _profile(acts) -> RankProfile:
    stages = sorted({a.stage for a in acts})
    col = {st: i for i, st in enumerate(stages)}
    fb = [0] * len(stages)
    fw = [0] * len(stages)
    states = set()
    for a in acts:
        states.add((tuple(fb), tuple(fw), col[a.stage], "FBW".index(a.phase)))
        i = col[a.stage]
        if a.phase == "F":
            fb[i] += 1
            fw[i] += 1
        elif a.phase == "B":
            fb[i] -= 1
        else:
            fw[i] -= 1
    ordered = sorted(states)
    matrix = (np.array([x[0] for x in ordered], dtype=float), np.array([x[1] for x in ordered], dtype=float),
              np.array([x[2] * 3 + x[3] for x in ordered]))
    last_b = max(i for i, a in enumerate(acts) if a.phase == "B")
    count = lambda part: tuple(sorted(_counter((a.stage, a.phase) for a in part).items()))  # noqa: E731
    return RankProfile(acts[0].stage, acts[last_b].stage, (tuple(stages), matrix),
                       count(acts[:last_b + 1]), count(acts[last_b + 1:]))


def _counter(items) -> dict:
    out: dict = {}
    for k in items:
        out[k] = out.get(k, 0) + 1
    return out


# ---- memory ---------------------------------------------------------------------------------
def _phase_memory(scn: Scenario, cache: EstimateCache) -> dict:
    """Per virtual stage: {"b": bytes alive from F to B, "w": bytes alive from F to W, "F"/"B"/"W": peak
    above the level before the action}, folded from the unit deltas ``analysis.memory.schedule_trace``
    walks (``strategy.stage_units.ActivationRules``); once per activation key (plans that differ in
    data parallelism or ZeRO only share it)."""
    return cache.by_activations(scn, lambda: _fold_phase_memory(scn, cache))


def _fold_phase_memory(scn: Scenario, cache: EstimateCache) -> dict:
    layout, rules = cache.layout(scn), activation_rules(scn)
    out = {}
    for vs in range(layout.nv):
        entry, net = {}, {}
        for phase in "FBW":
            level = peak = 0.0
            for _, delta, _ in rules.action(layout.units(vs), phase):
                level += delta
                peak = max(peak, level)
            entry[phase], net[phase] = peak, level
        entry["b"], entry["w"] = -net["B"], -net["W"]
        out[vs] = entry
    return out


def activation_peaks(scn: Scenario, cache: EstimateCache | None = None) -> list[float]:
    """Peak activation (+ recompute workspace) bytes of every pipeline rank over one step (once per
    activation key and micro-batch count: plans that differ in ZeRO only share them)."""
    cache = cache or EstimateCache()
    peaks = list(cache.by_activations(scn, lambda: _fold_peaks(scn, cache), "peaks", scn.num_microbatches))
    if deferred_head_wgrad(scn).microbatches:  # the head's stage by the walk itself: its buffers vary by micro-batch
        r = cache.layout(scn).head_rank
        peaks[r] = float(np.cumsum([e.mem_delta_bytes for e in schedule_trace(scn, [r]).events]).max(initial=0.0))
    return peaks


def _fold_peaks(scn: Scenario, cache: EstimateCache) -> tuple[float, ...]:
    phase = _phase_memory(scn, cache)
    peaks = []
    for prof in cache.profiles(scn):
        stages, (fb, fw, action) = prof.states
        b = np.array([phase[st]["b"] for st in stages])
        w = np.array([phase[st]["w"] for st in stages])
        up = np.array([phase[st][ph] for st in stages for ph in "FBW"])
        peaks.append(max(0.0, float(np.max(fb @ b + fw @ w + up[action]))))
    return tuple(peaks)


def memory_totals(scn: Scenario, cache: EstimateCache | None = None) -> list[float]:
    """memory_bytes["total"] of every pipeline stage, as ``memory_report`` accounts it."""
    par, tr = scn.parallel, scn.training
    cache = cache or EstimateCache()
    opt = optimizer_bytes_per_param(tr)
    pbytes = tr.param_bytes
    dense_dp = par.shard_group_size or par.dp * par.cp  # HSDP shards inside its shard group
    out = []
    graph, layout = cache.graph(scn), cache.layout(scn)
    for s, act in enumerate(activation_peaks(scn, cache)):
        counts = cache.stage_counts(scn, s, lambda: stage_param_counts(graph, par, layout, s))
        state = [model_state_bytes(counts[k], state_zero_stage(par), dp, pbytes, tr.grad_dtype_bytes,
                                   par.offload_optimizer, opt) for k, dp in (("dense", dense_dp), ("expert", par.expert_dp))]
        fixed = sum(static_buffers(scn, counts, s).values()) + FRAGMENTATION_FRACTION * act
        out.append(sum(sum(x.values()) for x in state) + fp8_params_bf16_bytes(scn, counts, s) + fixed + act)
    return out


# ---- time lower bound ----------------------------------------------------------------------------
def _layer_times(scn: Scenario, cache: EstimateCache, b: LayerBlocks,
                 recompute: str) -> tuple[float, float, float, float, float]:
    """(F compute, F blocking TP, B compute, B blocking TP, W compute) seconds of one layer of the kind
    whose blocks are ``b`` under ``recompute`` (``recompute.layer_recompute``), one micro-batch."""
    par, split = scn.parallel, splits_backward(cache.layout(scn).schedule)
    work = lambda w, k=1: cache.work_s(scn, w, k)  # noqa: E731
    bpart = "B" if split else "BW"
    first, later, n_later = cp_te.core_works(b, scn) or core_works(b, par.cp_algorithm, par.cp)  # the lowering's rule

    def seg_s(seg, part: str) -> float:
        if seg is b.attn_core and part != "W":
            return work(first[part]) + (work(later[part], n_later) if n_later else 0.0)
        return work({"F": seg.fwd, "B": seg.bwd_b, "BW": seg.bwd, "W": seg.bwd_w}[part])

    segs = b.segments()
    f_c = sum(seg_s(s, "F") for s in segs)
    tp = blocking_tp(par, b)  # the lowering's rule: which TP collectives block, with which overlap
    f_tp = sum(cache.tp_s(scn, *coll) for coll in tp.forward())
    b_c = sum(seg_s(s, bpart) for s in segs)
    b_tp = sum(cache.tp_s(scn, *coll) for coll in tp.backward())
    again = recomputed_forward(recompute, par.recompute_modules, scn.model, b)  # the lowering's rule
    if again.layer:
        b_c, b_tp = b_c + f_c, b_tp + f_tp
    else:
        b_c += sum(work(w) for w in again.works_without_experts() if w)
        b_c += (seg_s(b.attn_core, "F") if again.core else 0.0) + (sum(seg_s(s, "F") for s in b.between_all_to_alls())
                                                                  if again.experts else 0.0)
        b_tp += sum(cache.tp_s(scn, *coll) for coll in again.collectives(tp))
    w_c = sum(seg_s(s, "W") for s in segs) if split else 0.0
    return f_c, f_tp, b_c, b_tp, w_c


def _phase_times(scn: Scenario, cache: EstimateCache) -> dict:
    """(virtual stage, phase) -> (compute seconds, blocking TP seconds) of one micro-batch on the
    compute stream: the forward's TP/SP collectives, SP's all-gather of output gradients in B and the
    recompute; the asynchronous input-gradient collectives of B and W are left out. Each layer is
    costed by its kind (``strategy.blocks.layer_blocks``, as the lowering)."""
    par = scn.parallel
    split = splits_backward(cache.layout(scn).schedule)
    b = cache.blocks(scn)
    work = lambda w: cache.work_s(scn, w)  # noqa: E731
    sp = par.sequence_parallel
    memo: dict = {}
    modes = layer_recompute_modes(par, cache.layout(scn), scn.model)
    per_layer = [_kind_times(scn, cache, lb, memo, mode) for lb, mode in zip(cache.layer_blocks(scn), modes)]
    embed_tp = cache.tp_s(scn, "reduce_scatter" if sp else "all_reduce")
    gather = cache.tp_s(scn, "all_gather") if sp else 0.0
    layout = cache.layout(scn)
    out = {}
    for vs, layers in enumerate(layout.chunks):
        first, last = "embed" in layout.units(vs), "head" in layout.units(vs)  # a model copy's ends
        f_c, f_tp, b_c, b_tp, w_c = (sum(per_layer[i][k] for i in layers) for k in range(5))
        out[vs, "F"] = (f_c + first * work(b.embed.fwd) + last * work(b.head.fwd), f_tp + first * embed_tp + last * gather)
        out[vs, "B"] = (b_c + first * (0.0 if split else work(b.embed.bwd))
                        + last * work(b.head.bwd_b if split else b.head.bwd), b_tp + first * gather)
        out[vs, "W"] = (w_c + first * work(b.embed.bwd_w) + last * work(b.head.bwd_w), 0.0)
    return out


def _kind_times(scn: Scenario, cache: EstimateCache, lb: LayerBlocks, memo: dict, recompute: str) -> tuple:
    key = ("times", id(lb), recompute)
    if key not in memo:
        memo[key] = _layer_times(scn, cache, lb, recompute)
    return memo[key]


def time_lower_bound(scn: Scenario, cache: EstimateCache | None = None) -> tuple[float, float]:
    """(bound, blocking TP seconds on the bounding rank's compute stream). Per pipeline rank, the compute
    stream: the forward chain of the virtual stages before its first action + its work up to its last B
    (less the deferred head wgrads, which run after it) + max(its remaining work, the backward chain of
    the virtual stages before that B); its data-parallel streams (``dp_stream_s``) and pipeline sends
    (``pp_stream_s``); DeepSpeed 2021's host work (``ds2021_host_s``). The largest over ranks and streams."""
    cache = cache or EstimateCache()
    t, layout = _phase_times(scn, cache), cache.layout(scn)
    fwd = [sum(t[vs, "F"]) for vs in range(layout.nv)]
    bwd = [sum(t[vs, "B"]) for vs in range(layout.nv)]
    before = lambda vs: slice(layout.smap.first_of(vs), vs)  # noqa: E731 (the stages before vs in its model copy)
    drain = cache.work_s(scn, cache.blocks(scn).head.bwd_w, deferred_head_wgrad(scn).microbatches)
    best = (0.0, 0.0)
    for r, prof in enumerate(cache.profiles(scn)):
        moved = drain if r == layout.head_rank else 0.0
        head = sum(c * sum(t[k]) for k, c in prof.head) - moved
        tail = sum(c * sum(t[k]) for k, c in prof.tail) + moved
        bound = (sum(fwd[before(prof.first_stage)]) + head + max(tail, sum(bwd[before(prof.last_b_stage)]))
                 + ds2021_host_s(scn, cache, r))
        tp = sum(c * t[k][1] for k, c in prof.head + prof.tail)
        bound = max(bound, dp_stream_s(scn, cache, r), pp_stream_s(scn, cache, r, prof))
        if bound > best[0]:
            best = (bound, tp)
    return best


def estimate(scn: Scenario, cache: EstimateCache | None = None, with_time: bool = True) -> StaticEstimate:
    cache = cache or EstimateCache()
    totals = memory_totals(scn, cache)
    worst = max(range(len(totals)), key=lambda s: (totals[s], -s))
    bound, tp = time_lower_bound(scn, cache) if with_time else (0.0, 0.0)
    return StaticEstimate(totals[worst], worst, tuple(totals), float(scn.cluster.gpu.memory_capacity_bytes), bound, tp)
