"""The operator graph of one micro-batch: parameters, FLOPs (Narayanan eq. 3) and bytes."""

import pytest

from simulator.model.opgraph import build_op_graph
from simulator.model.presets import MODEL_PRESETS
from simulator.model.spec import ModelSpec

SMALL_GPT = ModelSpec("small-gpt", num_layers=3, hidden_size=64, num_attention_heads=4,
                      vocab_size=1000, seq_length=128)
SMALL_LLAMA = ModelSpec("small-llama", num_layers=2, hidden_size=64, num_attention_heads=8,
                        num_kv_heads=2, ffn_hidden_size=160, vocab_size=500, seq_length=32,
                        mlp="swiglu")
SMALL_MOE = ModelSpec("small-moe", num_layers=2, hidden_size=64, num_attention_heads=8,
                      num_kv_heads=2, ffn_hidden_size=96, vocab_size=500, seq_length=32,
                      mlp="swiglu", num_experts=4, moe_top_k=2)


def op(ops, name):
    return next(o for o in ops if o.name == name)


@pytest.mark.parametrize("name", sorted(MODEL_PRESETS))
def test_params_summed_over_ops_match_spec(name):
    m = MODEL_PRESETS[name]
    assert build_op_graph(m, 1).num_params() == m.num_params()


def test_gpt3_175b_params_narayanan_eq2():
    m = MODEL_PRESETS["gpt3-175b"]
    l, h, v, s = m.num_layers, m.hidden_size, m.vocab_size, m.seq_length
    eq2 = 12 * l * h * h * (1 + 13 / (12 * h) + (v + s) / (12 * l * h))
    assert build_op_graph(m, 1).num_params() == pytest.approx(eq2, rel=1e-3)
    assert build_op_graph(m, 1).num_params() / 1e9 == pytest.approx(174.6, rel=1e-3)


def test_llama3_8b_params():
    g = build_op_graph(MODEL_PRESETS["llama3-8b"], 1)
    assert g.num_params() / 1e9 == pytest.approx(8.03, rel=1e-3)


@pytest.mark.parametrize("b", [1, 3])
def test_gpt_forward_flops_closed_form(b):
    """Korthikanti 2022 / Narayanan 2021 eq. 3 (÷4: forward only, no recompute)."""
    m = SMALL_GPT
    g = build_op_graph(m, b)
    l, h, s, v = m.num_layers, m.hidden_size, m.seq_length, m.vocab_size
    assert g.fwd_flops() == pytest.approx(
        24 * b * s * l * h * h * (1 + s / (6 * h)) + 2 * b * s * h * v, rel=1e-12)
    assert g.bwd_flops() == 2 * g.fwd_flops()


def test_gpt_forward_flops_is_2_params_tokens_plus_attention():
    m, b = SMALL_GPT, 2
    g = build_op_graph(m, b)
    t, h, l = b * m.seq_length, m.hidden_size, m.num_layers
    # matmul weights: all parameters but biases, norms and the position table (the tied word
    # embedding is the LM head's matrix)
    biases_norms = l * (13 * h) + 2 * h
    matmul_params = m.num_params() - biases_norms - m.seq_length * h
    attention = l * 4 * b * m.seq_length ** 2 * h
    assert g.fwd_flops() == 2 * matmul_params * t + attention


def test_llama_gqa_swiglu_flops_and_shapes():
    m, b = SMALL_LLAMA, 2
    g = build_op_graph(m, b)
    t, h, kv, f = b * m.seq_length, 64, 2 * 8, 160
    qkv = op(g.layer, "qkv")
    assert qkv.shape == (t, h + 2 * kv, h) and qkv.params == h * (h + 2 * kv)
    fc1, fc2 = op(g.layer, "fc1"), op(g.layer, "fc2")
    assert fc1.shape == (t, 2 * f, h) and fc2.shape == (t, h, f)  # gate+up fused, then down
    per_layer = 2 * t * (h * (h + 2 * kv) + h * h + 3 * h * f) + 4 * b * m.seq_length ** 2 * h
    assert g.fwd_flops() == m.num_layers * per_layer + 2 * t * h * m.vocab_size
    # 6·N·T + attention, N = non-embedding matmul params + LM head
    n = m.num_params() - m.vocab_size * h - (2 * m.num_layers + 1) * h
    attention = m.num_layers * 4 * b * m.seq_length ** 2 * h
    assert g.fwd_flops() + g.bwd_flops() == 6 * n * t + 3 * attention
    att = op(g.layer, "attn_core")
    assert att.shape == (b, 8, 32, 32, 8) and att.kv_heads == 2 and att.tp_split == "heads"
    assert [o.name for o in g.layer] == ["ln1", "qkv", "rope", "attn_core", "attn_out",
                                         "attn_residual", "ln2", "fc1", "act", "fc2",
                                         "mlp_residual"]


def test_backward_split_gemm_equal_halves_attention_all_input():
    g = build_op_graph(SMALL_LLAMA, 1)
    for o in g.layer + g.head:
        if o.kind == "gemm":
            assert o.bwd_input_flops == o.bwd_weight_flops == o.fwd_flops > 0
            assert o.bwd_bytes == 2 * o.fwd_bytes
        elif o.kind == "attention":
            assert o.bwd_input_flops == 2 * o.fwd_flops and o.bwd_weight_flops == 0
        else:
            assert o.fwd_flops == o.bwd_input_flops == o.bwd_weight_flops == 0


def test_gemm_bytes_compulsory_traffic():
    g = build_op_graph(SMALL_GPT, 1, "bf16")
    m, n, k = op(g.layer, "fc1").shape
    assert op(g.layer, "fc1").fwd_bytes == 2 * (m * k + k * n + m * n)
    g32 = build_op_graph(SMALL_GPT, 1, "fp32")
    assert op(g32.layer, "fc1").fwd_bytes == 2 * op(g.layer, "fc1").fwd_bytes


def test_attention_bytes_gqa():
    m, b = SMALL_LLAMA, 2
    a = op(build_op_graph(m, b).layer, "attn_core")
    q, kv = b * 32 * 64, b * 32 * 16
    assert a.fwd_bytes == 2 * (2 * q + 2 * kv) and a.bwd_bytes == 2 * (4 * q + 4 * kv)


def test_moe_ops():
    m, b = SMALL_MOE, 2
    g = build_op_graph(m, b)
    t, h, f, e, k = b * 32, 64, 96, 4, 2
    router, fc1, fc2 = op(g.layer, "router"), op(g.layer, "expert_fc1"), op(g.layer, "expert_fc2")
    assert router.shape == (t, e, h) and router.tp_split == "sequence" and router.params == h * e
    assert fc1.shape == (t * k, 2 * f, h) and fc1.experts == e and fc1.tp_split == "expert"
    assert fc2.shape == (t * k, h, f) and fc2.params == e * f * h
    assert fc1.fwd_bytes == 2 * (t * k * h + e * h * 2 * f + t * k * 2 * f)  # all experts' weights
    assert op(g.layer, "expert_act").shape == (t * k, f)
    # MoE forward FLOPs: 2·T·(active matmul params) — top_k experts per token
    active = h * (h + 2 * 16) + h * h + h * e + k * 3 * h * f
    attn = 4 * b * 32 ** 2 * h
    assert g.fwd_flops() == m.num_layers * (2 * t * active + attn) + 2 * t * h * m.vocab_size
    assert g.num_params() == m.num_params()


def test_moe_capacity_factor_pads_rows_only_when_padding_to_capacity():
    def rows(**kw):
        m = ModelSpec("cf", num_layers=1, hidden_size=64, num_attention_heads=8, vocab_size=100,
                      seq_length=10, mlp="swiglu", ffn_hidden_size=96, num_experts=4, moe_top_k=1, **kw)
        fc1 = op(build_op_graph(m, 1).layer, "expert_fc1")
        return fc1.shape[0], fc1.expert_load
    assert rows(moe_capacity_factor=1.25, moe_pad_to_capacity=True) == (13, (1.0, 1.0))  # ceil(1.25·10·1)
    assert rows(moe_capacity_factor=1.25) == (10, (1.0, 1.0))  # dropping: at most the routed slots
    assert rows(moe_capacity_factor=0.5) == (5, (1.0, 1.0))  # half the slots dropped
    assert rows() == (10, (1.0, 1.0))  # dropless (Megatron-core's default)
    # the busiest expert takes 1.5x the mean dropless, at most its capacity when dropping
    assert rows(moe_load_imbalance=1.5) == (10, (1.5, 2.5 / 3))  # the other 3 share the remaining 2.5
    assert rows(moe_load_imbalance=1.5, moe_capacity_factor=1.25) == (10, (1.25, 2.5 / 3))
    assert rows(moe_load_imbalance=1.5, moe_capacity_factor=1.25, moe_pad_to_capacity=True)[1] == (1.0, 1.0)


def test_embedding_and_head():
    m, b = SMALL_GPT, 2
    g = build_op_graph(m, b)
    (emb,) = g.embed
    assert emb.kind == "embedding" and emb.fwd_flops == 0 and emb.fwd_bytes > 0
    assert emb.params == m.vocab_size * 64 + 128 * 64
    assert [o.name for o in g.head] == ["final_norm", "lm_head", "loss"]
    head = op(g.head, "lm_head")
    assert head.shape == (b * 128, 1000, 64) and head.params == 0  # tied: weights live in embed
    assert head.fwd_flops == 2 * b * 128 * 1000 * 64 and head.tp_split == "vocab"
    untied = build_op_graph(SMALL_LLAMA, 1)
    assert op(untied.head, "lm_head").params == 500 * 64


def test_residual_dropout_only_for_gpt_style():
    gpt = op(build_op_graph(SMALL_GPT, 1).layer, "attn_residual")
    llama = op(build_op_graph(SMALL_LLAMA, 1).layer, "attn_residual")
    # backward: dropout's (read dy and the mask, write dx) plus autograd's sum of the residual
    # stream's two gradients (read 2, write 1)
    assert gpt.fwd_bytes == 128 * 64 * (3 * 2 + 1) and gpt.bwd_bytes == 128 * 64 * (2 * 2 + 1 + 3 * 2)
    assert llama.fwd_bytes == 32 * 64 * 3 * 2 and llama.bwd_bytes == 32 * 64 * 3 * 2


def test_every_op_is_well_formed():
    for model in (SMALL_GPT, SMALL_LLAMA, SMALL_MOE):
        g = build_op_graph(model, 1)
        for o in g.embed + g.layer + g.head:
            assert o.kind in ("gemm", "attention", "elementwise", "norm", "softmax", "embedding",
                              "loss")
            assert o.fwd_bytes > 0 and o.params >= 0
            assert len(o.shape) == {"gemm": 3, "attention": 5}.get(o.kind, 2)


@pytest.mark.parametrize("kw, msg", [
    (dict(micro_batch_size=0), "micro_batch_size"),
    (dict(micro_batch_size=1, dtype="int3"), "dtype"),
])
def test_bad_input(kw, msg):
    with pytest.raises(ValueError, match=msg):
        build_op_graph(SMALL_GPT, **kw)


def test_bad_model_shapes():
    bad_kv = ModelSpec("x", num_layers=1, hidden_size=64, num_attention_heads=8, num_kv_heads=3,
                       vocab_size=10, seq_length=8)
    with pytest.raises(ValueError, match="num_kv_heads 3"):
        build_op_graph(bad_kv, 1)
    bad_h = ModelSpec("x", num_layers=1, hidden_size=65, num_attention_heads=8, vocab_size=10,
                      seq_length=8)
    with pytest.raises(ValueError, match="hidden_size 65"):
        build_op_graph(bad_h, 1)


@pytest.mark.parametrize("mlp, fc1_width, act_bytes", [
    ("squared-relu", 160, (2 * 2, 3 * 2)),  # one h -> f GEMM, relu(x)^2 reads x, writes y
    ("geglu", 320, (3 * 2, 5 * 2)),  # gate and up fused: h -> 2f, gelu(gate)*up reads both
])
def test_new_mlp_kinds_ops(mlp, fc1_width, act_bytes):
    m = ModelSpec("t", num_layers=2, hidden_size=64, num_attention_heads=8, num_kv_heads=2,
                  ffn_hidden_size=160, vocab_size=500, seq_length=32, mlp=mlp)
    g = build_op_graph(m, 1)
    fc1, act = op(g.layer, "fc1"), op(g.layer, "act")
    assert fc1.shape == (32, fc1_width, 64)
    assert (act.fwd_bytes, act.bwd_bytes) == (act_bytes[0] * 32 * 160, act_bytes[1] * 32 * 160)
    assert g.num_params() == m.num_params()


def test_head_dim_qk_norm_sandwich_and_window_ops():
    m = ModelSpec("t", num_layers=4, hidden_size=64, num_attention_heads=4, num_kv_heads=2, head_dim=32,
                  ffn_hidden_size=96, vocab_size=500, seq_length=32, mlp="swiglu", qk_norm=True,
                  sandwich_norm=True, sliding_window=8, sliding_window_pattern=2)
    g = build_op_graph(m, 1)
    assert op(g.layer, "qkv").shape == (32, 128 + 2 * 64, 64)  # Q 4 x 32, K and V 2 x 32 each
    assert op(g.layer, "attn_out").shape == (32, 64, 128)
    assert op(g.layer, "qk_norm").shape == (32, 128 + 64) and op(g.layer, "rope").shape == (32, 128 + 64)
    assert {"post_attn_norm", "post_mlp_norm"} <= {o.name for o in g.layer}
    core = op(g.layer, "attn_core")
    assert core.shape == (1, 4, 32, 32, 32)
    # every 2nd layer global (layers 1 and 3), the others windowed: keys per query min(8, i) sum to
    # 36 + 24·8 = 228 of the causal 528; each layer's template carries its own FLOPs
    full = 4 * 4 * 32 * 32 * 32
    assert [op(g.layer_ops(i), "attn_core").fwd_flops for i in range(4)] == pytest.approx(
        [full * 228 / 528, full, full * 228 / 528, full])
    assert g.layer_ops(1) is g.layer and g.layer_ops(0) is g.layer_ops(2) is g.windowed_layer
    assert g.fwd_flops() - 4 * sum(o.fwd_flops for o in g.layer if o.name != "attn_core") - sum(
        o.fwd_flops for o in g.embed + g.head) == pytest.approx(full * (2 + 2 * 228 / 528))
    assert m.attention_flops_fraction() == pytest.approx((2 + 2 * 228 / 528) / 4)
    assert g.num_params() == m.num_params()


TINY_DEEPSEEK = ModelSpec("tiny-ds", num_layers=4, hidden_size=64, num_attention_heads=4, vocab_size=500,
                          seq_length=32, ffn_hidden_size=128, mlp="swiglu", num_experts=8, moe_top_k=2,
                          moe_ffn_hidden_size=32, moe_shared_expert_ffn_hidden_size=32, moe_first_dense_layers=1,
                          q_lora_rank=48, kv_lora_rank=16, qk_rope_head_dim=8, head_dim=24, v_head_dim=16)


def test_mla_ops_shapes_and_flops():
    g = build_op_graph(TINY_DEEPSEEK, 1)
    assert op(g.layer, "q_down").shape == (32, 48, 64) and op(g.layer, "q_down").tp_split == "none"
    assert op(g.layer, "q_up").shape == (32, 4 * 24, 48)
    assert op(g.layer, "kv_down").shape == (32, 16 + 8, 64)
    assert op(g.layer, "kv_up").shape == (32, 4 * (16 + 16), 16)  # K without RoPE part, and V
    assert op(g.layer, "attn_out").shape == (32, 64, 4 * 16)
    core = op(g.layer, "attn_core")
    # QK^T over 24 dims, AV over 16: 2·b·heads·s²·(24 + 16)
    assert core.fwd_flops == 2 * 4 * 32 * 32 * (24 + 16)
    assert "qkv" not in {o.name for o in g.layer}


def test_dense_first_layers_and_shared_experts():
    m = TINY_DEEPSEEK
    g = build_op_graph(m, 1)
    names = [o.name for o in g.layer]
    assert names.index("shared_fc1") > names.index("expert_fc2")  # Megatron-core adds them after the routed ones
    assert op(g.layer, "expert_fc1").shape[1:] == (2 * 32, 64) and op(g.layer, "shared_fc1").shape == (32, 64, 64)
    assert op(g.dense_layer, "fc1").shape == (32, 2 * 128, 64) and "router" not in {o.name for o in g.dense_layer}
    assert g.layer_ops(0) is g.dense_layer and g.layer_ops(1) is g.layer
    assert g.num_params() == m.num_params()
    per = lambda ops: sum(o.fwd_flops for o in ops)
    assert g.fwd_flops() == pytest.approx(per(g.embed) + per(g.dense_layer) + 3 * per(g.layer) + per(g.head))


def test_deepseek_v3_preset_graph_params():
    m = MODEL_PRESETS["deepseek-v3"]
    assert build_op_graph(m, 1).num_params() == m.num_params()


def test_moe_permute_and_unpermute_kernels():
    """Megatron-core moe_utils.permute / unpermute around the experts: T tokens in, cf·k·T copies out
    (and back), so their bytes grow with top_k; they sit before and after the expert ops, outside
    the expert segment the all-to-all surrounds."""
    m, b = SMALL_MOE, 2
    g = build_op_graph(m, b)
    t, h, k, d = b * m.seq_length, m.hidden_size, m.moe_top_k, 2
    perm, unperm = op(g.layer, "moe_permute"), op(g.layer, "moe_unpermute")
    assert perm.shape == unperm.shape == (t, h) and perm.tp_split == "sequence"
    assert perm.fwd_bytes == d * (t * h + k * t * h) and unperm.bwd_bytes == d * (t * h + 2 * k * t * h)
    names = [o.name for o in g.layer]
    assert names.index("router") < names.index("moe_permute") < names.index("expert_fc1")
    assert names.index("expert_fc2") < names.index("moe_unpermute") < names.index("mlp_residual")


@pytest.mark.parametrize("name", ["deepseek-v3", "qwen3-235b-a22b", "gpt-oss-120b", "mixtral-8x22b", "grok-1"])
def test_moe_forward_gemm_flops_are_two_per_active_weight(name):
    """Outside the attention core a token costs 2 FLOPs per active matmul weight (Kaplan et al. 2020
    C ≈ 2N forward): every weight but the embedding lookup, norms and biases, with the MLA, shared
    expert and dense-first-layer GEMMs included. For GPT-OSS-120B that is the model card's 5.13B
    active parameters (OpenAI gpt-oss model card, Table 1)."""
    m = MODEL_PRESETS[name]
    g = build_op_graph(m, 1)
    core = sum(o.fwd_flops for i in range(m.num_layers) for o in g.layer_ops(i) if o.kind == "attention")
    lookup = 0 if m.tie_embeddings else m.vocab_size * m.hidden_size
    per_token = (g.fwd_flops() - core) / (2 * m.seq_length)
    assert per_token == pytest.approx(m.num_active_params() - lookup, rel=1e-3)
    if name == "gpt-oss-120b":
        assert per_token == pytest.approx(5.13e9, rel=0.005)


# ---- parallel attention + MLP blocks (GPT-J, GPT-NeoX) ----------------------------------------------------
def parallel(model: ModelSpec, norms: int) -> ModelSpec:
    from dataclasses import replace
    return replace(model, parallel_attn_mlp=True, parallel_norms=norms)


def test_parallel_block_ops():
    """GPT-J: one shared norm feeds QKV and fc1; GPT-NeoX: a second norm of the layer input feeds fc1; both
    end with the sum of the two branches' partial outputs and one residual add."""
    seq = [o.name for o in build_op_graph(SMALL_GPT, 1).layer]
    assert seq == ["ln1", "qkv", "attn_core", "attn_out", "attn_residual", "ln2", "fc1", "act", "fc2", "mlp_residual"]
    assert [o.name for o in build_op_graph(parallel(SMALL_GPT, 1), 1).layer] == [
        "ln1", "qkv", "attn_core", "attn_out", "fc1", "act", "fc2", "attn_mlp_sum", "residual"]
    assert [o.name for o in build_op_graph(parallel(SMALL_LLAMA, 2), 1).layer] == [
        "ln1", "qkv", "rope", "attn_core", "attn_out", "ln2", "fc1", "act", "fc2", "attn_mlp_sum", "residual"]


@pytest.mark.parametrize("model", [SMALL_GPT, SMALL_LLAMA], ids=["gpt", "llama"])
@pytest.mark.parametrize("norms", [1, 2])
def test_parallel_block_runs_the_sequential_gemms(model, norms):
    """Same GEMMs and attention core, so the same FLOPs forward and backward; parameters less one norm per
    layer with a shared norm."""
    seq, par = build_op_graph(model, 2), build_op_graph(parallel(model, norms), 2)
    gemms = lambda g: [(o.name, o.shape, o.fwd_flops, o.bwd_input_flops, o.bwd_weight_flops, o.params)  # noqa: E731
                       for o in g.layer if o.kind in ("gemm", "attention")]
    assert gemms(par) == gemms(seq)
    assert (par.fwd_flops(), par.bwd_flops()) == (seq.fwd_flops(), seq.bwd_flops())
    assert seq.num_params() - par.num_params() == (2 - norms) * model.num_layers * model.norm_params()
    assert par.num_params() == parallel(model, norms).num_params()


@pytest.mark.parametrize("model", [SMALL_GPT, SMALL_LLAMA], ids=["dropout", "no-dropout"])
def test_parallel_block_end_bytes(model):
    """The branches' sum reads both partial outputs and writes one (full on every TP rank: tp_split
    "none"), with a uint8 mask per branch under dropout; the residual add reads x and the sum. Backward:
    dropout's masked products, and the sums of gradients of tensors read twice (a shared norm's output
    for QKV and fc1; the layer input for its norms and the residual)."""
    t, h, d = model.seq_length, model.hidden_size, 2
    drop = model.dropout
    for norms in (1, 2):
        layer = build_op_graph(parallel(model, norms), 1).layer
        branch, res = op(layer, "attn_mlp_sum"), op(layer, "residual")
        assert (branch.tp_split, res.tp_split) == ("none", "sequence")
        assert branch.fwd_bytes == t * h * (3 * d + 2 * drop)
        assert branch.bwd_bytes == t * h * (3 * d * (norms == 1) + 2 * (2 * d + 1) * drop)
        assert (res.fwd_bytes, res.bwd_bytes) == (t * h * 3 * d, t * h * 3 * d * norms)
