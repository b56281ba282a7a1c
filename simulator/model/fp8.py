"""FP8 training as Transformer Engine runs it: which GEMMs run in FP8 and the quantization kernels
around them, per TE scaling recipe (``training.fp8_recipe``).

Under ``fp8_autocast`` only TE modules run FP8 GEMMs: Megatron-Core's TE linear layers (QKV, attention
projection, fc1, fc2, the experts' linears). The core attention (TE ``DotProductAttention`` without
``fp8_dpa``), norms, activations, the router (a plain ``torch`` linear) and the output layer
(``tensor_parallel.ColumnParallelLinear``, not a TE module) stay in BF16, and activations travel
between kernels in BF16 (TE docs, "Using FP8 with Transformer Engine"; Megatron-Core
``transformer_engine.py``). Each FP8 linear quantizes its BF16 input x before the forward GEMM and
its BF16 output gradient dy before the dgrad and wgrad GEMMs, each into a row-wise copy and a
column-wise one (TE docs, low_precision_training/performance_considerations: "each tensor (input,
weight, output gradient) needs both rowwise and columnwise usages"). The recipes differ in how:

- ``delayed`` (``DelayedScaling``, the NeMo/Megatron-Core default ``fp8: hybrid``; TE 1.x
  ``module/linear.py``, ``layernorm_linear.py``): the scale comes from an amax history, so x is cast
  and transposed in one kernel (``fp8_cast_transpose``: read 2 B, write 1 + 1 B per element); when a
  LayerNorm/RMSNorm feeds the layer the norm writes FP8 itself (TE ``normalization.cpp``: Float8
  quantizers take the ``FULLY_FUSED`` norm) and only the transpose remains (read 1, write 1); dy is
  cast and transposed the same way (4 B).
- ``current`` (``Float8CurrentScaling``; ``Float8CurrentScalingQuantizer::quantize_impl`` in TE
  ``pytorch/csrc/quantizer.cpp``): the scale comes from the tensor itself, three kernels per tensor:
  ``nvte_compute_amax`` (reads the BF16 tensor, 2 B per element), ``nvte_compute_scale_from_amax``
  (one scalar) and the cast-transpose (4 B). After a norm the amax is computed inside the norm kernel
  (``FUSED_NORM_AMAX_FP8``), which then writes BF16: the scale kernel and the full cast-transpose
  remain. With sequence parallelism TE also all-reduces the amax over the TP group for the inputs of
  column-parallel layers and the output gradients of row-parallel ones
  (``set_quantizer_amax_reduction_group`` in ``module/linear.py``): a collective, which the lowering
  emits before the gather (``strategy/blocking_tp.TPTraffic``), not a kernel of this module.
- ``blockwise`` (``Float8BlockScaling``, DeepSeek-V3's recipe; TE docs fp8_blockwise_scaling): 1x128
  tiles for x and dy with one FP32 scale each, 128x128 blocks for weights. A 1D-scaled tensor's
  column-wise copy cannot be transposed from its row-wise one: one kernel
  (``quantize_transpose_vector_blockwise.cu``) reads the BF16 tensor and writes both FP8 copies and
  both scale arrays, 2 + 2 x (1 + 4/128) B per element; norms run unfused (``Impl::UNFUSED``).
- ``mxfp8`` (``MXFP8BlockScaling``, Blackwell; TE docs mxfp8): 1x32 blocks with E8M0 (1-byte)
  scales; the row-wise (1x32) and column-wise (32x1) copies are quantized separately from the BF16
  source, in one kernel (``cast/mxfp8/quantize_mxfp8.cuh`` with ROWWISE_SCALING and COLWISE_SCALING),
  2 + 2 x (1 + 1/32) B per element; norms run unfused unless ``NVTE_NORM_FWD_USE_CUDNN``.

The GEMMs of ``blockwise`` and ``mxfp8`` are block-scaled kernels, tagged by their own ``precision``
(cost/compute.py prices them); ``delayed`` and ``current`` run the same per-tensor-scaled GEMM.
Neglected for every recipe: the weight quantization (once per step: TE caches FP8 weights across
micro-batches through ``is_first_microbatch``), the amax-history update kernel of ``delayed`` (one per
pass) and the scale swizzle after an FP8 all-gather. The experts' linears (TE ``GroupedLinear``:
``fp8_multi_cast_transpose_fused`` in TE 1.11, ``fused_multi_quantize`` in 2.x) quantize the token slots
the dispatcher hands them like the dense linears, one kernel over the rank's experts; their kernels
share the expert GEMMs' routed rows and load (``Op.expert_load``), and with expert TP > 1 the
sharding divides their width by it, right for fc2's input and fc1's output gradient, short by that
factor for fc1's input and fc2's output gradient (expert TP is 1 in the bundled MoE recipes).
On Blackwell the per-tensor recipes make no transposed copy (``fp8_transposes``): the cast writes one
FP8 tensor, a norm's FP8 output needs nothing more, and TE caches one FP8 weight.
"""

from __future__ import annotations

from dataclasses import replace

from .opgraph import Op

FP8 = "fp8"
FP8_RECIPES = ("delayed", "current", "blockwise", "mxfp8")
# Op.precision of a TE linear's GEMM per recipe: the per-tensor-scaled FP8 GEMM, the Hopper 1x128 /
# 128x128 block-scaled one (cuBLAS >= 12.9), the Blackwell 1x32 microscaled one.
GEMM_PRECISION = {"delayed": FP8, "current": FP8, "blockwise": "fp8-block", "mxfp8": "mxfp8"}
FP8_PRECISIONS = frozenset(GEMM_PRECISION.values())
# GPU architectures a recipe needs beyond FP8 tensor cores (TE docs, "Supported devices"): blockwise
# "Hopper (SM 9.0); Blackwell and later ... emulated with MXFP8"; MXFP8 "SM 10.0, SM 10.3".
RECIPE_ARCHITECTURES = {"blockwise": ("hopper", "blackwell"), "mxfp8": ("blackwell",)}

# Bytes per element: cast + transpose of a BF16 tensor (read 2, write 1 row-wise + 1 column-wise FP8);
# transpose of an FP8 tensor a norm kernel already wrote (read 1, write 1); the cast alone (read 2,
# write 1) where no transpose is made (``fp8_transposes``).
CAST_TRANSPOSE_BYTES = 4
TRANSPOSE_ONLY_BYTES = 2
CAST_BYTES = 3
# Hopper runs FP8 GEMMs only in the TN layout, so a per-tensor-scaled tensor's column-wise usage is its
# data transposed; Blackwell runs the other layouts and TE makes no transpose there (TE 2.x
# pytorch/csrc/quantizer.cpp: "create_transpose = columnwise_usage && !nvte_is_non_tn_fp8_gemm_supported()";
# common/gemm: "Hopper only supports TN GEMMs for FP8. 'Column-wise data' is transpose of data"; TE docs
# performance_considerations: Blackwell "supports columnwise access natively, so no transpose is
# needed"). The block recipes' column-wise copies are scaled along the other dimension: still copies.
NON_TN_FP8_ARCHITECTURES = ("blackwell",)
# Current scaling's amax pass reads the BF16 tensor once (TE docs fp8_current_scaling: "two tensor
# reads are needed, one to compute amax and one to apply the scaling factor and cast to FP8").
AMAX_BYTES = 2
# nvte_compute_scale_from_amax: reads the FP32 amax, writes the FP32 scale; a launch, not a stream.
SCALE_KERNEL_BYTES = 8
# Scale bytes per data element of one quantized copy: an FP32 scale per 1x128 tile (blockwise), an
# E8M0 byte per 1x32 block (MXFP8), an FP32 scale per 128x128 weight block.
BLOCK_1D_SCALE_BYTES = 4 / 128
MX_SCALE_BYTES = 1 / 32
BLOCK_2D_SCALE_BYTES = 4 / (128 * 128)
# One kernel reading BF16 and writing the row-wise and column-wise copies with their scales.
BLOCKWISE_QUANTIZE_BYTES = 2 + 2 * (1 + BLOCK_1D_SCALE_BYTES)
MXFP8_QUANTIZE_BYTES = 2 + 2 * (1 + MX_SCALE_BYTES)
# TE keeps each FP8 linear's weight quantized in both usages across the micro-batches of a step (the
# Linear's weight workspaces): 1 + 1 B per parameter, plus the copies' scales for the block recipes
# (128x128 FP32 blocks for blockwise weights, 1x32 / 32x1 E8M0 blocks for MXFP8).
WEIGHT_COPY_BYTES = {"delayed": 2, "current": 2, "blockwise": 2 * (1 + BLOCK_2D_SCALE_BYTES),
                     "mxfp8": 2 * (1 + MX_SCALE_BYTES)}

# Sequence parallelism gathers what the linear consumes: TE all-gathers the quantized tensor, not the
# BF16 one, for a column-parallel FP8 linear's input and a row-parallel one's output gradient (TE 1.11
# module/base.py initialize_ub: "AllGather buffers use fp8 when using fp8 recipe" for
# layers_all_gather_overlap; layernorm_linear.py: the norm writes FP8 and gather_along_first_dim gathers
# it; linear.py grad_output_preprocess: cast_to_fp8, then gather; TE 2.x distributed.py
# gather_along_first_dim: _all_gather_fp8, _start_all_gather_fp8_blockwise and _all_gather_mxfp8 gather
# the FP8 data with its scales). Bytes per gathered element: the FP8 byte and the block recipes' scales.
GATHERED_BYTES = {"delayed": 1.0, "current": 1.0, "blockwise": 1 + BLOCK_1D_SCALE_BYTES, "mxfp8": 1 + MX_SCALE_BYTES}
# Current scaling with SP: before such a gather the quantizer all-reduces its FP32 amax (one element,
# ReduceOp.MAX) over the TP group (TE 2.x module/linear.py set_quantizer_amax_reduction_group: the input
# quantizer of a column-parallel layer, the output-gradient quantizer of a row-parallel one; csrc
# quantizer.cpp Float8CurrentScalingQuantizer with_amax_reduction), so that every rank casts with one scale.
AMAX_REDUCE_BYTES = 4.0

_SPLITS_OF_INPUT = {"column": "none", "row": "row", "expert": "expert"}  # the GEMM input's TP split, by its own
_SPLITS_OF_GRAD = {"column": "column", "row": "none", "expert": "expert"}  # the output gradient's TP split


def fp8_transposes(architecture: str) -> bool:
    """Whether TE keeps a transposed copy for a per-tensor-scaled tensor's column-wise usage on GPUs of
    ``architecture`` (NON_TN_FP8_ARCHITECTURES: not where FP8 GEMMs run every layout)."""
    return architecture not in NON_TN_FP8_ARCHITECTURES


def weight_copy_bytes_per_param(recipe: str, transpose: bool = True) -> float:
    """Bytes per FP8-linear parameter of the quantized weight copies TE caches for ``recipe``: one FP8
    copy for a per-tensor recipe where no transpose is made (``fp8_transposes``)."""
    if not transpose and recipe in ("delayed", "current"):
        return 1.0
    return WEIGHT_COPY_BYTES[recipe]


def gathered_bytes_per_element(recipe: str) -> float:
    """Bytes per element of an SP all-gather of a tensor TE quantized for ``recipe`` (GATHERED_BYTES)."""
    if recipe not in GATHERED_BYTES:
        raise ValueError(f"fp8 recipe {recipe!r} is unknown; known: {', '.join(FP8_RECIPES)}")
    return GATHERED_BYTES[recipe]


def quantize_kernels(recipe: str, after_norm: bool, transpose: bool = True) -> tuple[tuple[str, float, float], ...]:
    """The kernels that quantize one BF16 tensor for ``recipe``, in execution order: (name, bytes per
    element, fixed bytes). ``after_norm``: a norm kernel produced the tensor (forward input of a
    LayerNormLinear), so the delayed recipe's norm wrote FP8 and current scaling's norm the amax.
    ``transpose``: the per-tensor recipes' casts also write the transposed copy (``fp8_transposes``)."""
    cast = CAST_TRANSPOSE_BYTES if transpose else CAST_BYTES
    if recipe == "delayed":
        if after_norm:
            return (("fp8_cast", TRANSPOSE_ONLY_BYTES, 0),) if transpose else ()
        return (("fp8_cast", cast, 0),)
    if recipe == "current":
        amax = () if after_norm else (("fp8_amax", AMAX_BYTES, 0),)
        return amax + (("fp8_scale", 0, SCALE_KERNEL_BYTES), ("fp8_cast", cast, 0))
    if recipe == "blockwise":
        return (("fp8_cast", BLOCKWISE_QUANTIZE_BYTES, 0),)
    if recipe == "mxfp8":
        return (("fp8_cast", MXFP8_QUANTIZE_BYTES, 0),)
    raise ValueError(f"fp8 recipe {recipe!r} is unknown; known: {', '.join(FP8_RECIPES)}")


def is_fp8_linear(op: Op) -> bool:
    """A layer GEMM that is a TE linear module: column/row-parallel or expert linears, not the router."""
    return op.kind == "gemm" and op.tp_split in ("column", "row", "expert")


def _kernel(name: str, op: Op, width: int, split: str, per_elem: float, fixed: float, backward: bool) -> Op:
    tokens = op.shape[0]
    nbytes = per_elem * tokens * width + fixed
    fwd, bwd = (0, nbytes) if backward else (nbytes, 0)
    k = Op(name, "elementwise", op.block, 0.0, 0.0, 0.0, fwd, bwd, 0, (tokens, width), split, op.dtype_bytes)
    # an expert linear's kernels run over its routed rows, with its load and grouping (strategy/sharding)
    return replace(k, expert_load=op.expert_load, grouped=op.grouped, experts=op.experts) if split == "expert" else k


def fp8_layer(ops: tuple[Op, ...], recipe: str = "delayed", transpose: bool = True) -> tuple[Op, ...]:
    """The layer's ops with TE's FP8 linears for ``recipe``: the GEMM marked with the recipe's
    ``precision``, its input's quantization kernels before it (forward only) and its output
    gradient's after it in reverse order (backward only: the backward walks the ops in reverse, so
    they run in order before the GEMM's backward); ``transpose`` as ``quantize_kernels``."""
    if recipe not in GEMM_PRECISION:
        raise ValueError(f"fp8 recipe {recipe!r} is unknown; known: {', '.join(FP8_RECIPES)}")
    precision = GEMM_PRECISION[recipe]
    out: list[Op] = []
    for i, op in enumerate(ops):
        if not is_fp8_linear(op):
            out.append(op)
            continue
        _m, n, k = op.shape
        after_norm = i > 0 and ops[i - 1].kind == "norm"
        for name, per_elem, fixed in quantize_kernels(recipe, after_norm, transpose):
            out.append(_kernel(f"{op.name}.{name}_x", op, k, _SPLITS_OF_INPUT[op.tp_split], per_elem, fixed, False))
        out.append(replace(op, precision=precision))
        for name, per_elem, fixed in reversed(quantize_kernels(recipe, False, transpose)):
            out.append(_kernel(f"{op.name}.{name}_dy", op, n, _SPLITS_OF_GRAD[op.tp_split], per_elem, fixed, True))
    return tuple(out)
