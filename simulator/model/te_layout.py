"""Megatron-Core's self-attention through Transformer Engine: the copies that lay Q, K and V out for the kernel.

Megatron-Core (``SelfAttention.get_query_key_value_tensors``, core_r0.9 megatron/core/transformer/
attention.py) views the fused QKV projection's output as [s, b, groups, (heads/groups + 2) x head_dim],
splits it into query, key and value views (TE's ``SplitAlongDim``) and reshapes the query to [s, b,
heads, head_dim]; Transformer Engine's ``DotProductAttention`` (TE 1.7 to 2.x: transformer_engine/
pytorch/attention.py, later attention/dot_product_attention/) then lays them out for its backend. Per
element, with Q, K, V, O the query, key, value and output blocks (bytes), in the training dtype:

- the query reshape copies under GQA (the split's query view cannot merge its group and head
  dimensions): 2 Q forward; with multi-head attention it is a view;
- ``get_qkv_layout``: multi-head attention without rotary embedding leaves the three views
  interleaved in one buffer (``sbh3d``), a layout every backend takes as it is; otherwise the value is
  still a strided view of the projection's output (RoPE wrote new query and key tensors), the layout is
  ``not_supported`` and TE makes it contiguous: 2 V forward;
- FlashAttention (``FlashAttention.forward``): q, k, v transposed to [b, s, h, d]
  (``x.transpose(0, 1).contiguous()``, or the fused ``fa_prepare_fwd`` on the interleaved layout) and the
  output back to [s, b, ...] (``.transpose(0, 1).contiguous()``): at micro-batch 1 a contiguous tensor's
  transpose is contiguous already and copies nothing (measured on the lent H100:
  ``scenarios/calibration/h100/gpu_layout_copies.csv``), so only the interleaved views copy, 2 (Q + K + V);
  above micro-batch 1 all of them, 2 (Q + K + V) + 2 O forward; the gradients' transposes are views;
- backward, ``SplitAlongDim``'s backward concatenates dQ, dK, dV into the projection's output gradient
  (``torch.cat``: 2 (Q + K + V)), except where they already lie interleaved in one buffer: the fused
  (cuDNN) backend on an ``sbh3d`` layout without context parallelism (with CP, TE makes q, k, v contiguous
  before its ring, 2 (Q + K + V) forward, and the ring returns separate gradients); FlashAttention's
  interleaved case pays the same bytes in ``fa_prepare_bwd``.

Counted as one memory-bound op before the attention kernel (``qkv_layout``; with selective recompute
Megatron-Core re-runs TE's part of it with the core, which this op is not). MLA (its own projections
and concatenations) and GQA without rotary embedding (whose key is a strided view too) are not modelled.
"""

from __future__ import annotations

from collections.abc import Callable

from .opgraph import Op, _vector
from .spec import ModelSpec

TE_ATTENTION = ("flash", "cudnn")
# training.attention_module: "te" (Megatron-Core + Transformer Engine) | "sdpa" (torch's SDPA on the views)
ATTENTION_MODULES = ("te", "sdpa")


def te_cp(sharding: str, kernels: str, attention: str, module: str, cp: int) -> int:
    """The CP degree at which these copies apply, 0 where they do not: Megatron-Core (its distributed
    optimizer, ``sharding = "megatron-distopt"``) running Transformer Engine's attention module
    (``module = "te"``) on cuDNN or FlashAttention with fused kernels. The argument ``build_op_graph``
    takes as ``te_cp``."""
    megatron = sharding == "megatron-distopt" and kernels == "fused"
    return cp if megatron and module == "te" and attention in TE_ATTENTION else 0


def layout_bytes(model: ModelSpec, attention: str, cp: int, micro_batch: int = 1) -> tuple[float, float]:
    """(forward, backward) bytes per query element per byte of the dtype (module doc)."""
    rho = model.kv_hidden_size / model.q_size  # K (and V) per Q element
    qkv = 1.0 + 2.0 * rho
    gqa = model.num_kv_heads < model.num_attention_heads
    interleaved = not gqa and model.position_embedding != "rope"
    fwd = (2.0 if gqa else 0.0) + (0.0 if interleaved else 2.0 * rho)
    if attention == "flash":
        fwd += (2.0 * qkv if interleaved or micro_batch > 1 else 0.0) + (2.0 if micro_batch > 1 else 0.0)
    elif interleaved and cp > 1:
        fwd += 2.0 * qkv
    bwd = 0.0 if attention == "cudnn" and interleaved and cp == 1 else 2.0 * qkv
    return fwd, bwd


def with_layouts(ops: tuple[Op, ...], model: ModelSpec, attention: str, cp: int) -> tuple[Op, ...]:
    """A layer's ops with ``qkv_layout`` before its attention core (split over TP like the query)."""
    if model.is_mla:
        return ops
    return before_attention(ops, "qkv_layout", model, lambda op: layout_bytes(model, attention, cp, op.shape[0]))


def before_attention(ops: tuple[Op, ...], name: str, model: ModelSpec,
                     bytes_per_q: Callable[[Op], tuple[float, float]]) -> tuple[Op, ...]:
    """``ops`` with a memory-bound copy ``name`` before each attention core, over the query block (split
    over TP like the query), moving ``bytes_per_q(core)`` (forward, backward) bytes per query element per
    byte of the dtype: the one shape for the copies that lay Q, K, V out for the kernel."""
    out: list[Op] = []
    for op in ops:
        if op.kind == "attention":
            d, (fwd, bwd) = op.dtype_bytes, bytes_per_q(op)
            out.append(_vector(name, "elementwise", op.block, op.shape[0] * op.shape[2], model.q_size,
                               fwd * d, bwd * d, 0, "column", d))
        out.append(op)
    return tuple(out)
