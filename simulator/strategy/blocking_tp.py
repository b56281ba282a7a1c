"""Which TP/SP collectives of a layer block its compute stream, and which GEMM's userbuffers overlap
each: one rule for the lowering (``layer_emit``) and the search estimate (``explore/estimate``).

Forward (Shoeybi et al. 2019; Korthikanti et al. 2022 Fig. 5): [SP all-gather] attention [TP all-reduce
| SP reduce-scatter] [SP all-gather] MLP [TP all-reduce | SP reduce-scatter], blocking; backward, the
conjugates of the exits (SP's all-gathers of the output gradients). Under tp_comm_overlap with SP,
Transformer Engine's userbuffers overlap them with the GEMM that consumes or produces them
(``cost/tp_overlap``), or run the backward's input-gradient collectives as bulk overlaps on SMs of
their own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from .blocks import LayerBlocks, Work

if TYPE_CHECKING:  # scenario imports strategy: a type-only import
    from ..scenario import ParallelSpec


def overlap_site(par: ParallelSpec, site: str, work: Work, last: bool = False, moe: bool = False) -> tuple:
    """(site, GEMM) of a TP collective overlapped with the first (or last) GEMM of ``work`` under
    tp_comm_overlap (Transformer Engine userbuffers, cost/tp_overlap); () when not overlapped. The
    MLP sites (fc1/fc2) overlap only a dense MLP: in an MoE layer the experts sit between. The
    lowering and the search estimator both place the overlap with this rule."""
    if not (par.tp_comm_overlap and par.sequence_parallel and par.tp > 1) or (moe and site.startswith("fc")):
        return ()
    gemms = [w for w in work if w.kind == "gemm"]
    return (site, gemms[-1 if last else 0]) if gemms else ()


class BlockingTP(NamedTuple):
    """The TP/SP collectives of one layer that block its compute stream, each (op, overlap site of
    ``overlap_site``) or None: forward at the attention's entry and exit and the MLP's entry and exit;
    backward the conjugates of the exits (SP's all-gathers of the output gradients). One rule for the
    lowering (``layer_forward``/``layer_backward``) and the search estimator (explore/estimate)."""

    attn_in: tuple | None
    attn_out: tuple | None
    mlp_in: tuple | None
    mlp_out: tuple
    mlp_grad: tuple | None
    attn_grad: tuple | None

    def forward(self) -> tuple[tuple, ...]:
        return tuple(c for c in (self.attn_in, self.attn_out, self.mlp_in, self.mlp_out) if c is not None)

    def backward(self) -> tuple[tuple, ...]:
        return tuple(c for c in (self.mlp_grad, self.attn_grad) if c is not None)


def blocking_tp(par: ParallelSpec, b: LayerBlocks) -> BlockingTP:
    """The blocking TP collectives of a layer whose blocks are ``b`` (strategy/blocks.LayerBlocks).

    A parallel block sums the attention's and the MLP's partial outputs and reduces them once at its
    end (GPT-NeoX megatron/model/transformer.py ParallelTransformerLayer with gpt_j_residual: both
    built with ``parallel_output``, then ``self.reduce``, an all-reduce or with SP a reduce-scatter;
    mesh-transformer-jax layers.py TransformerLayerShard: ``g_psum(attn_out + dense_out)``): no exit
    after the attention, and no conjugate of it backward (the attention's output gradient is the
    block's, gathered once). Each norm's output enters the TP region by its own all-gather under SP, as
    GPT-NeoX's ColumnParallelLinear gathers its input (megatron/mpu/layers.py): two with GPT-NeoX's two
    norms, one with a shared norm (``LayerBlocks.shared_input``)."""
    sp, moe, parallel = par.sequence_parallel, b.experts is not None, b.parallel_norms > 0
    exit_op = "reduce_scatter" if sp else "all_reduce"
    return BlockingTP(
        ("all_gather", overlap_site(par, "qkv_fprop", b.attn_pre.fwd)) if sp else None,
        None if parallel else (exit_op, overlap_site(par, "proj_fprop", b.attn_post.fwd)),
        ("all_gather", overlap_site(par, "fc1_fprop", b.mlp_pre.fwd, moe=moe)) if sp and not b.shared_input else None,
        (exit_op, overlap_site(par, "fc2_fprop", b.mlp_pre.fwd, last=True, moe=moe)),
        ("all_gather", overlap_site(par, "fc2_dgrad", b.mlp_pre.bwd_b, moe=moe)) if sp else None,
        ("all_gather", overlap_site(par, "proj_dgrad", b.attn_post.bwd_b)) if sp and not parallel else None)


def bulk_site(par: ParallelSpec, gemm: str, kind: str) -> tuple:
    """(site,) of a backward TP collective that userbuffers run as a bulk overlap on their own SMs
    (cost/tp_overlap.BULK_SITES: "qkv_dgrad", "fc1_wgrad", ...) under tp_comm_overlap with SP, for the
    GEMM ``gemm`` ("qkv" or "fc1"; "" for none) and ``kind`` "dgrad" or "wgrad"; () otherwise."""
    if not (gemm and par.tp_comm_overlap and par.sequence_parallel and par.tp > 1):
        return ()
    return (f"{gemm}_{kind}",)
