"""lower(): a Scenario becomes a TaskGraph of per-rank compute and communication tasks.

The pipeline schedule (``schedules``) fixes the program order of every stage's compute stream; each
action F/B/W of a virtual stage expands into its units (embedding, layers via ``layer_emit``, head),
P2P transfers connect the stages, and gradient synchronisation and the optimizer close the step
(placed by ``emit_sync``, built by ``grad_sync``). In symmetric mode one representative rank per pipeline stage is lowered (DESIGN.md
§5); collectives still name their full groups, so the cost model charges the network for all of them.
Activation memory is attached per unit: allocated by its forward, freed by its backward (B and W
parts for zero-bubble), the deltas from ``stage_units`` (one rule with the memory estimates).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING

from ..model import repeat_kv
from ..model.eager import is_loss_parallel
from ..model.fp8 import fp8_transposes
from ..model.opgraph import build_op_graph
from ..model.te_layout import te_cp
from ..tasks import InternalError, TaskGraph
from .blocks import build_blocks, layer_blocks, split_off
from .context import LowerCtx
from .emit_sync import ParamGradSync
from .grad_sync import last_compute, zero3_reduce
from .layer_emit import amax_reduction, column_backward, layer_backward, layer_forward, layer_weight_grad, tp_op
from .mesh import DeviceMesh
from .pair_overlap import interleave
from .schedules import Action, StageMap, overlapped_pairs, schedule_actions, splits_backward
from .embed_grad import weight_grad_bytes
from .sharding import layer_submodules
from .recompute import layer_recompute_modes
from .stage_units import (activation_rules, chunk_layers, chunk_sizes, copy_sync_bytes,  # noqa: F401 (re-exported)
                          deferred_head_wgrad, scenario_layout, stage_layout, stage_param_counts, unit_params)
from .stamp import Stamper
from .zero_impl import FSDP, pipelined_fsdp2

if TYPE_CHECKING:  # scenario imports strategy: a type-only import
    from ..scenario import Scenario


@dataclass(frozen=True)
class LoweredPlan:
    graph: TaskGraph
    mesh: DeviceMesh
    stage_params: dict  # simulated rank -> {"dense": params, "expert": params}
    rank_labels: dict
    chunk_layers: tuple  # virtual stage -> tuple of global layer indices


def graph_args(scn: Scenario) -> tuple:
    """``build_op_graph``'s arguments after the model, one micro-batch of the scenario's training (the
    search's estimate builds the same graph)."""
    t, p = scn.training, scn.parallel
    return (t.micro_batch_size, t.dtype, t.fp8_recipe, t.attention, t.kernels, t.cross_entropy,
            fp8_transposes(scn.cluster.gpu.architecture),
            te_cp(p.sharding, t.kernels, t.attention, t.attention_module, p.cp),
            t.attention_module == repeat_kv.MODULE, is_loss_parallel(t.cross_entropy, p.tp))


def lower(scn: Scenario, full: bool = False) -> LoweredPlan:
    par, tr, model = scn.parallel, scn.training, scn.model
    mesh = DeviceMesh(pp=par.pp, dp=par.dp, cp=par.cp, tp=par.tp, ep=par.ep, etp=par.etp)
    graph = build_op_graph(model, *graph_args(scn))
    acc, emb = weight_grad_bytes(scn)
    blocks = build_blocks(graph, par.tp, par.sequence_parallel, par.cp, par.ep, acc, par.etp, emb)
    per_layer = layer_blocks(graph, par.tp, par.sequence_parallel, par.cp, par.ep, acc, par.etp, emb)
    ctx = LowerCtx(scn, mesh, graph, blocks, full, layers=per_layer)
    layout = scenario_layout(scn)  # schedule, stage map and layers of every virtual stage (stage_units)
    schedule, v, smap, layers = layout.schedule, layout.v, layout.smap, layout.chunks
    actions = schedule_actions(schedule, par.pp, scn.num_microbatches, v)
    ranks = tuple(range(mesh.size)) if full else mesh.representatives
    stage_params = {r: stage_param_counts(graph, par, layout, mesh.stage_of(r)) for r in ranks}
    emitter = _Emitter(ctx, actions, layers, ranks, splits_backward(schedule), stage_params, smap)
    emitter.run()
    emitter.stamp.templates.clear()  # its keys hold the emitter's bound methods: a cycle the collector would walk
    labels = {r: f"stage {mesh.stage_of(r)} (rank {r})" for r in ranks}
    meta = {"num_stages": par.pp, "virtual_stages": v, "num_microbatches": scn.num_microbatches,
            "schedule": schedule, "stage_map": smap.kind}
    g = ctx.builder.build(ranks, full, meta)
    return LoweredPlan(g, mesh, stage_params, labels, layers)


class _Emitter(ParamGradSync):
    """Walks every simulated rank's action list in a dependency-respecting order."""

    def __init__(self, ctx: LowerCtx, actions: list[list[Action]], layers: tuple[tuple[int, ...], ...],
                 ranks: tuple[int, ...], split_w: bool, stage_params: dict, smap: StageMap) -> None:
        self.ctx, self.actions, self.layers, self.ranks = ctx, actions, layers, ranks
        self.split_w, self.stage_params, self.smap = split_w, stage_params, smap
        par = ctx.par
        p = par.pp
        self.p, self.nv, self.m = p, p * (par.virtual_stages if p > 1 else 1), ctx.scn.num_microbatches
        self.sends: dict = {}  # (rank, virtual stage, mb, phase) -> send task id
        self._peers: dict = {}  # (rank, virtual stage) -> _peer
        self._unit_names: dict = {}  # virtual stage -> _units
        self.passes: dict = {}  # (virtual stage, phase) -> its passes in the step (m, or a copy's share)
        for row in actions:
            for a in row:
                self.passes[a.stage, a.phase] = self.passes.get((a.stage, a.phase), 0) + 1
        self.final_ready: dict = {r: [] for r in ranks}  # rank -> per chunk [(task, dense, expert)] (ZeRO <= 1)
        self.seen: dict = {}  # (rank, virtual stage, phase) -> backward passes emitted
        self.gathers: dict = {}  # (rank, virtual stage, unit) -> param all-gathers its first forward waits for
        self.grad_waits: dict = {r: [] for r in ranks}  # rank -> reductions the optimizer waits for
        # parameters gathered per unit: ZeRO-3, and FSDP's SHARD_GRAD_OP (zero_stage 2)
        self.zero3 = par.dp * par.cp > 1 and (par.zero_stage == 3 or (par.zero_stage == 2 and par.sharding in FSDP))
        self.fsdp1 = self.zero3 and par.sharding == "fsdp1"  # reduce-scatters issued unit by unit (grad_sync)
        self.plans: dict = {}  # virtual stage -> zero_impl.pass_fetches
        self.pipelined = self.zero3 and pipelined_fsdp2(par)  # FSDP2 under torch's pipelining
        self.resident: set = set()  # (rank, virtual stage) gathered for the step (zero_impl.pipelined_fsdp2)
        self.stamp = Stamper(ctx)  # layers emitted once per shape, then stamped out (``stamp``)
        # each unit's activation deltas per pass and its parameters on this rank (stage_units)
        self.mem = activation_rules(ctx.scn, split_w)
        ctx.layer_mem = self.mem.layers
        g, layout = ctx.graph, scenario_layout(ctx.scn)
        self.layout = layout
        # DualPipe's overlapped forward-backward pairs: (virtual stage, micro-batch) of their forwards in
        # the schedule the layout runs (one stage runs 1F1B, whatever the scenario names), and per rank
        # the first task id of a pair whose B is still to come (``pair_overlap``)
        self.pairs = overlapped_pairs(layout.schedule, layout.p, self.m, layout.v)
        self.pair_open: dict[int, int] = {}
        self.unit_params = unit_params(g, par, layout)
        self.tied_pp = ctx.scn.model.tie_embeddings and not layout.ends_together
        # DeepSpeed fetches per submodule: one (weight, bias) pair per op holding dense parameters
        self.layer_subs = layer_submodules(g, par.tp, par.ep)
        self.recompute_modes = layer_recompute_modes(par, layout, ctx.scn.model)  # per layer index
        self.recomputed = frozenset(i for i, mode in enumerate(self.recompute_modes) if mode == "full")
        self.defer = deferred_head_wgrad(ctx.scn)  # the output layer's wgrads run in the flush (drain)
        self.deferred: dict = {r: [] for r in ranks}  # rank -> metas of its deferred head backwards

    # ---- driver ------------------------------------------------------------------------------
    def run(self) -> None:
        ctx = self.ctx
        if ctx.par.zero_stage in (1, 2) and ctx.par.overlap_param_gather and not self.zero3:
            for r in self.ranks:
                self._early_param_gather(r)
        pos = {r: 0 for r in self.ranks}
        todo = sum(len(self.actions[ctx.mesh.stage_of(r)]) for r in self.ranks)
        while todo:
            progressed = False
            for r in self.ranks:
                acts = self.actions[ctx.mesh.stage_of(r)]
                while pos[r] < len(acts) and self._try(r, acts[pos[r]]):
                    pos[r] += 1
                    todo -= 1
                    progressed = True
            if not progressed:
                raise InternalError("pipeline schedule deadlocks: no stage can make progress")
        for r in self.ranks:
            self._drain(r)
            self._finish(r)

    def _peer(self, rank: int, vs: int) -> int:
        """The rank that holds virtual stage vs, at the same (dp, cp, tp) coordinates (memoised: asked
        twice per action)."""
        peer = self._peers.get((rank, vs))
        if peer is None:
            _, dp, cp, tp = self.ctx.mesh.coords(rank)
            peer = self._peers[(rank, vs)] = self.ctx.mesh.rank(self.smap.rank(vs), dp, cp, tp)
        return peer

    def _try(self, r: int, a: Action) -> bool:
        vs, mb = a.stage, a.microbatch
        dep = None
        src = self.smap.prev(vs) if a.phase == "F" else self.smap.next(vs, self.nv) if a.phase == "B" else None
        if src is not None:  # the stage before (F) or after (B) in vs's model copy (StageMap)
            dep = self.sends.get((self._peer(r, src), src, mb, a.phase))
            if dep is None:
                return False
        if r in self.pair_open and a.phase != "B":
            raise InternalError(f"rank {r}: an overlapped pair's forward is followed by {a}, not by a backward")
        start = len(self.ctx.builder)
        (self._forward if a.phase == "F" else self._backward if a.phase == "B" else self._weight)(r, vs, mb, dep)
        if a.phase == "F" and (vs, mb) in self.pairs:
            self.pair_open[r] = start  # DualPipe: this F and the B after it on r run as one pair
        elif a.phase == "B" and r in self.pair_open:
            interleave(self.ctx.builder, r, self.pair_open.pop(r), start)
        return True

    def _meta(self, vs: int, mb: int, phase: str, layer: int = -1) -> dict:
        return {"microbatch": mb, "chunk": vs // self.p, "phase": phase, "layer": layer}

    def _units(self, vs: int) -> list[str]:
        """The chunk's units in forward order (``stage_units.StageLayout.units``), layers as strings."""
        units = self._unit_names.get(vs)
        if units is None:
            units = self._unit_names[vs] = tuple(str(u) for u in self.layout.units(vs))
        return list(units)

    def _layers(self, vs: int) -> list[int]:
        return [int(u) for u in self.layout.units(vs) if str(u) not in ("embed", "head")]

    def _params(self, unit: str) -> tuple[float, float]:
        return self.unit_params.of(unit)

    def _send(self, r: int, vs: int, mb: int, phase: str, last: int | None) -> None:
        to = self.smap.next(vs, self.nv) if phase == "F" else self.smap.prev(vs)
        if to is None:  # a model copy's end
            return
        ctx = self.ctx
        peer = self._peer(r, to)
        if peer == r:  # the turn of a V stage map: the next stage is on this rank, nothing to send
            self.sends[(r, vs, mb, phase)] = last
            return
        # Narayanan et al. 2021 §4.1 scatter/gather: each TP rank sends 1/t of the activation.
        size = ctx.full_activation_bytes() / ctx.par.tp
        self.sends[(r, vs, mb, phase)] = ctx.comm(
            r, "comm_pp", f"send.{vs}{phase}{mb}", "send_recv", size, (r, peer), "pp", "comm_pp", (last,),
            **self._meta(vs, mb, phase))

    def _forward(self, r: int, vs: int, mb: int, dep: int | None) -> None:
        """F of virtual stage vs for micro-batch mb after ``dep`` (the received activation). Outside
        ZeRO-3 the whole pass is stamped from a template (``stamp``); the parameter all-gathers its
        first units wait for (``_early_param_gather``) go in as outside dependencies."""
        meta = self._meta(vs, mb, "F")
        if self.zero3 and (r, vs) not in self.resident:  # its gathers go in (after the first: none)
            x = self._forward_units(self.ctx, r, (dep,), f"F{mb}", meta, vs, ())
        else:
            got = [tuple(self.gathers.pop((r, vs, u), ())) for u in self._units(vs)] if self.gathers else []
            x = self.stamp.call(self._forward_units, r, (dep,) + tuple(chain.from_iterable(got)), f"F{mb}", meta, vs,
                                tuple(map(len, got)))
        self._send(r, vs, mb, "F", x)

    def _forward_units(self, ctx: LowerCtx, r: int, deps: tuple, name: str, meta: dict, vs: int,
                       counts: tuple[int, ...]) -> int | None:
        """The units of an F pass after deps[0]; unit k also waits for the next counts[k] of deps[1:]."""
        b, mb = ctx.blocks, meta["microbatch"]
        x = ctx.join(r, f"{name}.wait", deps[:1], **meta)
        extra, at = deps[1:], 0
        for k, (unit, waits) in enumerate(zip(self._units(vs), self._prefetching(r, vs, "F", name))):
            if counts:
                waits += extra[at:at + counts[k]]
                at += counts[k]
            deps = (x,) + waits if x is not None else waits
            if unit == "embed":
                ctx.alloc_next(r, self.mem.unit(unit, "F").alloc_bytes)
                x = ctx.compute(r, f"{name}.embed", b.embed.fwd, deps, **meta)
                # vocab-parallel embedding: all-reduce (reduce-scatter with SP) of its output over TP
                x = tp_op(ctx, r, x, f"{name}.embed", "reduce_scatter" if ctx.par.sequence_parallel else "all_reduce",
                          meta)
            elif unit == "head":
                x = ctx.join(r, f"{name}.head.wait", deps, **meta)
                if ctx.par.sequence_parallel:  # ColumnParallelLinear output layer gathers the sequence
                    x = tp_op(ctx, r, x, f"{name}.head", "all_gather", meta)
                ctx.alloc_next(r, self.mem.unit(unit, "F").alloc_bytes)
                x = ctx.compute(r, f"{name}.head", b.head.fwd, () if x is None else (x,), **meta)
            else:
                ctx.alloc_next(r, self.mem.unit(unit, "F").alloc_bytes)
                x = self.stamp.call(layer_forward, r, deps, f"{name}.L{unit}", self._meta(vs, mb, "F", int(unit)))
        return amax_reduction(ctx, r, x, name, meta, self._layers(vs), "F")

    def _count(self, r: int, vs: int, phase: str) -> bool:
        """Count a backward (B or W) pass of (rank, virtual stage); True on the last micro-batch."""
        n = self.seen.get((r, vs, phase), 0) + 1
        self.seen[(r, vs, phase)] = n
        return n == self.passes[vs, phase]

    def _backward(self, r: int, vs: int, mb: int, dep: int | None) -> None:
        """B of virtual stage vs for micro-batch mb after ``dep``; stamped outside ZeRO-3 (see _forward)."""
        final = self._count(r, vs, "B")
        meta = self._meta(vs, mb, "B")
        defer = self._units(vs)[-1] == "head" and len(self.deferred[r]) < self.defer.microbatches
        if defer:
            self.deferred[r].append(meta)
        if self.zero3 and (r, vs) not in self.resident:
            out = self._backward_units(self.ctx, r, (dep,), f"B{mb}", meta, vs, defer)
        else:
            out = self.stamp.call(self._backward_units, r, (dep,), f"B{mb}", meta, vs, defer)
        x = out[-1]
        if self.split_w:
            self._grads_ready(r, vs, f"B{mb}", [], final, x)
        elif final or self.zero3 or self.ctx.par.zero_stage == 2:  # ZeRO-0/1 reduce after the last micro-batch
            self._grads_ready(r, vs, f"B{mb}", list(zip(self._units(vs)[::-1], out[:-1])), final, x)
        self._send(r, vs, mb, "B", x)

    def _backward_units(self, ctx: LowerCtx, r: int, deps: tuple, name: str, meta: dict, vs: int,
                        defer: bool = False) -> tuple:
        """The units of a B pass after deps[0], in backward order; returns the last task of every unit
        (when the backward is not split) and the pass's last task. ``defer``: the head computes its
        input gradient only and keeps its wgrad's operands for the flush (``_drain``)."""
        b, mb = ctx.blocks, meta["microbatch"]
        ends: list = []
        x = deps[0]
        for unit, waits in zip(self._units(vs)[::-1], self._prefetching(r, vs, "B", name)):
            deps = (x,) + waits if x is not None else waits
            if unit == "head":
                x = ctx.join(r, f"{name}.head.wait", deps, **meta)
                d, head = self.mem.unit(unit, "B"), b.head
                if d.alloc_bytes:  # the loss's own gradients (loss_backward_bytes): its backward allocates them
                    loss, head = split_off(head, "loss")
                    ctx.alloc_next(r, d.alloc_bytes)
                    x = ctx.compute(r, f"{name}.head.loss", loss, () if x is None else (x,), **meta)
                kept = self.defer.kept_bytes if defer else 0.0
                x = column_backward(ctx, r, head, x, f"{name}.head", meta, self.split_w or defer, d.free_bytes - kept)
            elif unit == "embed":
                x = ctx.join(r, f"{name}.embed.wait", deps, **meta)
                if ctx.par.sequence_parallel:  # conjugate of the embedding's reduce-scatter
                    x = tp_op(ctx, r, x, f"{name}.embed_grad", "all_gather", meta)
                if not self.split_w:  # the table's scatter-add is its weight gradient (W when split)
                    x = ctx.compute(r, f"{name}.embed", b.embed.bwd, () if x is None else (x,), **meta)
                ctx.free_last(r, self.mem.unit(unit, "B").free_bytes)
            else:
                d = self.mem.unit(unit, "B")  # its recompute's bytes: layer_emit, ctx.transient_bytes
                ctx.alloc_next(r, d.alloc_bytes)  # the output gradients W will need beyond what B frees
                x = self.stamp.call(layer_backward, r, deps, f"{name}.L{unit}", self._meta(vs, mb, "B", int(unit)),
                                    self.split_w, self.recompute_modes[int(unit)], d.free_bytes)
            if self.fsdp1 and not self.split_w:  # FSDP1's post-backward hook: as soon as the unit's grads exist
                label = unit if unit in ("embed", "head") else "L" + unit
                self.grad_waits[r] += zero3_reduce(ctx, r, f"{name}.{label}", *self._params(unit), x,
                                                   self.seen.get((r, vs, "B"), 1) - 1)
            if not self.split_w:
                ends.append(x)
        return tuple(ends) + (amax_reduction(ctx, r, x, name, meta, self._layers(vs), "B"),)

    def _drain(self, r: int) -> None:
        """Megatron-Core's drain_embedding_wgrad_compute on the last stage, after its last backward: the
        deferred output-layer weight gradients in micro-batch order, each after the TP all-gather of its
        buffered input under sequence parallelism, each freeing its buffers (``stage_units``). The head's
        gradient reduction is not held for them: the deferring backward still returns a (dummy) weight
        gradient, so DDP's hook marks the parameter ready in its last backward, as without deferral
        (megatron/core/tensor_parallel/layers.py; Megatron-LM issue #1012 reports the drain after the
        gradient reduction); the optimizer step waits for the drain."""
        metas = self.deferred[r]
        if not metas:
            return
        ctx = self.ctx
        x = last_compute(ctx, r)
        for meta in metas:
            w = dict(meta, phase="W")
            name = f"W{meta['microbatch']}.head.deferred"
            g = None
            if ctx.par.sequence_parallel and ctx.par.tp > 1:
                g = ctx.tp_collective(r, f"{name}.input_all_gather", "all_gather", ctx.full_activation_bytes(), (x,),
                                      "comm_tp", **w)
            x = ctx.compute(r, name, ctx.blocks.head.bwd_w, tuple(d for d in (x, g) if d is not None),
                            mem_delta_bytes=-self.defer.kept_bytes, **w)

    def _weight(self, r: int, vs: int, mb: int, dep: int | None) -> None:
        """W of virtual stage vs for micro-batch mb (split backward schedules), stamped (see _forward)."""
        final = self._count(r, vs, "W")
        out = self.stamp.call(self._weight_units, r, (), f"W{mb}", self._meta(vs, mb, "W"), vs)
        self._grads_ready(r, vs, f"W{mb}", list(zip(self._units(vs)[::-1], out[:-1])), final, out[-1])

    def _weight_units(self, ctx: LowerCtx, r: int, deps: tuple, name: str, meta: dict, vs: int) -> tuple:
        """The weight-gradient GEMMs of every unit, in backward order; returns each unit's last task
        and the pass's last task."""
        b, mb = ctx.blocks, meta["microbatch"]
        ends: list = []
        x = None
        for unit in self._units(vs)[::-1]:
            meta = self._meta(vs, mb, "W", -1 if unit in ("embed", "head") else int(unit))
            if unit == "embed":
                x = ctx.compute(r, f"{name}.embed", b.embed.bwd_w, () if x is None else (x,), **meta)
            elif unit == "head":
                g = None
                if ctx.par.sequence_parallel:  # the LM head's sequence-sharded input, gathered again
                    g = ctx.tp_collective(r, f"{name}.head.input_all_gather", "all_gather", ctx.full_activation_bytes(),
                                          (), "comm_tp", **meta)
                x = ctx.compute(r, f"{name}.head", b.head.bwd_w, tuple(d for d in (x, g) if d is not None), **meta)
            else:
                x = self.stamp.call(layer_weight_grad, r, (x,), f"{name}.L{unit}", meta,
                                    self.mem.unit(unit, "W").free_bytes)
            ends.append(x)
        return tuple(ends) + (x,)
