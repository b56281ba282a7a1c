"""Tensor-parallel communication overlapped with its GEMM (``tp_comm_overlap``, TE userbuffers).

With sequence parallelism, Megatron-Core + Transformer Engine split the all-gather in front of a
column-parallel GEMM and the reduce-scatter behind a row-parallel GEMM into chunks that travel while
the GEMM computes the chunks already there (Wang et al. 2022, "Overlap communication with dependent
computation via decomposition", ASPLOS'23; TE ``comm_gemm_overlap``). NeMo's H100 configuration
(``nemo/collections/llm/recipes/tp_overlap_configs/userbuffers.py``,
``userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192`` and its FP8 twin) chooses per site:
- ``ring_exchange`` for the forward all-gathers (qkv_fprop, fc1_fprop) and the backward all-gathers
  of the output gradient (proj_dgrad, fc2_dgrad): tp steps; in each, the GEMM runs on the chunk at
  hand while the next chunk moves peer to peer (1 SM, no SM margin: its SMs are not charged);
- ``pipeline`` for the forward reduce-scatters (proj_fprop: 24 SMs, fc2_fprop: 16 SMs, 4 splits,
  ``set_sm_margin``: the GEMM chunks run on the SMs the communication kernel leaves).
The bulk overlaps of the backward (the input all-gather and the gradient reduce-scatter hidden
behind the other backward GEMM) are the asynchronous collectives the lowering already overlaps; under
userbuffers their kernels hold the ``num_sm`` SMs of BULK_SITES (cost/sm_share charges them to the
GEMMs beside them) instead of NCCL's channels.
Each chunk's GEMM is costed on its own rows (1/tp or 1/splits of the GEMM's m, TE splits along the
sequence) with its own wave quantization, on the SMs the site's communication leaves (cost/model).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class OverlapSite:
    method: str  # "ring_exchange" | "pipeline"
    num_sm: int  # SMs the communication kernel holds (pipeline, with set_sm_margin) ; 0 for ring exchange
    splits: int  # pipeline chunks; 0 for ring exchange (tp steps)


# NeMo userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192 (the recipes of the shared H100 rows).
UB_SITES: dict[str, OverlapSite] = {
    "qkv_fprop": OverlapSite("ring_exchange", 0, 0),
    "fc1_fprop": OverlapSite("ring_exchange", 0, 0),
    "proj_dgrad": OverlapSite("ring_exchange", 0, 0),
    "fc2_dgrad": OverlapSite("ring_exchange", 0, 0),
    "proj_fprop": OverlapSite("pipeline", 24, 4),
    "fc2_fprop": OverlapSite("pipeline", 16, 4),
}

# The same NeMo configuration's bulk sites (BulkOverlapCfg num_sm): qkv_dgrad / fc1_dgrad all-gather
# the layer input for the weight gradient beside the input-gradient GEMM, qkv_wgrad / fc1_wgrad
# reduce-scatter the input gradient beside the weight-gradient GEMM.
BULK_SITES: dict[str, int] = {"qkv_dgrad": 4, "qkv_wgrad": 24, "fc1_dgrad": 2, "fc1_wgrad": 4}


def ring_exchange_s(gemm_s: float, comm_s: float, tp: int, chunk_s: float | None = None) -> float:
    """GEMM + all-gather by ring exchange: tp steps; steps 1..tp-1 each wait for the slower of their
    GEMM chunk and the chunk in flight (the collective's (tp-1) transfers), the last step computes.
    ``chunk_s``: one step's GEMM on its 1/tp of the rows (its own waves); default gemm_s / tp."""
    if tp <= 1:
        return gemm_s
    g = gemm_s / tp if chunk_s is None else chunk_s
    return (tp - 1) * max(g, comm_s / (tp - 1)) + g


def pipelined_s(gemm_s: float, comm_s: float, splits: int, num_sm: int, total_sms: int,
                chunk_s: float | None = None) -> float:
    """GEMM + reduce-scatter pipelined over ``splits`` chunks: chunk i's reduce-scatter (on ``num_sm``
    SMs) runs under chunk i+1's GEMM (on the rest); the first GEMM chunk and the last transfer are
    exposed. ``chunk_s``: one chunk's GEMM on the SMs left (its own waves); default the whole GEMM's
    rate scaled to those SMs."""
    g = gemm_s * total_sms / (total_sms - num_sm) / splits if chunk_s is None else chunk_s
    c = comm_s / splits
    return g + (splits - 1) * max(g, c) + c


def chunks(site: str, tp: int) -> tuple[int, int]:
    """(GEMM chunks, SMs the communication holds beside them) of a UB_SITES site."""
    s = UB_SITES[site]
    return (tp, 0) if s.method == "ring_exchange" else (s.splits, s.num_sm)


def overlapped_s(site: str, gemm_s: float, comm_s: float, tp: int, total_sms: int,
                 chunk_s: float | None = None) -> float:
    """Time of the GEMM and its TP collective together, at one of the UB_SITES."""
    s = UB_SITES[site]
    if s.method == "ring_exchange":
        return ring_exchange_s(gemm_s, comm_s, tp, chunk_s)
    return pipelined_s(gemm_s, comm_s, s.splits, s.num_sm, total_sms, chunk_s)


def exposed_comm_s(site: str, gemm_s: float, comm_s: float, tp: int, total_sms: int,
                   chunk_s: float | None = None) -> float:
    """What the overlapped pair costs beyond the GEMM alone, capped at the unoverlapped collective: the
    framework's overlap is an option a recipe enables where it pays (NeMo enables it per model), so a
    site never costs more than running GEMM and collective back to back."""
    return min(comm_s, max(0.0, overlapped_s(site, gemm_s, comm_s, tp, total_sms, chunk_s) - gemm_s))
