"""FlashAttention-2's variable-length kernel called on unpadded tokens: the copy kernels around it.

``training.attention = "flash-varlen"`` is FlashAttention-2 reached the way llm-foundry's
``flash_attn_fn`` reaches it (llmfoundry/models/layers/attention.py, v0.4.0 to v0.5.0, Jan 2024, the
``attn_impl: flash`` path; Hugging Face's ``_upad_input`` does the same): the fused QKV projection's
output is split into query, key and value views, each is unpadded by ``flash_attn.bert_padding``
(flash-attn 2.4.2) ``unpad_input``, the kernel is ``flash_attn_varlen_func``, and its output is padded
back by ``pad_input`` before the output projection. With every token valid (pre-training on packed
sequences) the gathers move every element; the kernel is FlashAttention-2's (same tiles, same
measured curves, ``cost/attention_eff``). Per element of the tensors named:

- ``unpad_input`` -> ``IndexFirstAxis.forward``: ``torch.gather`` of q, k and v into new contiguous
  tensors (read + write). Backward: ``torch.zeros`` of the padded gradient (write) and ``scatter_``
  (read + write), per tensor; then autograd's backward of ``qkv.split`` concatenates the three
  gradients into the fused projection's output gradient (``split_with_sizes_backward``: read + write).
- ``pad_input`` -> ``IndexPutFirstAxis.forward``: ``torch.zeros`` (write) and ``output[indices] =
  values`` (read + write). Backward: ``grad_output[indices]`` (read + write).

The index bookkeeping (``attention_mask.sum``, ``torch.nonzero``, ``cumsum``, ``F.pad`` over b·s
integers) moves negligible bytes; its ``nonzero`` and ``.max().item()`` make the host wait for the GPU
three times each per forward, a cost in host latency this module does not charge.
"""

from __future__ import annotations

from .opgraph import Op, _vector

UNPAD_FWD_PASSES = 2  # gather: read + write
UNPAD_BWD_PASSES = 5  # zero-fill 1 + scatter 2, then the split's backward cat 2
PAD_FWD_PASSES = 3  # zero-fill 1 + index_put 2
PAD_BWD_PASSES = 2  # index (gather): read + write


def with_unpadding(ops: tuple[Op, ...]) -> tuple[Op, ...]:
    """A layer's ops with ``attn_unpad`` before and ``attn_pad`` after its attention core (per element
    passes above, in the core's dtype), both split over TP like the QKV projection's output."""
    out: list[Op] = []
    for op in ops:
        if op.kind != "attention":
            out.append(op)
            continue
        b, heads, seq_q, seq_kv, head_dim = op.shape
        d = op.dtype_bytes
        q_width, kv_width = heads * head_dim, op.kv_heads * head_dim
        unpad = _vector("attn_unpad", "elementwise", op.block, b * seq_q, q_width + 2 * kv_width,
                        UNPAD_FWD_PASSES * d, UNPAD_BWD_PASSES * d, 0, "column", d)
        pad = _vector("attn_pad", "elementwise", op.block, b * seq_q, q_width, PAD_FWD_PASSES * d,
                      PAD_BWD_PASSES * d, 0, "column", d)
        out += [unpad, op, pad]
    return tuple(out)

