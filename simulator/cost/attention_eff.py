"""Fused attention kernel efficiency: measured throughput by sequence length, head dim, direction and mask.

A fused attention kernel (FlashAttention-2, cuDNN's fused attention) tiles the queries in blocks of 128
rows and loops each block over the keys. Its efficiency is not one number: short sequences give each
query tile a short key loop, so the per-tile prologue and epilogue (loading Q, writing O and the
softmax statistics) weigh more; the causal mask adds half-empty diagonal tiles; the backward runs five
matrix products with more shared-memory traffic than the forward's two; the head dim sets the tile
shapes. This module holds the published measurements of those kernels and reads them as a fraction of
the benchmark GPU's dense BF16 peak, in the benchmarks' FLOP convention (flash-attention's
benchmarks/benchmark_flash_attention.py): forward 4·b·heads·s²·d, halved when causal; backward 2.5x
the forward; forward + backward 3.5x. ``cost.compute`` charges a kernel these FLOPs, so at a measured
point the modelled time is the measured one.

Rules where no measurement exists (each a stated estimate):
- Sequence lengths between the measured points: linear in log2(s). Above the longest (16k) the
  plateau. Below the shortest (512) the time per query tile stays the 512 point's (efficiency
  proportional to s): a key loop shorter than 4 tiles is dominated by the per-tile prologue/epilogue.
- Head dims: the nearest measured one in log2 (64, 128, 256); MLA's mean of 192 and 128 -> 128.
- Causal backward on Hopper: not in the paper (its backward figures are without the mask). It is the
  non-causal backward times the same implementation's causal/non-causal forward ratio at that s and
  head dim (the mask's cost -- diagonal tiles, a key loop half as long on average -- is the same
  tiling in both passes). Check: with FlashAttention-2's forward from the same paper this gives
  forward + backward 145, 208, 254, 281, 298, 303 TFLOP/s (512 .. 16k, head dim 128) against
  163, 221, 265, 294, 308, 328 measured in the FlashAttention-2 paper (Dao 2023, Fig. 7d, H100
  causal fwd+bwd): -11% .. -3%; the same comparison without the mask (Fig. 7b, measured backward)
  is -5% .. -0.4%, so about half of the causal gap is the two papers' different kernel versions.
- Ampere: only forward + backward was found (Dao 2023, Fig. 4, the repository's
  assets/flash2_a100_fwd_bwd_benchmark.png); both passes take it, so fwd + bwd reproduces it. No
  separate cuDNN measurement: cuDNN takes FlashAttention-2's.
- Blackwell: cuDNN's fused attention is NVIDIA's measurement on a GB200 (cudnn-frontend
  benchmark/sdpa_benchmark_training, results/llama3.1/gb200, cuDNN 9.22, April 2026: Llama 3.1 GQA
  dims, 64 query and 8 K/V heads of 128, batch 2, s = 2k .. 32k, forward and backward, with and
  without the causal mask, measured directly), read against the GB200's dense BF16 datasheet peak. Its
  points are 2k .. 32k (the "below the shortest" rule starts at 2k); past 16k the measured throughput
  falls (causal forward 1,708 -> 1,622 TFLOP/s at 32k), which the curve keeps. Like the papers' points
  they are read at the clock the peak is quoted at and slowed to the GPU's sustained one; the script
  times 10 calls without warm-up (benchmark_single_sdpa.py --num_iterations 10), 1-14 ms in all up to
  8k, where the clock has not dropped yet (flashinfer PR #2899: throttling after ~5 ms to tens of ms),
  but 50-700 ms at 16-32k, where part of the drop is already in the measurement (the fall past 16k
  fits it): long-sequence attention on Blackwell is priced up to ~20% slow. FlashAttention on
  Blackwell: no measurement at hand (FlashAttention-2 targets sm80/sm90); it takes Hopper's fractions
  of peak, an estimate until calibrated.
"""

from __future__ import annotations

import math

SEQ_POINTS = (512, 1024, 2048, 4096, 8192, 16384)
# The sequence lengths of each benchmark GPU's tables (each point twice the one before).
SEQ_POINTS_OF = {"hopper": SEQ_POINTS, "ampere": SEQ_POINTS, "blackwell": (2048, 4096, 8192, 16384, 32768)}
# Dense 16-bit tensor-core peak of the GPU each table was measured on (datasheets): H100 SXM5 989.4
# TFLOP/s (H100 whitepaper), A100 SXM4 312 (A100 whitepaper), GB200 2,500 (GB200 NVL72 datasheet:
# 360 PFLOPS BF16 with 2:4 sparsity for 72 GPUs).
BENCH_PEAK_TFLOPS = {"hopper": 989.4, "ampere": 312.0, "blackwell": 2500.0}
# architecture -> the benchmark GPU whose tables it reads; BORROWED: the (architecture, implementation)
# pairs with no measurement of their own, and the benchmark GPU they read instead
ARCH_MEASURED = {"hopper": "hopper", "ampere": "ampere", "blackwell": "blackwell"}
BORROWED = {("blackwell", "flash"): "hopper"}

# (architecture, implementation, pass, causal, head_dim) -> TFLOP/s at SEQ_POINTS_OF[architecture];
# pass "fwd", "bwd" or "fwd_bwd". The papers' shapes: batch x seqlen = 16k tokens, hidden 2048 (heads =
# 2048 / head_dim); the GB200 rows': batch 2, 64 query and 8 K/V heads.
MEASURED_TFLOPS: dict[tuple[str, str, str, bool, int], tuple[float, ...]] = {
    # Shah et al. 2024, FlashAttention-3 (arXiv 2407.08608), Fig. 4: forward, H100 80GB SXM5, BF16.
    # "flash" is FlashAttention-2 (the flash-attn package's kernels), "cudnn" cuDNN's fused attention.
    ("hopper", "flash", "fwd", False, 64): (282, 306, 318, 321, 322, 324),
    ("hopper", "flash", "fwd", False, 128): (309, 350, 362, 368, 370, 370),
    ("hopper", "flash", "fwd", False, 256): (275, 313, 321, 323, 324, 326),
    ("hopper", "flash", "fwd", True, 64): (180, 229, 262, 284, 295, 299),
    ("hopper", "flash", "fwd", True, 128): (191, 260, 298, 319, 333, 335),
    ("hopper", "flash", "fwd", True, 256): (208, 251, 278, 293, 297, 298),
    ("hopper", "cudnn", "fwd", False, 64): (335, 373, 395, 408, 412, 413),
    ("hopper", "cudnn", "fwd", False, 128): (497, 574, 617, 609, 600, 595),
    ("hopper", "cudnn", "fwd", False, 256): (470, 546, 580, 581, 580, 581),
    ("hopper", "cudnn", "fwd", True, 64): (225, 288, 334, 363, 379, 388),
    ("hopper", "cudnn", "fwd", True, 128): (315, 410, 484, 518, 529, 539),
    ("hopper", "cudnn", "fwd", True, 256): (308, 391, 450, 483, 497, 509),
    # Same paper, Fig. 5: backward without causal mask, head dims 64 and 128.
    ("hopper", "flash", "bwd", False, 64): (198, 238, 264, 279, 287, 291),
    ("hopper", "flash", "bwd", False, 128): (214, 260, 291, 310, 318, 322),
    ("hopper", "cudnn", "bwd", False, 64): (266, 348, 395, 417, 432, 433),
    ("hopper", "cudnn", "bwd", False, 128): (305, 408, 465, 499, 518, 516),
    # Dao 2023, FlashAttention-2 (arXiv 2307.08691), Fig. 4: forward + backward, A100 80GB SXM4, FP16/BF16.
    # Two labels are hidden by the legend: 153 (head dim 64, 1k) is legible through it; 151 (head dim
    # 128, 512) is read from the bar's height on the figure's axis (+-1).
    ("ampere", "flash", "fwd_bwd", False, 64): (132, 153, 162, 171, 175, 176),
    ("ampere", "flash", "fwd_bwd", False, 128): (151, 173, 187, 196, 201, 203),
    ("ampere", "flash", "fwd_bwd", True, 64): (88, 119, 140, 156, 165, 171),
    ("ampere", "flash", "fwd_bwd", True, 128): (99, 133, 155, 173, 182, 189),
    # cudnn-frontend results/llama3.1/gb200/llama3.1_20260424_100750.csv (NVIDIA GB200, cuDNN 9.22):
    # BF16, non-deterministic backward, at 2k, 4k, 8k, 16k, 32k (SEQ_POINTS_OF["blackwell"]).
    ("blackwell", "cudnn", "fwd", False, 128): (1433, 1599, 1771, 1697, 1634),
    ("blackwell", "cudnn", "fwd", True, 128): (1097, 1408, 1574, 1708, 1622),
    ("blackwell", "cudnn", "bwd", False, 128): (1124, 1350, 1404, 1374, 1262),
    ("blackwell", "cudnn", "bwd", True, 128): (885, 1148, 1332, 1328, 1226),
}


def _nearest_head_dim(arch: str, impl: str, direction: str, causal: bool, head_dim: int) -> int:
    """The measured head dim nearest ``head_dim`` in log2 (the larger on a tie)."""
    dims = [k[4] for k in MEASURED_TFLOPS if k[:4] == (arch, impl, direction, causal)]
    return min(dims, key=lambda d: (abs(math.log2(d / max(head_dim, 1))), -d))


def _table(arch: str, impl: str, direction: str, causal: bool, head_dim: int) -> tuple[float, ...]:
    return MEASURED_TFLOPS[arch, impl, direction, causal, _nearest_head_dim(arch, impl, direction, causal, head_dim)]


def bench_of(arch: str, impl: str) -> str:
    """The benchmark GPU whose measurements ``impl`` on ``arch`` reads (``ARCH_MEASURED``, ``BORROWED``)."""
    if arch not in ARCH_MEASURED:
        raise ValueError(f"no attention measurements for architecture {arch!r}; known: {', '.join(ARCH_MEASURED)}")
    if impl not in ("flash", "cudnn"):
        raise ValueError(f"fused attention implementation must be 'flash' or 'cudnn', got {impl!r}")
    return BORROWED.get((arch, impl), ARCH_MEASURED[arch])


def measured_curve(arch: str, impl: str, backward: bool, causal: bool, head_dim: int) -> tuple[float, ...]:
    """TFLOP/s at the benchmark GPU's SEQ_POINTS_OF (``bench_of``; see the module's rules)."""
    bench = bench_of(arch, impl)
    if bench == "ampere":
        return _table(bench, "flash", "fwd_bwd", causal, head_dim)
    if not backward:
        return _table(bench, impl, "fwd", causal, head_dim)
    if any(k[:4] == (bench, impl, "bwd", causal) for k in MEASURED_TFLOPS):  # measured with the mask
        return _table(bench, impl, "bwd", causal, head_dim)
    bwd = _table(bench, impl, "bwd", False, head_dim)
    if not causal:
        return bwd
    masked, full = _table(bench, impl, "fwd", True, head_dim), _table(bench, impl, "fwd", False, head_dim)
    return tuple(b * m / f for b, m, f in zip(bwd, masked, full))


def interpolate_tflops(curve: tuple[float, ...], seq_len: float, points: tuple[int, ...] = SEQ_POINTS) -> float:
    """``curve`` at ``seq_len``: linear in log2(s) between ``points`` (the curve's sequence lengths),
    the plateau above the longest, proportional to s below the shortest (time per query tile held)."""
    if seq_len >= points[-1]:
        return curve[-1]
    if seq_len <= points[0]:
        return curve[0] * max(seq_len, 1.0) / points[0]
    x = math.log2(seq_len / points[0])  # the points double: point i sits at x = i
    i = min(int(x), len(points) - 2)
    return curve[i] + (x - i) * (curve[i + 1] - curve[i])


def kernel_seq_len(seq_q: int, seq_kv: int, score_fraction: float = 1.0) -> float:
    """The sequence length at which to read the measured curves for one kernel of shape (seq_q, seq_kv).

    - Context parallelism: a ring-attention step is a kernel of the local queries against one K/V
      block (``strategy/blocks.split_work``: seq_q = seq_kv = s / cp); an op not split into steps
      carries seq_q = s / cp against all s keys and runs as such steps, so the shorter side is the
      kernel's length.
    - Sliding window (``score_fraction`` < 1: the op's FLOPs over the full causal count,
      ``ModelSpec.window_flops_fraction``): each query tile loops over about the window, not the
      causal prefix; the causal curve at s·fraction has the same mean key loop and the same FLOPs.
    - GQA changes neither the FLOPs nor the tiling of the key loop (K/V heads are shared by index),
      so it reads the same curve."""
    return min(seq_q, seq_kv) * min(1.0, max(score_fraction, 0.0))


def attention_efficiency(arch: str, impl: str, backward: bool, causal: bool, head_dim: int, seq_q: int,
                         seq_kv: int, score_fraction: float = 1.0) -> float:
    """Fraction of the dense BF16 datasheet peak a fused attention kernel reaches, in the benchmarks'
    FLOP convention (causal counts half the scores; the backward 2.5x the forward)."""
    curve = measured_curve(arch, impl, backward, causal, head_dim)
    bench = bench_of(arch, impl)
    tflops = interpolate_tflops(curve, kernel_seq_len(seq_q, seq_kv, score_fraction), SEQ_POINTS_OF[bench])
    return tflops / BENCH_PEAK_TFLOPS[bench]
