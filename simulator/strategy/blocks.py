"""Per-rank work templates of one transformer layer, the embedding and the head.

The op graph is split into the segments between communication points (TP/SP collectives, CP K/V
exchange, EP all-to-all), each segment sharded once by ``strategy/sharding``. The lowering reuses
these tuples for every layer and micro-batch, which keeps lowering and costing O(segments).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model.opgraph import Op, OpGraph
from ..tasks import OpWork
from .sharding import shard_ops, shard_ops_backward

Work = tuple[OpWork, ...]


@dataclass(frozen=True)
class Segment:
    """Forward work, backward input-gradient (B) and weight-gradient (W) work of a run of ops."""

    name: str
    fwd: Work
    bwd_b: Work
    bwd_w: Work
    bwd: Work  # B and W fused, as non-zero-bubble schedules run them


def _segment(name: str, ops: tuple[Op, ...], tp: int, sp: bool, cp: int, ep: int) -> Segment:
    return Segment(name, shard_ops(ops, tp, sp, cp, ep), shard_ops_backward(ops, tp, sp, cp, ep, "B"),
                   shard_ops_backward(ops, tp, sp, cp, ep, "W"), shard_ops_backward(ops, tp, sp, cp, ep, "BW"))


@dataclass(frozen=True)
class LayerBlocks:
    """One layer cut at its communication points.

    attn_pre | attn_core | attn_post  -- [TP collective] --  mlp_pre | experts | mlp_post  -- [TP collective]
    Dense layers have empty ``experts`` / ``mlp_post``; the MoE dispatch all-to-all sits between
    mlp_pre (norm + router) and experts, the combine between experts and mlp_post.
    """

    attn_pre: Segment
    attn_core: Segment
    attn_post: Segment
    mlp_pre: Segment
    experts: Segment | None
    mlp_post: Segment | None
    embed: Segment
    head: Segment
    core_flops_fwd: float  # attention-core FLOPs on this rank (selective recompute re-runs them)


def build_blocks(graph: OpGraph, tp: int, sp: bool, cp: int, ep: int) -> LayerBlocks:
    attn = tuple(op for op in graph.layer if op.block == "attn")
    mlp = tuple(op for op in graph.layer if op.block == "mlp")
    core_at = next(i for i, op in enumerate(attn) if op.kind == "attention")
    experts_at = [i for i, op in enumerate(mlp) if op.tp_split == "expert"]

    def seg(name: str, ops: tuple[Op, ...]) -> Segment:
        return _segment(name, ops, tp, sp, cp, ep)

    if experts_at:
        lo, hi = experts_at[0], experts_at[-1] + 1
        mlp_pre, experts, mlp_post = seg("mlp_pre", mlp[:lo]), seg("experts", mlp[lo:hi]), seg("mlp_post", mlp[hi:])
    else:
        mlp_pre, experts, mlp_post = seg("mlp", mlp), None, None
    core = seg("attn_core", attn[core_at:core_at + 1])
    return LayerBlocks(
        attn_pre=seg("attn_pre", attn[:core_at]), attn_core=core, attn_post=seg("attn_post", attn[core_at + 1:]),
        mlp_pre=mlp_pre, experts=experts, mlp_post=mlp_post,
        embed=seg("embed", graph.embed), head=seg("head", graph.head),
        core_flops_fwd=sum(w.flops for w in core.fwd))


def split_work(work: Work, parts: int) -> Work:
    """One of ``parts`` equal slices of a segment (ring-attention steps over K/V blocks)."""
    return tuple(OpWork(w.name, w.kind, w.flops / parts, w.bytes / parts, w.shape) for w in work)
