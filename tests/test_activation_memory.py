"""Specification of per-layer activation memory: Korthikanti et al. 2022's closed forms for GPT-3
175B, the zero-bubble split of Qi et al. 2024, and the GQA / SwiGLU / MoE / CP generalisations
checked tensor by tensor."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simulator.model.presets import MODEL_PRESETS
from simulator.model.spec import ModelSpec
from simulator.strategy.activation_memory import (activation_terms, embedding_activation_bytes,
                                                  head_activation_bytes, layer_activation_bytes,
                                                  layer_activation_split, weight_grad_bytes)

GPT3 = MODEL_PRESETS["gpt3-175b"]
S, B, H, A, T = 2048, 1, 12288, 96, 8
SBH = S * B * H
ATT = 5 * A * S / H  # 5as/h = 80 for GPT-3 175B at s = 2048


# --- Korthikanti et al. 2022, Table 2 (bytes, 16-bit activations, 1-byte masks) -----------------

@pytest.mark.parametrize("sp,recompute,per_sbh", [
    (False, "none", 10 + 24 / T + ATT / T),     # TP only
    (True, "none", (34 + ATT) / T),            # TP + SP
    (False, "selective", 10 + 24 / T),         # TP + selective recompute
    (True, "selective", 34 / T),               # TP + SP + selective recompute
    (False, "full", 2.0),                      # full recompute: the layer input
    (True, "full", 2.0 / T),                   # ... stored sequence-split with SP
])
def test_korthikanti_gpt3_175b_per_layer(sp, recompute, per_sbh):
    assert layer_activation_bytes(GPT3, B, T, sp, 1, recompute) == pytest.approx(SBH * per_sbh, rel=1e-12)


def test_unsharded_layer_is_sbh_34_plus_5as_over_h():
    assert layer_activation_bytes(GPT3, B, 1, False, 1, "none") == pytest.approx(SBH * (34 + ATT), rel=1e-12)
    assert layer_activation_bytes(GPT3, 4, 1, False, 1, "none") == pytest.approx(4 * SBH * (34 + ATT), rel=1e-12)


def test_terms_outside_tp_region_are_ten_sbh_replicated_without_sp_split_with_sp():
    tp_only = {x.name: x.bytes for x in activation_terms(GPT3, B, T, False, 1) if x.stored_at_f}
    with_sp = {x.name: x.bytes for x in activation_terms(GPT3, B, T, True, 1) if x.stored_at_f}
    outside = [n for n in tp_only if tp_only[n] != with_sp[n]]
    assert sum(tp_only[n] for n in outside) == pytest.approx(10 * SBH)
    assert sum(with_sp[n] for n in outside) == pytest.approx(10 * SBH / T)


# --- zero-bubble split (Qi et al. 2024, Table 1: W keeps 32 sbh) --------------------------------

def test_w_pass_keeps_32_sbh_for_a_gpt_layer():
    assert weight_grad_bytes(GPT3, B, 1, False, 1) == pytest.approx(32 * SBH)


@pytest.mark.parametrize("sp,recompute", [(False, "none"), (True, "selective"), (False, "full")])
def test_split_parts_sum_to_the_forward_allocation(sp, recompute):
    at_b, at_w = layer_activation_split(GPT3, B, T, sp, 1, recompute)
    assert at_b + at_w == pytest.approx(layer_activation_bytes(GPT3, B, T, sp, 1, recompute))
    assert at_w == pytest.approx(weight_grad_bytes(GPT3, B, T, sp, 1))


def test_split_unsharded_no_recompute_frees_2sbh_plus_core_at_b():
    at_b, at_w = layer_activation_split(GPT3, B, 1, False, 1, "none")
    assert at_b == pytest.approx(SBH * (2 + ATT))
    assert at_w == pytest.approx(32 * SBH)


def test_full_recompute_split_allocates_at_b():
    at_b, _ = layer_activation_split(GPT3, B, 1, False, 1, "full")
    assert at_b == pytest.approx(2 * SBH - 32 * SBH)


# --- generalisations ---------------------------------------------------------------------------

def _model(**kw) -> ModelSpec:
    base = dict(name="m", num_layers=4, hidden_size=1024, num_attention_heads=16, vocab_size=1000,
                seq_length=512)
    base.update(kw)
    return ModelSpec(**base)


def test_gqa_shrinks_k_and_v_only():
    mha, gqa = _model(), _model(num_kv_heads=4)
    tokens, kv = 512 * 2, 4 * 64
    diff = layer_activation_bytes(mha, 2, 2, True, 1, "selective") - \
        layer_activation_bytes(gqa, 2, 2, True, 1, "selective")
    assert diff == pytest.approx(2 * 2 * tokens * (1024 - kv) / 2)


def test_gqa_with_more_tp_ranks_than_kv_heads_keeps_one_kv_head_per_rank():
    gqa = _model(num_kv_heads=2)
    terms = {x.name: x.bytes for x in activation_terms(gqa, 1, 8, False, 1)}
    assert terms["k"] == terms["v"] == 2 * 512 * 64


def test_swiglu_layer_from_its_tensors():
    m = _model(mlp="swiglu", ffn_hidden_size=2816, num_kv_heads=4)  # Llama style: no dropout
    tokens, h, f, kv, t = 512, 1024, 2816, 4 * 64, 4
    outside = 2 * tokens * h * 4 / t  # two norm inputs, QKV input, fc1 input (SP)
    inside = 2 * tokens * (h / t + 2 * kv / t + h / t) + 2 * tokens * (2 * f + f) / t
    assert layer_activation_bytes(m, 1, t, True, 1, "selective") == pytest.approx(outside + inside)
    scores = 16 // t * 512 * 512
    assert layer_activation_bytes(m, 1, t, True, 1, "none") == pytest.approx(outside + inside + 2 * scores)


def test_moe_experts_hold_top_k_times_capacity_token_slots():
    dense, moe = _model(), _model(num_experts=8, moe_top_k=2, moe_capacity_factor=1.25, moe_pad_to_capacity=True)
    tokens, h, f = 512, 1024, 4096
    slots = tokens * 2 * 1.25
    expert = 2 * slots * (h + f + f + h)  # permuted input, fc1 output, fc2 input, output to combine
    router = 2 * tokens * 8
    dense_mlp = 2 * tokens * (f + f)  # fc1 output, fc2 input of the dense MLP
    diff = layer_activation_bytes(moe, 1, 1, False, 1, "selective") - \
        layer_activation_bytes(dense, 1, 1, False, 1, "selective")
    assert diff == pytest.approx(expert + router - dense_mlp)


def test_moe_expert_parallelism_does_not_change_the_slots_per_rank():
    moe = _model(num_experts=8, moe_top_k=2)
    assert layer_activation_bytes(moe, 1, 1, False, 1, "none", ep=4) == \
        layer_activation_bytes(moe, 1, 1, False, 1, "none", ep=1)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_context_parallel_divides_by_cp(recompute):
    # ring attention: local queries against the whole sequence, so the scores divide by cp too
    one = layer_activation_bytes(GPT3, B, T, True, 1, recompute)
    assert layer_activation_bytes(GPT3, B, T, True, 4, recompute) == pytest.approx(one / 4)


# --- first and last stage ---------------------------------------------------------------------

def test_embedding_keeps_its_dropout_mask():
    assert embedding_activation_bytes(GPT3, B, T, False, 1) == SBH
    assert embedding_activation_bytes(GPT3, B, T, True, 1) == SBH / T
    assert embedding_activation_bytes(_model(mlp="swiglu"), 1, 1, False, 1) == 0.0


def test_head_keeps_norm_tensors_and_fp32_logits():
    v = GPT3.vocab_size
    assert head_activation_bytes(GPT3, B, T, True, 1) == pytest.approx(4 * SBH / T + 4 * S * B * v / T)
    assert head_activation_bytes(GPT3, B, T, False, 2) == pytest.approx((4 * SBH + 4 * S * B * v / T) / 2)


def test_dropout_override_from_model_extra():
    no_drop = replace(GPT3, extra={"dropout": False})
    assert layer_activation_bytes(no_drop, B, 1, False, 1, "selective") == pytest.approx(32 * SBH)


# --- input validation -------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,match", [
    (dict(recompute="some"), "recompute"),
    (dict(tp=5), "tp = 5"),
    (dict(cp=3), "cp = 3"),
    (dict(micro_batch_size=0), "micro_batch_size"),
])
def test_bad_input_names_the_field(kwargs, match):
    args = dict(model=GPT3, micro_batch_size=1, tp=8, sp=False, cp=1, recompute="none")
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        layer_activation_bytes(**args)


def test_geglu_keeps_swiglu_tensors_and_squared_relu_gelus():
    """Gated kinds keep gate and up (2f columns); plain kinds keep f, whatever the activation."""
    def by_name(mlp):
        return {t.name: t.bytes for t in activation_terms(_model(mlp=mlp, ffn_hidden_size=2816), 1, 2, True, 1)}
    assert by_name("geglu") == by_name("swiglu")
    assert by_name("squared-relu")["fc1_output"] == by_name("swiglu")["fc1_output"] / 2


def test_mla_keeps_the_compressed_kv_of_deepseek_v2_table1():
    """DeepSeek-V2 Table 1: MLA caches d_c + d_h^R = 4.5·d_h elements per token and layer (d_c = 4·d_h =
    512, d_h^R = d_h/2 = 64 for d_h = 128). A training layer keeps that compressed KV (the KV down
    projection's output, the latent norm's input) and its normed d_c copy (the up projection's input);
    the per-head K and V it up-projects are kept like MHA's, 2·n_h·d_h per token without TP."""
    from simulator.model.spec import ModelSpec
    from simulator.strategy.activation_memory import activation_terms

    d_h, n_h = 128, 128
    v2 = ModelSpec("deepseek-v2", num_layers=60, hidden_size=5120, num_attention_heads=n_h, vocab_size=102400,
                   seq_length=4096, ffn_hidden_size=12288, mlp="swiglu", q_lora_rank=1536, kv_lora_rank=4 * d_h,
                   qk_rope_head_dim=d_h // 2, head_dim=d_h + d_h // 2, v_head_dim=d_h)
    terms = {t.name: t.bytes for t in activation_terms(v2, 1, 1, False, 1, 2)}
    tokens = 4096
    assert terms["mla_kv_latent"] == 2 * tokens * (4.5 * d_h + 4 * d_h)
    assert terms["mla_q_latent"] == 2 * tokens * 2 * 1536
    assert terms["k"] + terms["v"] == 2 * tokens * n_h * (v2.head_dim + d_h)
    # with TP 8 the latents stay whole on every rank (duplicated down projections), K and V split
    tp8 = {t.name: t.bytes for t in activation_terms(v2, 1, 8, False, 1, 2)}
    assert tp8["mla_kv_latent"] == terms["mla_kv_latent"] and tp8["k"] == terms["k"] / 8


# --- parallel attention + MLP blocks (GPT-J, GPT-NeoX) ---------------------------------------------
# Both norms read the layer input, kept once (attn_norm_input); fc1 reads the second norm's output
# (GPT-NeoX: 2sbh) or the shared norm's, already kept as QKV's input (GPT-J: nothing more); the two
# branches' dropout masks cover their partial outputs before the block's one reduction, full tensors on
# every TP rank (sbh each, not divided by SP). Against Korthikanti's 10 outside the TP region (sbh(10 +
# 24/t + 5as/(ht)) with TP only): GPT-NeoX 6/r + 2, GPT-J 4/r + 2 (r = t with SP, 1 without).

@pytest.mark.parametrize("norms,sp,recompute,per_sbh", [
    (2, False, "none", 8 + 24 / T + ATT / T),
    (2, True, "none", (30 + ATT) / T + 2),
    (2, True, "selective", 30 / T + 2),
    (1, False, "none", 6 + 24 / T + ATT / T),
    (1, True, "none", (28 + ATT) / T + 2),
    (1, False, "selective", 6 + 24 / T),
    (1, True, "full", 2 / T),  # the layer input, as a sequential block
])
def test_parallel_block_gpt3_shapes_closed_form(norms, sp, recompute, per_sbh):
    model = replace(GPT3, parallel_attn_mlp=True, parallel_norms=norms)
    assert layer_activation_bytes(model, B, T, sp, 1, recompute) == pytest.approx(SBH * per_sbh, rel=1e-12)


@pytest.mark.parametrize("norms,outside", [(2, 6), (1, 4)])
def test_parallel_block_without_dropout_keeps_its_norm_inputs_and_outputs_once(norms, outside):
    """No dropout (GPT-J, Pythia, GPT-NeoX-20B train without): outside the TP region the layer input and
    the norms' outputs, 2sbh each: 6 with two norms, 4 with one, against the sequential block's 8."""
    model = _model(mlp="gelu", dropout=False)
    seq = layer_activation_bytes(model, B, 4, True, 1, "selective")
    par = layer_activation_bytes(replace(model, parallel_attn_mlp=True, parallel_norms=norms), B, 4, True, 1,
                                 "selective")
    sbh = S // 4 * B * 1024  # seq_length 512 = S / 4
    assert seq - par == pytest.approx((8 - outside) * sbh / 4)
    names = {x.name for x in activation_terms(replace(model, parallel_attn_mlp=True, parallel_norms=norms),
                                              B, 4, True, 1)}
    assert "mlp_norm_input" not in names and ("fc1_input" in names) == (norms == 2)


@pytest.mark.parametrize("norms,per_sbh", [(2, 32), (1, 30)])
def test_parallel_block_w_pass(norms, per_sbh):
    """Qi et al. 2024 Table 1's 32sbh, less fc1's input with a shared norm (QKV's input serves both)."""
    model = replace(GPT3, parallel_attn_mlp=True, parallel_norms=norms)
    assert weight_grad_bytes(model, B, 1, False, 1) == pytest.approx(per_sbh * SBH)


# --- FP8 (Transformer Engine): the linear layers keep their inputs in FP8 ------------------------

def test_fp8_keeps_the_linear_inputs_in_one_byte_and_copies_the_attention_output():
    """GPT layer, t = 1: QKV's and fc1's norm outputs (2 sbh each) and fc2's GELU output (8 sbh) are kept
    in FP8 (half), the attention output stays BF16 for the attention's backward with an FP8 copy for
    the projection's weight gradient (+1 sbh): 34 - 1 - 1 - 4 + 1 = 29 sbh; the W pass keeps the FP8
    inputs (1 + 1 + 1 + 4) and the BF16 output gradients (18): 25 sbh against 32."""
    bf16 = layer_activation_bytes(GPT3, B, 1, False, 1, "selective")
    fp8 = layer_activation_bytes(GPT3, B, 1, False, 1, "selective", fp8=True)
    assert (bf16 / SBH, fp8 / SBH) == pytest.approx((34, 29))
    assert weight_grad_bytes(GPT3, B, 1, False, 1, fp8=True) == pytest.approx(25 * SBH)
    assert layer_activation_bytes(GPT3, B, 1, False, 1, "full", fp8=True) == pytest.approx(2 * SBH)  # the input
    names = {x.name for x in activation_terms(GPT3, B, 1, False, 1, fp8=True)}
    assert "proj_input_fp8" in names and "proj_input" in names
