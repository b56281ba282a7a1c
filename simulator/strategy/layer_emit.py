"""Program order of one transformer layer on one rank: compute segments and the collectives between.

Forward (Shoeybi et al. 2019; Korthikanti et al. 2022 Fig. 5): [SP all-gather] attention [TP all-reduce
| SP reduce-scatter] [SP all-gather] MLP [TP all-reduce | SP reduce-scatter]. Backward runs the conjugate
collectives in reverse. CP splits the attention core into ring steps overlapped with the K/V P2P
exchange (Liu et al. 2023, ring attention) or gathers K/V first (Llama 3, Dubey et al. 2024 §3.3.2).
EP brackets the experts with the dispatch and combine all-to-alls (Lepikhin et al. 2020, GShard).
"""

from __future__ import annotations

from .blocks import Segment, split_work
from .context import LowerCtx


def _tp_pair(ctx: LowerCtx, forward: bool) -> tuple[str | None, str]:
    """Collectives at a block's (entry, exit) in one direction; None where there is none."""
    if ctx.par.sequence_parallel:
        return ("all_gather", "reduce_scatter")
    return (None, "all_reduce") if forward else (None, "all_reduce")


def _kv_block_bytes(ctx: LowerCtx) -> float:
    """K and V of one CP shard: 2·b·(s/cp)·(kv_heads·head_dim / tp) elements."""
    m = ctx.scn.model
    kv = m.kv_hidden_size // ctx.par.tp if m.num_kv_heads >= ctx.par.tp else m.head_dim
    return 2 * ctx.scn.training.micro_batch_size * (m.seq_length // ctx.par.cp) * kv * ctx.dtype_bytes


def _a2a_bytes(ctx: LowerCtx) -> float:
    """EP dispatch/combine send buffer: local tokens · top_k · capacity factor · h (GShard §2.2)."""
    m, p = ctx.scn.model, ctx.par
    tokens = ctx.scn.training.micro_batch_size * m.seq_length // p.cp
    if p.sequence_parallel:
        tokens //= p.tp
    return tokens * m.moe_top_k * m.moe_capacity_factor * m.hidden_size * ctx.dtype_bytes


def _core(ctx: LowerCtx, rank: int, seg: Segment, part: str, dep: int, meta: dict, category: str) -> int:
    """The attention core, with the CP exchange when cp > 1."""
    work = seg.fwd if part == "F" else (seg.bwd_b if part == "B" else seg.bwd)
    cp = ctx.par.cp
    if cp == 1:
        return ctx.compute(rank, f"{meta['name']}.core", work, (dep,), category, **meta["m"])
    group = ctx.mesh.group("cp", rank)
    # backward circulates K, V and their gradients: twice the forward's bytes (Liu et al. 2023 §3)
    kv = _kv_block_bytes(ctx) * (1 if part == "F" else 2)
    if ctx.par.cp_algorithm == "all-gather":
        op = "all_gather" if part == "F" else "reduce_scatter"
        c = ctx.comm(rank, "comm_cp", f"{meta['name']}.cp_{op}", op, kv * cp, group, "cp", "comm_cp", (dep,),
                     **meta["m"])
        return ctx.compute(rank, f"{meta['name']}.core", work, (c,), category, **meta["m"])
    nxt = group[(group.index(rank) + 1) % cp]
    step_work = split_work(work, cp)
    last = dep
    send = None
    for j in range(cp):
        if j < cp - 1:
            send = ctx.comm(rank, "comm_cp", f"{meta['name']}.cp_send{j}", "send_recv", kv, (rank, nxt), "cp",
                            "comm_cp", (dep,), **meta["m"])
        deps = (last,) if j == 0 else (last, prev_send)
        last = ctx.compute(rank, f"{meta['name']}.core{j}", step_work, deps, category, **meta["m"])
        prev_send = send
    return last


def _experts(ctx: LowerCtx, rank: int, seg: Segment, part: str, dep: int, meta: dict, category: str) -> int:
    work = seg.fwd if part == "F" else (seg.bwd_b if part == "B" else seg.bwd)
    if ctx.par.ep == 1:
        return ctx.compute(rank, f"{meta['name']}.experts", work, (dep,), category, **meta["m"])
    group = ctx.mesh.group("ep", rank)
    size = _a2a_bytes(ctx)
    a = ctx.comm(rank, "comm_ep", f"{meta['name']}.dispatch", "all_to_all", size, group, "ep", "comm_ep", (dep,),
                 **meta["m"])
    e = ctx.compute(rank, f"{meta['name']}.experts", work, (a,), category, **meta["m"])
    return ctx.comm(rank, "comm_ep", f"{meta['name']}.combine", "all_to_all", size, group, "ep", "comm_ep", (e,),
                    **meta["m"])


def _after(ctx: LowerCtx, rank: int, last: int, name: str, op: str | None, meta: dict) -> int:
    if op is None:
        return last
    size = ctx.full_activation_bytes()
    tid = ctx.tp_collective(rank, f"{name}.{op}", op, size, (last,), **meta["m"])
    return last if tid is None else tid


def layer_forward(ctx: LowerCtx, rank: int, dep: int | None, name: str, meta: dict,
                  category: str = "compute") -> tuple[int, int]:
    """Emit one layer's forward; returns (first task, last task)."""
    b = ctx.blocks
    m = {"name": name, "m": meta}
    enter, leave = _tp_pair(ctx, True)
    deps = () if dep is None else (dep,)
    first = ctx.tp_collective(rank, f"{name}.attn.{enter}", enter, ctx.full_activation_bytes(), deps, **meta) \
        if enter else None
    x = ctx.compute(rank, f"{name}.attn", b.attn_pre.fwd, deps if first is None else (first,), category, **meta)
    first = x if first is None else first
    x = _core(ctx, rank, b.attn_core, "F", x, m, category)
    x = ctx.compute(rank, f"{name}.attn_out", b.attn_post.fwd, (x,), category, **meta)
    x = _after(ctx, rank, x, f"{name}.attn", leave, m)
    x = _after(ctx, rank, x, f"{name}.mlp", enter, m)
    x = ctx.compute(rank, f"{name}.mlp", b.mlp_pre.fwd, (x,), category, **meta)
    if b.experts is not None:
        x = _experts(ctx, rank, b.experts, "F", x, m, category)
        x = ctx.compute(rank, f"{name}.mlp_out", b.mlp_post.fwd, (x,), category, **meta)
    x = _after(ctx, rank, x, f"{name}.mlp", leave, m)
    return first, x


def layer_backward(ctx: LowerCtx, rank: int, dep: int | None, name: str, meta: dict, split_w: bool,
                   recompute: str) -> tuple[int, int]:
    """Emit one layer's backward (input gradient only when ``split_w``), with its recompute first."""
    b = ctx.blocks
    m = {"name": name, "m": meta}
    part = "B" if split_w else "BW"
    first = None
    if recompute == "full":
        first, dep = layer_forward(ctx, rank, dep, f"{name}.R", {**meta, "phase": "R"}, "recompute")
    # the conjugate of the forward's exit collective: SP all-gather / nothing for TP all-reduce
    enter_b = "all_gather" if ctx.par.sequence_parallel else None
    leave_b = "reduce_scatter" if ctx.par.sequence_parallel else "all_reduce"
    deps = () if dep is None else (dep,)
    x = _after(ctx, rank, dep, f"{name}.mlp_grad", enter_b, m) if dep is not None and enter_b else dep
    w = (lambda s: s.bwd_b) if split_w else (lambda s: s.bwd)
    if b.experts is not None:
        x = ctx.compute(rank, f"{name}.mlp_out.grad", w(b.mlp_post), () if x is None else (x,), **meta)
        first = first if first is not None else x
        x = _experts(ctx, rank, b.experts, part, x, m, "compute")
        x = ctx.compute(rank, f"{name}.mlp.grad", w(b.mlp_pre), (x,), **meta)
    else:
        x = ctx.compute(rank, f"{name}.mlp.grad", w(b.mlp_pre), () if x is None else (x,), **meta)
        first = first if first is not None else x
    x = _after(ctx, rank, x, f"{name}.mlp_grad", leave_b, m)
    x = _after(ctx, rank, x, f"{name}.attn_grad", enter_b, m)
    x = ctx.compute(rank, f"{name}.attn_out.grad", w(b.attn_post), (x,), **meta)
    if recompute == "selective":
        # Korthikanti 2022 §4.3: the attention core's forward is recomputed before its backward
        x = ctx.compute(rank, f"{name}.core.R", b.attn_core.fwd, (x,), "recompute", **{**meta, "phase": "R"})
    x = _core(ctx, rank, b.attn_core, part, x, m, "compute")
    x = ctx.compute(rank, f"{name}.attn.grad", w(b.attn_pre), (x,), **meta)
    x = _after(ctx, rank, x, f"{name}.attn_grad", leave_b, m)
    del deps
    return first, x


def layer_weight_grad(ctx: LowerCtx, rank: int, dep: int | None, name: str, meta: dict) -> int:
    """Zero-bubble W: every weight-gradient GEMM of the layer, no communication (Qi et al. 2024 §2)."""
    b = ctx.blocks
    segs = [b.attn_pre, b.attn_core, b.attn_post, b.mlp_pre] + [s for s in (b.experts, b.mlp_post) if s]
    work = tuple(w for s in segs for w in s.bwd_w)
    return ctx.compute(rank, f"{name}.W", work, () if dep is None else (dep,), **meta)
