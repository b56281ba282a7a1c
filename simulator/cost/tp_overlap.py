"""Tensor-parallel communication overlapped with its GEMM (``tp_comm_overlap``, TE userbuffers).

With sequence parallelism, Megatron-Core + Transformer Engine split the all-gather in front of a
column-parallel GEMM and the reduce-scatter behind a row-parallel GEMM into chunks that travel while
the GEMM computes the chunks already there (Wang et al. 2022, "Overlap communication with dependent
computation via decomposition", ASPLOS'23; TE ``comm_gemm_overlap``). The scenario's userbuffers
configuration (strategy/ub_config: TE's defaults, or the table a recipe passes) sets each site's method:
- ``ring_exchange`` at an all-gather site: tp steps; in each, the GEMM runs on the chunk at hand while the
  next chunk moves peer to peer on copy engines (TE ``split_overlap_ag`` with ``use_ce``); ``aggregate``:
  a first one-chunk exchange with the neighbour, then tp/2 steps of two-chunk GEMMs;
- ``ring_exchange`` at a reduce-scatter site (TE ``split_overlap_rs`` of ``CommOverlapP2P``): tp GEMM
  chunks back to back, each chunk's output sent to its owner while the next computes, the local chunk
  last, then one kernel sums the tp received chunks (``torch::sum_out`` over [tp, s/tp, h]);
- ``pipeline`` at a reduce-scatter site: ``num_splits`` chunks, chunk i's reduce-scatter (a userbuffers
  kernel on ``num_sm`` SMs) under chunk i+1's GEMM.
``set_sm_margin`` launches the GEMM chunks on the SMs ``num_sm`` leaves (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET);
without it a pipeline's GEMM chunks are chosen for the whole GPU and run beside the kernel's SMs.
The bulk overlaps of the backward (the input all-gather and the gradient reduce-scatter hidden behind
the other backward GEMM) are the asynchronous collectives the lowering already overlaps; their kernels
hold the site's ``num_sm`` SMs (cost/sm_share charges them to the GEMMs beside them) instead of NCCL's
channels. Each chunk's GEMM is costed on its own rows (TE splits along the sequence) with its own wave
quantization (cost/model).
"""

from __future__ import annotations

from typing import NamedTuple

from ..strategy.ub_config import SCATTER_SITES, OverlapSite


def ring_exchange_s(gemm_s: float, comm_s: float, tp: int, chunk_s: float | None = None) -> float:
    """GEMM + all-gather by ring exchange: tp steps; steps 1..tp-1 each wait for the slower of their
    GEMM chunk and the chunk in flight (the collective's (tp-1) transfers), the last step computes.
    ``chunk_s``: one step's GEMM on its 1/tp of the rows (its own waves); default gemm_s / tp."""
    if tp <= 1:
        return gemm_s
    g = gemm_s / tp if chunk_s is None else chunk_s
    return (tp - 1) * max(g, comm_s / (tp - 1)) + g


def pipelined_s(comm_s: float, splits: int, chunk_s: float) -> float:
    """GEMM + reduce-scatter pipelined over ``splits`` chunks: chunk i's reduce-scatter runs under chunk
    i+1's GEMM; the first GEMM chunk and the last transfer are exposed. ``chunk_s``: one chunk's GEMM on
    the SMs the communication kernel leaves (its own waves)."""
    c = comm_s / splits
    return chunk_s + (splits - 1) * max(chunk_s, c) + c


def aggregated_ring_exchange_s(gemm_s: float, comm_s: float, tp: int, chunk_s: float | None = None) -> float:
    """GEMM + all-gather by aggregated ring exchange (TE ``aggregate``): the local chunk first swaps with a
    neighbour's (one transfer, exposed), then tp/2 steps each run a GEMM on two chunks while the next two
    move. ``chunk_s``: one step's GEMM on its 2/tp of the rows; default 2 gemm_s / tp."""
    if tp <= 1:
        return gemm_s
    steps = max(1, tp // 2)
    g = gemm_s / steps if chunk_s is None else chunk_s
    c = comm_s / (tp - 1)
    return c + (steps - 1) * max(g, 2 * c) + g


def scattered_ring_exchange_s(gemm_s: float, comm_s: float, tp: int, chunk_s: float | None = None,
                              reduce_s: float = 0.0) -> float:
    """GEMM + reduce-scatter by ring exchange: tp GEMM chunks back to back (their own streams), chunk i's
    output sent to its owner under chunk i+1 (the local chunk is computed last and not sent), then the
    summation of the tp received chunks (``reduce_s``)."""
    if tp <= 1:
        return gemm_s
    g = gemm_s / tp if chunk_s is None else chunk_s
    return g + (tp - 1) * max(g, comm_s / (tp - 1)) + reduce_s


class Chunking(NamedTuple):
    """How a site cuts its GEMM: ``parts`` chunks along the rows, run with ``sms_taken`` SMs unavailable,
    the kernel chosen for the SMs left when ``chosen`` (set_sm_margin) or for the whole GPU otherwise."""

    parts: int
    sms_taken: int
    chosen: bool


def chunking(s: OverlapSite, tp: int) -> Chunking:
    """A chunked site's GEMM chunks: tp (tp/2 aggregated) for a ring exchange, num_splits for a pipeline;
    with set_sm_margin the GEMM gives up num_sm SMs, without it a pipeline's kernel holds them anyway."""
    if s.method == "ring_exchange":
        parts = max(1, tp // 2) if s.aggregate else tp
        return Chunking(parts, s.num_sm if s.sm_margin else 0, s.sm_margin)
    return Chunking(s.splits, s.num_sm, s.sm_margin)


def overlapped_s(site: str, s: OverlapSite, gemm_s: float, comm_s: float, tp: int, chunk_s: float,
                 reduce_s: float = 0.0) -> float:
    """Time of the GEMM and its TP collective together at ``site``, run as ``s`` says. ``chunk_s``: one
    chunk's GEMM (cost/model: its own rows and waves, on the SMs left; ``chunking``)."""
    if s.method == "pipeline":
        return pipelined_s(comm_s, s.splits, chunk_s)
    if site in SCATTER_SITES:
        return scattered_ring_exchange_s(gemm_s, comm_s, tp, chunk_s, reduce_s)
    if s.aggregate:
        return aggregated_ring_exchange_s(gemm_s, comm_s, tp, chunk_s)
    return ring_exchange_s(gemm_s, comm_s, tp, chunk_s)


def exposed_comm_s(site: str, s: OverlapSite, gemm_s: float, comm_s: float, tp: int, chunk_s: float,
                   reduce_s: float = 0.0) -> float:
    """What the overlapped pair costs beyond the GEMM alone, capped at the unoverlapped collective: the
    framework's overlap is an option a recipe enables where it pays (NeMo enables it per model), so a
    site never costs more than running GEMM and collective back to back."""
    return min(comm_s, max(0.0, overlapped_s(site, s, gemm_s, comm_s, tp, chunk_s, reduce_s) - gemm_s))
