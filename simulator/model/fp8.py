"""FP8 training as Transformer Engine runs it: which GEMMs run in FP8 and the cast kernels around them.

Recipe modelled: TE's per-tensor *delayed scaling* (``DelayedScaling``, the NeMo/Megatron-Core default
``fp8: hybrid``: E4M3 forward, E5M2 gradients). Under ``fp8_autocast`` only TE modules run FP8 GEMMs:
Megatron-Core's TE linear layers (QKV, attention projection, fc1, fc2, the experts' linears). The
core attention (TE ``DotProductAttention`` without ``fp8_dpa``), norms, activations, the router
(a plain ``torch`` linear) and the output layer (``tensor_parallel.ColumnParallelLinear``, not a TE
module) stay in BF16, and activations travel between kernels in BF16 (TE docs, "Using FP8 with
Transformer Engine"; Megatron-Core ``transformer_engine.py``).

Around every FP8 linear layer, TE moves (``transformer_engine/pytorch/module/linear.py`` and
``layernorm_linear.py``, TE 1.x):
- forward: the BF16 input is cast to FP8 and transposed for the weight gradient (``fp8_cast_transpose``:
  read 2 B, write 1 + 1 B per element); when a LayerNorm/RMSNorm feeds the layer (``LayerNormLinear``)
  the norm kernel writes FP8 itself and only the transpose remains (read 1 B, write 1 B);
- backward: the BF16 output gradient is cast and transposed the same way (read 2 B, write 1 + 1 B)
  before the input-gradient (dgrad) and weight-gradient (wgrad) FP8 GEMMs.
Neglected: the weight cast + transpose (once per step: TE caches FP8 weights across micro-batches
through ``is_first_microbatch``), the fused amax/scale update kernel (one per pass, a few µs) and the
amax all-reduce; the expert linears' casts (their token counts follow the dispatcher).
"""

from __future__ import annotations

from dataclasses import replace

from .opgraph import Op

FP8 = "fp8"
# Bytes per element: cast + transpose of a BF16 tensor (read 2, write 1 row-wise + 1 column-wise FP8);
# transpose of an FP8 tensor a norm kernel already wrote (read 1, write 1).
CAST_TRANSPOSE_BYTES = 4
TRANSPOSE_ONLY_BYTES = 2
_SPLITS_OF_INPUT = {"column": "none", "row": "row"}  # the GEMM input's TP split, by the GEMM's own split
_SPLITS_OF_GRAD = {"column": "column", "row": "none"}  # the output gradient's TP split


def is_fp8_linear(op: Op) -> bool:
    """A layer GEMM that is a TE linear module: column/row-parallel or expert linears, not the router."""
    return op.kind == "gemm" and op.tp_split in ("column", "row", "expert")


def _cast(name: str, op: Op, width: int, split: str, fwd_elem: int, bwd_elem: int) -> Op:
    tokens = op.shape[0]
    e = tokens * width
    return Op(name, "elementwise", op.block, 0.0, 0.0, 0.0, fwd_elem * e, bwd_elem * e, 0, (tokens, width),
              split, op.dtype_bytes)


def fp8_layer(ops: tuple[Op, ...]) -> tuple[Op, ...]:
    """The layer's ops with TE's FP8 linears: the GEMM marked ``precision = "fp8"``, its input cast before
    it (forward only) and its output-gradient cast after it (backward only, so it runs before the
    GEMM's backward)."""
    out: list[Op] = []
    for i, op in enumerate(ops):
        if not is_fp8_linear(op):
            out.append(op)
            continue
        if op.tp_split in _SPLITS_OF_INPUT:
            _m, n, k = op.shape
            after_norm = i > 0 and ops[i - 1].kind == "norm"
            fwd = TRANSPOSE_ONLY_BYTES if after_norm else CAST_TRANSPOSE_BYTES
            out.append(_cast(f"{op.name}.fp8_cast_x", op, k, _SPLITS_OF_INPUT[op.tp_split], fwd, 0))
            out.append(replace(op, precision=FP8))
            out.append(_cast(f"{op.name}.fp8_cast_dy", op, n, _SPLITS_OF_GRAD[op.tp_split], 0, CAST_TRANSPOSE_BYTES))
        else:
            out.append(replace(op, precision=FP8))
    return tuple(out)
