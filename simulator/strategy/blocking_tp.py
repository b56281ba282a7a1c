"""Which TP/SP collectives of a layer block its compute stream, and which GEMM's userbuffers overlap
each: one rule for the lowering (``layer_emit``) and the search estimate (``explore/estimate``).

Forward (Shoeybi et al. 2019; Korthikanti et al. 2022 Fig. 5): [SP all-gather] attention [TP all-reduce
| SP reduce-scatter] [SP all-gather] MLP [TP all-reduce | SP reduce-scatter], blocking; backward, the
conjugates of the exits (SP's all-gathers of the output gradients). Under tp_comm_overlap with SP,
Transformer Engine's userbuffers overlap them with the GEMM that consumes or produces them
(``cost/tp_overlap``), or run the backward's input-gradient collectives as bulk overlaps on SMs of
their own. Under FP8 the gathers a TE linear consumes carry the quantized tensor (``TPTraffic``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from ..model.fp8 import AMAX_REDUCE_BYTES, FP8, gathered_bytes_per_element
from .blocks import LayerBlocks, Work

if TYPE_CHECKING:  # scenario imports strategy: a type-only import
    from ..scenario import ParallelSpec, Scenario

# Transformer Engine's names of a layer's SP all-gathers (TE 1.11 module/base.py initialize_ub,
# layers_all_gather_overlap): the inputs of QKV and fc1 (qkv_fprop, fc1_fprop), the output gradients
# of the projection and fc2 (proj_dgrad, fc2_dgrad), the inputs again for the weight gradients
# (qkv_dgrad, fc1_dgrad: the tensors the forward saved, already quantized).
GATHER_SITES = ("qkv_fprop", "qkv_dgrad", "proj_dgrad", "fc1_fprop", "fc1_dgrad", "fc2_dgrad")
FRESH_GATHERS = ("qkv_fprop", "fc1_fprop", "proj_dgrad", "fc2_dgrad")  # quantized right before the gather


@dataclass(frozen=True)
class TPTraffic:
    """Bytes of a layer's TP/SP collectives of the hidden-state tensor, b·(s/cp)·h elements (the
    nccl-tests size: an all-reduce's buffer, a reduce-scatter's input, an all-gather's output). Under
    FP8 with SP the gathers at the ``quantized`` sites move the recipe's FP8 bytes (model/fp8
    GATHERED_BYTES) and, with current scaling, follow an amax all-reduce where the tensor was just
    quantized; reduce-scatters and all-reduces carry BF16 outputs. One rule for the lowering and the
    search estimate."""

    elements: float
    dtype_bytes: float
    quantized: frozenset = frozenset()  # GATHER_SITES moving quantized data
    gathered_bytes: float = 0.0  # bytes per element of those gathers
    amax_reduce: bool = False

    def bytes(self, site: str = "") -> float:
        """Bytes of the collective at ``site`` (a GATHER_SITES name; "" for any other)."""
        per = self.gathered_bytes if site in self.quantized else self.dtype_bytes
        return self.elements * per

    def amax_before(self, site: str) -> float:
        """Bytes of the amax all-reduce before the gather at ``site`` (0: none)."""
        return AMAX_REDUCE_BYTES if self.amax_reduce and site in self.quantized and site in FRESH_GATHERS else 0.0


def tp_traffic(scn: Scenario) -> TPTraffic:
    """``TPTraffic`` of ``scn``: TE quantizes the gathers of its FP8 linears (QKV's, unless the
    attention is MLA, whose down projections are gathered in BF16 by Megatron-Core's
    MultiLatentAttention; fc1's of a dense MLP, ``blocking_tp`` leaves the MoE ones out)."""
    m, t, p = scn.model, scn.training, scn.parallel
    elements = float(t.micro_batch_size * (m.seq_length // p.cp) * m.hidden_size)
    if t.dtype != FP8 or not p.sequence_parallel or p.tp <= 1:
        return TPTraffic(elements, t.dtype_bytes)
    sites = frozenset(s for s in GATHER_SITES if not (m.is_mla and s.startswith("qkv")))
    return TPTraffic(elements, t.dtype_bytes, sites, gathered_bytes_per_element(t.fp8_recipe),
                     t.fp8_recipe == "current")


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
    ``overlap_site``, GATHER_SITES name of an all-gather a TE linear consumes or "") or None: forward
    at the attention's entry and exit and the MLP's entry and exit;
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
    fc1_in, fc2_grad = ("", "") if moe else ("fc1_fprop", "fc2_dgrad")  # MoE: its dispatcher's BF16 gathers
    return BlockingTP(
        ("all_gather", overlap_site(par, "qkv_fprop", b.attn_pre.fwd), "qkv_fprop") if sp else None,
        None if parallel else (exit_op, overlap_site(par, "proj_fprop", b.attn_post.fwd), ""),
        ("all_gather", overlap_site(par, "fc1_fprop", b.mlp_pre.fwd, moe=moe), fc1_in)
        if sp and not b.shared_input else None,
        (exit_op, overlap_site(par, "fc2_fprop", b.mlp_pre.fwd, last=True, moe=moe), ""),
        ("all_gather", overlap_site(par, "fc2_dgrad", b.mlp_pre.bwd_b, moe=moe), fc2_grad) if sp else None,
        ("all_gather", overlap_site(par, "proj_dgrad", b.attn_post.bwd_b), "proj_dgrad")
        if sp and not parallel else None)


def bulk_site(par: ParallelSpec, gemm: str, kind: str) -> tuple:
    """(site,) of a backward TP collective that userbuffers run as a bulk overlap on their own SMs
    (cost/tp_overlap.BULK_SITES: "qkv_dgrad", "fc1_wgrad", ...) under tp_comm_overlap with SP, for the
    GEMM ``gemm`` ("qkv" or "fc1"; "" for none) and ``kind`` "dgrad" or "wgrad"; () otherwise."""
    if not (gemm and par.tp_comm_overlap and par.sequence_parallel and par.tp > 1):
        return ()
    return (f"{gemm}_{kind}",)
