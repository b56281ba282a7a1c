"""The operator graph of one micro-batch: every kernel-sized op of the model, UNSHARDED.

Each op carries its forward and backward FLOPs, HBM bytes, parameters, shape and the rule by which
tensor parallelism divides it; ``strategy/sharding`` turns an op into one rank's work. All layers
of one kind are identical, so the graph holds one template per layer kind (MoE or dense MLP: an
MoE model's first dense layers; global or sliding-window attention, as Gemma 2 / GPT-OSS alternate
them, ``ModelSpec.is_windowed_layer``) plus the embedding and head ops; ``OpGraph.layer_ops(i)``
names the template of layer i, the one rule the lowering and the estimators follow. A parallel block
(GPT-J, GPT-NeoX) holds the same GEMMs; only its norms and its end (``_parallel_exit``) differ.

FLOP convention (Narayanan et al. 2021 eq. 3; Korthikanti et al. 2022 §5; PaLM App. B MFU):
only matrix multiplications count. A GEMM of (m, n, k) costs 2·m·n·k forward and twice that
backward, split equally into the input gradient ("B" of zero-bubble, Qi et al. 2024) and the
weight gradient ("W"). The attention core counts QK^T and AV over the FULL s x s score matrix,
4·b·s²·h forward, although the mask is causal: this is how those papers count, so MFU computed
from this graph matches theirs. Vector ops (norms, activations, residuals, softmax, loss,
embedding lookup) carry zero FLOPs and are costed by their bytes (memory-bound). A GPT layer costs
24·b·s·h² + 4·b·s²·h forward, the model 24·b·s·l·h²·(1 + s/(6h)) + 2·b·s·h·V (Narayanan eq. 3 / 4).

Bytes are the compulsory HBM traffic of each kernel (each operand read once, each result written once),
dtype-sized; bias vectors, norm weights and FlashAttention's per-row softmax statistics are neglected.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import ceil

from ..units import dtype_bytes as _dtype_bytes
from .spec import ModelSpec

OP_KINDS = ("gemm", "attention", "elementwise", "norm", "softmax", "embedding", "loss")
# training.attention: FA2 packed, FA2 varlen on unpadded tokens (varlen.py), cuDNN (TE), unfused (compute.py)
ATTENTION_IMPLS = ("flash", "flash-varlen", "cudnn", "unfused")
TP_SPLITS = ("column", "row", "heads", "vocab", "sequence", "expert", "none")

_MASK_BYTES = 1  # a dropout mask element: a bool, 1 byte (Korthikanti et al. 2022 §4.1: s·b·h bytes)


@dataclass(frozen=True, slots=True)
class Op:
    name: str
    kind: str  # one of OP_KINDS
    block: str  # "embed" | "attn" | "mlp" | "head"
    fwd_flops: float  # one micro-batch, unsharded
    bwd_input_flops: float  # gradient w.r.t. inputs ("B")
    bwd_weight_flops: float  # gradient w.r.t. weights ("W"); 0 for ops without weights
    fwd_bytes: float  # HBM bytes read + written in forward
    bwd_bytes: float  # HBM bytes read + written in backward (B and W together)
    params: int
    shape: tuple[int, ...]  # gemm (m, n, k); attention (b, heads, seq_q, seq_kv, head_dim);
    #                         others (tokens, width)
    tp_split: str  # one of TP_SPLITS
    dtype_bytes: int = 2
    experts: int = 1  # expert GEMMs: the number of experts whose weights the op holds
    kv_heads: int = 0  # attention: key/value heads (GQA); 0 for other ops
    precision: str = ""  # "fp8": a Transformer Engine FP8 GEMM (model/fp8.py); "" = the training dtype
    # expert ops: (busiest expert, every other expert) rows relative to the mean expert's share of
    # ``shape`` (ModelSpec.moe_expert_loads), and whether a rank's experts run as one grouped GEMM
    expert_load: tuple[float, float] = (1.0, 1.0)
    grouped: bool = True
    kernels: tuple[int, int] = (1, 1)  # (forward, backward) kernels launched: eager PyTorch's (model/eager.py)


@dataclass(frozen=True, slots=True)
class OpGraph:
    model: ModelSpec
    micro_batch_size: int
    dtype_bytes: int
    embed: tuple[Op, ...]
    layer: tuple[Op, ...]  # one transformer layer (an MoE layer for MoE models), global attention
    head: tuple[Op, ...]
    dense_layer: tuple[Op, ...] = ()  # an MoE model's dense-MLP layers (ModelSpec.has_dense_mlp)
    # the same two with sliding-window attention (models with windowed layers only)
    windowed_layer: tuple[Op, ...] = ()
    windowed_dense_layer: tuple[Op, ...] = ()
    mtp_layer: tuple[Op, ...] = ()  # one MTP module's layer (model.mtp_layers > 0): its inputs, then ``layer``

    @property
    def tokens(self) -> int:
        return self.micro_batch_size * self.model.seq_length

    def fwd_flops(self) -> float:
        """Whole model, one micro-batch, forward."""
        return self._total(lambda op: op.fwd_flops)

    def bwd_flops(self) -> float:
        return self._total(lambda op: op.bwd_input_flops + op.bwd_weight_flops)

    def num_params(self) -> int:
        return int(self._total(lambda op: op.params))

    def layer_ops(self, index: int) -> tuple[Op, ...]:
        """The ops of layer ``index`` (0-based): the dense template for an MoE model's first dense
        layers, the windowed one for a sliding-window layer, the MTP module's for the layers after
        the main model's (``ModelSpec.total_layers``)."""
        if index >= self.model.num_layers:
            return self.mtp_layer
        dense = self.model.has_dense_mlp(index)
        if self.model.is_windowed_layer(index):
            return self.windowed_dense_layer if dense else self.windowed_layer
        return self.dense_layer if dense else self.layer

    def layer_kinds(self) -> list[tuple[tuple[Op, ...], int]]:
        """(template, number of layers using it) over the distinct templates, in first-use order."""
        counts: dict = {}
        for ops in map(self.layer_ops, range(self.model.total_layers)):
            counts.setdefault(id(ops), [ops, 0])[1] += 1
        return [(ops, n) for ops, n in counts.values()]

    def _total(self, f) -> float:
        layers = sum(n * sum(f(op) for op in ops) for ops, n in self.layer_kinds())
        return sum(f(op) for op in self.embed) + layers + sum(f(op) for op in self.head)


# ---- work formulas shared with strategy/sharding --------------------------------------------
def gemm_flops(m: int, n: int, k: int) -> float:
    """(m x k) @ (k x n): m·n multiply-adds per k, 2 FLOPs each."""
    return 2.0 * m * n * k


def gemm_bytes(m: int, n: int, k: int, dtype_bytes: int, experts: int = 1) -> float:
    """Read input (m·k) and weights (experts·k·n), write output (m·n). The two backward GEMMs
    (dX = dY·W^T, dW = X^T·dY) each move the same three matrices, so each costs this too."""
    return float(m * k + experts * k * n + m * n) * dtype_bytes


def attention_flops(batch: int, heads: int, seq_q: int, seq_kv: int, head_dim: int) -> float:
    """QK^T and AV: 2·(2·b·heads·sq·skv·d) = 4·b·s²·h for sq = skv = s (Narayanan eq. 3)."""
    return 4.0 * batch * heads * seq_q * seq_kv * head_dim


def attention_bytes(batch: int, heads: int, kv_heads: int, seq_q: int, seq_kv: int, head_dim: int,
                    dtype_bytes: int, backward: bool = False) -> float:
    """Fused (FlashAttention, Dao et al. 2022) kernel, compulsory traffic. Forward reads Q, K, V and
    writes O; backward reads Q, K, V, O, dO and writes dQ, dK, dV."""
    q = batch * heads * seq_q * head_dim
    kv = batch * kv_heads * seq_kv * head_dim
    return float((4 * q + 4 * kv) if backward else (2 * q + 2 * kv)) * dtype_bytes


def expert_rows(tokens: int, top_k: int, mean_load: float) -> int:
    """Token slots the experts compute, balanced routing: T·k times ``ModelSpec.moe_mean_load`` (the
    capacity cf·T·k/E per expert of GShard, Lepikhin et al. 2020 §2.2 / Switch Transformer, Fedus et
    al. 2021 eq. 4, over E experts when padded to capacity: padded slots are computed, so cf > 1
    costs FLOPs; at most T·k when dropping; T·k dropless)."""
    return ceil(mean_load * tokens * top_k - 1e-9)


# ---- op constructors --------------------------------------------------------------------------
def _gemm(name: str, block: str, m: int, n: int, k: int, params: int, tp_split: str, d: int, experts: int = 1) -> Op:
    f = gemm_flops(m, n, k)
    b = gemm_bytes(m, n, k, d, experts)
    return Op(name, "gemm", block, f, f, f, b, 2 * b, params, (m, n, k), tp_split, d, experts)


def _vector(name: str, kind: str, block: str, tokens: int, width: int, fwd_elem_bytes: float,
            bwd_elem_bytes: float, params: int, tp_split: str, d: int) -> Op:
    """A memory-bound op over a (tokens, width) tensor; *_elem_bytes: bytes moved per element."""
    e = tokens * width
    return Op(name, kind, block, 0.0, 0.0, 0.0, fwd_elem_bytes * e, bwd_elem_bytes * e, params,
              (tokens, width), tp_split, d)


def _norm(name: str, block: str, m: ModelSpec, tokens: int, d: int) -> Op:
    # forward reads x, writes y; backward reads dy and x, writes dx
    return _vector(name, "norm", block, tokens, m.hidden_size, 2 * d, 3 * d, m.norm_params(), "sequence", d)


def _residual(name: str, block: str, m: ModelSpec, tokens: int, d: int) -> Op:
    """Megatron's fused bias-dropout-add with dropout (``ModelSpec.dropout``; GPT style, Brown et al.
    2020): reads x and the residual, writes out and the mask; backward reads dy and the mask, writes dx.
    Llama-style models train without dropout (Touvron et al. 2023): a plain add. The residual stream
    feeds the norm and this add, so autograd sums the input's two gradients (InputBuffer::accumulate)."""
    grad_sum = 3 * d
    if m.dropout:
        return _vector(name, "elementwise", block, tokens, m.hidden_size, 3 * d + _MASK_BYTES,
                       2 * d + _MASK_BYTES + grad_sum, 0, "sequence", d)
    return _vector(name, "elementwise", block, tokens, m.hidden_size, 3 * d, grad_sum, 0, "sequence", d)


def _attention_ops(m: ModelSpec, b: int, d: int, windowed: bool = False) -> list[Op]:
    h, q, kv, s, t = m.hidden_size, m.q_size, m.kv_hidden_size, m.seq_length, b * m.seq_length
    n_qkv = q + 2 * kv  # GQA: Q is h x heads·head_dim, K and V h x kv_heads·head_dim (Ainslie 2023)
    ops = [_norm("ln1", "attn", m, t, d)]
    ops += _mla_ops(m, t, d) if m.is_mla else [
        _gemm("qkv", "attn", t, n_qkv, h, h * n_qkv + (n_qkv if m.qkv_bias else 0), "column", d)]
    if m.qk_norm:
        # Qwen3 / Gemma 3: per-head norm of q and k (head_dim weights each); reads and writes q
        # and k forward, reads dy and x and writes dx backward, like the other norms
        ops.append(_vector("qk_norm", "norm", "attn", t, q + kv, 2 * d, 3 * d, m.qk_norm_params(),
                           "column", d))
    if m.position_embedding == "rope":
        # rotary embedding of q and k (Su et al. 2021): read and write both, either direction
        # (MLA: the decoupled RoPE part of every query head; the one shared RoPE key, 1/heads of
        # that, is neglected)
        width = m.num_attention_heads * m.qk_rope_head_dim if m.is_mla else q + kv
        ops.append(_vector("rope", "elementwise", "attn", t, width, 2 * d, 2 * d, 0, "column", d))
    heads, kvh = m.num_attention_heads, m.num_kv_heads
    # MLA's QK^T runs over head_dim and AV over v_head_dim: the shape carries their mean, so that
    # 4·b·heads·s²·mean and the Q+O, K+V bytes are exact.
    hd = (m.head_dim + m.v_head_dim) // 2
    # A sliding window scales the score FLOPs (ModelSpec.window_flops_fraction); the kernel still
    # reads every K and V once, so the bytes do not change.
    f = attention_flops(b, heads, s, s, hd) * (m.window_flops_fraction() if windowed else 1.0)
    ops.append(Op("attn_core", "attention", "attn", f, 2 * f, 0.0,
                  attention_bytes(b, heads, kvh, s, s, hd, d),
                  attention_bytes(b, heads, kvh, s, s, hd, d, backward=True),
                  0, (b, heads, s, s, hd), "heads", d, 1, kvh))
    o = m.attn_out_size
    ops.append(_gemm("attn_out", "attn", t, h, o, o * h + (h if m.bias else 0), "row", d))
    if m.sandwich_norm:
        ops.append(_norm("post_attn_norm", "attn", m, t, d))
    if not m.parallel_attn_mlp:  # a parallel block adds both branches at its end (_parallel_exit)
        ops.append(_residual("attn_residual", "attn", m, t, d))
    return ops


def _mla_ops(m: ModelSpec, t: int, d: int) -> list[Op]:
    """MLA's projections (DeepSeek-V2 §2.1.2-2.1.3; Megatron-core MLASelfAttention): the down
    projections to the latents and the latents' norms are duplicated on every TP rank ("none"), the
    up projections are column-parallel over heads. Parameters sum to ModelSpec.mla_params_per_layer."""
    h, heads, r_q, r_kv, rope = (m.hidden_size, m.num_attention_heads, m.q_lora_rank, m.kv_lora_rank,
                                 m.qk_rope_head_dim)
    norm = 2 if m.norm == "layernorm" else 1
    ops = [_gemm("q_down", "attn", t, r_q, h, h * r_q, "none", d),
           _vector("q_norm", "norm", "attn", t, r_q, 2 * d, 3 * d, norm * r_q, "none", d),
           _gemm("q_up", "attn", t, m.q_size, r_q, r_q * m.q_size, "column", d)] if r_q else [
        _gemm("q_proj", "attn", t, m.q_size, h, h * m.q_size, "column", d)]
    n_up = heads * (m.head_dim - rope + m.v_head_dim)  # K without its RoPE part, and V, per head
    return ops + [_gemm("kv_down", "attn", t, r_kv + rope, h, h * (r_kv + rope), "none", d),
                  _vector("kv_norm", "norm", "attn", t, r_kv, 2 * d, 3 * d, norm * r_kv, "none", d),
                  _gemm("kv_up", "attn", t, n_up, r_kv, r_kv * n_up, "column", d)]


def _act_bytes(m: ModelSpec, d: int) -> tuple[int, int]:
    """Bytes per output element of the fused activation kernel. Plain kinds (GELU, squared ReLU,
    Megatron-core's jit-fused ``torch.pow(F.relu(x), 2)`` in megatron/training/activations.py): read
    x, write y / read dy and x, write dx. Gated kinds (SwiGLU, GeGLU; Shazeer 2020): read gate and
    up, write y / read dy, gate and up, write dgate and dup."""
    return (3 * d, 5 * d) if m.gated_mlp else (2 * d, 3 * d)


def _dense_mlp(m: ModelSpec, t: int, width: int, d: int, prefix: str = "") -> list[Op]:
    """fc1, activation, fc2 of one MLP ``width`` wide. Gated MLPs' gate and up projections are one
    fused fc1 GEMM of width 2·f, as Megatron-core's linear_fc1 with gated_linear_unit; plain MLPs
    have one h -> f GEMM."""
    h, n1 = m.hidden_size, (m.mlp_matrices - 1) * width
    act_fwd, act_bwd = _act_bytes(m, d)
    return [_gemm(prefix + "fc1", "mlp", t, n1, h, h * n1 + (n1 if m.bias else 0), "column", d),
            _vector(prefix + "act", "elementwise", "mlp", t, width, act_fwd, act_bwd, 0, "column", d),
            _gemm(prefix + "fc2", "mlp", t, h, width, width * h + (h if m.bias else 0), "row", d)]


def _mlp_ops(m: ModelSpec, b: int, d: int, dense: bool = False) -> list[Op]:
    """The MLP block: a dense MLP (``dense``: also an MoE model's first dense layers), or the router,
    the routed experts and the shared experts, which Megatron-core's MoELayer adds after the routed
    ones (with moe_shared_expert_overlap, strategy/blocks runs them beside the all-to-alls)."""
    h, t = m.hidden_size, b * m.seq_length
    ops = [_norm("ln2", "mlp", m, t, d)] if m.norms_per_layer != 1 else []  # a parallel block's shared norm: ln1
    if not m.is_moe or dense:
        ops += _dense_mlp(m, t, m.ffn_hidden_size, d)
    else:
        e, f = m.num_experts, m.moe_ffn_hidden_size
        n1 = (m.mlp_matrices - 1) * f
        fc1_params = h * n1 + (n1 if m.bias else 0)
        fc2_params = f * h + (h if m.bias else 0)
        act_fwd, act_bwd = _act_bytes(m, d)
        rows = expert_rows(t, m.moe_top_k, m.moe_mean_load())
        copies = rows / t  # token copies the experts see per token: k (cf·k padded)
        busy, other = m.moe_expert_loads()
        load = (busy / m.moe_mean_load(), other / m.moe_mean_load())
        fc1 = _gemm("expert_fc1", "mlp", rows, n1, h, e * fc1_params, "expert", d, e)
        fc2 = _gemm("expert_fc2", "mlp", rows, h, f, e * fc2_params, "expert", d, e)
        act = _vector("expert_act", "elementwise", "mlp", rows, f, act_fwd, act_bwd, 0, "expert", d)
        fc1, act, fc2 = (replace(o, expert_load=load, grouped=m.moe_grouped_gemm, experts=e) for o in (fc1, act, fc2))
        ops += [
            # router: a replicated h x E linear layer (Megatron-core TopKRouter); under sequence
            # parallelism each rank routes its own s/t tokens
            _gemm("router", "mlp", t, e, h, m.router_params_per_layer(), "sequence", d),
            # the scores (softmax or sigmoid) over the E logits and the top-k selection, one fused
            # kernel (Megatron-core moe_router_fusion / topk_softmax_with_capacity): forward reads the
            # logits and writes the scores; backward reads their gradient and the scores, writes the
            # logits' gradient (the k selected values and indices per token are neglected)
            _vector("router_topk", "softmax", "mlp", t, e, 2 * d, 3 * d, 0, "sequence", d),
            # Megatron-core moe_utils.permute: index_select of each token's cf·k copies, grouped by
            # expert (read the tokens, write the copies); its backward scatter-adds the copies'
            # gradients back (read the copies, write the tokens)
            _vector("moe_permute", "elementwise", "mlp", t, h, d * (1 + copies), d * (copies + 1), 0,
                    "sequence", d),
            fc1, act, fc2,
            # moe_utils.unpermute: weight the copies by their router probabilities and scatter-add
            # them into the tokens (read the copies, write the tokens); backward writes the copies'
            # gradients and reads the copies again for the probabilities' gradient
            _vector("moe_unpermute", "elementwise", "mlp", t, h, d * (copies + 1), d * (1 + 2 * copies), 0,
                    "sequence", d),
        ]
        if m.moe_shared_expert_ffn_hidden_size:
            ops += _dense_mlp(m, t, m.moe_shared_expert_ffn_hidden_size, d, "shared_")
    if m.sandwich_norm:
        ops.append(_norm("post_mlp_norm", "mlp", m, t, d))
    if m.parallel_attn_mlp:
        return ops + _parallel_exit(m, t, d)
    ops.append(_residual("mlp_residual", "mlp", m, t, d))
    return ops


def _parallel_exit(m: ModelSpec, t: int, d: int) -> list[Op]:
    """A parallel block's end (``ModelSpec.parallel_attn_mlp``): the attention's and the MLP's partial
    outputs summed before the block's one TP reduction (GPT-NeoX megatron/model/transformer.py:
    ``residual + self.reduce(output)``; mesh-transformer-jax layers.py ``g_psum(attn_out + dense_out)``),
    a full tensor on every TP rank ("none"), then the residual add over the rank's tokens. Forward: read
    both, write the sum (with dropout a uint8 mask per branch, GPT-NeoX's bias_dropout); the residual
    reads x and the sum, writes the output. Backward: a branch's gradient is the output's (dropout: dy
    times its mask); autograd sums the gradients of tensors read twice: one shared norm's output (QKV's
    and fc1's inputs, before their one collective) and the layer input (norm, residual); with two
    norms the input's three (two norms, residual)."""
    shared = m.parallel_norms == 1
    drop_fwd, drop_bwd = (2 * _MASK_BYTES, 2 * (2 * d + _MASK_BYTES)) if m.dropout else (0, 0)
    return [_vector("attn_mlp_sum", "elementwise", "mlp", t, m.hidden_size, 3 * d + drop_fwd,
                    3 * d * shared + drop_bwd, 0, "none", d),
            _vector("residual", "elementwise", "mlp", t, m.hidden_size, 3 * d, 3 * d * (2 - shared), 0,
                    "sequence", d)]


def _embed_ops(m: ModelSpec, b: int, d: int) -> list[Op]:
    """Token (and learned position) lookup, fused into one gather: forward reads one row per token
    of each table and writes the output; backward reads dy and scatter-adds into each table's rows
    (read-modify-write). Megatron's VocabParallelEmbedding writes the full output on every TP
    rank."""
    t, tables = b * m.seq_length, 2 if m.position_embedding == "learned" else 1
    return [_vector("embed", "embedding", "embed", t, m.hidden_size, (tables + 1) * d,
                    (1 + 2 * tables) * d, m.embedding_params(), "vocab", d)]


def _mtp_input_ops(m: ModelSpec, b: int, d: int) -> list[Op]:
    """An MTP module's inputs (DeepSeek-V3 eq. 21): the next tokens' embedding (the shared table:
    no weights of its own), RMSNorm of it and of the previous depth's hidden state, and the
    projection of their concatenation (2h -> h, column-parallel as Megatron-core's eh_proj). In
    the attention block: they run before the layer's own norm and share its TP communication."""
    t, h = b * m.seq_length, m.hidden_size
    return [_vector("mtp_embed", "embedding", "attn", t, h, 2 * d, 3 * d, 0, "vocab", d),
            _norm("mtp_enorm", "attn", m, t, d), _norm("mtp_hnorm", "attn", m, t, d),
            _gemm("mtp_eh_proj", "attn", t, h, 2 * h, 2 * h * h, "column", d)]


def _head_ops(m: ModelSpec, b: int, d: int) -> list[Op]:
    """The final norm, the LM head and the loss; then, per MTP module, its own norm, the shared head
    again (no weights of its own) and its loss."""
    ops = _output_ops(m, b, d, "", 0 if m.tie_embeddings else m.vocab_size * m.hidden_size)
    for k in range(m.mtp_layers):
        ops += _output_ops(m, b, d, f"mtp{k}_", 0)
    return ops


def _output_ops(m: ModelSpec, b: int, d: int, prefix: str, head_params: int) -> list[Op]:
    t, h, v = b * m.seq_length, m.hidden_size, m.vocab_size
    return [
        _norm(f"{prefix}final_norm", "head", m, t, d),
        _gemm(f"{prefix}lm_head", "head", t, v, h, head_params, "vocab", d),
        # Megatron's vocab-parallel cross entropy (core/tensor_parallel/cross_entropy.py) runs as
        # separate fp32 passes over the logits: upcast (read 16-bit, write fp32), max, subtract the max
        # in place, exp in place, sum, divide in place (the softmax saved for backward):
        # (d + 4) + 4 + 8 + 8 + 4 + 8 = d + 32 bytes per logit. Backward: subtract the one-hot and
        # scale by the upstream gradient in place (8 + 8), cast back to the training dtype (4 + d).
        _vector(f"{prefix}loss", "loss", "head", t, v, d + 32, 20 + d, 0, "vocab", d),
    ]


def build_op_graph(model: ModelSpec, micro_batch_size: int, dtype: str = "bf16", fp8_recipe: str = "delayed",
                   attention: str = "flash", kernels: str = "fused", cross_entropy: str = "fused",
                   fp8_transpose: bool = True, te_cp: int = 0, kv_repeat: bool = False, loss_parallel: bool = False
                   ) -> OpGraph:
    """One micro-batch. ``dtype = "fp8"``: TE's FP8 (fp8.py); ``attention`` "flash-varlen": unpadding (varlen.py);
    ``kernels`` "eager", ``cross_entropy`` "torch" (``loss_parallel``: over TP): PyTorch ops (eager.py); ``te_cp``
    > 0: Megatron-Core's attention via TE (te_layout.py); ``kv_repeat``: GQA's K, V repeated for SDPA (repeat_kv.py)."""
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    model.check()
    d, b = _dtype_bytes("bf16" if dtype == "fp8" else dtype), micro_batch_size
    from . import eager, fp8, repeat_kv, te_layout, varlen  # they build on this module's Op

    def layer(ops: list[Op]) -> tuple[Op, ...]:
        out = varlen.with_unpadding(tuple(ops)) if attention == "flash-varlen" else tuple(ops)
        out = te_layout.with_layouts(out, model, attention, te_cp) if te_cp else out
        out = repeat_kv.with_repeat_kv(out, model) if kv_repeat else out
        out = eager.eager_layer(out, model) if kernels == "eager" else out
        return fp8.fp8_layer(out, fp8_recipe, fp8_transpose) if dtype == "fp8" else out
    kinds: dict = {}
    for i in range(model.num_layers):
        dense, windowed = model.has_dense_mlp(i), model.is_windowed_layer(i)
        if (dense, windowed) not in kinds:
            kinds[dense, windowed] = layer(_attention_ops(model, b, d, windowed) + _mlp_ops(model, b, d, dense=dense))
    main = next(kinds[k] for k in ((False, False), (False, True), (True, False), (True, True)) if k in kinds)
    mtp: tuple[Op, ...] = ()
    if model.mtp_layers:
        mtp = layer(_mtp_input_ops(model, b, d) + _attention_ops(model, b, d) + _mlp_ops(model, b, d))
    head = eager.eager_head(tuple(_head_ops(model, b, d)), model, kernels, cross_entropy, loss_parallel)
    return OpGraph(model, b, d, tuple(_embed_ops(model, b, d)), main, head,
                   kinds.get((True, False), ()), kinds.get((False, True), ()), kinds.get((True, True), ()), mtp)
