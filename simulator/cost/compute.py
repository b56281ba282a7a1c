"""Compute cost: roofline time of one kernel (OpWork) with global per-architecture efficiencies.

time = max(FLOPs / (peak · gemm_eff(shape)), bytes / (HBM bandwidth · mem_eff)) + kernel overhead;
fused attention reads its efficiency from measured curves (attention_eff.py).
The efficiencies are global per GPU architecture, each from a published measurement; no constant is
fitted to a validation row (DESIGN.md §5).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace

from ..hardware.gpus import GPUSpec
from ..model.fp8 import FP8_PRECISIONS
from ..model.opgraph import ATTENTION_IMPLS, attention_flops
from ..tasks import OpWork, gemm_grad_shapes
from ..units import DTYPE_BYTES
from .attention_eff import attention_efficiency
from .clocks import held_clock_MHz, power_limited_boost, slowest_speed_ratio, sustained_clock_ratio

# Bytes moved per attention-score element by the unfused kernels (see _unfused_attention_s).
UNFUSED_FWD_BYTES_PER_SCORE = 13
UNFUSED_BWD_BYTES_PER_SCORE = 19
UNFUSED_KERNELS = 4  # QK^T, softmax, dropout, AV


@dataclass(frozen=True, slots=True)
class Efficiency:
    gemm_max: float  # fraction of dense peak of a GEMM's main loop (tiles in full waves, long k)
    memory: float  # fraction of HBM bandwidth reached by streaming elementwise kernels
    num_sms: int  # streaming multiprocessors: wave quantization of GEMM tiles
    block_k: int  # k extent of one main-loop iteration of the bf16 tensor-core GEMM kernel
    tile_overhead_iters: float  # pipeline prologue + epilogue of one output tile, in main-loop iterations
    kernel_overhead_s: float  # per-kernel launch/tail gap when the GPU is saturated with kernels
    fp8_block_k: int = 0  # k extent of one main-loop iteration of the FP8 GEMM kernel; 0: no FP8 tensor cores
    dense_flops_per_clock_per_sm: int = 0  # 16-bit dense tensor-core FLOP per SM clock: peak -> its clock
    stream_k: bool = False  # persistent kernels deal main-loop iterations evenly to the SMs (no waves)
    fp8_gemm_max: float = 0.0  # gemm_max of the FP8 kernels; 0: the same as BF16's


# Sources:
# - gemm_max: derived from measured GEMMs through this module's own GEMM model (waves x k-efficiency):
#   A100 SXM: CUTLASS profiler documentation (media/docs/profiler.md, "Example Tensor Core GEMM
#   Operations"): f16 in, f32 accumulate, 3456x4096x8192 in 0.98647 ms = 235.1 TFLOP/s = 0.7535 of
#   312; that shape fills 4 full waves of 128x256 tiles and k_eff(8192) = 0.982 -> 0.767.
#   H100 SXM (hopper): measured on the lent H100 SXM (700 W) here, 256 GEMMs of at least 50 us back to
#   back at the power limit (scenarios/calibration/h100/gpu_kernels.csv, gpu_waves.csv,
#   gpu_fp8_accum.csv; torch 2.11 / cuBLAS of CUDA 13.0): square 4096-16384, an 8192 x 8192 k sweep
#   256-16384, m sweeps 256-8192 at n, k = 4608, 12288 and 12288, 1536, and the layer GEMMs of Llama
#   3.1 8B, 70B TP 4 and GPT-3 175B TP 8 in BF16 and FP8. gemm_max (BF16 0.81, FP8 0.79) and one
#   tile_overhead_iters (1.5) are their least-squares fit (log time) through stream_k_gemm_s at this
#   sustained clock; the GEMMs then come within -11.6%..+13.5% (MAPE 3.0%; the waves-and-split-K model
#   of before: 7.9%, up to +63% at partial waves). The sustained 8192^3 product ran at 665 TFLOP/s with the SM clock at
#   1,350 MHz and 697 W; the model, 679. cuBLAS on Hopper shows no wave steps: throughput is flat in m
#   from 512 rows on (gpu_waves.csv), as persistent stream-K scheduling gives (Osama et al. 2023,
#   Stream-K, PPoPP'23; CUTLASS 3 sm90 PersistentTileSchedulerSm90StreamK).
#   B200 (blackwell), measured by others: torch.matmul BF16 (cuBLAS) on an HGX B200 (pytorch/ao PR
#   #2427, 2025-06, benchmarks/float8/bench_matmul.py): 4096^3 in 97.4 us, 6144^3 in 319 us, 8192^3 in
#   774 us (1.41, 1.45, 1.42 PFLOP/s, 0.63-0.65 of the 2.25 PFLOP/s datasheet peak). 0.657 of the
#   datasheet peak is their least-squares fit (log time) through stream_k_gemm_s with Hopper's tiles
#   and tile overhead and 148 SMs: within -2.5%..+2.1% of the three (3072^3, 38 us, below the 50 us of
#   the fit: +8.5%). Those GEMMs ran at the boost clock: the PR times one warm-up and five profiled
#   calls (benchmarks/float8/utils.py get_gpu_kernel_gemm_time_s), under 5 ms, before a B200's clock
#   drops under sustained load (b200-sxm-180gb.toml: 1,965 -> 1,580 MHz after ~5 ms). gemm_max is that
#   fit per clock at the clock the datasheet peak is quoted at (1,855.8 MHz = 2.25 PFLOP/s / (148 SMs x
#   8,192)): 0.657 x 1,855.8 / 1,965 = 0.6205; the GPU's sustained clock then scales it as Hopper's.
#   A GB200 runs the same die and kernels at its own (derived) sustained clock. FP8 (fp8_gemm_max): no
#   per-tensor FP8 rate of its own was found; it keeps Hopper's measured FP8/BF16 ratio of gemm_max
#   (0.79 / 0.81), an estimate. Check against FP8/BF16 time ratios measured by others on Blackwell
#   (this model: 0.54 at 4096^3, 0.52-0.53 on the layer below): XLA's sm_100 GEMM cost table
#   (tensorflow/tensorflow third_party/xla/xla/backends/gpu/cost_model/matmul_interpolator_data.h at
#   a305421c, 4096^3: BF16 1,417, f8e4m3 2,765 TFLOP/s: 0.51) and Transformer Engine's GEMM profiling
#   tutorial (docs/examples/gemm_profiling at 8f2e6357, B300, a 5B layer's 12 GEMMs at m = 15,872,
#   pre-quantized: BF16 13.102 ms, per-tensor FP8 6.812 ms: 0.52).
# - block_k / tile_overhead_iters: CUTLASS multistage main loop (media/docs/efficient_gemm.md,
#   "software pipelining"): an output tile costs ceil(k / block_k) iterations plus a prologue of
#   stages - 1 iterations that fill the pipeline and an epilogue that writes the tile, equivalent
#   to (tile_m·tile_n) / ((tile_m + tile_n)·block_k) iterations of operand traffic. Ampere
#   (cutlass_tensorop_s16816gemm_f16_256x128_32x3): block_k 32, 3 stages, epilogue 2.67 -> 4.67.
#   Hopper: block_k 64 (sm90 128x256x64 warp-specialized kernels); the tile overhead is measured (see
#   gemm_max): 1.5 iterations, under the 3 + 1.33 of a non-persistent 4-stage kernel, since a
#   persistent kernel loads the next tile's operands while it writes the last one's output.
# - fp8_block_k: Hopper FP8 tensor-core GEMMs (CUTLASS sm90 kernels for e4m3/e5m2, as cuBLASLt and
#   TE run them) load 128-byte K slices per stage like the 16-bit kernels, i.e. 128 one-byte elements
#   (tile 128x256x128): half the main-loop iterations of BF16 for the same k, with the same prologue
#   and epilogue (the BF16 output tile is the same 64 KiB), so short-k FP8 GEMMs lose more to the tile
#   overhead. Check against measurements (tilelang, H800 SXM = H100 SXM compute, 8192 x 8192 x k,
#   benchmark/matmul{,_fp8}/README.md): FP8/BF16 time 0.56 at k = 1024, 0.50 at 4096, 0.50 at 8192;
#   this model gives 0.58, 0.53, 0.52. The dense FP8 peak is the datasheet's (2x BF16); its gemm_max
#   (fp8_gemm_max) is measured with BF16's (see gemm_max).
# - fused attention (flash, cudnn): not here -- a measured curve by sequence length, head dim, pass and
#   mask in attention_eff.py (FlashAttention-2/-3 papers), read in the benchmarks' FLOP convention.
# - memory: STREAM-like copy kernels reach ~90% of HBM peak on A100/H100 (NVIDIA's "GPU Performance
#   Background" guide); we take 0.85 for the mix of norm/elementwise kernels.
# - num_sms: A100 108 SMs (A100 whitepaper), H100 SXM5 132 SMs (H100 whitepaper).
# - kernel_overhead_s: back-to-back kernel launch gap of ~2-4 us on a busy stream (NVIDIA Nsight
#   Systems timelines; PyTorch CUDA Graphs announcement, 2021: "launch overhead ... several us").
# - dense_flops_per_clock_per_sm (datasheet arithmetic): A100 1,024 dense FP16 FMA per SM per clock
#   (A100 whitepaper: 108 SMs x 2,048 FLOP x 1.41 GHz = 312 TFLOP/s); Hopper twice that per SM clock
#   for clock (H100 whitepaper: 132 x 4,096 x 1.83 GHz = 989.4); Blackwell datacenter 8,192
#   (NVIDIA/cudnn-frontend PR #314, per-arch MMA table: "BF16/FP16 dense = 8192"). With the GPU's
#   SM count they give the clock its datasheet peak is quoted at, over which a sustained clock scales.
# - Blackwell: Hopper's tile pipeline (same CUTLASS family; tiles, block_k, tile overhead not measured
#   there), 148 SMs (B200, DGX B200 page), its own MMA rate per clock and gemm_max (above; attention:
#   attention_eff.py). Calibrate your own with `calibrate profile`.
HOPPER_GEMM_MAX, HOPPER_FP8_GEMM_MAX = 0.81, 0.79  # the lent H100's fit (above)
BLACKWELL_SMS, BLACKWELL_DENSE_FLOPS_PER_CLOCK_PER_SM = 148, 8192  # B200 (above)
# the B200 GEMMs of pytorch/ao PR #2427 at their boost clock (b200-sxm-180gb.toml: 1,965 MHz), per clock
# at the clock its 2.25 PFLOP/s datasheet peak is quoted at (above; cost/clocks.quoted_clock_Hz)
B200_BURST_GEMM_MAX, B200_BOOST_MHZ = 0.657, 1965.0
B200_QUOTED_MHZ = 2250e12 / (BLACKWELL_SMS * BLACKWELL_DENSE_FLOPS_PER_CLOCK_PER_SM) / 1e6
BLACKWELL_GEMM_MAX = B200_BURST_GEMM_MAX * B200_QUOTED_MHZ / B200_BOOST_MHZ
EFFICIENCIES: dict[str, Efficiency] = {
    "ampere": Efficiency(gemm_max=0.767, memory=0.85, num_sms=108, block_k=32,
                         tile_overhead_iters=4.67, kernel_overhead_s=2e-6, dense_flops_per_clock_per_sm=2048),
    "hopper": Efficiency(gemm_max=HOPPER_GEMM_MAX, memory=0.85, num_sms=132, block_k=64,
                         tile_overhead_iters=1.5, kernel_overhead_s=2e-6, fp8_block_k=128,
                         dense_flops_per_clock_per_sm=4096, stream_k=True, fp8_gemm_max=HOPPER_FP8_GEMM_MAX),
    "blackwell": Efficiency(gemm_max=BLACKWELL_GEMM_MAX, memory=0.85, num_sms=BLACKWELL_SMS,
                            block_k=64, tile_overhead_iters=1.5, kernel_overhead_s=2e-6, fp8_block_k=128,
                            dense_flops_per_clock_per_sm=BLACKWELL_DENSE_FLOPS_PER_CLOCK_PER_SM, stream_k=True,
                            fp8_gemm_max=BLACKWELL_GEMM_MAX * HOPPER_FP8_GEMM_MAX / HOPPER_GEMM_MAX),
}

# Block-scaled FP8 GEMMs (training.fp8_recipe "blockwise" / "mxfp8", model/fp8.py): main-loop rate
# relative to the per-tensor-scaled FP8 kernel above, per (Op.precision, architecture); measured by
# others, not fitted:
# - Hopper 1x128 x 128x128 (cuBLAS >= 12.9, which TE's Float8BlockScaling calls): NVIDIA's cuBLAS 12.9
#   blog ("Boosting Matrix Multiplication Speed and Flexibility with NVIDIA cuBLAS 12.9", 2025): block-
#   scaled FP8 matmuls on Hopper reach up to 1.75x BF16 on large matmuls, where the per-tensor FP8
#   kernel reaches 2.0x (the tilelang measurements of fp8_block_k above: FP8/BF16 time 0.50 at
#   k >= 4096): 1.75 / 2.0 = 0.875. (DeepGEMM's README, H800: its own block-scaled kernel reached
#   1520 TFLOP/s at 4096x7168x16384 and 1.4x its CUTLASS 3.6 baseline; TE does not run DeepGEMM.)
# - Blackwell 1x32 MXFP8 (tcgen05 block-scaled MMA): TE's GEMM profiling tutorial
#   (docs/examples/gemm_profiling, B300, pre-quantized inputs, 5B model's 12 GEMMs per layer):
#   MXFP8 7.161 ms against per-tensor FP8 (CurrentScaling) 6.812 ms: 6.812 / 7.161 = 0.951. TE runs
#   Float8BlockScaling on Blackwell through MXFP8 GEMMs (TE docs fp8_blockwise_scaling), same rate.
BLOCK_SCALED_GEMM_RATE: dict[tuple[str, str], float] = {
    ("fp8-block", "hopper"): 1.75 / 2.0,
    ("fp8-block", "blackwell"): 6.812 / 7.161,
    ("mxfp8", "blackwell"): 6.812 / 7.161,
}

# Per-tensor-scaled FP8 GEMMs of the backward pass on Hopper: Transformer Engine runs dgrad and wgrad
# with split accumulators (partial sums promoted to FP32 outside the tensor cores) and fprop with fast
# accumulation (transformer_engine/pytorch/module/base.py: _2X_ACC_FPROP = False, _2X_ACC_DGRAD =
# _2X_ACC_WGRAD = True; the recipes' MMParams likewise). Rate with split over fast accumulation,
# measured on an H100 SXM here: the 39 layer GEMM shapes of Llama 3.1 8B, 70B TP4 and GPT-3 175B TP8
# in their three layouts, torch._scaled_mm both ways, fast/split time 0.936 (0.84..1.00)
# (scenarios/calibration/h100/gpu_fp8_accum.csv). Blackwell's MMA accumulates in FP32: not applied.
# The block-scaled recipes' rates above already include their accumulation.
FP8_SPLIT_ACCUMULATOR_RATE: dict[str, float] = {"hopper": 0.936}

# Host time of one eager PyTorch op issued from Python while the GPU waits (an OpWork of kind "host",
# shape (ops,)): PyTorch operator micro-benchmark of a tiny view op on a CUDA tensor, "Forward
# Execution Time (us) : 3.333" (split, pytorch/pytorch PR #32194, 2020), measured by others.
EAGER_OP_HOST_S = 3.333e-6
# Host time of one kernel launched from eager PyTorch (Python op, ATen dispatch, cudaLaunchKernel):
# the same micro-benchmark on a tiny CUDA add, whose kernel is shorter than its dispatch, "Forward
# Execution Time (us)" 7.748 (add_M8_N32_K256_cuda) and 7.058 (add_M8_N32_K512_cuda), pytorch/pytorch
# PR #38421 (2020), measured by others. The GPU cannot run a task's kernels faster than the host
# issues them (the host-side floor); CUDA graphs (``training.cuda_graphs``) replay them without it.
EAGER_KERNEL_HOST_S = 7.4e-6

# CUTLASS/cuBLAS tensor-core GEMM output tile for bf16 on Ampere/Hopper (128 x 256), NVIDIA
# "Matrix Multiplication Background User's Guide": tile and wave quantization.
GEMM_TILE_M = 128
GEMM_TILE_N = 256
# Split-K (CUTLASS media/docs/efficient_gemm.md "Parallelized Reductions"; Osama et al. 2023, Stream-K,
# PPoPP'23: few-wave GEMMs lose a large share of the GPU to wave quantization) is searched while an
# output has fewer than this many waves of tiles. A bound on the search, not a fitted rate: the
# fastest candidate is taken, and from this many waves on quantization costs at most 1/4 while a split
# adds its fp32 reduction traffic.
SPLIT_K_WAVES = 4
# Executed / counted FLOPs of a FlashAttention backward: it recomputes the scores QK^T, five matrix
# products against the forward's two (Dao 2023 Algorithm 2), 2.5x the forward, as the FlashAttention
# benchmarks count it (benchmarks/benchmark_flash_attention.py: fwd_bwd = 3.5x fwd); the op graph's
# backward carries 2x (the MFU convention).
FLASH_BWD_RECOMPUTE = 2.5 / 2.0
# Fraction of the full attention score matrix a causal kernel computes (lower triangle).
CAUSAL_EXECUTED_FRACTION = 0.5


def k_efficiency(k: int, block_k: int, overhead_iters: float) -> float:
    """Main-loop share of a tile's time: iterations / (iterations + prologue and epilogue)."""
    iters = math.ceil(k / block_k)
    return iters / (iters + overhead_iters)


def split_k_candidates(m: int, n: int, k: int, num_sms: int, block_k: int) -> range:
    """Split-K factors tried for an (m, n) output: 1, and while it has fewer than SPLIT_K_WAVES waves
    of tiles, up to the factor that makes that many, never more splits than main-loop iterations."""
    tiles = math.ceil(m / GEMM_TILE_M) * math.ceil(n / GEMM_TILE_N)
    return range(1, max(1, min(SPLIT_K_WAVES * num_sms // tiles, math.ceil(k / block_k))) + 1)


def split_k_gemm_s(flops: float, rate_flops_per_s: float, m: int, n: int, k: int, splits: int, num_sms: int,
                   block_k: int, overhead_iters: float, mem_Bps: float) -> float:
    """Time of an (m, n, k) GEMM tiled (m, n) with K split ``splits`` ways (CUTLASS parallel split-K,
    media/docs "GEMM API ... Split-K"): tiles x splits CTAs in waves, each CTA a k / splits main loop
    with its prologue and epilogue; with splits > 1 the fp32 partial tiles are written to a workspace
    and reduced (4 B per element written and read per split, the BF16 result written once)."""
    tiles = math.ceil(m / GEMM_TILE_M) * math.ceil(n / GEMM_TILE_N)
    tile_eff = (m * n) / (tiles * GEMM_TILE_M * GEMM_TILE_N)
    ctas = tiles * splits
    wave = tile_eff * ctas / (math.ceil(ctas / num_sms) * num_sms)
    keff = k_efficiency(math.ceil(k / splits), block_k, overhead_iters)
    reduce_s = (8.0 * splits + 2.0) * m * n / mem_Bps if splits > 1 else 0.0
    return flops / (rate_flops_per_s * wave * keff) + reduce_s


def stream_k_gemm_s(flops: float, rate_flops_per_s: float, m: int, n: int, k: int, num_sms: int,
                    block_k: int, overhead_iters: float, mem_Bps: float) -> float:
    """Time of an (m, n, k) GEMM run by a persistent stream-K kernel (Osama et al. 2023; CUTLASS sm90
    stream-K tile scheduler, data-parallel whole tiles then the remainder split): the tiles' main-loop
    iterations are dealt evenly to the SMs; the busiest SM runs ceil(iterations / SMs) of them and
    pays the prologue and epilogue of every tile piece it touches (its whole tiles plus at most two
    pieces of the remainder); each extra piece of a split tile writes and reads back its fp32
    partial tile (8 B per element)."""
    tiles = math.ceil(m / GEMM_TILE_M) * math.ceil(n / GEMM_TILE_N)
    iters = math.ceil(k / block_k)
    tail = tiles % num_sms
    pieces = tiles // num_sms + (2 if tail else 0)
    iter_s = 2.0 * GEMM_TILE_M * GEMM_TILE_N * block_k * num_sms / rate_flops_per_s
    extra_pieces = min(num_sms - tail, tail * (iters - 1)) if tail else 0
    fixup_s = 8.0 * extra_pieces * GEMM_TILE_M * GEMM_TILE_N / mem_Bps
    return (math.ceil(tiles * iters / num_sms) + overhead_iters * pieces) * iter_s + fixup_s


class RooflineCompute:
    """Kernel time from FLOPs and bytes against one GPU's peak, with the global efficiencies."""

    def __init__(self, gpu: GPUSpec, dtype: str, attention: str = "flash", num_gpus: int = 1) -> None:
        if attention not in ATTENTION_IMPLS:
            raise ValueError(f"attention implementation {attention!r} is unknown; known: {', '.join(ATTENTION_IMPLS)}")
        self.attention = attention
        self.dtype_bytes = DTYPE_BYTES[dtype]
        self.gpu = gpu
        self.eff = EFFICIENCIES[gpu.architecture]
        # FP8 training (Transformer Engine): FP8 GEMMs are marked per op; everything else runs in BF16.
        # Tensor-core peaks at the clock the GPU sustains under training load (sustained_clock_ratio),
        # the slowest of the job's num_gpus units (slowest_speed_ratio): the pace of a synchronous step.
        self.slowest_ratio = slowest_speed_ratio(gpu, num_gpus)
        self.clock_ratio = sustained_clock_ratio(gpu, self.eff) * self.slowest_ratio
        self.held_MHz = held_clock_MHz(gpu, self.eff)
        self.peak_flops_per_s = gpu.peak("bf16" if dtype == "fp8" else dtype) * self.clock_ratio
        self.fp8_peak_flops_per_s = gpu.peak_flops_per_s.get("fp8", 0.0) * self.clock_ratio
        self.mem_Bps = gpu.hbm_bandwidth_Bps * self.eff.memory
        self.launch_sms = self.eff.num_sms  # the SMs a GEMM's kernel is chosen for (cuBLAS heuristic)
        self._cache: dict[OpWork, float] = {}

    def on_sms(self, sms: int, chosen_for_them: bool = False) -> "RooflineCompute":
        """The same GPU with only ``sms`` SMs free (at least one): tensor-core peaks scale with them
        and GEMM waves quantize on them; HBM-bound kernels keep their bandwidth. A GEMM's kernel is
        still chosen for ``launch_sms`` unless ``chosen_for_them``."""
        left = max(1, min(sms, self.eff.num_sms))
        other = copy.copy(self)
        other.eff = replace(self.eff, num_sms=left)
        share = left / self.eff.num_sms * power_limited_boost(self.gpu, self.eff.num_sms, left, self.held_MHz)
        other.peak_flops_per_s = self.peak_flops_per_s * share
        other.fp8_peak_flops_per_s = self.fp8_peak_flops_per_s * share
        other.launch_sms = left if chosen_for_them else self.launch_sms
        other._cache = {}
        return other

    def op_time_s(self, op: OpWork) -> float:
        t = self._cache.get(op)
        if t is None:
            t = self._cache[op] = self._op_time_s(op)
        return t

    def _op_time_s(self, op: OpWork) -> float:
        if op.kind == "host":  # ops issued from Python with the GPU idle: no kernel of their own
            return op.shape[0] * EAGER_OP_HOST_S
        mem_s = op.bytes / self.mem_Bps
        if op.kind == "gemm" and op.flops > 0:
            m, n, k = gemm_shape(op)
            if is_fused_backward_gemm(op):
                # a fused backward of the forward GEMM (m, n, k): the input- and weight-gradient
                # GEMMs, each with its own waves and main-loop length, two kernels as B and W alone
                dgrad, wgrad = gemm_grad_shapes((m, n, k))
                half = op.flops / 2
                flop_s = (self._gemm_s(half, *dgrad, op.precision, True)
                          + self._gemm_s(half, *wgrad, op.precision, True) + self.eff.kernel_overhead_s)
            else:
                flop_s = self._gemm_s(op.flops, m, n, k, op.precision, op.backward)
        elif op.kind == "attention" and op.flops > 0 and self.attention == "unfused":
            return self._unfused_attention_s(op)
        elif op.kind == "attention" and op.flops > 0:
            flop_s = self._fused_attention_s(op)
        else:
            flop_s = 0.0
        return max(flop_s, mem_s) + self.eff.kernel_overhead_s * op.kernels

    def _fused_attention_s(self, op: OpWork) -> float:
        """A FlashAttention-2 / cuDNN kernel. The op counts the full s^2 score matrix (Narayanan 2021
        eq. 3; the backward 2x); the causal kernel computes the lower triangle, half of it (Dao 2023
        §3.1), and its backward recomputes QK^T, 2.5x the forward (FLASH_BWD_RECOMPUTE): exactly the
        FLOPs the FlashAttention benchmarks count, so attention_eff's measured fraction of the datasheet
        peak applies to them and a measured point's time is reproduced. As for the GEMMs, the fraction
        is of the datasheet peak and the sustained clock ratio then scales that peak (the papers state
        no clock; at ratio 1 their times are reproduced). Training attention is causal; a sliding
        window computes the fraction of the causal scores its FLOPs say (opgraph scales them). A later
        step of a load-balanced CP ring (``causal`` false, ``blocks.later_step_work``) keeps its slice's
        FLOPs, of which its half block executes half, at the non-causal kernel's efficiency."""
        b, heads, sq, skv, hd = op.shape
        counted = attention_flops(b, heads, sq, skv, hd) * (2.0 if op.backward else 1.0)
        # flash-varlen runs FlashAttention-2's kernel (model/varlen: only the copies around it differ)
        impl = "flash" if self.attention == "flash-varlen" else self.attention
        eff = attention_efficiency(self.gpu.architecture, impl, op.backward, op.causal, hd, sq, skv,
                                   score_fraction=op.flops / counted)
        executed = CAUSAL_EXECUTED_FRACTION * op.flops * (FLASH_BWD_RECOMPUTE if op.backward else 1.0)
        return executed / (self.peak_flops_per_s * eff)

    def _gemm_s(self, flops: float, m: int, n: int, k: int, precision: str = "", backward: bool = False) -> float:
        """A GEMM's time; ``precision`` an FP8 tag of model/fp8.py or "" (the training dtype);
        ``backward``: a dgrad or wgrad GEMM (per-tensor FP8 runs them with split accumulators)."""
        fp8 = precision in FP8_PRECISIONS
        if fp8 and not self.eff.fp8_block_k:
            raise ValueError(f"gpu {self.gpu.name} has no FP8 tensor cores (training.dtype = 'fp8')")
        block_k, peak = (self.eff.fp8_block_k, self.fp8_peak_flops_per_s) if fp8 else (self.eff.block_k,
                                                                                        self.peak_flops_per_s)
        if fp8 and precision != "fp8":
            rate = BLOCK_SCALED_GEMM_RATE.get((precision, self.gpu.architecture))
            if rate is None:
                raise ValueError(f"gpu {self.gpu.name} ({self.gpu.architecture}) has no {precision} GEMM")
            peak *= rate
        elif fp8 and backward:
            peak *= FP8_SPLIT_ACCUMULATOR_RATE.get(self.gpu.architecture, 1.0)
        rate = peak * (self.eff.fp8_gemm_max if fp8 and self.eff.fp8_gemm_max else self.eff.gemm_max)
        over = self.eff.tile_overhead_iters
        if self.eff.stream_k and self.eff.num_sms >= self.launch_sms:
            return stream_k_gemm_s(flops, rate, m, n, k, self.eff.num_sms, block_k, over, self.mem_Bps)
        # Under SM contention (fewer SMs free than the kernel was chosen for) tiles run in waves over the
        # free SMs, also on Hopper: a one-wave GEMM beside a 24-CTA NCCL all-gather nearly doubles (NVIDIA
        # developer forum 337991, H100); the stream-K dealing is measured on a free GPU only.
        # Either orientation of the output can be tiled, with or without split-K; cuBLAS's heuristic
        # picks among such kernels for the whole GPU (``launch_sms``), modelled as the fastest there;
        # the kernel then runs on the SMs it finds free (fewer beside a collective: cost/sm_share).
        full = self.launch_sms
        a, b, s = min(((a, b, s) for a, b in ((m, n), (n, m)) for s in split_k_candidates(a, b, k, full, block_k)),
                      key=lambda c: split_k_gemm_s(flops, rate, c[0], c[1], k, c[2], full, block_k, over, self.mem_Bps))
        return split_k_gemm_s(flops, rate, a, b, k, s, self.eff.num_sms, block_k, over, self.mem_Bps)

    def _unfused_attention_s(self, op: OpWork) -> float:
        """Pre-FlashAttention Megatron (2019-2022): QK^T and AV as batched GEMMs over the full s x s
        matrix (no causal skipping), the score matrix materialised in HBM and passed through the fused
        scale-mask-softmax and the attention dropout (Korthikanti et al. 2022 §4.1 lists these
        tensors: 2as²b scores, 2as²b softmax output, as²b dropout mask). Per score element, forward:
        QK^T writes 2 B, softmax reads and writes 2 + 2, dropout reads 2 and writes 2 + 1 (mask), AV
        reads 2: 13 B. Backward: dV reads P (2), dP written (2), dropout backward 2 + 1 + 2, softmax
        backward reads dP and P and writes dS (6), dQ and dK read dS (4): 19 B."""
        b, heads, sq, skv, _hd = op.shape
        scores = b * heads * sq * skv
        mem_s = scores * (UNFUSED_BWD_BYTES_PER_SCORE if op.backward else UNFUSED_FWD_BYTES_PER_SCORE) / self.mem_Bps
        tiles = b * heads * math.ceil(sq / GEMM_TILE_M) * math.ceil(skv / GEMM_TILE_N)
        wave = tiles / (math.ceil(tiles / self.eff.num_sms) * self.eff.num_sms)
        gemm_s = op.flops / (self.peak_flops_per_s * self.eff.gemm_max * wave)
        return gemm_s + mem_s + UNFUSED_KERNELS * self.eff.kernel_overhead_s

    def work_time_s(self, work: tuple[OpWork, ...], eager: bool = True) -> float:
        """A task's time: its kernels, never faster than an eager host issues them, then its host ops."""
        kernels_s = sum(self.op_time_s(op) for op in work if op.kind != "host")
        host_s = sum(self.op_time_s(op) for op in work if op.kind == "host")
        return with_host_floor_s(kernels_s, host_s, sum(self.kernel_launches(op) for op in work), eager)

    def kernel_launches(self, op: OpWork) -> int:
        """Kernels the host launches for one op: none for a host op, two for a fused backward GEMM
        (input and weight gradient), the four of unfused attention, else the op's (eager: several)."""
        if op.kind == "host":
            return 0
        if op.kind == "gemm" and op.flops > 0 and is_fused_backward_gemm(op):
            return 2
        return UNFUSED_KERNELS if op.kind == "attention" and self.attention == "unfused" else op.kernels


def gemm_shape(op: OpWork) -> tuple[int, int, int]:
    """(m, n, k) of a GEMM op; a large square stand-in when the op carries no shape."""
    if len(op.shape) == 3:
        m, n, k = op.shape
        return m, n, k
    return 1 << 14, 1 << 14, 1 << 14


def is_fused_backward_gemm(op: OpWork) -> bool:
    """A backward op that carries both gradients of its forward (m, n, k) GEMM: 2x its FLOPs."""
    m, n, k = gemm_shape(op)
    return op.flops > 1.5 * 2.0 * m * n * k


def with_host_floor_s(kernels_s: float, host_s: float, launches: int, eager: bool) -> float:
    """Time of a task whose kernels take ``kernels_s`` on the GPU and whose host ops ``host_s`` with the
    GPU idle: an eager host issues the task's kernels at EAGER_KERNEL_HOST_S each, running ahead of
    the GPU within the task (not across tasks), so the kernels take at least their dispatch; CUDA
    graphs (``eager`` false) replay them with no per-kernel host cost."""
    if eager:
        kernels_s = max(kernels_s, EAGER_KERNEL_HOST_S * launches)
    return kernels_s + host_s
