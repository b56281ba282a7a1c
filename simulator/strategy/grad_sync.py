"""Gradient synchronisation, parameter gathering, offload and the optimizer step of one rank.

- DP / ZeRO-1 (Megatron-core DDP and distributed optimizer): gradients reduced in buckets as soon as
  the last micro-batch's backward has produced them (overlap_grad_reduce; Li et al. 2020, PyTorch
  DDP), by all-reduce (stage 0) or reduce-scatter (ZeRO-1); the updated parameters all-gathered
  after the step (Rajbhandari et al. 2020 §5), overlapped with the next forward when
  overlap_param_gather (modelled at the start of this step, the steady state).
- ZeRO-2 (DeepSpeed stage 2): gradients are partitioned as they are produced, so every micro-batch's
  backward reduce-scatters its buckets (DeepSpeed engine.backward calls
  overlapping_partition_gradients_reduce_epilogue on every micro-step, stage 1 only at the
  gradient-accumulation boundary).
- ZeRO-3 / FSDP: all-gathers of a unit's (layer's, embedding's, head's) parameters before its uses,
  as the framework issues them (``zero_impl``; ``lower`` places them, prefetching one unit ahead),
  gradients reduce-scattered per unit and micro-batch (FSDP) or in reduce_bucket_size buckets
  (DeepSpeed); HSDP all-reduces the reduced shards across replicas.
- ZeRO-Offload (Ren et al. 2021 §4.2): each reduced gradient shard is copied to the host over PCIe
  as soon as it is reduced, Adam runs on the CPU, the updated 16-bit shard comes back over PCIe.
Expert parameters are reduced and gathered over the expert-data-parallel group (tp·cp·dp/(ep·etp)
ranks, ``mesh.DeviceMesh``).
"""

from __future__ import annotations

from ..tasks import OpWork
from ..units import DTYPE_BYTES
from .context import COMPUTE, LowerCtx
from .fsdp1 import post_backward_work, unshard_work
from .zero_impl import (FSDP2_COPY_PASSES, hsdp_groups, list_all_gather_host_work, persistent_copy_host_work,
                        persistent_gather_work, shard_elements)

# Megatron-core DistributedDataParallelConfig: bucket_size = max(40M, 1M x dp) parameters.
BUCKET_MIN_PARAMS = 40_000_000
BUCKET_PARAMS_PER_DP_RANK = 1_000_000
# DeepSpeed ZeRO-2/3 reduce_bucket_size default: 5e8 elements (DeepSpeed configuration docs,
# zero_optimization.reduce_bucket_size).
DEEPSPEED_REDUCE_BUCKET_PARAMS = 500_000_000
# Fused Adam (apex / torch foreach) per parameter: read grad, read+write fp32 master, m, v (24 B),
# write the 16-bit model copy (2 B): memory-bound (Rajbhandari et al. 2020 §3 state sizes).
ADAM_MOMENTS = 2  # Adam's first and second moments, each one state element per parameter
ADAM_STATE_RW_BYTES = 2 * (ADAM_MOMENTS + 1) * DTYPE_BYTES["fp32"]  # fp32 moments and master: 24 B
# training.master_weights: where the optimizer's master copy of a weight lives. "stored": its own copy
# in optimizer_state_dtype (Megatron-Core's distributed optimizer, torch, Apex with store_params).
# "remainders": Apex DistributedFusedAdam's store_param_remainders, the 16 low bits of each fp32 master
# (int16) whose 16 high bits are the BF16 parameter (apex/contrib/optimizers/distributed_fused_adam.py,
# StateBucket.param_remainders_shard); NeMo 1 sets it for a BF16 model with fp32 optim.dtype.
# "parameter": no copy, the BF16 parameter is the master; NeMo 1 sets store_params = False when
# optim.dtype is the model's (NeMo v2.0.0 megatron_base_model.setup_optimization). Bytes per parameter:
MASTER_WEIGHTS = {"stored": None, "remainders": 2, "parameter": 0}  # None: optimizer_state_dtype's size
# DeepSpeed 2021 allreduce_and_copy (stage3.py v0.3.13): flatten(bucket) reads and writes it, div_ reads
# and writes it, the copy back into the gradients reads and writes it: 6 bytes moved per bucket byte.
DS2021_BUCKET_PASSES = 6
STREAM_DP = "comm_dp"
STREAM_DP_RS = "comm_dp_rs"  # reduce-scatters on their own stream (FSDP2, DeepSpeed); HSDP's replica all-reduce
STREAM_OFFLOAD = "offload"

Ready = tuple[int, float, float]  # (task after which the gradients exist, dense params, expert params)


def bucket_params(dp: int, zero_stage: int = 0) -> int:
    if zero_stage >= 2:
        return DEEPSPEED_REDUCE_BUCKET_PARAMS
    return max(BUCKET_MIN_PARAMS, BUCKET_PARAMS_PER_DP_RANK * dp)


def buckets(layer_ready: list[Ready], dp: int, zero_stage: int = 0) -> list[Ready]:
    """Group (ready task, dense params, expert params) in backward order into buckets.

    Returns (task after which the bucket is complete, dense params, expert params) per bucket."""
    out, dense, expert, cap = [], 0.0, 0.0, bucket_params(dp, zero_stage)
    for i, (tid, d, e) in enumerate(layer_ready):
        dense += d
        expert += e
        if dense + expert >= cap or i == len(layer_ready) - 1:
            out.append((tid, dense, expert))
            dense = expert = 0.0
    return out


def _groups(ctx: LowerCtx, rank: int):
    """(dense params group, expert params group) of gradient reduction / parameter gathering."""
    return ctx.group("dp_cp", rank), ctx.group("edp", rank)


def _to_host(ctx: LowerCtx, rank: int, name: str, params: float, group_size: int, dep: int) -> int:
    """ZeRO-Offload: this rank's reduced shard of ``params`` gradients to host memory over PCIe."""
    size = params / group_size * ctx.scn.training.grad_dtype_bytes
    return ctx.comm(rank, STREAM_OFFLOAD, name, "d2h", size, (rank,), "host", "offload", (dep,))


def reduce_gradients(ctx: LowerCtx, rank: int, ready: list[Ready], end_dep: int, tag: str = "",
                     stream: str = STREAM_DP) -> list[int]:
    """Bucketed gradient reduction (with its offload copies) on ``stream``; returns the tasks the step
    waits for. DeepSpeed ZeRO-3 reduces on its own reduction stream (stage3.py reduction_stream); the
    2021 engine all-reduces its buckets (``_ds2021_all_reduce``)."""
    par = ctx.par
    gbytes = ctx.scn.training.grad_dtype_bytes
    op = "all_reduce" if par.zero_stage == 0 else "reduce_scatter"
    out = []
    for k, (tid, dense, expert) in enumerate(buckets(ready, par.dp * par.cp, par.zero_stage)):
        dep = tid if par.overlap_grad_reduce else end_dep
        for params, group, kind in zip((dense, expert), _groups(ctx, rank), ("dense", "expert")):
            if params > 0 and len(group) > 1:
                if par.sharding == "deepspeed-2021":
                    t = _ds2021_all_reduce(ctx, rank, f"grad_all_reduce.{tag}{kind}{k}", params, group, dep,
                                           stream)
                else:
                    t = ctx.comm(rank, stream, f"grad_{op}.{tag}{kind}{k}", op, params * gbytes, group, "dp",
                                 "comm_dp", (dep,))
                out.append(_to_host(ctx, rank, f"grads_to_host.{tag}{kind}{k}", params, len(group), t)
                           if par.offload_optimizer else t)
            elif params > 0 and par.offload_optimizer:
                out.append(_to_host(ctx, rank, f"grads_to_host.{tag}{kind}{k}", params, 1, dep))
    return out


def _ds2021_all_reduce(ctx: LowerCtx, rank: int, name: str, params: float, group: tuple[int, ...], dep: int,
                       stream: str) -> int:
    """DeepSpeed 2021 ZeRO-3 with its default contiguous_gradients = false (constants.py v0.3.13-v0.4.0):
    reduce_ipg_grads falls back to buffered_reduce_fallback, an all-reduce of each flattened
    reduce_bucket_size bucket on the reduction stream, issued after reduction_stream.synchronize() has
    made the host wait for the previous bucket (so the compute stream waits too). Around it
    allreduce_and_copy flattens the bucket's gradients, divides them by the group and copies the result
    back into them (DS2021_BUCKET_PASSES): elementwise kernels that take the SMs in turn with the
    backward's GEMMs, charged on the compute stream as FSDP1's are (``fsdp1``), before the collective
    (the copy-back's SM time moved ahead of it: the chain to the next bucket's sync is as long)."""
    prev = ctx.builder.last_on(rank, stream)
    wait = ctx.compute(rank, f"{name}.host", (OpWork(f"{name}.reduction_stream_sync", "host", 0.0, 0.0, (1,)),),
                       (dep,) + (() if prev is None else (prev,)), "comm_dp")
    nbytes = params * ctx.scn.training.grad_dtype_bytes
    work = (OpWork("ds2021_bucket_flatten_div_copy", "elementwise", 0.0, DS2021_BUCKET_PASSES * nbytes,
                   (int(params), 1)),)
    kernels = ctx.compute(rank, f"{name}.flatten_div_copy", work, (wait,), "comm_dp")
    return ctx.comm(rank, stream, name, "all_reduce", nbytes, group, "dp", "comm_dp", (kernels,))


def shard_groups(ctx: LowerCtx, rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(dense shard group, dense replicate group): HSDP shards inside ``shard_group_size`` ranks."""
    return hsdp_groups(ctx.group("dp_cp", rank), rank, ctx.par.shard_group_size)


def zero3_gather(ctx: LowerCtx, rank: int, name: str, dense: float, expert: float, dep: int | None,
                 tensors: int = 1) -> list[int]:
    """ZeRO-3 / FSDP: all-gather 16-bit parameters (a unit's, or DeepSpeed's coalesced submodules')
    over the shard group before their use. DeepSpeed 2021 gathers each of the ``tensors`` parameter
    tensors alone, after a device-wide synchronization, with its per-rank host work on the issuing
    thread (``_ds2021_host``). FSDP1 first casts the fp32 shard to the parameter dtype
    (``fsdp1.unshard_work``), charged on the compute stream (``fsdp1``: the streams share the SMs)."""
    out = []
    groups = (shard_groups(ctx, rank)[0], _groups(ctx, rank)[1])
    per_tensor = ctx.par.sharding == "deepspeed-2021"
    for params, group, kind in zip((dense, expert), groups, ("", ".expert")):
        if params > 0 and len(group) > 1:
            count = max(tensors, 1) if per_tensor else 1
            for k in range(count):
                tag = f"{name}.param_all_gather{kind}" + (f".t{k}" if count > 1 else "")
                nbytes = params / count * ctx.dtype_bytes
                deps = () if dep is None else (dep,)
                if per_tensor:
                    deps = (_ds2021_host(ctx, rank, tag, len(group), nbytes, deps),)
                elif ctx.par.sharding == "fsdp1" and (cast := unshard_work(params, len(group), ctx.dtype_bytes)):
                    deps = (ctx.compute(rank, f"{tag}.shard_cast", cast, deps, "comm_dp"),)
                out.append(ctx.comm(rank, STREAM_DP, tag, "all_gather", nbytes, group, "dp", "comm_dp", deps))
    return out


def _ds2021_host(ctx: LowerCtx, rank: int, name: str, ranks: int, full_bytes: float, deps: tuple) -> int:
    """DeepSpeed 2021: the host work of one per-tensor list collective (``zero_impl``), on the compute
    stream (no kernel of the step is launched meanwhile), after ``torch.cuda.synchronize()``: it waits
    for every stream of the rank (compute, gathers, reduce-scatters)."""
    synced = tuple(t for t in (ctx.builder.last_on(rank, s) for s in (STREAM_DP, STREAM_DP_RS)) if t is not None)
    return ctx.compute(rank, f"{name}.host", list_all_gather_host_work(ranks, full_bytes), deps + synced,
                       "comm_dp")


def ds2021_persistent_gather(ctx: LowerCtx, rank: int, dep: int, units: list[tuple[str, tuple[int, ...]]]) -> int:
    """DeepSpeed 2021 ZeRO-3 after the optimizer step: the persistent tensors of ``units`` ((unit name,
    element counts)) all-gathered in one list collective, then copied out per tensor and rank
    (``zero_impl.persistent_gather_work``, ``persistent_copy_host_work``: host work on the compute
    stream, no kernel of the next step is issued meanwhile). Returns the last task (``dep`` if none)."""
    group = shard_groups(ctx, rank)[0]
    sizes = tuple(n for _, unit in units for n in unit)
    if len(group) == 1 or not sizes:
        return dep
    head, nbytes = persistent_gather_work(len(group), sizes, ctx.dtype_bytes)
    t = ctx.compute(rank, "persistent_param_all_gather.host", head, (dep,), "comm_dp")
    t = ctx.comm(rank, STREAM_DP, "persistent_param_all_gather", "all_gather", nbytes, group, "dp", "comm_dp", (t,))
    for name, unit in units:
        if unit:
            work = persistent_copy_host_work(len(group), unit, ctx.dtype_bytes)
            t = ctx.compute(rank, f"{name}.persistent_copy_out", work, (t,), "comm_dp")
    return t


def deepspeed_persistent_gather(ctx: LowerCtx, rank: int, dep: int, units: list[tuple[str, tuple[int, ...]]]) -> int:
    """DeepSpeed ZeRO-3 after the optimizer step (stage3 ``_post_step``): the persistent tensors of
    ``units`` gathered again. The 2021 engine: ``ds2021_persistent_gather``. Today's engine
    (partition_parameters.py ``_allgather_params_coalesced``): one ``all_gather_into_tensor`` of each
    tensor's shards, all issued at once, then a device synchronize: tiny collectives over the whole
    group, each paying the group's latency. Returns the last task (``dep`` if none)."""
    if ctx.par.sharding == "deepspeed-2021":
        return ds2021_persistent_gather(ctx, rank, dep, units)
    group = shard_groups(ctx, rank)[0]
    if len(group) == 1:
        return dep
    t = dep
    for name, unit in units:
        for k, n in enumerate(unit):
            t = ctx.comm(rank, STREAM_DP, f"{name}.persistent_param_all_gather.t{k}", "all_gather",
                         shard_elements(n, len(group)) * len(group) * ctx.dtype_bytes, group, "dp", "comm_dp",
                         (dep,))
    return t


def zero3_reduce(ctx: LowerCtx, rank: int, name: str, dense: float, expert: float, dep: int,
                 microbatch: int = 0) -> list[int]:
    """ZeRO-3 / FSDP: reduce-scatter one unit's gradients of one micro-batch over the shard group (FSDP2
    first copies them into the reduce-scatter input, ``zero_impl.FSDP2_COPY_PASSES``; FSDP1 runs its
    post-backward kernels, ``fsdp1.post_backward_work``, and issues the collective on the stream of its
    all-gathers), HSDP then all-reduces the reduced shard across the replicas; plus the offload copy.
    ``microbatch``: the index of this micro-batch among the step's (FSDP1 accumulates from the second)."""
    out = []
    gbytes = ctx.scn.training.grad_dtype_bytes
    shard, replicas = shard_groups(ctx, rank)
    edp = _groups(ctx, rank)[1]
    stream = STREAM_DP_RS
    if ctx.par.sharding == "fsdp2" and dense + expert > 0:
        nbytes = FSDP2_COPY_PASSES * (dense + expert) * gbytes
        dep = ctx.compute(rank, f"{name}.fsdp2_chunk_cat", (OpWork("fsdp2_chunk_cat", "elementwise", 0.0, nbytes,
                                                                   (int(dense + expert), 1)),), (dep,))
    elif ctx.par.sharding == "fsdp1":
        stream = STREAM_DP
        work = (post_backward_work(dense, len(shard), ctx.dtype_bytes, gbytes, microbatch > 0,
                                   len(shard) * len(replicas))
                + post_backward_work(expert, len(edp), ctx.dtype_bytes, gbytes, microbatch > 0))
        if work:
            dep = ctx.compute(rank, f"{name}.fsdp1_post_backward", work, (dep,), "comm_dp")
    for params, group, kind in zip((dense, expert), (shard, edp), ("", ".expert")):
        if params > 0 and len(group) > 1:
            t = ctx.comm(rank, stream, f"{name}.grad_reduce_scatter{kind}", "reduce_scatter",
                         params * gbytes, group, "dp", "comm_dp", (dep,))
            if kind == "" and len(replicas) > 1:  # HSDP: the shard's all-reduce across replicas
                t = ctx.comm(rank, STREAM_DP_RS, f"{name}.grad_all_reduce_replicas", "all_reduce",
                             params / len(group) * gbytes, replicas, "dp", "comm_dp", (t,))
            out.append(_to_host(ctx, rank, f"{name}.grads_to_host{kind}", params, len(group), t)
                       if ctx.par.offload_optimizer else t)
    return out


def master_weight_bytes(tr) -> int:
    """Bytes of the optimizer's master copy per parameter (``training.master_weights``)."""
    size = MASTER_WEIGHTS[tr.master_weights]
    return tr.optimizer_state_bytes if size is None else size


def adam_state_rw_bytes(tr) -> int:
    """Bytes Adam reads and writes of its state per parameter: each moment and the master copy read and
    written (ADAM_STATE_RW_BYTES with fp32 state and a stored master)."""
    return 2 * (ADAM_MOMENTS * tr.optimizer_state_bytes + master_weight_bytes(tr))


def optimizer_step(ctx: LowerCtx, rank: int, deps: list[int], dense: float, expert: float) -> int:
    """Adam over this rank's shard (ZeRO >= 1 shards it over the data-parallel group), on the GPU or,
    with offload, on the host CPU followed by the copy of the updated 16-bit shard back to the GPU."""
    par = ctx.par
    dense_n, expert_n = par.shard_group_size or par.dp * par.cp, par.expert_dp
    shard = dense / dense_n + expert / expert_n if par.zero_stage else dense + expert
    gbytes = ctx.scn.training.grad_dtype_bytes
    if not par.offload_optimizer:
        # gradient clipping first reads every gradient of the shard for the global L2 norm
        # (Megatron clip_grad_norm_fp32 with multi_tensor_l2norm; clip_grad = 1.0 by default)
        work = (OpWork("grad_norm", "optimizer", 0.0, shard * gbytes, (int(shard),)),
                OpWork("adam", "optimizer", 0.0, shard * (adam_state_rw_bytes(ctx.scn.training) + gbytes),
                       (int(shard),)))
        return ctx.compute(rank, "optimizer", work, deps, "optimizer", phase="O")
    step = ctx.host(rank, "cpu_adam", (OpWork("cpu_adam", "optimizer", 0.0, 0.0, (int(shard),)),), deps, phase="O")
    return ctx.comm(rank, STREAM_OFFLOAD, "params_to_gpu", "h2d", shard * ctx.dtype_bytes, (rank,), "host",
                    "offload", (step,))


def gather_parameters(ctx: LowerCtx, rank: int, ready: list[Ready], deps: list[int]) -> list[tuple[int, list[int]]]:
    """Distributed-optimizer parameter all-gather, one per bucket (ZeRO-1/2), issued in forward order:
    ``ready`` lists the units in backward order (the buckets' layout, shared with the gradients);
    Megatron-core maps its all-gather handles to the buckets in reverse so that the bucket the forward
    needs first is gathered first (DistributedOptimizer, overlap_param_gather). Returns, forward order
    first, each bucket's ``ready`` entry of its last unit in backward order and its gathers."""
    out = []
    bucket_list = buckets(ready, ctx.par.dp * ctx.par.cp, ctx.par.zero_stage)
    for k in range(len(bucket_list) - 1, -1, -1):
        tid, dense, expert = bucket_list[k]
        tasks = []
        for params, group, kind in zip((dense, expert), _groups(ctx, rank), ("", ".expert")):
            if params > 0 and len(group) > 1:
                tasks.append(ctx.comm(rank, STREAM_DP, f"param_all_gather{k}{kind}", "all_gather",
                                      params * ctx.scn.training.param_bytes, group, "dp", "comm_dp", deps))
        out.append((tid, tasks))
    return out


def last_compute(ctx: LowerCtx, rank: int) -> int:
    tid = ctx.builder.last_on(rank, COMPUTE)
    if tid is None:
        raise ValueError(f"rank {rank} has no compute task")
    return tid
