"""Program order of one transformer layer on one rank: compute segments and the collectives between.

Forward (Shoeybi et al. 2019; Korthikanti et al. 2022 Fig. 5): [SP all-gather] attention [TP all-reduce
| SP reduce-scatter] [SP all-gather] MLP [TP all-reduce | SP reduce-scatter], blocking on the compute
stream. Backward runs the conjugates in reverse: the exit's conjugate (SP all-gather of the output
gradient) blocks; the entry's conjugate (TP all-reduce | SP reduce-scatter of the input gradient) is
launched asynchronously after the column-parallel GEMM's input gradient and overlapped with its
weight gradient, and with SP the saved sequence-sharded GEMM input is all-gathered again, overlapped
with the input-gradient GEMM (Megatron-LM core/tensor_parallel/layers.py,
LinearWithGradAccumulationAndAsyncCommunication.backward). CP splits the attention core into ring steps
overlapped with the K/V P2P exchange (Liu et al. 2023, ring attention) or gathers K/V first (Llama 3,
Dubey et al. 2024 §3.3.2; Transformer Engine's AttnFuncWithCPAndKVAllGather re-gathers K/V in the
backward and reduce-scatters dK/dV), or as PyTorch's context parallelism runs it for torchtitan
(``cp_torch``), or by heads between two all-to-alls (``cp_a2a``). EP brackets the experts with the
dispatch and combine all-to-alls (Lepikhin et al. 2020, GShard), forward and backward, with
Megatron-Core's overlapped shared experts between them (``_shared``). A parallel attention + MLP block
(``LayerBlocks.parallel_norms``) reduces the sum of both branches once at its end (``blocking_tp``).
"""

from __future__ import annotations

from typing import Any

from ..model.fp8 import FP8_PRECISIONS
from ..tasks import InternalError
from . import cp_a2a, cp_te, cp_torch
from .blocks import LayerBlocks, Segment, Work, ring_steps
from .blocking_tp import blocking_tp, bulk_site
from .context import COMM_TP, COMPUTE, LowerCtx
from .recompute import LayerRecompute, recomputed_forward

def _d(x: int | None) -> tuple[int, ...]:
    return () if x is None else (x,)


def _moe(seg: Segment | None, layer: int) -> Segment:
    """An MoE layer's experts or post-experts segment (a dense layer has none)."""
    if seg is None:
        raise InternalError(f"layer {layer}: MoE emission asked for a segment its blocks lack")
    return seg


def a2a_bytes(ctx: LowerCtx) -> float:
    """EP dispatch/combine send buffer: local tokens · top_k · h (GShard §2.2), times the capacity
    factor when padded to capacity (``ModelSpec.moe_mean_load``).
    With SP each TP rank routes its own s/t tokens (Megatron-core requires SP for MoE with TP)."""
    m = ctx.scn.model
    return _local_tokens(ctx) * m.moe_top_k * m.moe_mean_load() * m.hidden_size * ctx.dtype_bytes


def _local_tokens(ctx: LowerCtx) -> int:
    """Tokens one rank routes: b·s/cp, /tp with SP."""
    p = ctx.par
    tokens = ctx.scn.training.micro_batch_size * ctx.scn.model.seq_length // p.cp
    return tokens // p.tp if p.sequence_parallel else tokens


def tp_op(ctx: LowerCtx, rank: int, dep: int | None, name: str, op: str, meta: dict,
          overlap: tuple = (), site: str = "") -> int | None:
    """A blocking TP collective of the activation after ``dep``; ``dep`` itself when tp = 1. ``site``:
    the TE gather it is (blocking_tp.GATHER_SITES), which sizes it and may put an amax all-reduce first."""
    amax = ctx.traffic().amax_before(site)
    if amax:
        dep = ctx.tp_collective(rank, f"{name}.amax_reduce_tp", "all_reduce", amax, _d(dep), **meta)
    tid = ctx.tp_collective(rank, f"{name}.{op}", op, ctx.tp_bytes(site), _d(dep), overlap=overlap, **meta)
    return dep if tid is None else tid


def _blocking(ctx: LowerCtx, rank: int, dep: int | None, name: str, coll: tuple | None, meta: dict) -> int | None:
    """One of ``BlockingTP``'s collectives (None: none there) after ``dep``."""
    return dep if coll is None else tp_op(ctx, rank, dep, name, coll[0], meta, coll[1], coll[2])


def _core(ctx: LowerCtx, rank: int, part: str, dep: int | None, name: str, meta: dict,
          category: str) -> int | None:
    """The attention core, with the CP exchange when cp > 1; ``part`` is "F", "B" or "BW"."""
    core = ctx.layer_blocks(meta["layer"]).attn_core
    work = {"F": core.fwd, "B": core.bwd_b, "BW": core.bwd}[part]
    cp = ctx.par.cp
    if cp == 1:
        return ctx.compute(rank, f"{name}.core", work, _d(dep), category, **meta)
    if ctx.par.cp_algorithm == "torch-allgather":
        return cp_torch.emit_core(ctx, rank, part, dep, name, meta, category)
    if ctx.par.cp_algorithm == "a2a":
        return cp_a2a.emit_core(ctx, rank, part, dep, name, meta, category)
    group = ctx.group("cp", rank)
    kv = ctx.kv_block_bytes()
    if ctx.par.cp_algorithm == "all-gather":
        c = ctx.comm(rank, "comm_cp", f"{name}.cp_all_gather", "all_gather", kv * cp, group, "cp", "comm_cp",
                     _d(dep), **meta)
        x = ctx.compute(rank, f"{name}.core", work, (c,), category, **meta)
        if part == "F":
            return x
        return ctx.comm(rank, "comm_cp", f"{name}.cp_reduce_scatter", "reduce_scatter", kv * cp, group, "cp",
                        "comm_cp", (x,), **meta)
    # Ring: step j attends to the K/V block received in step j-1 while the next block travels.
    # The backward circulates K, V and the dK, dV accumulators: twice the bytes (Liu et al. 2023 §3).
    # A rank's task is the transfer it receives, from the rank before it, which its next step waits
    # for; every rank's incoming transfer together are every hop of the ring once.
    size = kv * (1 if part == "F" else 2)
    prv = group[(group.index(rank) - 1) % cp]
    first, later = cp_te.te_ring_steps(ctx.layer_blocks(meta["layer"]), ctx.scn)  # with TE's copies and merges
    last, prev_recv = dep, None
    for j in range(cp):
        recv = None
        if j < cp - 1:
            recv = ctx.comm(rank, "comm_cp", f"{name}.cp_recv{j}", "send_recv", size, (prv, rank), "cp",
                            "comm_cp", _d(dep), **meta)
        last = ctx.compute(rank, f"{name}.core{j}", (later if j else first)[part], _d(last) + _d(prev_recv),
                           category, **meta)
        prev_recv = recv
    return last


def _experts(ctx: LowerCtx, rank: int, part: str, dep: int, name: str, meta: dict, category: str,
             again: tuple = ()) -> int:
    """The routed experts between the EP dispatch and combine all-to-alls (with MoE parallel folding,
    the expert-TP all-gather and reduce-scatter inside them). ``again``: (work, meta, pending bytes)
    of a recompute run right before the experts' kernels ("moe_act", ``_rerun``)."""
    b = ctx.layer_blocks(meta["layer"])
    seg = _moe(b.experts, meta["layer"])
    work = {"F": seg.fwd, "B": seg.bwd_b, "BW": seg.bwd}[part]
    if ctx.par.ep == 1:
        dep = _shared(ctx, rank, part, dep, name, meta, category, b, "before")
        dep = _one(_rerun(ctx, rank, dep, f"{name}.R.expert_act", *again), rank) if again else dep
        e = ctx.compute(rank, f"{name}.experts", work, (dep,), category, **meta)
        return _shared(ctx, rank, part, e, name, meta, category, b, "after")
    group = ctx.group("ep", rank)
    size = a2a_bytes(ctx)
    # Megatron-core MoEAllGatherTokenDispatcher: every rank gathers all the EP group's tokens (h wide,
    # before routing copies), computes its local experts' share, and reduce-scatters the outputs
    gather = ctx.scn.model.moe_token_dispatcher == "allgather"
    op, coll = ("all_gather", "reduce_scatter") if gather else ("all_to_all", "all_to_all")
    if gather:
        size = _local_tokens(ctx) * ctx.scn.model.hidden_size * ctx.dtype_bytes * len(group)
    a = ctx.comm(rank, "comm_ep", f"{name}.dispatch", op, size, group, "ep", "comm_ep", (dep,), **meta)
    _shared(ctx, rank, part, dep, name, meta, category, b, "before")  # beside the all-to-all, on the compute stream
    etp = ctx.par.expert_tp
    folded = etp > 1 and etp != ctx.par.tp  # with etp = tp the SP all-gather before the MLP block stands for it
    if folded:  # Megatron-core alltoall dispatcher: the received tokens all-gathered over the expert-TP group
        a = ctx.comm(rank, "comm_ep", f"{name}.etp_all_gather", "all_gather", size * etp, ctx.group("etp", rank),
                     "ep", "comm_ep", (a,), **meta)
    a = _one(_rerun(ctx, rank, a, f"{name}.R.expert_act", *again), rank) if again else a
    e = ctx.compute(rank, f"{name}.experts", work, (a,), category, **meta)
    if folded:
        e = ctx.comm(rank, "comm_ep", f"{name}.etp_reduce_scatter", "reduce_scatter", size * etp,
                     ctx.group("etp", rank), "ep", "comm_ep", (e,), **meta)
    c = ctx.comm(rank, "comm_ep", f"{name}.combine", coll, size, group, "ep", "comm_ep", (e,), **meta)
    _shared(ctx, rank, part, e, name, meta, category, b, "after")  # what follows on the compute stream waits for it
    return c


def _shared(ctx: LowerCtx, rank: int, part: str, dep: int, name: str, meta: dict, category: str,
            b: LayerBlocks, where: str) -> int:
    """With moe_shared_expert_overlap, the shared experts' part that Megatron-core runs on its side
    stream beside an all-to-all (here in program order on the compute stream, which the all-to-all
    leaves free): forward, fc1 + activation after the dispatch is launched ("before" the routed
    experts) and fc2 after the combine ("after"); backward, all of them first, beside the combine's
    conjugate (set_tensor_grad_fn_sequence_sr gives their grad_fns the highest sequence number, so
    autograd runs them as soon as they are ready). ``dep`` when there are none to run there."""
    if b.shared_in is None or b.shared_out is None:
        return dep
    if part == "F":
        seg = b.shared_in if where == "before" else b.shared_out
        return ctx.compute(rank, f"{name}.shared_{where}", seg.fwd, (dep,), category, **meta)
    if where == "after":
        return dep
    x = dep
    for seg in (b.shared_out, b.shared_in):
        x = ctx.compute(rank, f"{name}.{seg.name}.grad", seg.bwd_b if part == "B" else seg.bwd, (x,), category,
                        **meta)
    return x


def column_backward(ctx: LowerCtx, rank: int, seg: Segment, dep: int | None, name: str, meta: dict,
                    split_w: bool, free_bytes: float = 0.0, site: str = "", wgrad: Work | None = None) -> int | None:
    """Backward of a segment that opens with a column-parallel GEMM, with the asynchronous TP
    collective of its input gradient overlapped with the weight-gradient GEMM (see module doc).
    Its last task releases ``free_bytes`` of activations. ``site``: "qkv" or "fc1", the GEMM's
    userbuffers bulk sites under tp_comm_overlap (bulk_site). ``wgrad``: the weight gradients overlapped
    with the collective (``LayerBlocks.entry_wgrad``; default the segment's own)."""
    free: dict[str, Any] = {"mem_delta_bytes": -free_bytes} if free_bytes else {}
    wgrad = seg.bwd_wgrad if wgrad is None else wgrad
    if ctx.par.tp == 1:
        return ctx.compute(rank, f"{name}.grad", seg.bwd_b if split_w else seg.bwd, _d(dep), **meta, **free)
    sp = ctx.par.sequence_parallel
    op = "reduce_scatter" if sp else "all_reduce"
    size = ctx.tp_bytes()
    gather = None
    if sp and not split_w and wgrad:  # the input the forward saved, quantized under FP8 (site qkv_dgrad...)
        gather = ctx.tp_collective(rank, f"{name}.input_all_gather", "all_gather",
                                   ctx.tp_bytes(f"{site}_dgrad" if site else ""), _d(dep), COMM_TP,
                                   bulk_site(ctx.par, site, "dgrad"), **meta)
    x: int | None = ctx.compute(rank, f"{name}.grad", seg.bwd_b_pre if split_w else seg.bwd_pre, _d(dep), **meta)
    red = ctx.tp_collective(rank, f"{name}.grad.{op}", op, size, (x,), COMM_TP, bulk_site(ctx.par, site, "wgrad"),
                            **meta)
    if not split_w and wgrad:
        x = ctx.compute(rank, f"{name}.wgrad", wgrad, (x,) + _d(gather), **meta)
    post = seg.bwd_b_post if split_w else seg.bwd_post
    if post:
        return ctx.compute(rank, f"{name}.grad_post", post, (x, red), **meta, **free)
    x = ctx.join(rank, f"{name}.grad_wait", (x, red), **meta)
    ctx.free_last(rank, free_bytes)
    return x


def layer_forward(ctx: LowerCtx, rank: int, deps, name: str, meta: dict, category: str = "compute") -> int | None:
    """Emit one layer's forward after ``deps``; returns its last task."""
    b = ctx.layer_blocks(meta["layer"])
    tp = blocking_tp(ctx.par, b)
    x = ctx.join(rank, f"{name}.wait", deps, **meta)
    x = _blocking(ctx, rank, x, f"{name}.attn", tp.attn_in, meta)
    if ctx.par.cp == 1:
        x = ctx.compute(rank, f"{name}.attn", b.attn.fwd, _d(x), category, **meta)
    else:
        x = ctx.compute(rank, f"{name}.attn", b.attn_pre.fwd, _d(x), category, **meta)
        x = _core(ctx, rank, "F", x, name, meta, category)
        x = ctx.compute(rank, f"{name}.attn_out", b.attn_post.fwd, (x,), category, **meta)
    x = _blocking(ctx, rank, x, f"{name}.attn", tp.attn_out, meta)
    x = _blocking(ctx, rank, x, f"{name}.mlp", tp.mlp_in, meta)
    x = ctx.compute(rank, f"{name}.mlp", b.mlp_pre.fwd, _d(x), category, **meta)
    if b.experts is not None:
        x = _experts(ctx, rank, "F", x, name, meta, category)
        x = ctx.compute(rank, f"{name}.mlp_out", _moe(b.mlp_post, meta["layer"]).fwd, (x,), category, **meta)
    return _blocking(ctx, rank, x, f"{name}.mlp", tp.mlp_out, meta)


def _rerun(ctx: LowerCtx, rank: int, dep: int | None, name: str, work: Work, rmeta: dict, pending: list) -> int | None:
    """A recompute task re-running ``work`` after ``dep`` (``dep`` when there is none); the layer's
    first recompute task allocates its re-materialised bytes (``pending[0]``, then zeroed)."""
    if not work:
        return dep
    _first(ctx, rank, pending)
    return ctx.compute(rank, name, work, _d(dep), "recompute", **rmeta)


def _first(ctx: LowerCtx, rank: int, pending: list) -> None:
    """The next kernel (the layer's first recompute) allocates the bytes the recompute re-materialises."""
    ctx.alloc_next(rank, pending[0])
    pending[0] = 0.0


def _mlp_rerun(ctx: LowerCtx, rank: int, x: int | None, name: str, rc: LayerRecompute, rmeta: dict,
               pending: list) -> int | None:
    """The recomputes before the MLP block's backward (``recompute.LayerRecompute``): the pre-MLP
    norm, the dense MLP or the MoE layer with the block's blocking TP collectives, the shared experts."""
    b = ctx.layer_blocks(rmeta["layer"])
    x = _rerun(ctx, rank, x, f"{name}.mlp_norm", rc.mlp_norm, rmeta, pending)
    if rc.mlp_tp:
        tp = blocking_tp(ctx.par, b)
        x = _blocking(ctx, rank, x, f"{name}.mlp", tp.mlp_in, rmeta)
        x = _rerun(ctx, rank, x, f"{name}.mlp", rc.mlp_pre, rmeta, pending)
        if rc.experts:
            _first(ctx, rank, pending)
            x = _experts(ctx, rank, "F", _one(x, rank), name, rmeta, "recompute")
        x = _rerun(ctx, rank, x, f"{name}.mlp_out", rc.mlp_post, rmeta, pending)
        x = _blocking(ctx, rank, x, f"{name}.mlp", tp.mlp_out, rmeta)
    return _rerun(ctx, rank, x, f"{name}.shared_experts", rc.shared, rmeta, pending)


def _op_sac(ctx: LowerCtx, rank: int, x: int | None, name: str, rc: LayerRecompute, rmeta: dict,
            pending: list) -> int | None:
    """torchtitan's per-op SAC re-run (``recompute.op_sac_rerun``): all at once, or with TP the
    attention block's and the MLP block's re-run ops each after its input all-gather again."""
    tp = blocking_tp(ctx.par, ctx.layer_blocks(rmeta["layer"]))
    if not rc.ops or tp.attn_in is None:
        return _rerun(ctx, rank, x, f"{name}.sac", rc.ops, rmeta, pending)
    attn, mlp = rc.ops_split
    x = _blocking(ctx, rank, x, f"{name}.attn", tp.attn_in, rmeta)
    x = _rerun(ctx, rank, x, f"{name}.sac", attn, rmeta, pending)
    x = _blocking(ctx, rank, x, f"{name}.mlp", tp.mlp_in, rmeta)
    return _rerun(ctx, rank, x, f"{name}.sac_mlp", mlp, rmeta, pending)


def _one(x: int | None, rank: int) -> int:
    if x is None:
        raise InternalError(f"rank {rank}: an MoE recompute has no task to follow")
    return x


def layer_backward(ctx: LowerCtx, rank: int, deps, name: str, meta: dict, split_w: bool, recompute: str,
                   free_bytes: float = 0.0) -> int | None:
    """Emit one layer's backward (input gradient only when ``split_w``), each recompute
    (``recompute.recomputed_forward``) right before the backward that needs it; returns its last
    task, which releases ``free_bytes`` of activations and the recompute's re-materialised bytes
    (``ctx.transient_bytes``); the layer's first recompute task allocates ``ctx.recompute_alloc_bytes``
    (the same bytes, or under Megatron's uniform groups its whole group's for the group's first backward)."""
    b = ctx.layer_blocks(meta["layer"])
    part = "B" if split_w else "BW"
    rmeta, rname = {**meta, "phase": "R"}, f"{name}.R"
    rc = recomputed_forward(recompute, ctx.par.recompute_modules, ctx.scn.model, b)
    transient = ctx.transient_bytes(meta["layer"]) if rc.any else 0.0
    pending = [ctx.recompute_alloc_bytes(meta["layer"]) if rc.any else 0.0]
    x = ctx.join(rank, f"{name}.wait", deps, **meta)
    x = _op_sac(ctx, rank, x, rname, rc, rmeta, pending)
    if rc.layer:
        _first(ctx, rank, pending)
        x = layer_forward(ctx, rank, _d(x), rname, rmeta, "recompute")
    x = _mlp_rerun(ctx, rank, x, rname, rc, rmeta, pending)
    tp = blocking_tp(ctx.par, b)
    x = _blocking(ctx, rank, x, f"{name}.mlp_grad", tp.mlp_grad, meta)  # conjugate of the MLP's exit
    if b.experts is not None:
        post = _moe(b.mlp_post, meta["layer"])
        x = ctx.compute(rank, f"{name}.mlp_out.grad", post.bwd_b if split_w else post.bwd, _d(x),
                        **meta)
        x = _experts(ctx, rank, part, x, name, meta, "compute", (rc.act, rmeta, pending))
    if b.shared_input:  # fc1's input gradient joins QKV's: one collective, after the attention's backward
        x = ctx.compute(rank, f"{name}.mlp.grad", b.mlp_input_grad(split_w), _d(x), **meta)
    else:
        x = column_backward(ctx, rank, b.mlp_pre, x, f"{name}.mlp", meta, split_w,
                            site="" if b.experts is not None else "fc1")
    x = _rerun(ctx, rank, x, f"{rname}.attn_norm", rc.attn_norm, rmeta, pending)
    x = _blocking(ctx, rank, x, f"{name}.attn_grad", tp.attn_grad, meta)
    if ctx.par.cp == 1 and not rc.inside_attention:
        x = column_backward(ctx, rank, b.attn, x, f"{name}.attn", meta, split_w, free_bytes + transient, "qkv",
                            b.entry_wgrad(b.attn))
    else:
        x = ctx.compute(rank, f"{name}.attn_out.grad", b.attn_post.bwd_b if split_w else b.attn_post.bwd, (x,),
                        **meta)
        x = _rerun(ctx, rank, x, f"{rname}.up_proj", rc.up_proj, rmeta, pending)
        if rc.core:
            # Korthikanti et al. 2022 §4.3: the attention core's forward (with its CP exchange) is
            # recomputed right before its backward
            _first(ctx, rank, pending)
            x = _core(ctx, rank, "F", x, rname, rmeta, "recompute")
        x = _core(ctx, rank, part, x, name, meta, "compute")
        x = column_backward(ctx, rank, b.attn_pre, x, f"{name}.attn", meta, split_w, free_bytes + transient, "qkv",
                            b.entry_wgrad(b.attn_pre))
    if pending[0]:
        raise InternalError(f"layer {meta['layer']}: {pending[0]} recomputed bytes but nothing re-run")
    return x


def layer_weight_grad(ctx: LowerCtx, rank: int, deps: tuple, name: str, meta: dict,
                      free_bytes: float = 0.0) -> int:
    """Zero-bubble W after ``deps`` (at most one task): every weight-gradient GEMM of the layer (Qi
    et al. 2024 §2), releasing ``free_bytes`` of activations. With SP the column-parallel GEMMs'
    sequence-sharded inputs are all-gathered again first, as in B+W (one with a shared input)."""
    after = tuple(d for d in deps if d is not None)
    deps = after
    b = ctx.layer_blocks(meta["layer"])
    if ctx.par.sequence_parallel and ctx.par.tp > 1:
        sites = {"attn": "qkv_dgrad", "mlp": "" if b.experts is not None else "fc1_dgrad"}
        blks = ("attn",) if b.shared_input else ("mlp", "attn")
        deps += tuple(ctx.tp_collective(rank, f"{name}.{blk}.input_all_gather", "all_gather", ctx.tp_bytes(sites[blk]),
                                        after, COMM_TP, **meta) for blk in blks)
    return ctx.compute(rank, f"{name}.W", b.layer_w, deps, mem_delta_bytes=-free_bytes, **meta)


# Transformer Engine's FP8 scaling tensors per GEMM (module/base.py init_fp8_meta_tensors:
# "num_gemms * 3 if fwd else num_gemms * 2": input, weight, output; output and input gradients).
AMAX_TENSORS_PER_GEMM = {"F": 3, "B": 2}


def amax_reduction(ctx: LowerCtx, rank: int, dep: int | None, name: str, meta: dict, layers: list[int],
                   phase: str) -> int | None:
    """Transformer Engine's delayed scaling after a model chunk's forward ("F") or backward ("B") of
    one micro-batch: the amaxes of every FP8 tensor of the chunk concatenated and all-reduced (MAX,
    ``async_op=False``: the compute stream waits) over the amax group, Megatron-Core's tensor x data
    (x context) parallel ranks of the stage (TE quantization.py reduce_and_update_fp8_tensors, at the
    outermost fp8_autocast's exit and in the backward of its first module; Megatron-Core
    get_amax_reduction_group(with_context_parallel=True)). None of it without delayed FP8 or alone."""
    tr = ctx.scn.training
    if tr.dtype != "fp8" or tr.fp8_recipe != "delayed" or not layers:
        return dep
    group = ctx.group("tp_dp_cp", rank)
    if len(group) < 2:
        return dep
    gemms = sum(1 for layer in layers for seg in ctx.layer_blocks(layer).segments() for w in seg.fwd
                if w.kind == "gemm" and w.precision in FP8_PRECISIONS)
    if not gemms:
        return dep
    nbytes = 4.0 * AMAX_TENSORS_PER_GEMM[phase] * gemms
    return ctx.comm(rank, COMPUTE, f"{name}.amax_all_reduce", "all_reduce", nbytes, group, "dp", "comm_dp", _d(dep),
                    **meta)
