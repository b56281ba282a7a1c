"""All-to-all context parallelism (``parallelism.cp_algorithm = "a2a"``): attention split by heads.

Megatron-Core's ``cp_comm_type = "a2a"`` runs Transformer Engine's ``AttnFuncWithCPAndQKVOA2A``
(transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py, TE 1.10 and later),
the exchange DeepSpeed-Ulysses introduced (Jacobs et al. 2023, arXiv 2309.14509): each CP rank holds
s / cp tokens of every head going in; an all-to-all over the CP group hands it every token of
heads / cp heads, a rank attends those heads over the whole sequence (one causal kernel of the full
length, ``blocks.head_split_work``), and a second all-to-all returns the output to the token split.

- Forward: Q, K and V (``flash_attn_a2a_communicate(..., before_attn=True)``, one
  ``all_to_all_single`` each, issued together), the attention, then the output (``before_attn=False``).
- Backward: the output gradient, the attention's backward, then dQ, dK and dV.
- Each all-to-all is blocking: the next kernel waits for it (the function ends with
  ``current_stream().wait_stream(cp_stream)``); the three tensors' exchanges overlap one another's
  reshuffles, which are priced here in one copy kernel on each side of the exchange.
- The reshuffles are HBM copies of every exchanged byte, two on each side (read and write each): before
  the exchange into the sending layout (``movedim(...).contiguous()`` for Q, K, V; the chunk reorder
  ``reorder_seq_chunks_for_a2a_after_attn``, an ``index_select``, for the output), after it out of the
  receiving one (the chunk reorder back to sequence order for Q, K, V; ``movedim(...).contiguous()``
  for the output): ``COPY_BYTES_PER_BYTE`` on each side.
- Every rank's heads / cp must be whole: TE asserts that the query heads and the K/V heads of a TP rank
  divide by cp (``scenario_checks``).

The saved activations are those of the sequence split (the same bytes in the other layout); the
exchange buffers are transient and not in the memory report.
"""

from __future__ import annotations

from functools import lru_cache

from ..tasks import OpWork
from .blocks import Work, core_works
from .context import LowerCtx

COPY_BYTES_PER_BYTE = 2  # one HBM read and one write of every exchanged byte, on each side of the exchange


@lru_cache(maxsize=64)
def reshuffle(size_bytes: float) -> Work:
    """The copy kernel on one side of an exchange of ``size_bytes`` (one tuple per size: the cost model
    caches work by identity)."""
    return (OpWork("cp_a2a_reshuffle", "memcpy", 0.0, COPY_BYTES_PER_BYTE * size_bytes),)


def exchange(ctx: LowerCtx, rank: int, dep: int | None, name: str, size_bytes: float, meta: dict,
             category: str) -> int:
    """One of the layer's blocking all-to-alls over the CP group with its reshuffle copies either side."""
    pre = ctx.compute(rank, f"{name}_pack", reshuffle(size_bytes), () if dep is None else (dep,), category, **meta)
    a2a = ctx.comm(rank, "comm_cp", name, "all_to_all", size_bytes, ctx.group("cp", rank), "cp", "comm_cp",
                   (pre,), **meta)
    return ctx.compute(rank, f"{name}_unpack", reshuffle(size_bytes), (a2a,), category, **meta)


def emit_core(ctx: LowerCtx, rank: int, part: str, dep: int | None, name: str, meta: dict,
              category: str) -> int:
    """The attention core of one layer and pass ("F", "B" or "BW") between its two all-to-alls."""
    work = core_works(ctx.layer_blocks(meta["layer"]), "a2a", ctx.par.cp)[0][part]
    m = ctx.scn.model  # Q (dQ) and K, V (dK, dV); the output (its gradient): heads x v_head_dim
    qkv, out = ctx.cp_block_bytes(m.q_size) + ctx.kv_block_bytes(), ctx.cp_block_bytes(m.attn_out_size)
    first, second = (qkv, out) if part == "F" else (out, qkv)
    x = exchange(ctx, rank, dep, f"{name}.cp_a2a_in", first, meta, category)
    x = ctx.compute(rank, f"{name}.core", work, (x,), category, **meta)
    return exchange(ctx, rank, x, f"{name}.cp_a2a_out", second, meta, category)
