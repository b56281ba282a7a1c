"""The search bound's non-compute streams, one rule each with the lowering: a rank's data-parallel
streams (gradient reduction, parameter gathers as each framework issues them, ``zero_impl``), its
pipeline sends, and DeepSpeed 2021's per-tensor host work on its compute stream. Split from
``estimate`` (its compute-stream bound and memory walk), which adds them into ``time_lower_bound``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..scenario import Scenario
from ..strategy.mesh import DeviceMesh
from ..strategy.recompute import recomputed_layers
from ..strategy.sharding import layer_submodules, unit_persistent_sizes
from ..strategy.stage_units import copy_sync_bytes, stage_param_counts, unit_params
from ..strategy.zero_impl import (FSDP, chunk_fetches, hsdp_groups, list_all_gather_host_work, persistent_copy_host_work,
                                  persistent_gather_work, pipelined_fsdp2)

if TYPE_CHECKING:
    from .estimate import EstimateCache, RankProfile


def dp_stream_s(scn: Scenario, cache: "EstimateCache", stage: int) -> float:
    """The busier of the rank's two data-parallel streams, each serial (grad_sync): gradient
    reduction once (ZeRO-0/1) or per micro-batch (ZeRO-2), the distributed optimizer's parameter
    all-gather (ZeRO-1/2); ZeRO-3's / FSDP's per-unit all-gathers of every micro-batch as the framework
    issues them (``zero_impl.chunk_fetches``) and one reduce-scatter per micro-batch on its own stream,
    over the HSDP shard group. Dense parameters only, each stream's traffic as
    one collective of its total size (never slower than the buckets or units it is cut into). With two
    model copies (DualPipe), the all-reduce of their gradients that waits for all of it follows."""
    return _dp_streams_s(scn, cache, stage) + copy_sync_s(scn, cache, stage)


def copy_sync_s(scn: Scenario, cache: "EstimateCache", stage: int) -> float:
    """Uncontended time of the all-reduce summing the two model copies' gradients over (stage,
    ``copy_peer``) (``stage_units.copy_sync_bytes``, as the lowering issues it); 0 with one copy."""
    par, layout = scn.parallel, cache.layout(scn)
    peer = layout.copy_peer(stage)
    if peer is None:
        return 0.0
    mesh = DeviceMesh(pp=par.pp, dp=par.dp, cp=par.cp, tp=par.tp, ep=par.ep, etp=par.etp)
    counts = stage_param_counts(cache.graph(scn), par, layout, stage)
    size = copy_sync_bytes(par, layout, counts, scn.training.grad_dtype_bytes)
    return cache.collective_s(scn, "all_reduce", size, tuple(sorted((mesh.rank(pp=stage), mesh.rank(pp=peer)))))


def _dp_streams_s(scn: Scenario, cache: "EstimateCache", stage: int) -> float:
    par, tr = scn.parallel, scn.training
    if par.dp * par.cp == 1:
        return 0.0
    mesh = DeviceMesh(pp=par.pp, dp=par.dp, cp=par.cp, tp=par.tp, ep=par.ep, etp=par.etp)
    group = mesh.group("dp_cp", mesh.rank(pp=stage))
    params = stage_param_counts(cache.graph(scn), par, cache.layout(scn), stage)["dense"]
    grads, weights = params * tr.grad_dtype_bytes, params * tr.param_bytes
    m = cache.layout(scn).microbatches(scn.num_microbatches)  # passes of each held virtual stage
    coll = lambda op, size: cache.collective_s(scn, op, size, group)  # noqa: E731
    if par.zero_stage == 0:
        return coll("all_reduce", grads)
    shard = hsdp_groups(group, group[0], par.shard_group_size)[0]
    if par.zero_stage == 3 or (par.zero_stage == 2 and par.sharding in FSDP):
        once = pipelined_fsdp2(par)  # gathered at each chunk's first forward, reduced after its last backward
        passes = 1 if once else m
        gathered = passes * gathered_params(scn, stage, cache, ("F",) if once else ("F", "B"))
        return max(cache.collective_s(scn, "all_gather", gathered * tr.dtype_bytes, shard),
                   cache.collective_s(scn, "reduce_scatter", passes * grads, shard))
    return coll("reduce_scatter", grads * (m if par.zero_stage == 2 else 1)) + coll("all_gather", weights)


def gathered_params(scn: Scenario, stage: int, cache: "EstimateCache | None" = None,
                    passes: tuple[str, ...] = ("F", "B")) -> float:
    """Dense parameters a rank of ``stage`` all-gathers per micro-batch: the fetches of ``passes`` of
    every chunk it holds, by the framework's rule (``zero_impl.chunk_fetches``, as the lowering issues them)."""
    return sum(f.params for f in stage_fetches(scn, stage, cache, passes))


def stage_fetches(scn: Scenario, stage: int, cache: "EstimateCache | None" = None,
                  passes: tuple[str, ...] = ("F", "B")) -> list:
    """The all-gathers (``zero_impl.Fetch``) a rank of ``stage`` issues per micro-batch, every pass of
    every chunk it holds (under the schedule's stage map), its units' parameters by
    ``stage_units.unit_params`` as the lowering counts them."""
    if cache is None:
        from .estimate import EstimateCache  # estimate imports this module
        cache = EstimateCache()
    par, graph, layout = scn.parallel, cache.graph(scn), cache.layout(scn)
    params = unit_params(graph, par, layout)
    subs = layer_submodules(graph, par.tp, par.ep)
    out: list = []
    recomputed = recomputed_layers(par, layout.chunks, scn.model.num_layers, layout.rank_stages())
    for vs in layout.held(stage):
        units = [str(u) for u in layout.units(vs)]
        dense = [params.of(u)[0] for u in units]
        fetches = chunk_fetches(par.sharding, par.zero_stage, recomputed, units, dense, subs)
        out += [f for phase in passes for f in fetches.get(phase, ())]
    return out


def ds2021_host_s(scn: Scenario, cache: "EstimateCache", stage: int) -> float:
    """DeepSpeed 2021: the host work of every per-tensor all-gather of a step on the compute stream
    (``zero_impl.list_all_gather_host_work``, charged as the lowering charges it in
    ``grad_sync.zero3_gather``); 0 for every other implementation."""
    par = scn.parallel
    if par.sharding != "deepspeed-2021" or par.zero_stage != 3 or par.dp * par.cp == 1:
        return 0.0
    mesh = DeviceMesh(pp=par.pp, dp=par.dp, cp=par.cp, tp=par.tp, ep=par.ep, etp=par.etp)
    n = len(hsdp_groups(mesh.group("dp_cp", mesh.rank(pp=stage)), mesh.rank(pp=stage), par.shard_group_size)[0])
    total = 0.0
    for f in stage_fetches(scn, stage, cache):
        nbytes = f.params / max(f.tensors, 1) * scn.training.dtype_bytes
        one = cache.work_s(scn, list_all_gather_host_work(n, nbytes))
        total += max(f.tensors, 1) * one
    return cache.layout(scn).microbatches(scn.num_microbatches) * total + _persistent_host_s(scn, cache, stage, n)


def _persistent_host_s(scn: Scenario, cache: "EstimateCache", stage: int, n: int) -> float:
    """The host work of the post-step gather of the persistent tensors (``grad_sync.ds2021_persistent_gather``)."""
    graph, layout, par = cache.graph(scn), cache.layout(scn), scn.parallel
    units = [[unit_persistent_sizes(graph, par.tp, par.ep, str(u)) for u in layout.units(vs)] for vs in layout.held(stage)]
    sizes = tuple(x for chunk in units for unit in chunk for x in unit)
    if not sizes:
        return 0.0
    head = cache.work_s(scn, persistent_gather_work(n, sizes, scn.training.dtype_bytes)[0])
    return head + sum(cache.work_s(scn, persistent_copy_host_work(n, unit, scn.training.dtype_bytes))
                      for chunk in units for unit in chunk if unit)


def pp_stream_s(scn: Scenario, cache: "EstimateCache", rank: int, prof: "RankProfile") -> float:
    """The rank's pipeline send stream, serial: one send of its 1/t share of the hidden state per F
    to the next virtual stage and per B to the previous one (Narayanan et al. 2021 §4.1)."""
    par, tr, m = scn.parallel, scn.training, scn.model
    layout = cache.layout(scn)
    if layout.nv == 1:
        return 0.0
    mesh = DeviceMesh(pp=par.pp, dp=par.dp, cp=par.cp, tp=par.tp, ep=par.ep, etp=par.etp)
    size = tr.micro_batch_size * (m.seq_length // par.cp) * m.hidden_size * tr.dtype_bytes / par.tp
    total = 0.0
    for (vs, phase), count in prof.head + prof.tail:
        to = layout.smap.next(vs, layout.nv) if phase == "F" else layout.smap.prev(vs) if phase == "B" else None
        peer = layout.smap.rank(to) if to is not None else rank
        if peer != rank:  # the turn of a V stage map stays on the rank: no send (as the lowering)
            group = (mesh.rank(pp=rank), mesh.rank(pp=peer))
            total += count * cache.collective_s(scn, "send_recv", size, group)
    return total
