"""Activation memory of one transformer layer (and of the embedding / LM head) per micro-batch on
one rank, derived tensor by tensor from the layer's forward graph (Korthikanti et al. 2022, sec. 4).

The lowering puts these bytes on a micro-batch's F task (+) and its B (or B and W) task (-), so the
per-rank peak comes from the simulated schedule; the paper's closed forms are the tests.
"""

from __future__ import annotations

from ..model.eager import is_loss_parallel
from ..model.spec import ModelSpec
from ..units import DTYPE_BYTES
from .saved_tensors import ActivationTerm, eager_saved, fp8_saved_inputs, repeated_kv_saved

# "selective-op": torchtitan's per-op selective activation checkpointing (``SelectiveAC``,
# ``selective_ac_option = "op"``, strategy/recompute.py): a layer keeps its input, the outputs of the
# odd-numbered matmuls of its forward and the attention's output, and re-runs everything else.
RECOMPUTE_MODES = ("none", "selective", "full", "selective-op")
# Megatron-Core's selective recompute (TransformerConfig.recompute_modules, megatron/core/transformer/
# transformer_config.py; default ["core_attn"]): the submodules whose activations are recomputed. Each
# drops the ActivationTerms tagged with it (``ActivationTerm.modules``) and re-runs their ops before
# their backward (strategy/recompute.py).
RECOMPUTE_MODULES = ("core_attn", "mla_up_proj", "moe_act", "layernorm", "mlp", "moe", "shared_experts")
DEFAULT_RECOMPUTE_MODULES = ("core_attn",)
MASK_BYTES = 1  # dropout masks are stored as uint8 (Korthikanti et al. 2022, sec. 4.1)
LOGITS_BYTES = DTYPE_BYTES["fp32"]  # Megatron-LM casts logits to fp32 for the vocab-parallel cross entropy
# F.cross_entropy's backward (training.cross_entropy "torch"): fp32 logit-sized tensors it allocates beside
# the saved log-softmax output. Whole vocabulary (TP 1): nll_loss_backward's zero-filled gradient, then
# _log_softmax_backward_data's output, two at once. Loss parallel (model/eager.is_loss_parallel):
# torch/distributed/tensor/parallel/loss.py _nll_loss_and_log_softmax_backward
# computes both in ``(grad_input + torch.exp(x)) * grad_output`` over ``grad_input = torch.zeros_like(x)``:
# the zeros, exp(x) and their sum alive at the add, the zeros, the sum and the product at the multiply.
TORCH_LOSS_BACKWARD_TENSORS = 2
LOSS_PARALLEL_BACKWARD_TENSORS = 3


def standalone_norms(model: ModelSpec, moe_layer: bool) -> tuple[bool, bool]:
    """(input norm, pre-MLP norm): whether Megatron-Core's Transformer Engine layer spec builds the
    norm as a module of its own, whose output "layernorm" recompute discards (transformer_layer.py
    recomputes them only ``if not isinstance(..., IdentityOp)``). gpt_layer_specs.py
    get_gpt_layer_with_transformer_engine_submodules: the input norm is TENorm with MLA (its output
    feeds the two down projections; mla_down_proj_fusion, off by default, would fuse it) and fused
    into linear_qkv (TELayerNormColumnParallelLinear, input_layernorm = IdentityOp) otherwise; the
    pre-MLP norm is TENorm in MoE layers (router, shared experts and dispatcher read it) and fused
    into the dense MLP's linear_fc1 otherwise."""
    return model.is_mla, moe_layer


def has_dropout(model: ModelSpec) -> bool:
    """GPT-style models (GELU MLP) train with dropout 0.1 after attention, the attention
    projection and the MLP (Brown et al. 2020; Megatron-LM defaults), so they store uint8 masks.
    Llama-style models (SwiGLU) train without dropout (Touvron et al. 2023), so no masks: PyTorch's
    dropout with p = 0 returns its input. ``ModelSpec.dropout`` says which (derived from ``mlp``
    unless set, e.g. from a config.json's dropout probabilities); ``model.extra["dropout"]`` (a
    bool) overrides it."""
    flag = model.extra.get("dropout") if model.extra else None
    return bool(flag) if flag is not None else bool(model.dropout)


def _check(model: ModelSpec, micro_batch_size: int, tp: int, cp: int, ep: int, dtype_bytes: int) -> None:
    for name, value in (("micro_batch_size", micro_batch_size), ("tp", tp), ("cp", cp), ("ep", ep),
                        ("dtype_bytes", dtype_bytes)):
        if value < 1:
            raise ValueError(f"activation memory: {name} must be >= 1, got {value}")
    if model.num_attention_heads % tp:
        raise ValueError(f"activation memory: tp = {tp} does not divide num_attention_heads = "
                         f"{model.num_attention_heads}")
    if model.seq_length % cp:
        raise ValueError(f"activation memory: cp = {cp} does not divide seq_length = {model.seq_length}")
    if model.num_experts % ep:
        raise ValueError(f"activation memory: ep = {ep} does not divide num_experts = {model.num_experts}")


def activation_terms(model: ModelSpec, micro_batch_size: int, tp: int, sp: bool, cp: int,
                     dtype_bytes: int = 2, ep: int = 1, dense_mlp: bool = False,
                     etp: int = 0, fp8: bool = False, eager: bool = False,
                     kv_repeat: bool = False) -> list[ActivationTerm]:
    """Every tensor one layer keeps from its forward to its backward, bytes on one rank.

    Notation of Korthikanti et al. 2022 (sec. 4.1): T = (s/cp)*b local tokens, h hidden, f the MLP
    width, a heads, t = tp. Tensors outside the tensor-parallel region (norm inputs, the inputs of
    the column-parallel GEMMs, the residual dropout masks) are replicated on the t ranks with TP only
    and split along the sequence with sequence parallelism (sec. 4.2.2): divided by r = t with SP,
    r = 1 without. Tensors inside the region (Q, K, V, the attention context, the MLP intermediates,
    the attention scores) are split over heads / columns: divided by t. With a GPT layer
    (f = 4h, dropout) the non-core terms sum to 10 + 24/t (x sbh) and the core terms to 5as/(ht),
    i.e. sbh(34 + 5as/h) unsharded, eq. 1-2 of the paper.

    Generalisations, each from the layer's tensors rather than by scaling:
    GQA: K and V have num_kv_heads * head_dim columns (max(kv_heads/t, 1) heads per rank).
    SwiGLU: the first MLP GEMM outputs gate and up (2f columns) and both feed the gated product,
    whose output (f columns) is the second GEMM's input: 6Tf/t bytes/2 instead of GELU's 4Tf/t.
    MoE: each token is sent to top_k experts; an EP rank receives on average T*top_k token-slots
    (x cf padded to capacity, ``ModelSpec.moe_mean_load``) (its own tokens' share of all experts: with balanced routing the tokens a
    rank sends equal the slots it receives, so ep does not divide them). Expert tensors follow the
    dense rule (expert tensor parallelism = tp, Megatron-Core's default). The router adds its logits.
    With MoE parallel folding (expert TP etp != tp, SP) a rank's expert tensors hold its own tokens'
    slots times etp (the expert-TP all-gather), over ffn/etp columns (``sharding._expert_tokens``).
    CP: the sequence is split over cp ranks, and ring attention scores local queries against the
    whole sequence: (s/cp) x s scores per head.
    ``dense_mlp``: one of an MoE model's dense layers (ModelSpec.has_dense_mlp), whose
    MLP is the dense ffn_hidden_size one. Parallel attention + MLP blocks: ``_mlp_input_terms``.

    Each term names the selective-recompute modules that do not keep it (``ActivationTerm.modules``;
    Megatron-Core megatron/core/transformer/): "core_attn" the attention core's internals (attention.py
    checkpoint_core_attention: a tensor_parallel.checkpoint that keeps its q, k, v inputs); "mla_up_proj"
    the up-projected, RoPE-applied q, k, v (multi_latent_attention.py recompute_up_proj: a
    CheckpointWithoutOutput over the up projections and RoPE whose outputs are discarded after the core
    attention and recomputed in its backward; the latents, its inputs, stay); "moe_act" the experts'
    activation output, fc2's input (moe/experts.py TEGroupedMLP activation_recompute); "layernorm" the
    output of a norm that is a module of its own (``standalone_norms``; transformer_layer.py
    input_layernorm_checkpoint / pre_mlp_norm_checkpoint); "mlp" a dense MLP's tensors after its input
    (transformer_layer.py recompute_mlp, a checkpoint of the MLP module, whose TE linear_fc1 holds the
    norm); "moe" the MoE layer's tensors after its input, the pre-MLP norm's output (moe/moe_layer.py
    moe_layer_recompute); "shared_experts" the shared experts' tensors after their input (moe_layer.py
    shared_experts_recompute).
    """
    _check(model, micro_batch_size, tp, cp, ep, dtype_bytes)
    d = dtype_bytes
    tokens = model.seq_length // cp * micro_batch_size
    h, r = model.hidden_size, tp if sp else 1
    drop = has_dropout(model)
    terms = _attention_terms(model, micro_batch_size, tp, r, cp, d, drop, model.is_moe and not dense_mlp)
    if model.is_moe and not dense_mlp:
        terms += _moe_terms(model, d, tokens, tp, r, etp or tp, sp, ep)
    else:
        terms += _mlp_terms("", d, tokens, h, model.ffn_hidden_size, tp, r, model.gated_mlp, ("mlp",))
    if drop:  # a parallel block's MLP branch: before the reduction (_mlp_input_terms)
        terms.append(ActivationTerm("mlp_dropout_mask", MASK_BYTES * tokens * h / (1 if model.parallel_attn_mlp else r)))
    terms = eager_saved(terms, model, d) if eager else terms
    terms = terms + repeated_kv_saved(terms, model) if kv_repeat else terms
    return fp8_saved_inputs(terms, d) if fp8 else terms


def _attention_terms(model: ModelSpec, micro_batch_size: int, t: int, r: int, cp: int, d: int,
                     drop: bool, moe_layer: bool) -> list[ActivationTerm]:
    """The attention block's tensors and the MLP block's inputs (see ``activation_terms``)."""
    s_local = model.seq_length // cp
    tokens = s_local * micro_batch_size
    h = model.hidden_size
    heads = model.num_attention_heads // t
    kv_cols = model.head_dim * max(model.num_kv_heads // t, 1)
    v_cols = model.v_head_dim * max(model.num_kv_heads // t, 1)
    scores = heads * s_local * model.seq_length * micro_batch_size  # elements, per rank

    T = ActivationTerm
    attn_norm, mlp_norm = standalone_norms(model, moe_layer)
    # a dense MLP's norm is inside its checkpointed module (TE linear_fc1), see standalone_norms
    fc1_in = ("layernorm",) if mlp_norm else () if moe_layer else ("mlp",)
    up = ("mla_up_proj",) if model.is_mla else ()  # the attention's inputs: after MLA's up projections + RoPE
    terms = [
        T("attn_norm_input", d * tokens * h / r),  # the layer input: all full recompute keeps
        # norm output, X of the QKV GEMM (MLA: of the down projections)
        T("qkv_input", d * tokens * h / r, ("layernorm",) if attn_norm else (), weight_grad=True),
        T("q", d * tokens * model.q_size / t, up),
        T("k", d * tokens * kv_cols, up),
        T("v", d * tokens * v_cols, up),
        T("softmax_output", d * scores, ("core_attn",)),
    ]
    if model.is_mla:
        # MLA (DeepSeek-V2 §2.1.2): the duplicated down projections' outputs (norm inputs) and the
        # normed latents (inputs of the up projections), on every TP rank for the gathered tokens.
        # The KV down projection's output is the compressed c^KV with the shared RoPE key k^R, the
        # d_c + d_h^R elements per token that MLA caches (DeepSeek-V2 Table 1); its normed c^KV (d_c)
        # feeds the up projection
        terms.append(T("mla_kv_latent", d * tokens * (model.kv_cache_elements_per_token_per_layer()
                                                      + model.kv_lora_rank), weight_grad=True))
        terms.append(T("mla_q_latent", d * tokens * 2 * model.q_lora_rank, weight_grad=True))
    if drop:
        terms += [T("attn_dropout_mask", MASK_BYTES * scores, ("core_attn",)),
                  T("attn_dropout_output", d * scores, ("core_attn",))]
    terms += [T("proj_input", d * tokens * model.attn_out_size / t, weight_grad=True)]
    terms += _mlp_input_terms(model, d, tokens, r, drop, fc1_in)
    # Output gradients of the attention GEMMs, created by B and kept for W. A row-parallel GEMM's
    # output gradient is the full (s/cp) x b x h tensor on every TP rank (the backward of its
    # all-reduce, or of SP's reduce-scatter, is an identity / all-gather), so it is not divided.
    terms += [T("qkv_output_grad", d * tokens * (model.q_size / t + 2 * kv_cols), weight_grad=True, stored_at_f=False),
              T("proj_output_grad", d * tokens * h, weight_grad=True, stored_at_f=False)]
    return terms


def _mlp_input_terms(model: ModelSpec, d: int, tokens: int, r: int, drop: bool,
                     fc1_in: tuple[str, ...]) -> list[ActivationTerm]:
    """The tensors between the attention and the MLP. A sequential block keeps the attention's residual
    dropout mask, the residual stream after it (the pre-MLP norm's input) and the norm's output, fc1's
    (and the router's) input. In a parallel block (``ModelSpec.parallel_attn_mlp``) both norms read the
    layer input, kept once as attn_norm_input; fc1 reads the second norm's output (GPT-NeoX) or the
    shared norm's, kept once as qkv_input (GPT-J); the attention branch's dropout mask covers its
    partial output before the block's one reduction, a full tensor on every TP rank (GPT-NeoX)."""
    T, h, parallel = ActivationTerm, model.hidden_size, model.parallel_attn_mlp
    out = [T("attn_residual_dropout_mask", MASK_BYTES * tokens * h / (1 if parallel else r))] if drop else []
    if not parallel:
        out.append(T("mlp_norm_input", d * tokens * h / r))
    if model.norms_per_layer != 1:
        out.append(T("fc1_input", d * tokens * h / r, fc1_in, weight_grad=True))
    return out


def _moe_terms(model: ModelSpec, d: int, tokens: int, t: int, r: int, etp: int, sp: bool,
               ep: int) -> list[ActivationTerm]:
    """The MoE block's tensors: router logits, the experts' MLP tensors over the token slots (of the
    busiest EP rank, ``ModelSpec.moe_rank_slots_per_token``), the expert outputs kept for the
    combine, and the shared experts' (see ``activation_terms``)."""
    T = ActivationTerm
    h, gated = model.hidden_size, model.gated_mlp
    slots = tokens * model.moe_rank_slots_per_token(model.num_experts // ep)
    moe, act = ("moe",), ("moe_act",)  # the MoE layer's checkpoint; the experts' activation (fc2's input)
    terms = [T("router_logits", d * tokens * model.num_experts / r, moe),
             T("router_logits_grad", d * tokens * model.num_experts / r, weight_grad=True, stored_at_f=False)]
    if etp != t and (sp or t == 1):  # folded expert TP: own tokens' slots x etp, over ffn/etp columns
        expert = _mlp_terms("expert_", d, slots / t * etp, h, model.moe_ffn_hidden_size, etp, etp, gated, moe, act)
    else:
        expert = _mlp_terms("expert_", d, slots, h, model.moe_ffn_hidden_size, t, r, gated, moe, act)
    terms += expert
    terms.append(T("expert_output", d * slots * h / r, moe))  # kept to weight the combine by the router probs
    if model.moe_shared_expert_ffn_hidden_size:  # shared experts read fc1_input like a dense MLP
        terms += [x for x in _mlp_terms("shared_", d, tokens, h, model.moe_shared_expert_ffn_hidden_size,
                                        t, r, gated, ("shared_experts",) + moe) if x.name != "shared_fc1_input"]
    return terms


def _mlp_terms(prefix: str, d: int, tokens: float, h: int, f: int, t: int, r: int, gated: bool,
               inner: tuple[str, ...], act: tuple[str, ...] = ()) -> list[ActivationTerm]:
    """An MLP's tensors; ``inner``: the recompute modules that keep none of them but its input (a
    checkpoint of the MLP), ``act``: those that discard the activation output only."""
    T = ActivationTerm
    fc1_cols = (2 if gated else 1) * f  # SwiGLU: gate and up projections
    out = []
    if prefix:  # experts: the permuted token copies are the GEMM input (dense: fc1_input above)
        out.append(T(prefix + "fc1_input", d * tokens * h / r, inner, weight_grad=True))
    out += [
        T(prefix + "fc1_output", d * tokens * fc1_cols / t, inner),  # GELU / SwiGLU input
        T(prefix + "fc2_input", d * tokens * f / t, act + inner, weight_grad=True),  # activation output
        T(prefix + "fc1_output_grad", d * tokens * fc1_cols / t, weight_grad=True, stored_at_f=False),
        T(prefix + "fc2_output_grad", d * tokens * h, weight_grad=True, stored_at_f=False),
    ]
    return out


def _check_recompute(recompute: str) -> None:
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"parallelism.recompute must be one of {RECOMPUTE_MODES}, got {recompute!r}")


def layer_activation_bytes(model: ModelSpec, micro_batch_size: int, tp: int, sp: bool, cp: int,
                           recompute: str, dtype_bytes: int = 2, ep: int = 1, attention: str = "unfused",
                           dense_mlp: bool = False, etp: int = 0,
                           modules: tuple[str, ...] = DEFAULT_RECOMPUTE_MODULES, fp8: bool = False,
                           eager: bool = False, kv_repeat: bool = False) -> float:
    """Bytes one transformer layer keeps for one micro-batch on one rank until its backward.

    none: every forward tensor (Korthikanti et al. 2022: sbh(34 + 5as/h) unsharded, sbh(10 + 24/t +
    5as/(ht)) with TP only, sbh/t (34 + 5as/h) with TP + SP, Table 2). selective: the terms of the
    recompute ``modules`` are dropped (``activation_terms``); with the default ["core_attn"] the
    attention core, the 5as^2b term (sec. 5: sbh(10 + 24/t), or 34 sbh/t with SP). full:
    only the layer input is kept, 2sbh (2sbh/t with SP, where Megatron stores it sequence-split).
    attention = "flash": FlashAttention never stores the s x s scores, softmax output or dropout mask
    (it recomputes them blockwise in the backward, Dao et al. 2022 §3.1), so the core terms are
    dropped exactly as selective recompute drops them.
    """
    _check_recompute(recompute)
    terms = activation_terms(model, micro_batch_size, tp, sp, cp, dtype_bytes, ep, dense_mlp, etp, fp8, eager,
                             kv_repeat)
    if recompute == "full":
        return next(x.bytes for x in terms if x.name == "attn_norm_input")
    if recompute == "selective-op":
        return op_sac_saved_bytes(terms, model, tp)
    dropped = set(modules) if recompute == "selective" else set()
    if attention != "unfused":  # fused kernels keep no s^2 scores
        dropped.add("core_attn")
    return sum(x.bytes for x in terms if x.stored_at_f and not dropped.intersection(x.modules))


def op_sac_saved_bytes(terms: list[ActivationTerm], model: ModelSpec, tp: int = 1) -> float:
    """What torchtitan's per-op SAC keeps of a dense layer (torchtitan distributed/activation_checkpoint.py
    ``SelectiveAC``: MUST_SAVE for the ops of ``_get_default_save_ops``, matmuls and attention among
    them, "except every second mm"; everything else PREFER_RECOMPUTE; the wrapper keeps the block's
    input). Its matmuls count in forward order q, k, v, output projection, then the MLP's (gate, up,
    down; or up, down), so the kept outputs are q, v, the gate's (the up projection's without a gate)
    and, with a gate, the down projection's: the layer input, q, v, the attention output (the
    projection's input), half the gated fc1 output (all of an ungated one) and an h-wide fc2 output.
    With TP (sequence-parallel, torchtitan's plan) the saved reduce-scatters keep the attention's and the
    MLP's sequence-split outputs, and fc2's output is the sequence's partial sum: tp x the layer input."""
    by_name = {x.name: x.bytes for x in terms}
    x = by_name["attn_norm_input"]  # [tokens, h] (tokens / tp under SP): the layer input
    fc1 = by_name["fc1_output"] / 2 if model.gated_mlp else by_name["fc1_output"]
    reduce_scatters = 2 * x if tp > 1 else 0.0
    fc2 = x * tp if model.gated_mlp else 0.0
    return x + by_name["q"] + by_name["v"] + by_name["proj_input"] + fc1 + fc2 + reduce_scatters


def weight_grad_bytes(model: ModelSpec, micro_batch_size: int, tp: int, sp: bool, cp: int,
                      dtype_bytes: int = 2, ep: int = 1, dense_mlp: bool = False, etp: int = 0,
                      fp8: bool = False, eager: bool = False, kv_repeat: bool = False) -> float:
    """Bytes the W pass of one layer needs: each weight GEMM's input X and output gradient dY.
    For a GPT layer with t = 1 this is 32sbh, Qi et al. 2024 Table 1 (X: 2+2+2+8, dY: 6+2+8+2)."""
    terms = activation_terms(model, micro_batch_size, tp, sp, cp, dtype_bytes, ep, dense_mlp, etp, fp8, eager,
                             kv_repeat)
    return sum(x.bytes for x in terms if x.weight_grad)


def layer_activation_split(model: ModelSpec, micro_batch_size: int, tp: int, sp: bool, cp: int,
                           recompute: str, dtype_bytes: int = 2, ep: int = 1,
                           attention: str = "unfused", dense_mlp: bool = False, etp: int = 0,
                           modules: tuple[str, ...] = DEFAULT_RECOMPUTE_MODULES,
                           fp8: bool = False, eager: bool = False, kv_repeat: bool = False) -> tuple[float, float]:
    """(freed at B, freed at W) for schedules that split the backward (zero-bubble).

    F allocates ``layer_activation_bytes``. B consumes what only the input gradient needs and
    allocates the output gradients dY the W pass needs; what stays until W is ``weight_grad_bytes``
    (the weight GEMMs' inputs X and their dY, Qi et al. 2024 Table 1: 32sbh for a GPT layer). The
    two parts sum to the F allocation. The B part is negative (B allocates more than it frees) when
    little was stored at F, e.g. with full recompute, where B recomputes the forward and must then
    keep X and dY for W; the lowering applies a negative "freed" amount as an allocation at B.
    """
    total = layer_activation_bytes(model, micro_batch_size, tp, sp, cp, recompute, dtype_bytes, ep, attention,
                                   dense_mlp, etp, modules, fp8, eager, kv_repeat)
    at_w = weight_grad_bytes(model, micro_batch_size, tp, sp, cp, dtype_bytes, ep, dense_mlp, etp, fp8, eager,
                             kv_repeat)
    return total - at_w, at_w


def embedding_activation_bytes(model: ModelSpec, micro_batch_size: int, tp: int, sp: bool, cp: int,
                               dtype_bytes: int = 2) -> float:
    """First stage, per micro-batch: the embedding backward needs only the token ids (input data,
    not counted); the dropout after the embedding keeps a uint8 mask of sbh (sbh/t with SP),
    Korthikanti et al. 2022 sec. 4.3. Zero for models trained without dropout."""
    _check(model, micro_batch_size, tp, cp, 1, dtype_bytes)
    if not has_dropout(model):
        return 0.0
    r = tp if sp else 1
    return MASK_BYTES * (model.seq_length // cp) * micro_batch_size * model.hidden_size / r


def head_activation_bytes(model: ModelSpec, micro_batch_size: int, tp: int, sp: bool, cp: int,
                          dtype_bytes: int = 2) -> float:
    """Last stage, per micro-batch: the final norm's input and output (the LM-head GEMM's input),
    2sbh each (/t with SP), plus the logits the loss keeps: Megatron-LM computes the vocab-parallel
    cross entropy in fp32 (``output.float()``), keeping the fp32 softmax of s x b x V/t entries,
    4sbV/t bytes (Korthikanti et al. 2022 sec. 4.3). The 16-bit logits die once cast."""
    _check(model, micro_batch_size, tp, cp, 1, dtype_bytes)
    tokens = (model.seq_length // cp) * micro_batch_size
    r = tp if sp else 1
    return 2 * dtype_bytes * tokens * model.hidden_size / r + LOGITS_BYTES * tokens * model.vocab_size / tp


def loss_backward_bytes(model: ModelSpec, micro_batch_size: int, tp: int, cp: int, cross_entropy: str) -> float:
    """Last stage, per micro-batch: what the loss's backward allocates beside the fp32 logit-sized tensor
    the loss keeps (``head_activation_bytes``). Megatron-Core's vocab-parallel cross entropy writes the
    gradient over its saved softmax (``VocabParallelCrossEntropy``): nothing. PyTorch's
    ``F.cross_entropy`` on fp32 logits (log_softmax, then nll_loss) saves the log-softmax output, and
    its backward allocates nll_loss's gradient and then log_softmax's, two more fp32 logit-sized
    tensors alive at once (torch/csrc/autograd: each backward node returns a new tensor); with loss
    parallel (DTensor, vocabulary sharded over TP) each is V/t wide, and the fused backward of its
    handlers holds three (LOSS_PARALLEL_BACKWARD_TENSORS)."""
    if cross_entropy == "fused":
        return 0.0
    tokens = (model.seq_length // cp) * micro_batch_size
    tensors = LOSS_PARALLEL_BACKWARD_TENSORS if is_loss_parallel(cross_entropy, tp) else TORCH_LOSS_BACKWARD_TENSORS
    return tensors * LOGITS_BYTES * tokens * model.vocab_size / tp
