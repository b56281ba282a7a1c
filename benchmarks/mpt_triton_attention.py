"""MPT's Triton FlashAttention (llm-foundry ``attn_impl: triton``) rewritten for today's Triton, to time it.

llm-foundry's ``llmfoundry/models/layers/flash_attn_triton.py`` (removed in March 2024, commit 4c99952d0;
a copy of the flash-attn repository's ``flash_attn_triton.py``) ran on the ``triton-pre-mlir`` compiler
(vchiley/triton branch ``triton_pre_mlir_sm90``: the December 2022 pre-MLIR Triton with sm_90 allowed as a
PTX target, nothing else changed), which emits Ampere's ``mma.sync`` on Hopper. This module is our own
Triton code with that kernel's algorithm and launch configuration, no more:

- forward: one program per 128-query tile and (batch, head), 8 warps, ``num_stages=1``; the causal mask
  added to every 128 x 128 score tile of the key loop; the running row scale stored to and reloaded
  from a global scratch buffer each step (the original's compiler work-around);
- backward: a preprocess kernel (rowsum of O * dO), then one program per 128-key column block
  (``SEQUENCE_PARALLEL``, dQ accumulated with fp32 atomics) or one program per (batch, head) looping over
  the column blocks (dQ read-modified-written in fp32 global memory); the original autotunes between the
  two, both 128 x 128 tiles, 8 warps, ``num_stages=1``; dQ is zeroed before and copied to bf16 after;
- the (batch, seq, heads, head_dim) layout MPT passes in; no ALiBi bias (the benchmark runs had learned
  position embeddings); head dim 128 and sequence lengths that are multiples of 128 only (the rows'
  shapes: the original's masking branches for ragged shapes are not rewritten).

Run with ``DISABLE_MMA_V3=1`` for the ``mma.sync`` code the pre-MLIR compiler emitted on Hopper; without
it today's Triton uses Hopper's ``wgmma``. Used by ``benchmarks/gpu_attention_triton.py``; checked against
PyTorch on CPU under ``TRITON_INTERPRET=1`` (``tests/test_mpt_triton_attention.py``).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

BLOCK = 128
WARPS = 8
STAGES = 1


@triton.jit
def _fwd(Q, K, V, Out, Lse, Tmp, scale, s_b, s_m, s_h, seqlen, seqlen_r, nheads,
         CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    start_m = tl.program_id(0)
    off_hb = tl.program_id(1)
    off_b = off_hb // nheads
    off_h = off_hb % nheads
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    base = off_b * s_b + off_h * s_h
    q = tl.load(Q + base + offs_m[:, None] * s_m + offs_d[None, :])
    k_ptrs = K + base + offs_n[:, None] * s_m + offs_d[None, :]
    v_ptrs = V + base + offs_n[:, None] * s_m + offs_d[None, :]
    t_ptrs = Tmp + off_hb * seqlen_r + offs_m
    lse_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    end_n = tl.minimum((start_m + 1) * BLOCK_M, seqlen) if CAUSAL else seqlen
    for start_n in range(0, end_n, BLOCK_N):
        k = tl.load(k_ptrs + start_n * s_m)
        qk = tl.dot(q, tl.trans(k))
        if CAUSAL:
            qk += tl.where(offs_m[:, None] >= (start_n + offs_n)[None, :], 0, float("-inf"))
        m_ij = tl.maximum(tl.max(qk, 1) * scale, lse_i)
        p = tl.exp(qk * scale - m_ij[:, None])
        l_ij = tl.sum(p, 1)
        acc_scale = tl.exp(m_i - m_ij)
        tl.store(t_ptrs, acc_scale)  # the original's store-and-reload of the row scale
        acc_scale = tl.load(t_ptrs)
        acc = acc * acc_scale[:, None]
        v = tl.load(v_ptrs + start_n * s_m)
        acc += tl.dot(p.to(v.dtype), v)
        m_i = m_ij
        lse_i = m_ij + tl.log(tl.exp(lse_i - m_ij) + l_ij)
    o_scale = tl.exp(m_i - lse_i)
    tl.store(t_ptrs, o_scale)
    o_scale = tl.load(t_ptrs)
    acc = acc * o_scale[:, None]
    tl.store(Lse + off_hb * seqlen_r + offs_m, lse_i)
    tl.store(Out + base + offs_m[:, None] * s_m + offs_d[None, :], acc.to(Out.dtype.element_ty))


@triton.jit
def _bwd_pre(Out, DO, Delta, s_b, s_m, s_h, seqlen_r, nheads, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    start_m = tl.program_id(0)
    off_hb = tl.program_id(1)
    base = (off_hb // nheads) * s_b + (off_hb % nheads) * s_h
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    o = tl.load(Out + base + offs_m[:, None] * s_m + offs_d[None, :]).to(tl.float32)
    do = tl.load(DO + base + offs_m[:, None] * s_m + offs_d[None, :]).to(tl.float32)
    tl.store(Delta + off_hb * seqlen_r + offs_m, tl.sum(o * do, axis=1))


@triton.jit
def _bwd_col_block(start_n, Q, K, V, DO, DQ, DK, DV, Lse, Delta, scale, base, s_m, seqlen,
                   ATOMIC: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   HEAD_DIM: tl.constexpr):
    begin_m = ((start_n * BLOCK_N) // BLOCK_M) * BLOCK_M if CAUSAL else 0
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    kv_off = base + offs_n[:, None] * s_m + offs_d[None, :]
    k = tl.load(K + kv_off)
    v = tl.load(V + kv_off)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    for start_m in range(begin_m, seqlen, BLOCK_M):
        offs_mc = start_m + offs_m
        row_off = base + offs_mc[:, None] * s_m + offs_d[None, :]
        q = tl.load(Q + row_off)
        qk = tl.dot(q, tl.trans(k))
        if CAUSAL:
            qk = tl.where(offs_mc[:, None] >= offs_n[None, :], qk, float("-inf"))
        p = tl.exp(qk * scale - tl.load(Lse + offs_mc)[:, None])
        do = tl.load(DO + row_off)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do)
        dp = tl.dot(do, tl.trans(v))
        ds = (p * (dp - tl.load(Delta + offs_mc)[:, None]) * scale).to(q.dtype)
        dk += tl.dot(tl.trans(ds), q)
        if ATOMIC:
            tl.atomic_add(DQ + row_off, tl.dot(ds, k))
        else:
            dq = tl.load(DQ + row_off, eviction_policy="evict_last")
            dq += tl.dot(ds, k)
            tl.store(DQ + row_off, dq, eviction_policy="evict_last")
    tl.store(DV + kv_off, dv.to(DV.dtype.element_ty))
    tl.store(DK + kv_off, dk.to(DK.dtype.element_ty))


@triton.jit
def _bwd(Q, K, V, DO, DQ, DK, DV, Lse, Delta, scale, s_b, s_m, s_h, seqlen, seqlen_r, nheads,
         SEQUENCE_PARALLEL: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
         HEAD_DIM: tl.constexpr):
    off_hb = tl.program_id(1)
    base = (off_hb // nheads) * s_b + (off_hb % nheads) * s_h
    lse, delta = Lse + off_hb * seqlen_r, Delta + off_hb * seqlen_r
    if SEQUENCE_PARALLEL:
        _bwd_col_block(tl.program_id(0), Q, K, V, DO, DQ, DK, DV, lse, delta, scale, base, s_m, seqlen,
                       True, CAUSAL, BLOCK_M, BLOCK_N, HEAD_DIM)
    else:
        for start_n in range(0, tl.cdiv(seqlen, BLOCK_N)):
            _bwd_col_block(start_n, Q, K, V, DO, DQ, DK, DV, lse, delta, scale, base, s_m, seqlen,
                           False, CAUSAL, BLOCK_M, BLOCK_N, HEAD_DIM)


def _check(q: torch.Tensor) -> tuple[int, int, int, int]:
    b, s, h, d = q.shape
    if d != 128 or s % BLOCK or not q.is_contiguous():
        raise ValueError(f"MPT Triton attention here takes contiguous (b, s, h, 128) with s % {BLOCK} == 0, "
                         f"got {tuple(q.shape)}")
    return b, s, h, d


def _record(stats: dict | None, name: str, kernel) -> None:
    """The compiled kernel's registers per thread and spilled bytes (Triton's CompiledKernel fields)."""
    if stats is not None:
        stats[name] = {"n_regs": getattr(kernel, "n_regs", None), "n_spills": getattr(kernel, "n_spills", None)}


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True, stats: dict | None = None):
    """(out, lse) of softmax(q k^T / sqrt(d)) v, tensors (batch, seq, heads, 128); ``stats`` collects the
    compiled kernel's registers and spills."""
    b, s, h, d = _check(q)
    out = torch.empty_like(q)
    lse = torch.empty(b, h, s, device=q.device, dtype=torch.float32)
    tmp = torch.empty_like(lse)
    strides = (q.stride(0), q.stride(1), q.stride(2))
    kernel = _fwd[(s // BLOCK, b * h)](q, k, v, out, lse, tmp, 1.0 / math.sqrt(d), *strides,
                              s, s, h, CAUSAL=causal, BLOCK_M=BLOCK, BLOCK_N=BLOCK, HEAD_DIM=d,
                              num_warps=WARPS, num_stages=STAGES)
    _record(stats, "fwd", kernel)
    return out, lse


def backward(do, q, k, v, out, lse, causal: bool = True, sequence_parallel: bool = True, stats: dict | None = None):
    """(dq, dk, dv) as the original's backward computes them, with the chosen dQ strategy."""
    b, s, h, d = _check(q)
    dq_acc = torch.zeros_like(q, dtype=torch.float32)  # the autotuner's pre_hook zeroes DQ
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    delta = torch.empty_like(lse)
    _bwd_pre[(s // BLOCK, b * h)](out, do, delta, q.stride(0), q.stride(1), q.stride(2), s, h,
                                  BLOCK_M=BLOCK, HEAD_DIM=d)
    grid = (s // BLOCK if sequence_parallel else 1, b * h)
    strides = (q.stride(0), q.stride(1), q.stride(2))
    kernel = _bwd[grid](q, k, v, do, dq_acc, dk, dv, lse, delta, 1.0 / math.sqrt(d), *strides,
               s, s, h, SEQUENCE_PARALLEL=sequence_parallel, CAUSAL=causal, BLOCK_M=BLOCK, BLOCK_N=BLOCK,
               HEAD_DIM=d, num_warps=WARPS, num_stages=STAGES)
    _record(stats, "bwd" if sequence_parallel else "bwd-nosp", kernel)
    return dq_acc.to(q.dtype), dk, dv
