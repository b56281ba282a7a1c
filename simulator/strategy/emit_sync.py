"""Where the lowering's parameter gathers and gradient reductions enter a rank's task stream.

``lower._Emitter`` mixes ``ParamGradSync`` in: ZeRO-3 / FSDP fetch their units' parameters around
each pass (``_prefetching``, by the framework's rule in ``zero_impl``), every pass reports the units
whose gradients now exist (``_grads_ready``: reduced per unit, per bucket or at the last
micro-batch), the distributed optimizer's parameter all-gather overlaps the first forwards
(``_early_param_gather``), and ``_finish`` closes the step (remaining reductions, tied-embedding and
DualPipe copy all-reduces, the optimizer). The collectives themselves are built in ``grad_sync``.
"""

from __future__ import annotations

from typing import Callable, Iterator

from ..tasks import OpWork
from .context import LowerCtx
from .grad_sync import (STREAM_DP_RS, deepspeed_persistent_gather, gather_parameters, last_compute,
                        optimizer_step, reduce_gradients, zero3_gather, zero3_reduce)
from .schedules import StageMap
from .sharding import unit_persistent_sizes
from .stage_units import StageLayout, copy_sync_bytes
from .zero_impl import DEEPSPEED, FSDP2_COPY_PASSES, chunk_fetches


class ParamGradSync:
    """The emitter's gathers and reductions; the state they use is the emitter's (``lower._Emitter``
    sets it in ``__init__``)."""

    ctx: LowerCtx
    p: int
    nv: int
    smap: StageMap
    layout: StageLayout
    split_w: bool
    zero3: bool
    fsdp1: bool
    tied_pp: bool | None
    plans: dict
    pipelined: bool  # zero3 under zero_impl.pipelined_fsdp2
    resident: set  # (rank, virtual stage) whose parameters stay gathered (pipelined_fsdp2)
    gathers: dict
    grad_waits: dict
    final_ready: dict
    stage_params: dict
    pair_open: dict[int, int]
    layer_subs: tuple
    recomputed: frozenset[int]
    _units: Callable[[int], list[str]]
    _params: Callable[[str], tuple[float, float]]

    def _plan(self, vs: int) -> dict:
        """The chunk's all-gathers per pass (``zero_impl.pass_fetches``), units by forward index."""
        plan = self.plans.get(vs)
        if plan is None:
            par, units = self.ctx.par, self._units(vs)
            plan = self.plans[vs] = chunk_fetches(par.sharding, par.zero_stage, self.recomputed, units,
                                                  [self._params(u)[0] for u in units], self.layer_subs)
        return plan

    def _prefetching(self, r: int, vs: int, phase: str, prefix: str) -> Iterator[tuple]:
        """ZeRO-3 / FSDP: yields, per unit of the pass (forward order for "F", reverse for "B"), the
        tasks it waits for. A fetch is issued when the unit before its first unit starts (after that
        unit's predecessor's compute, whose parameters are then freed), so at most two units'
        parameters are gathered at once (FSDP's one-unit prefetch and limit_all_gathers; DeepSpeed's
        prefetch of the next submodules); a DeepSpeed fetch that stage3_max_live_parameters keeps
        from being prefetched is issued when its unit starts, after the unit before has run. FSDP2
        copies each gathered unit out into its parameters on the compute stream."""
        units = self._units(vs) if phase == "F" else self._units(vs)[::-1]
        # pipelined FSDP2 gathers a chunk once, at its first forward (zero_impl.pipelined_fsdp2)
        if not self.zero3 or (self.pipelined and (phase == "B" or (r, vs) in self.resident)):
            yield from (() for _ in units)
            return
        if self.pipelined:
            self.resident.add((r, vs))
        fwd_index = {u: i for i, u in enumerate(self._units(vs))}
        pos = [fwd_index[u] for u in units]
        fetches = self._plan(vs)[phase]
        first: dict[int, list[int]] = {}
        for k, f in enumerate(fetches):
            first.setdefault(pos.index(f.units[0]), []).append(k)
        issued: dict = {}
        expert_done: set = set()
        fsdp2 = self.ctx.par.sharding == "fsdp2"
        builder = self.ctx.builder
        for i, unit in enumerate(units):
            before = builder.last_on(r, "compute")
            if phase == "B" and r in self.pair_open and before is not None and builder.task(before).phase == "F":
                # a paired backward shares nothing with its forward (pair_overlap): its first fetch
                # follows what ran before the pair, not the forward it is interleaved with
                before = builder.last_before(r, "compute", self.pair_open[r])
            for j in (i, i + 1):
                for k in first.get(j, ()):
                    if k in issued or (j > i and not fetches[k].prefetch):
                        continue
                    f = fetches[k]
                    expert = sum(self._params(self._units(vs)[u])[1] for u in f.units if u not in expert_done)
                    expert_done |= set(f.units)
                    name = units[j] if units[j] in ("embed", "head") else "L" + units[j]
                    issued[k] = zero3_gather(self.ctx, r, f"{prefix}.{name}.g{k}", f.params, expert, before,
                                             f.tensors)
            waits = tuple(t for k, f in enumerate(fetches) if pos[i] in f.units for t in issued.get(k, ()))
            if fsdp2 and waits:
                d, e = self._params(unit)
                work = (OpWork("fsdp2_copy_out", "elementwise", 0.0, FSDP2_COPY_PASSES * (d + e) * self.ctx.dtype_bytes,
                               (int(d + e), 1)),)
                waits = (self.ctx.compute(r, f"{prefix}.{unit}.fsdp2_copy_out", work, waits),)
            yield waits

    def _grads_ready(self, r: int, vs: int, action: str, units: list, final: bool, end: int) -> None:
        """Gradients of ``units`` [(unit, task after which they exist)] exist, in backward order:
        ZeRO-3 reduce-scatters each unit, ZeRO-2 buckets this micro-batch, ZeRO-0/1 wait for the last
        micro-batch (reduced in ``_finish``)."""
        ctx, stage = self.ctx, self.ctx.par.zero_stage
        if self.zero3 and ctx.par.sharding in DEEPSPEED:  # reduce_bucket_size buckets, own stream
            ready = [(tid,) + self._params(unit) for unit, tid in units]
            self.grad_waits[r] += reduce_gradients(ctx, r, ready, end, f"{action}.vs{vs}.", STREAM_DP_RS)
            return
        if self.fsdp1 and not self.split_w:  # reduced as each unit finished (_backward_units)
            return
        if self.zero3:
            if self.pipelined and not final:  # reduced once per step, after the stage's last backward
                return
            for unit, tid in units:
                name = f"{action}.{unit if unit in ('embed', 'head') else 'L' + unit}"
                self.grad_waits[r] += zero3_reduce(ctx, r, name, *self._params(unit), end if self.pipelined else tid)
            return
        ready = [(tid,) + self._params(unit) for unit, tid in units]
        if stage == 2:
            self.grad_waits[r] += reduce_gradients(ctx, r, ready, end, f"{action}.vs{vs}.")
        elif final:
            self.final_ready[r].append((vs, ready))

    def _early_param_gather(self, r: int) -> None:
        """Distributed optimizer with overlap_param_gather: the previous step's parameter all-gather
        runs during this step's first forwards, bucket by bucket in forward order; a unit's first
        forward waits only for its own bucket (Megatron-core's forward pre-hook finishes that
        bucket's all-gather and has the next one in flight)."""
        for vs in self.smap.stages_of(self.ctx.mesh.stage_of(r), self.nv // self.p):
            units = self._units(vs)
            # the buckets' ready entries are forward unit indices, so each bucket reports the first
            # unit it holds and the next bucket (forward order) starts where it ends
            ready = [(i,) + self._params(units[i]) for i in range(len(units) - 1, -1, -1)]
            gathered = gather_parameters(self.ctx, r, ready, [])
            bounds = [first for first, _ in gathered] + [len(units)]
            for lo, hi, (_, tasks) in zip(bounds, bounds[1:], gathered):
                for unit in units[lo:hi]:
                    self.gathers[(r, vs, unit)] = tasks

    def _finish(self, r: int) -> None:
        ctx = self.ctx
        end = last_compute(ctx, r)
        waits = list(self.grad_waits[r])
        if ctx.par.zero_stage < 2 or (ctx.par.zero_stage == 3 and not self.zero3):
            for vs, ready in self.final_ready[r]:
                waits += reduce_gradients(ctx, r, ready, end, f"vs{vs}.")
        s = ctx.mesh.stage_of(r)
        if self.tied_pp and s in (0, self.p - 1):
            # Megatron-LM _allreduce_word_embedding_grads: the two copies of the tied embedding
            m = ctx.scn.model
            peer = ctx.mesh.rank(self.p - 1 if s == 0 else 0, *ctx.mesh.coords(r)[1:])
            group = (r, peer) if s == 0 else (peer, r)
            waits.append(ctx.comm(r, "comm_dp", "embedding_grad_all_reduce", "all_reduce",
                                  -(-m.vocab_size // ctx.par.tp) * m.hidden_size * ctx.scn.training.grad_dtype_bytes,
                                  group, "pp", "comm_dp", (end,)))
        params = self.stage_params[r]
        peer_stage = self.layout.copy_peer(s)
        if peer_stage is not None:  # DualPipe: sum the two model copies' gradients (stage_units.copy_sync_bytes)
            peer = ctx.mesh.rank(peer_stage, *ctx.mesh.coords(r)[1:])
            size = copy_sync_bytes(ctx.par, self.layout, params, ctx.scn.training.grad_dtype_bytes)
            waits = [ctx.comm(r, "comm_dp", "copy_grad_all_reduce", "all_reduce", size, tuple(sorted((r, peer))),
                              "pp", "comm_dp", tuple([end] + waits))]
        step = optimizer_step(ctx, r, [end] + waits, params["dense"], params["expert"])
        if self.zero3 and ctx.par.sharding in DEEPSPEED:
            units = [u for vs in self.smap.stages_of(s, self.nv // self.p) for u in self._units(vs)]
            g, par = ctx.graph, ctx.par
            named = [(u if u in ("embed", "head") else f"L{u}", unit_persistent_sizes(g, par.tp, par.ep, u))
                     for u in units]
            step = deepspeed_persistent_gather(ctx, r, step, named)
        if ctx.par.zero_stage in (1, 2) and not ctx.par.overlap_param_gather and not self.zero3:
            ready = [(-1,) + self._params(u) for vs in self.smap.stages_of(s, self.nv // self.p)
                     for u in self._units(vs)[::-1]]
            gather_parameters(ctx, r, ready, [step])
