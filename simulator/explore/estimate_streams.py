"""The search bound's non-compute streams, one rule each with the lowering: a rank's data-parallel
streams (gradient reduction, parameter gathers as each framework issues them, ``zero_impl``), its
pipeline sends, and DeepSpeed 2021's per-tensor host work on its compute stream. Split from
``estimate`` (its compute-stream bound and memory walk), which adds them into ``time_lower_bound``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..analysis.memory import rank_param_counts
from ..model.opgraph import build_op_graph
from ..strategy.lower import chunk_layers
from ..strategy.mesh import DeviceMesh
from ..strategy.sharding import linear_params, params_per_rank
from ..strategy.zero_impl import FSDP, chunk_fetches, hsdp_groups, list_all_gather_host_work, submodule_params

if TYPE_CHECKING:
    from .estimate import EstimateCache, RankProfile


def schedule_of(scn) -> tuple[str, int]:
    """Schedule and chunks the lowering runs (one stage runs plain 1F1B)."""
    par = scn.parallel
    return (par.schedule, par.virtual_stages) if par.pp > 1 else ("1f1b", 1)


def dp_stream_s(scn, cache: "EstimateCache", stage: int) -> float:
    """The busier of the rank's two data-parallel streams, each serial (grad_sync): gradient
    reduction once (ZeRO-0/1) or per micro-batch (ZeRO-2), the distributed optimizer's parameter
    all-gather (ZeRO-1/2); ZeRO-3's / FSDP's per-unit all-gathers of every micro-batch as the framework
    issues them (``zero_impl.chunk_fetches``) and one reduce-scatter per micro-batch on its own stream,
    over the HSDP shard group. Dense parameters only, each stream's traffic as
    one collective of its total size (never slower than the buckets or units it is cut into)."""
    par, tr = scn.parallel, scn.training
    if par.dp * par.cp == 1:
        return 0.0
    mesh = DeviceMesh(pp=par.pp, dp=par.dp, cp=par.cp, tp=par.tp, ep=par.ep, etp=par.etp)
    group = mesh.group("dp_cp", mesh.rank(pp=stage))
    params = rank_param_counts(scn.model, par, stage)["dense"]
    grads, weights = params * tr.grad_dtype_bytes, params * tr.dtype_bytes
    m = scn.num_microbatches
    coll = lambda op, size: cache.collective_s(scn, op, size, group)  # noqa: E731
    if par.zero_stage == 0:
        return coll("all_reduce", grads)
    shard = hsdp_groups(group, group[0], par.shard_group_size)[0]
    if par.zero_stage == 3 or (par.zero_stage == 2 and par.sharding in FSDP):
        gathered = m * gathered_params(scn, stage) * tr.dtype_bytes
        return max(cache.collective_s(scn, "all_gather", gathered, shard),
                   cache.collective_s(scn, "reduce_scatter", m * grads, shard))
    return coll("reduce_scatter", grads * (m if par.zero_stage == 2 else 1)) + coll("all_gather", weights)


def gathered_params(scn, stage: int) -> float:
    """Dense parameters a rank of ``stage`` all-gathers per micro-batch: every pass's fetches of every
    chunk it holds, by the framework's rule (``zero_impl.chunk_fetches``, as the lowering issues them)."""
    return sum(f.params for f in stage_fetches(scn, stage))


def stage_fetches(scn, stage: int) -> list:
    """The all-gathers (``zero_impl.Fetch``) a rank of ``stage`` issues per micro-batch, every pass of
    every chunk it holds."""
    par, tp, ep = scn.parallel, scn.parallel.tp, scn.parallel.ep
    graph = build_op_graph(scn.model, scn.training.micro_batch_size, scn.training.dtype)
    layer = [params_per_rank(graph, tp, ep, (i,), False, False, par.etp)["dense"] for i in range(scn.model.num_layers)]
    embed = params_per_rank(graph, tp, ep, 0, True, False)["dense"]
    head = (params_per_rank(graph, tp, ep, 0, True, True)["dense"] - embed if par.pp == 1
            else params_per_rank(graph, tp, ep, 0, False, True)["dense"])
    subs = submodule_params(linear_params(graph, tp, ep))
    chunks = chunk_layers(par.layers_per_stage, schedule_of(scn)[1])
    out: list = []
    for vs in range(stage, len(chunks), par.pp):
        units = (["embed"] if vs == 0 else []) + [str(i) for i in chunks[vs]] + (
            ["head"] if vs == len(chunks) - 1 else [])
        dense = [embed if u == "embed" else head if u == "head" else layer[int(u)] for u in units]
        fetches = chunk_fetches(par.sharding, par.zero_stage, par.recompute, units, dense, subs)
        out += [f for v in fetches.values() for f in v]
    return out


def ds2021_host_s(scn, cache: "EstimateCache", stage: int) -> float:
    """DeepSpeed 2021: the host work of every per-tensor all-gather of a step on the compute stream
    (``zero_impl.list_all_gather_host_work``, charged as the lowering charges it in
    ``grad_sync.zero3_gather``); 0 for every other implementation."""
    par = scn.parallel
    if par.sharding != "deepspeed-2021" or par.zero_stage != 3 or par.dp * par.cp == 1:
        return 0.0
    mesh = DeviceMesh(pp=par.pp, dp=par.dp, cp=par.cp, tp=par.tp, ep=par.ep, etp=par.etp)
    n = len(hsdp_groups(mesh.group("dp_cp", mesh.rank(pp=stage)), mesh.rank(pp=stage), par.shard_group_size)[0])
    total = 0.0
    for f in stage_fetches(scn, stage):
        nbytes = f.params / max(f.tensors, 1) * scn.training.dtype_bytes
        one = cache.work_s(scn, list_all_gather_host_work(n, nbytes))
        total += max(f.tensors, 1) * one
    return scn.num_microbatches * total


def pp_stream_s(scn, cache: "EstimateCache", rank: int, prof: "RankProfile") -> float:
    """The rank's pipeline send stream, serial: one send of its 1/t share of the hidden state per F
    to the next virtual stage and per B to the previous one (Narayanan et al. 2021 §4.1)."""
    par, tr, m = scn.parallel, scn.training, scn.model
    nv = par.pp * schedule_of(scn)[1]
    if nv == 1:
        return 0.0
    mesh = DeviceMesh(pp=par.pp, dp=par.dp, cp=par.cp, tp=par.tp, ep=par.ep, etp=par.etp)
    size = tr.micro_batch_size * (m.seq_length // par.cp) * m.hidden_size * tr.dtype_bytes / par.tp
    total = 0.0
    for (vs, phase), count in prof.head + prof.tail:
        to = vs + 1 if phase == "F" else vs - 1 if phase == "B" else -1
        if 0 <= to < nv:
            group = (mesh.rank(pp=rank), mesh.rank(pp=to % par.pp))
            total += count * cache.collective_s(scn, "send_recv", size, group)
    return total
