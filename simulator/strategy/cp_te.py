"""Transformer Engine's ring context parallelism as Megatron-Core runs it (``parallelism.cp_algorithm = "ring"``).

TE's ``AttnFuncWithCPAndKVP2P`` (transformer_engine/pytorch/attention.py at v1.11, the DGX Cloud
v24.11.1 recipes' TE; the same structure in 2.x's dot_product_attention/context_parallel.py) runs each
CP rank's attention as cp steps of the fused (cuDNN) or FlashAttention-2 kernel on the load-balanced
blocks (``blocks.ring_steps``: the causal diagonal, then ``no_mask`` half blocks), and around those
calls eager tensor ops that move the local blocks through HBM, in BF16. The fused path takes the
``sbhd`` layout Megatron-Core hands it, viewed as [2, s/2, b, h, d]: its half blocks (``q[1]``,
``kv[0]``) are contiguous slices and ``.contiguous()`` copies nothing. The FlashAttention path gets
``bshd`` (TE's FlashAttention transposes q, k, v first; those transposes belong to every TE
FlashAttention call, model/te_layout counts them): there the first half of a K/V block (``kv[:, :, 0]``)
is strided and copied, and the second half of the queries (``q[:, 1]``) is contiguous only at
micro-batch 1. With Q, O the bytes of the rank's query and output blocks and KV those of its K and V
(``bytes_of``), rank r of cp, step i:

forward
- K and V concatenated into the first ring buffer (``torch.cat``): 2 KV, before step 0;
- a step 0 < i <= r attends to the first half of the received block: KV where that half is copied; a
  step i > r attends the second half of the queries: Q where that half is copied;
- after the steps, the output accumulator zero-filled (``torch.zeros_like(q)``): Q, then each step's
  output merged into it (``flash_attn_fwd_out_correction``, one fused kernel: reads the step's output
  and the accumulator, writes the accumulator): 3 O for a full step (i <= r), 1.5 O for a half one.
backward
- K and V copied into the ring buffer (``p2p_comm_buffers[0][0].copy_(kv)``): 2 KV, before step 0;
- with t = cp - r - 1, a step t <= i < cp - 1 uses the first half of K/V (KV where copied); a step
  i < t the second halves of Q, O and dO (Q + 2 O where copied);
- dQ accumulated: a full add (read, read, write: 3 Q) for i > t; at i = t a copy (2 Q) on the last
  rank, else a half copy and a half add (2.5 Q); for i < t a half add (1.5 Q), a half copy at i = 0 (Q);
- the fused path concatenates dK and dV (``torch.cat``: 2 KV on a full step, KV on a half one); the
  FlashAttention path instead zero-fills its dQ output (``torch.zeros_like``: Q, or Q / 2 on a half step);
- dK, dV accumulated into the ring buffer: on the last step 2.5 KV on rank 0 (a half add and a half
  copy), else 3 KV; on a half step a half copy (KV) at i = 0 on the last rank, else a half add
  (1.5 KV); on a full step i < t a copy (2 KV) at i = 0, else an add (3 KV).

The lowering runs one representative rank per stage, so each step's bytes are averaged over the cp
ranks (the step-0 work of every rank, then the mean of the later steps: they run back to back on one
stream, so the sum is what the ranks wait for). The softmax statistics (one fp32 or fp64 value per
query and head: 1/head_dim of Q) and their corrections are left out. TE 2.x writes the first step's
merged output directly (``flash_attn_fwd_out_correction_init``: 2 O) instead of zero-filling and adding
(Q + 3 O): Q + O less per layer forward. FP8 attention (``fp8_dpa``) takes other paths and is not
modelled; nor is TE's second stream, on which every other step runs so that consecutive steps' kernels
may overlap.
"""

from __future__ import annotations

from ..tasks import OpWork
from .blocks import LayerBlocks, ring_steps
from .sharding import heads_per_tp_rank


def bytes_of(scn) -> tuple[float, float, float]:
    """(Q, O, KV) bytes of one CP rank's blocks on one TP rank, in the activation dtype."""
    m, par, tr = scn.model, scn.parallel, scn.training
    tokens = tr.micro_batch_size * (m.seq_length // par.cp)
    hq, hkv = heads_per_tp_rank(m.num_attention_heads, par.tp), heads_per_tp_rank(m.num_kv_heads, par.tp)
    b = tr.dtype_bytes
    return tokens * hq * m.head_dim * b, tokens * hq * m.v_head_dim * b, tokens * hkv * (m.head_dim + m.v_head_dim) * b


def forward_bytes(r: int, i: int, cp: int, q: float, o: float, kv: float, copies: tuple[bool, bool]) -> float:
    """HBM bytes of rank ``r``'s eager kernels belonging to forward step ``i`` (module doc); ``copies``:
    whether the half K/V block and the half of the queries are copied (``half_copies``)."""
    out = 2 * kv + q if i == 0 else 0.0  # the K/V concatenation; the zero-filled accumulator
    full = i <= r
    if i > 0:
        out += (kv if copies[0] else 0.0) if full else (q if copies[1] else 0.0)
    return out + (3 * o if full else 1.5 * o)


def backward_bytes(r: int, i: int, cp: int, q: float, o: float, kv: float, fused: bool,
                   copies: tuple[bool, bool]) -> float:
    """HBM bytes of rank ``r``'s eager kernels belonging to backward step ``i`` (module doc)."""
    t = cp - r - 1
    last, half_kv = i == cp - 1, t <= i < cp - 1
    out = 2 * kv if i == 0 else 0.0  # K and V into the ring buffer
    if half_kv:
        out += kv if copies[0] else 0.0
    elif not last:
        out += q + 2 * o if copies[1] else 0.0
    if i > t:
        out += 3 * q
    elif i == t:
        out += 2 * q if r == cp - 1 else 2.5 * q
    else:
        out += q if i == 0 else 1.5 * q
    if fused:
        out += kv if half_kv else 2 * kv
    else:
        out += q if i >= t else q / 2  # FlashAttention's zero-filled dQ: the queries it attends
    if last:
        out += 2.5 * kv if r == 0 else 3 * kv
    elif half_kv:
        out += kv if (i == 0 and r == cp - 1) else 1.5 * kv
    else:
        out += 2 * kv if i == 0 else 3 * kv
    return out


def half_copies(scn) -> tuple[bool, bool]:
    """(the half K/V block copied, the half of the queries copied): never on the fused path's sbhd
    leading-dimension slices; on FlashAttention's bshd, the strided K/V half always, the queries' half
    when the micro-batch holds more than one sequence (module doc)."""
    if scn.training.attention == "cudnn":
        return False, False
    return True, scn.training.micro_batch_size > 1


def step_bytes(scn, forward: bool) -> tuple[float, float]:
    """(step 0's bytes, each later step's) averaged over the cp ranks (module doc)."""
    cp = scn.parallel.cp
    q, o, kv = bytes_of(scn)
    fused, copies = scn.training.attention == "cudnn", half_copies(scn)

    def one(r: int, i: int) -> float:
        return (forward_bytes(r, i, cp, q, o, kv, copies) if forward else
                backward_bytes(r, i, cp, q, o, kv, fused, copies))
    first = sum(one(r, 0) for r in range(cp)) / cp
    later = sum(one(r, i) for r in range(cp) for i in range(1, cp)) / (cp * (cp - 1)) if cp > 1 else 0.0
    return first, later


def _with_copies(steps: dict, fwd_bytes: float, bwd_bytes: float) -> dict:
    """Each pass's works of one ring step followed by TE's copies and merges, one elementwise work."""
    return {part: tuple(work) + (OpWork("cp_te_merge" if part == "F" else "cp_te_grad_accumulate", "elementwise",
                                        0.0, fwd_bytes if part == "F" else bwd_bytes),)
            for part, work in steps.items()}


def te_ring_steps(b: LayerBlocks, scn) -> tuple[dict, dict]:
    """(the first ring step's works, each later step's) by pass, with TE's copies and merges as one
    elementwise work per step after the attention kernel: one rule for the lowering and the search."""
    def build() -> tuple[dict, dict]:
        first, later = ring_steps(b)
        (f0, f1), (b0, b1) = step_bytes(scn, True), step_bytes(scn, False)
        return _with_copies(first, f0, b0), _with_copies(later, f1, b1)
    return b.memo(("te-ring", scn.training.attention), build)


def core_works(b: LayerBlocks, scn) -> tuple[dict, dict, int] | None:
    """``blocks.core_works`` for TE's ring (cp > 1), None for every other algorithm."""
    par = scn.parallel
    if par.cp <= 1 or par.cp_algorithm != "ring":
        return None
    first, later = te_ring_steps(b, scn)
    return first, later, par.cp - 1

