"""Gradient synchronisation, parameter gathering and the optimizer step of one rank.

- DP / ZeRO-1 / ZeRO-2: gradients reduced in buckets as soon as the last micro-batch's backward has
  produced them (Megatron-core DDP with overlap_grad_reduce; Li et al. 2020, PyTorch DDP), by
  all-reduce (stage 0) or reduce-scatter (distributed optimizer / ZeRO-1, ZeRO-2); updated
  parameters all-gathered after the step (Rajbhandari et al. 2020 §5), overlapped with the next
  forward when overlap_param_gather (modelled at the start of this step, the steady state).
- ZeRO-3 gathers and reduce-scatters per layer inside the micro-batch loop (``lower``), so only the
  optimizer step is left here.
- ZeRO-Offload (Ren et al. 2021): gradients to host over PCIe, Adam on the CPU, parameters back.
"""

from __future__ import annotations

from ..tasks import OpWork
from .context import COMPUTE, LowerCtx

# Megatron-core DistributedDataParallelConfig: bucket_size = max(40M, 1M x dp) parameters.
BUCKET_MIN_PARAMS = 40_000_000
BUCKET_PARAMS_PER_DP_RANK = 1_000_000
# Fused Adam (apex / torch foreach) per parameter: read grad, read+write fp32 master, m, v (24 B),
# write the 16-bit model copy (2 B): memory-bound (Rajbhandari et al. 2020 §3 state sizes).
ADAM_STATE_RW_BYTES = 24


def bucket_params(dp: int) -> int:
    return max(BUCKET_MIN_PARAMS, BUCKET_PARAMS_PER_DP_RANK * dp)


def buckets(layer_ready: list[tuple[int, float, float]], dp: int) -> list[tuple[int, float, float]]:
    """Group (ready task, dense params, expert params) in backward order into buckets.

    Returns (task after which the bucket is complete, dense params, expert params) per bucket."""
    out, dense, expert, cap = [], 0.0, 0.0, bucket_params(dp)
    for i, (tid, d, e) in enumerate(layer_ready):
        dense += d
        expert += e
        if dense + expert >= cap or i == len(layer_ready) - 1:
            out.append((tid, dense, expert))
            dense = expert = 0.0
    return out


def reduce_gradients(ctx: LowerCtx, rank: int, ready: list[tuple[int, float, float]], end_dep: int) -> list[int]:
    """Bucketed gradient reduction; returns the tasks the optimizer must wait for."""
    par = ctx.par
    gbytes = ctx.scn.training.grad_dtype_bytes
    dense_group = ctx.mesh.group("dp_cp", rank)
    expert_group = ctx.mesh.group("edp", rank)
    op = "all_reduce" if par.zero_stage == 0 else "reduce_scatter"
    out = []
    for k, (tid, dense, expert) in enumerate(buckets(ready, par.dp * par.cp)):
        dep = tid if par.overlap_grad_reduce else end_dep
        for params, group, tag in ((dense, dense_group, "dense"), (expert, expert_group, "expert")):
            if params > 0 and len(group) > 1:
                out.append(ctx.comm(rank, "comm_dp", f"grad_{op}.{tag}{k}", op, params * gbytes, group, "dp",
                                    "comm_dp", (dep,)))
    return out


def optimizer_step(ctx: LowerCtx, rank: int, deps: list[int], dense: float, expert: float) -> int:
    """Adam over this rank's shard (ZeRO >= 1 shards it over the data-parallel group)."""
    par = ctx.par
    shard = dense / (par.dp * par.cp) + expert / max(1, par.dp * par.cp // par.ep) if par.zero_stage else dense + expert
    gbytes = ctx.scn.training.grad_dtype_bytes
    if not par.offload_optimizer:
        work = (OpWork("adam", "optimizer", 0.0, shard * (ADAM_STATE_RW_BYTES + gbytes), (int(shard),)),)
        return ctx.compute(rank, "optimizer", work, deps, "optimizer", phase="O")
    d2h = ctx.comm(rank, "offload", "grads_to_host", "send_recv", shard * gbytes, (rank,), "host", "offload",
                   deps)
    step = ctx.host(rank, "cpu_adam", (OpWork("cpu_adam", "optimizer", 0.0, 0.0, (int(shard),)),), (d2h,),
                    phase="O")
    return ctx.comm(rank, "offload", "params_to_gpu", "send_recv", shard * ctx.dtype_bytes, (rank,), "host",
                    "offload", (step,))


def gather_parameters(ctx: LowerCtx, rank: int, ready: list[tuple[int, float, float]], deps: list[int]) -> list[int]:
    """Distributed-optimizer parameter all-gather, one per bucket (ZeRO-1/2)."""
    out = []
    dense_group = ctx.mesh.group("dp_cp", rank)
    for k, (_tid, dense, expert) in enumerate(buckets(ready, ctx.par.dp * ctx.par.cp)):
        if dense + expert > 0 and len(dense_group) > 1:
            out.append(ctx.comm(rank, "comm_dp", f"param_all_gather{k}", "all_gather",
                                (dense + expert) * ctx.dtype_bytes, dense_group, "dp", "comm_dp", deps))
    return out


def last_compute(ctx: LowerCtx, rank: int) -> int:
    tid = ctx.builder.last_on(rank, COMPUTE)
    assert tid is not None
    return tid
