"""PyTorch attention modules that repeat GQA's keys and values to every query head before calling SDPA.

torchtitan's Llama attention (9dec370 torchtitan/models/llama/model.py, Dec 2024; 820504e
torchtitan/models/llama3/model.py, June 2025) and Hugging Face's ``LlamaAttention`` hand
``F.scaled_dot_product_attention`` keys and values with as many heads as the query: ``repeat_kv`` is
``torch.unsqueeze(x, 3).expand(b, s, kv_heads, n_rep, head_dim).reshape(b, s, kv_heads * n_rep,
head_dim)``, and a reshape of an expanded tensor copies it. Per element of the query block (bytes per
byte of the dtype), with rho = kv_heads / heads the key's (and the value's) size per query element:

- forward: K and V read (2 rho) and written once per query head (2): 2 + 2 rho;
- backward: the expand's backward sums the repeated gradients dK and dV over the repeats
  (``sum_to_size``): read 2, write 2 rho.

The transposes around the SDPA call copy nothing: PyTorch's flash and cuDNN backends take [b, s, h, d]
strides and return their output in that storage, so torchtitan's ``output.transpose(1, 2).contiguous()``
is a view at any micro-batch. Counted as one memory-bound op before the attention kernel
(``kv_repeat``, split over TP like the query) where ``training.attention_module = "sdpa"``, for GQA
layers (multi-head attention repeats nothing; MLA has a key per query head). Under ``torch.compile``
(``kernels = "fused"``) the repeated tensors are still written for SDPA, an external kernel; the read
of K may fuse with RoPE's kernel (2 rho of the same order). Context parallelism (``cp_torch``) already
exchanges the repeated K and V; this op is the copy that makes them. Memory: run eagerly, autograd keeps
the repeated K and V for SDPA's backward in place of K and V (``strategy/saved_tensors.repeated_kv_saved``);
under torch.compile the partitioner's choice (it may keep the un-repeated ones) is not modelled.
"""

from __future__ import annotations

from .opgraph import Op
from .spec import ModelSpec
from .te_layout import before_attention

MODULE = "sdpa"  # training.attention_module whose layers repeat K and V (model/te_layout.ATTENTION_MODULES)


def repeats_kv(model: ModelSpec) -> bool:
    """Whether ``repeat_kv`` copies anything: GQA (fewer key/value heads than query heads), not MLA."""
    return not model.is_mla and model.num_kv_heads < model.num_attention_heads


def repeat_bytes(model: ModelSpec) -> tuple[float, float]:
    """(forward, backward) bytes per query element per byte of the dtype (module doc); (0, 0) without GQA."""
    if not repeats_kv(model):
        return 0.0, 0.0
    rho = model.kv_hidden_size / model.q_size
    return 2.0 + 2.0 * rho, 2.0 + 2.0 * rho


def with_repeat_kv(ops: tuple[Op, ...], model: ModelSpec) -> tuple[Op, ...]:
    """A layer's ops with ``kv_repeat`` before its attention core (split over TP like the query)."""
    per_q = repeat_bytes(model)
    return before_attention(ops, "kv_repeat", model, lambda op: per_q) if repeats_kv(model) else ops
