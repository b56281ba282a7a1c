"""lower(): a Scenario becomes a TaskGraph of per-rank compute and communication tasks.

The pipeline schedule (``schedules``) fixes the program order of every stage's compute stream; each
action F/B/W of a virtual stage expands into its layers (``layer_emit``), P2P transfers connect the
stages, and gradient synchronisation and the optimizer close the step (``grad_sync``). In symmetric
mode one representative rank per pipeline stage is lowered (DESIGN.md §5); collectives still name
their full groups, so the cost model charges the network for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model.opgraph import build_op_graph
from ..tasks import TaskGraph
from .activation_memory import (embedding_activation_bytes, head_activation_bytes, layer_activation_bytes,
                                layer_activation_split)
from .blocks import build_blocks
from .context import LowerCtx
from .grad_sync import gather_parameters, last_compute, optimizer_step, reduce_gradients
from .layer_emit import layer_backward, layer_forward, layer_weight_grad
from .mesh import DeviceMesh
from .schedules import Action, schedule_actions, splits_backward
from .sharding import params_per_rank


@dataclass(frozen=True)
class LoweredPlan:
    graph: TaskGraph
    mesh: DeviceMesh
    stage_params: dict  # simulated rank -> {"dense": params, "expert": params}
    rank_labels: dict
    chunk_layers: tuple  # virtual stage -> tuple of global layer indices


def chunk_layers(layers_per_stage: tuple[int, ...], v: int) -> tuple[tuple[int, ...], ...]:
    """Global layer indices of every virtual stage (chunk c of rank r is virtual stage c·p + r)."""
    p = len(layers_per_stage)
    sizes = [layers_per_stage[vs % p] // v for vs in range(p * v)]
    out, first = [], 0
    for n in sizes:
        out.append(tuple(range(first, first + n)))
        first += n
    return tuple(out)


def lower(scn, full: bool = False) -> LoweredPlan:
    par, tr, model = scn.parallel, scn.training, scn.model
    mesh = DeviceMesh(pp=par.pp, dp=par.dp, cp=par.cp, tp=par.tp, ep=par.ep)
    graph = build_op_graph(model, tr.micro_batch_size, tr.dtype)
    blocks = build_blocks(graph, par.tp, par.sequence_parallel, par.cp, par.ep)
    ctx = LowerCtx(scn, mesh, graph, blocks, full)
    v = par.virtual_stages if par.pp > 1 else 1
    schedule = par.schedule if par.pp > 1 else "1f1b"
    actions = schedule_actions(schedule, par.pp, scn.num_microbatches, v)
    layers = chunk_layers(par.layers_per_stage, v)
    ranks = tuple(range(mesh.size)) if full else mesh.representatives
    stage_params = {}
    for r in ranks:
        s = mesh.stage_of(r)
        stage_params[r] = params_per_rank(graph, par.tp, par.ep, par.layers_per_stage[s], s == 0, s == par.pp - 1)
    _Emitter(ctx, actions, layers, ranks, splits_backward(schedule), stage_params).run()
    labels = {r: f"stage {mesh.stage_of(r)} (rank {r})" for r in ranks}
    meta = {"num_stages": par.pp, "virtual_stages": v, "num_microbatches": scn.num_microbatches,
            "schedule": schedule}
    g = ctx.builder.build(ranks, full, meta)
    return LoweredPlan(g, mesh, stage_params, labels, layers)


class _Emitter:
    """Walks every simulated rank's action list in a dependency-respecting order."""

    def __init__(self, ctx: LowerCtx, actions, layers, ranks, split_w: bool, stage_params: dict) -> None:
        self.ctx, self.actions, self.layers, self.ranks = ctx, actions, layers, ranks
        self.split_w, self.stage_params = split_w, stage_params
        p = ctx.par.pp
        self.p, self.nv = p, p * (ctx.par.virtual_stages if p > 1 else 1)
        self.sends: dict = {}  # (rank, virtual stage, mb, phase) -> send task id
        self.ready: dict = {r: [] for r in ranks}  # rank -> [(task, dense params, expert params)] bwd order
        self.last_bwd: dict = {}  # (rank, virtual stage) -> number of backward passes seen
        self.gathers: dict = {}  # (rank, virtual stage) -> param all-gather tasks to wait for
        self.act = self._activation_terms()
        m = ctx.scn.model
        self.layer_params = params_per_rank(ctx.graph, ctx.par.tp, ctx.par.ep, 1, False, False)
        self.tied_pp = m.tie_embeddings and p > 1

    # ---- memory terms -----------------------------------------------------------------------
    def _activation_terms(self) -> dict:
        c, scn = self.ctx, self.ctx.scn
        args = (scn.model, scn.training.micro_batch_size, c.par.tp, c.par.sequence_parallel, c.par.cp)
        per_layer = layer_activation_bytes(*args, c.par.recompute, c.dtype_bytes, c.par.ep)
        at_b, at_w = layer_activation_split(*args, c.par.recompute, c.dtype_bytes, c.par.ep)
        return {"layer": per_layer, "layer_b": at_b, "layer_w": at_w,
                "embed": embedding_activation_bytes(*args, c.dtype_bytes),
                "head": head_activation_bytes(*args, c.dtype_bytes)}

    def _chunk_activation(self, vs: int) -> tuple[float, float]:
        """(freed at B, freed at W) bytes of one micro-batch on virtual stage vs."""
        n = len(self.layers[vs])
        extra = (self.act["embed"] if vs == 0 else 0.0) + (self.act["head"] if vs == self.nv - 1 else 0.0)
        if self.split_w:
            return n * self.act["layer_b"] + extra, n * self.act["layer_w"]
        return n * self.act["layer"] + extra, 0.0

    # ---- driver ------------------------------------------------------------------------------
    def run(self) -> None:
        ctx = self.ctx
        if ctx.par.zero_stage in (1, 2) and ctx.par.overlap_param_gather:
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
                raise ValueError("pipeline schedule deadlocks: no stage can make progress")
        for r in self.ranks:
            self._finish(r)

    def _peer(self, rank: int, vs: int) -> int:
        """The rank that holds virtual stage vs, at the same (dp, cp, tp) coordinates."""
        _, dp, cp, tp = self.ctx.mesh.coords(rank)
        return self.ctx.mesh.rank(vs % self.p, dp, cp, tp)

    def _try(self, r: int, a: Action) -> bool:
        vs, mb = a.stage, a.microbatch
        dep = None
        if a.phase == "F" and vs > 0:
            dep = self.sends.get((self._peer(r, vs - 1), vs - 1, mb, "F"))
            if dep is None:
                return False
        if a.phase == "B" and vs < self.nv - 1:
            dep = self.sends.get((self._peer(r, vs + 1), vs + 1, mb, "B"))
            if dep is None:
                return False
        {"F": self._forward, "B": self._backward, "W": self._weight}[a.phase](r, vs, mb, dep)
        return True

    def _meta(self, r: int, vs: int, mb: int, phase: str, layer: int = -1) -> dict:
        return {"microbatch": mb, "chunk": vs // self.p, "phase": phase, "layer": layer}

    def _send(self, r: int, vs: int, mb: int, phase: str, last: int) -> None:
        to = vs + 1 if phase == "F" else vs - 1
        if not 0 <= to < self.nv:
            return
        ctx = self.ctx
        peer = self._peer(r, to)
        # Narayanan et al. 2021 §4.1 scatter/gather: each TP rank sends 1/t of the activation.
        size = ctx.full_activation_bytes() / ctx.par.tp
        self.sends[(r, vs, mb, phase)] = ctx.comm(
            r, "comm_pp", f"send.{vs}{phase}{mb}", "send_recv", size, (r, peer), "pp", "comm_pp", (last,),
            **self._meta(r, vs, mb, phase))

    def _forward(self, r: int, vs: int, mb: int, dep: int | None) -> None:
        ctx, b = self.ctx, self.ctx.blocks
        deps = [] if dep is None else [dep]
        deps += self.gathers.pop((r, vs), [])
        freed_b, freed_w = self._chunk_activation(vs)
        first = None
        x = None
        if vs == 0:
            x = ctx.compute(r, f"F{mb}.embed", b.embed.fwd, deps, mem_delta_bytes=freed_b + freed_w,
                            **self._meta(r, vs, mb, "F"))
            x = self._tp_after_embed(r, x, vs, mb)
            first, deps = x, [x]
        for layer in self.layers[vs]:
            meta = self._meta(r, vs, mb, "F", layer)
            d = x if x is not None else None
            if x is None and len(deps) > 1:
                d = ctx.compute(r, f"F{mb}.wait", (), deps, **self._meta(r, vs, mb, "F"))
            elif x is None and deps:
                d = deps[0]
            d = self._zero3_gather(r, d, f"F{mb}.L{layer}")
            f, x = layer_forward(ctx, r, d, f"F{mb}.L{layer}", meta)
            if first is None:
                first = f
                self._alloc(first, freed_b + freed_w)
        if vs == self.nv - 1:
            x = ctx.compute(r, f"F{mb}.head", b.head.fwd, () if x is None else (x,), **self._meta(r, vs, mb, "F"))
        self._send(r, vs, mb, "F", x)

    def _alloc(self, tid: int, nbytes: float) -> None:
        """Set the activation allocation on a task that was just created without one."""
        t = self.ctx.builder.task(tid)
        if t.mem_delta_bytes == 0.0:
            self.ctx.builder.set_mem(tid, nbytes)

    def _tp_after_embed(self, r: int, x: int, vs: int, mb: int) -> int:
        """Vocab-parallel embedding: all-reduce (reduce-scatter with SP) of its output over TP."""
        op = "reduce_scatter" if self.ctx.par.sequence_parallel else "all_reduce"
        t = self.ctx.tp_collective(r, f"F{mb}.embed.{op}", op, self.ctx.full_activation_bytes(), (x,),
                                   **self._meta(r, vs, mb, "F"))
        return x if t is None else t

    def _backward(self, r: int, vs: int, mb: int, dep: int | None) -> None:
        ctx, b = self.ctx, self.ctx.blocks
        freed_b, _ = self._chunk_activation(vs)
        x = dep
        if vs == self.nv - 1:
            x = ctx.compute(r, f"B{mb}.head", b.head.bwd_b if self.split_w else b.head.bwd,
                            () if x is None else (x,), **self._meta(r, vs, mb, "B"))
        count = self.last_bwd.get((r, vs), 0) + 1
        self.last_bwd[(r, vs)] = count
        final = count == self.ctx.scn.num_microbatches
        for layer in reversed(self.layers[vs]):
            meta = self._meta(r, vs, mb, "B", layer)
            x = self._zero3_gather(r, x, f"B{mb}.L{layer}")
            _, x = layer_backward(ctx, r, x, f"B{mb}.L{layer}", meta, self.split_w, ctx.par.recompute)
            if not self.split_w:
                self._grads_ready(r, x, final)
        if vs == 0:
            x = ctx.compute(r, f"B{mb}.embed", b.embed.bwd_b if self.split_w else b.embed.bwd, (x,),
                            **self._meta(r, vs, mb, "B"))
        ctx.builder.set_mem(x, -freed_b)
        self._send(r, vs, mb, "B", x)

    def _weight(self, r: int, vs: int, mb: int, dep: int | None) -> None:
        ctx = self.ctx
        _, freed_w = self._chunk_activation(vs)
        x = None
        count = self.last_bwd.get((r, vs, "W"), 0) + 1
        self.last_bwd[(r, vs, "W")] = count
        final = count == ctx.scn.num_microbatches
        for layer in reversed(self.layers[vs]):
            x = layer_weight_grad(ctx, r, x, f"W{mb}.L{layer}", self._meta(r, vs, mb, "W", layer))
            self._grads_ready(r, x, final)
        if x is not None:
            ctx.builder.set_mem(x, -freed_w)

    # ---- ZeRO ------------------------------------------------------------------------------
    def _zero3_gather(self, r: int, dep: int | None, name: str) -> int | None:
        """ZeRO-3 / FSDP: gather the layer's parameters before use, prefetched one layer ahead
        (the gather waits only for the previous gather on the comm stream and the compute two layers
        back, i.e. at most two gathered layers live at once)."""
        ctx = self.ctx
        if ctx.par.zero_stage != 3 or ctx.par.dp * ctx.par.cp == 1:
            return dep
        params = self.layer_params["dense"] + self.layer_params["expert"]
        group = ctx.mesh.group("dp_cp", r)
        prev = ctx.builder.last_on(r, "compute")
        g = ctx.comm(r, "comm_dp", f"{name}.param_all_gather", "all_gather", params * ctx.dtype_bytes, group, "dp",
                     "comm_dp", () if prev is None else (prev,))
        return g if dep is None else ctx.compute(r, f"{name}.wait", (), (dep, g))

    def _grads_ready(self, r: int, x: int, final: bool) -> None:
        ctx = self.ctx
        if ctx.par.zero_stage == 3:
            if ctx.par.dp * ctx.par.cp > 1:
                params = self.layer_params["dense"] + self.layer_params["expert"]
                ctx.comm(r, "comm_dp", f"grad_reduce_scatter.{x}", "reduce_scatter",
                         params * ctx.scn.training.grad_dtype_bytes, ctx.mesh.group("dp_cp", r), "dp", "comm_dp", (x,))
            return
        if final:
            self.ready[r].append((x, self.layer_params["dense"], self.layer_params["expert"]))

    def _early_param_gather(self, r: int) -> None:
        """Distributed optimizer with overlap_param_gather: the previous step's parameter all-gather
        runs during this step's first forwards; a chunk's first forward waits for its buckets."""
        ctx, p = self.ctx, self.p
        for vs in range(r % p if not ctx.full else ctx.mesh.stage_of(r), self.nv, p):
            ready = [(-1, self.layer_params["dense"], self.layer_params["expert"])] * len(self.layers[vs])
            self.gathers[(r, vs)] = gather_parameters(ctx, r, ready, [])

    def _finish(self, r: int) -> None:
        ctx = self.ctx
        end = last_compute(ctx, r)
        waits = reduce_gradients(ctx, r, self._with_embeddings(r), end) if ctx.par.zero_stage < 3 else []
        s = ctx.mesh.stage_of(r)
        if self.tied_pp and s in (0, self.p - 1):
            m = ctx.scn.model
            peer = ctx.mesh.rank(self.p - 1 if s == 0 else 0, *ctx.mesh.coords(r)[1:])
            group = (r, peer) if s == 0 else (peer, r)
            waits.append(ctx.comm(r, "comm_dp", "embedding_grad_all_reduce", "all_reduce",
                                  m.vocab_size // ctx.par.tp * m.hidden_size * ctx.scn.training.grad_dtype_bytes,
                                  group, "pp", "comm_dp", (end,)))
        if ctx.par.zero_stage == 3:
            waits += [t for t in ctx.builder.stream_ids(r, "comm_dp")]
        params = self.stage_params[r]
        step = optimizer_step(ctx, r, [end] + waits, params["dense"], params["expert"])
        if ctx.par.zero_stage in (1, 2) and not ctx.par.overlap_param_gather:
            gather_parameters(ctx, r, self._with_embeddings(r), [step])

    def _with_embeddings(self, r: int) -> list:
        """Gradient-ready list with the embedding / head parameters added to the first/last bucket."""
        ready = list(self.ready[r])
        layers_total = sum(d + e for _, d, e in ready)
        params = self.stage_params[r]
        extra = params["dense"] + params["expert"] - layers_total
        if ready and extra > 0:
            tid, d, e = ready[-1]
            ready[-1] = (tid, d + extra, e)
        elif extra > 0:
            ready = [(last_compute(self.ctx, r), extra, 0.0)]
        return ready
