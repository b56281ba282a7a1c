"""Kernel classes from kernel and operator names, NVIDIA and AMD families, and the shape of the work a
launching ATen operator describes (torch.profiler ``record_shapes``), without torch.

A kernel's class (gemm, attention, norm, elementwise, nccl, memcpy, other) is read off its name; the
launching CPU operator's ``Input Dims`` give the GEMM (rows, columns, inner) dimensions, the attention
(batch, heads, seq_q, seq_kv, head_dim) or the element count of a vector kernel, which is how a foreign
trace's kernels are matched to the scenario's ops (``calibration/matching``).
"""

from __future__ import annotations

import math
import re

# Name patterns, tried in order (first match wins).
# NVIDIA: NCCL (ncclKernel_* / ncclDevKernel_*), cuBLAS / cuBLASLt (sm90_xmma_gemm_*, ampere_*gemm*,
#   nvjet_* since cuBLAS 12.8), CUTLASS, cuDNN convolutions (implicit_convolve, dgrad, wgrad), cuDNN fused
#   attention (cudnn_generated_fort_native_sdpa), FlashAttention (flash_fwd_kernel), PyTorch's
#   memory-efficient attention (fmha_cutlassF), Transformer Engine norms (ln_fwd / rmsnorm_fwd_tuned),
#   Apex (cuApplyLayerNorm / cuApplyRMSNorm), ATen (vectorized_layer_norm_kernel, elementwise_kernel).
# AMD: RCCL keeps NCCL's kernel names (ncclKernel_*, ncclDevKernel_Generic); rocBLAS / hipBLASLt GEMMs
#   are Tensile kernels named Cijk_<layout>_<types>_MT<tile>...; MIOpen convolutions (miopenSp3AsmConv,
#   igemm_fwd_gtc*, naive_conv_*, MIOpenConv*, gridwise_convolution_implicit_gemm), MIOpen batch/layer
#   norms (MIOpenBatchNorm*, MIOpenLayerNorm*), Composable Kernel attention (ck_tile FmhaFwdKernel,
#   fmha_fwd / fmha_bwd), ROCm's copy and fill kernels (__amd_rocclr_copyBuffer / fillBuffer*).
# CPU ops follow ATen ("aten::addmm") and autograd ("AddmmBackward0").
_PATTERNS: tuple[tuple[str, re.Pattern], ...] = tuple((c, re.compile(p, re.IGNORECASE)) for c, p in (
    ("nccl", r"nccl|rccl|msccl|c10d::|allreduce|all_reduce|allgather|all_gather|reducescatter|reduce_scatter"
             r"|all_to_all|alltoall|sendrecv"),
    ("memcpy", r"^memcpy|^memset|cudaMemcpy|hipMemcpy|^Copy(Host|Device)To(Host|Device)|^FillBuffer"
               r"|__amd_rocclr_(copy|fill)|aten::_?to_copy$|aten::copy_$"),
    ("attention", r"flash|fmha|attention|attn_fwd|attn_bwd|sdpa|mha_fwd|mha_bwd|fused_attn"),
    ("gemm", r"gemm|gemv|cublas|xmma|cutlass|nvjet|^Cijk_|scudnn|implicit_convolve|conv2d|convolution|dgrad"
             r"|wgrad|miopenSp3AsmConv|MIOpenConv|igemm_|naive_conv|conv_(fwd|bwd|wrw)"
             r"|(^|::|_)(mm|addmm|bmm|baddbmm|matmul|linear)$"
             r"|(Addmm|Mm|Bmm|Baddbmm|Linear|Convolution)Backward"),
    ("norm", r"layer_?norm|rms_?norm|group_?norm|batch_?norm|instance_?norm|ln_fwd|ln_bwd|bn_fw|bn_bw"
             r"|cuApply(Layer|RMS)Norm|cuComputeGradInput|cuComputePartGradGammaBeta"),
    ("other", r"^aten::(view|reshape|_?unsafe_view|t|transpose|permute|expand|as_strided|empty\w*|detach"
              r"|alias|slice|select|unsqueeze|squeeze|split\w*|chunk|contiguous|lift\w*|zeros|ones|"
              r"resolve_\w+|item|_local_scalar_dense|result_type|set_|record_stream)$"
              r"|(View|Reshape|Alias|Transpose|Permute|Expand|Unsqueeze|Squeeze|T|Select|Slice|Split)"
              r"Backward\d*$"),
    ("elementwise", r"elementwise|vectorized|unrolled|at::native|reduce_kernel|softmax|gelu|silu|"
                    r"relu|dropout|adam|foreach|multi_tensor|cross_entropy|nll|embedding|index|scatter|"
                    r"gather|catarray|pool|rotary|rope|triton_|accumulategrad|^aten::|Backward\d*$"),
))
_AUTOGRAD_NODE = "autograd::engine::evaluate_function: "

# ATen operators whose Input Dims describe a GEMM: (first matrix, second matrix) argument positions.
_GEMM_ARGS = {"aten::mm": (0, 1), "aten::bmm": (0, 1), "aten::matmul": (0, 1), "aten::addmm": (1, 2),
              "aten::baddbmm": (1, 2), "aten::_scaled_mm": (0, 1)}
_ATTENTION_OPS = re.compile(r"^aten::_?(scaled_dot_product|flash_attention|efficient_attention)", re.I)


def categorize(name: str) -> str:
    """Kernel class of a GPU kernel or CPU op name (one of analysis.measured.KERNEL_CATEGORIES)."""
    base = name.split(": ", 1)[1] if name.startswith(_AUTOGRAD_NODE) else name
    for cat, pat in _PATTERNS:
        if pat.search(base):
            return cat
    return "other"


def _dims(dims, i: int) -> tuple[int, ...] | None:
    if i >= len(dims) or not isinstance(dims[i], (list, tuple)):
        return None
    try:
        return tuple(int(d) for d in dims[i])
    except (TypeError, ValueError):
        return None


def gemm_dims(op: str, dims) -> tuple[int, int, int] | None:
    """(rows, columns, inner) of the GEMM an ATen op computes, from its Input Dims; None when unknown.

    mm / addmm: (M, K) @ (K, N); bmm / baddbmm: batched, the batch folded into the rows (each batch is a
    GEMM of the same (M, N, K); the kernel runs them all); linear: input (..., K), weight (N, K)."""
    if op == "aten::linear":
        x, w = _dims(dims, 0), _dims(dims, 1)
        if not x or not w or len(w) != 2:
            return None
        return math.prod(x[:-1]), w[0], w[1]
    args = _GEMM_ARGS.get(op)
    if args is None:
        return None
    a, b = _dims(dims, args[0]), _dims(dims, args[1])
    if not a or not b or len(a) < 2 or len(b) < 2:
        return None
    return math.prod(a[:-1]), b[-1], a[-1]


def gemm_key(shape: tuple[int, int, int]) -> tuple[int, int, int]:
    """A GEMM up to transposition: C = A·B and Cᵀ = Bᵀ·Aᵀ are the same kernel work."""
    m, n, k = shape
    return min(m, n), max(m, n), k


def attention_dims(op: str, dims) -> tuple[int, int, int, int, int] | None:
    """(batch, heads, seq_q, seq_kv, head_dim) of a fused attention op from q (b, h, sq, d) and k
    (b, h_kv, skv, d); the backward ops take grad_out first (same shape as q)."""
    if not _ATTENTION_OPS.match(op):
        return None
    first = 1 if op.endswith("_backward") else 0
    q, k = _dims(dims, first), _dims(dims, first + 1)
    if not q or not k or len(q) != 4 or len(k) != 4:
        return None
    return q[0], q[1], q[2], k[2], q[3]


def elements(dims) -> int | None:
    """Element count of an op's first tensor argument (a vector kernel's size)."""
    d = _dims(dims, 0) if dims else None
    return math.prod(d) if d else None
