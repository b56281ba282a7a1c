"""ModelSpec: preset parameter counts against published sizes, and the derived defaults."""

import pytest

from simulator.model.presets import MODEL_PRESETS
from simulator.model.spec import ModelSpec


@pytest.mark.parametrize("name, billions, tol", [
    ("llama2-7b", 6.738, 0.001),     # Touvron et al. 2023; HF model card 6,738,415,616
    ("llama2-13b", 13.016, 0.001),
    ("llama2-70b", 68.977, 0.001),
    ("llama3-8b", 8.030, 0.001),     # HF model card 8,030,261,248
    ("llama3-70b", 70.554, 0.001),
    ("llama3-405b", 405.853, 0.001),
    ("mixtral-8x7b", 46.703, 0.001),  # Jiang et al. 2024: 46.7B total
    ("gpt3-175b", 174.6, 0.001),     # Narayanan et al. 2021 Table 1 / eq. 2
])
def test_preset_param_counts(name, billions, tol):
    assert MODEL_PRESETS[name].num_params() / 1e9 == pytest.approx(billions, rel=tol)


def test_llama3_8b_exact_count():
    assert MODEL_PRESETS["llama3-8b"].num_params() == 8_030_261_248
    assert MODEL_PRESETS["llama2-7b"].num_params() == 6_738_415_616


def test_mixtral_active_params():
    m = MODEL_PRESETS["mixtral-8x7b"]
    assert m.num_active_params() / 1e9 == pytest.approx(12.9, rel=0.005)  # Jiang et al. 2024: 12.9B
    inactive = m.num_layers * (m.num_experts - m.moe_top_k) * m.expert_params()
    assert m.num_params() - m.num_active_params() == inactive


def test_dense_active_equals_total():
    m = MODEL_PRESETS["llama3-70b"]
    assert m.num_active_params() == m.num_params()


@pytest.mark.parametrize("name", [n for n, m in MODEL_PRESETS.items() if m.mlp == "gelu"])
def test_gpt_presets_follow_narayanan_eq2(name):
    """P = 12·l·h²·(1 + 13/(12h) + (V + s)/(12·l·h)), plus the final LayerNorm's 2h."""
    m = MODEL_PRESETS[name]
    l, h, v, s = m.num_layers, m.hidden_size, m.vocab_size, m.seq_length
    assert m.num_params() == 12 * l * h * h + 13 * l * h + (v + s) * h + 2 * h


def test_gpt_megatron_table1_sizes():
    # Narayanan et al. 2021 Table 1 model sizes (billions), to the digit quoted
    for name, b in [("megatron-gpt-1.7b", 1.7), ("megatron-gpt-18.4b", 18.4),
                    ("megatron-gpt-145.6b", 145.6), ("megatron-gpt-529.6b", 529.6)]:
        assert round(MODEL_PRESETS[name].num_params() / 1e9, 1) == b


def test_defaults_mha_and_4h_ffn():
    m = ModelSpec("t", num_layers=2, hidden_size=256, num_attention_heads=8, vocab_size=1000,
                  seq_length=128)
    assert m.num_kv_heads == 8 and m.ffn_hidden_size == 1024
    assert (m.norm, m.position_embedding, m.tie_embeddings, m.bias) == ("layernorm", "learned",
                                                                         True, True)
    assert m.head_dim == 32 and m.kv_hidden_size == 256 and not m.is_moe and m.mlp_matrices == 2


def test_swiglu_defaults_llama_style():
    m = ModelSpec("t", num_layers=2, hidden_size=256, num_attention_heads=8, vocab_size=1000,
                  seq_length=128, num_kv_heads=2, ffn_hidden_size=688, mlp="swiglu")
    assert (m.norm, m.position_embedding, m.tie_embeddings, m.bias) == ("rmsnorm", "rope", False,
                                                                         False)
    assert m.kv_hidden_size == 64 and m.mlp_matrices == 3
    # attention: Q and O are h x h, K and V are h x kv each; MLP: 3 matrices; 2 RMSNorms
    assert m.params_per_layer() == 256 * (256 + 2 * 64) + 256 * 256 + 3 * 256 * 688 + 2 * 256
    assert m.num_params() == 2 * m.params_per_layer() + 2 * 1000 * 256 + 256


def test_explicit_overrides_win():
    m = ModelSpec("t", num_layers=1, hidden_size=64, num_attention_heads=4, vocab_size=10,
                  seq_length=8, tie_embeddings=False, bias=False, norm="rmsnorm")
    assert m.head_params() == 10 * 64 + 64
    assert m.attention_params_per_layer() == 4 * 64 * 64


def test_moe_counts():
    m = ModelSpec("t", num_layers=1, hidden_size=64, num_attention_heads=4, vocab_size=10,
                  seq_length=8, mlp="swiglu", ffn_hidden_size=128, num_experts=4, moe_top_k=2)
    assert m.is_moe and m.router_params_per_layer() == 64 * 4
    assert m.mlp_params_per_layer() == 4 * 3 * 64 * 128 + 64 * 4
    assert m.dense_params_per_layer() == m.attention_params_per_layer() + 2 * 64 + 64 * 4


@pytest.mark.parametrize("mlp, matrices", [("gelu", 2), ("squared-relu", 2), ("swiglu", 3), ("geglu", 3)])
def test_mlp_kinds_matrices_and_llama_style_defaults(mlp, matrices):
    m = ModelSpec("t", num_layers=1, hidden_size=64, num_attention_heads=4, vocab_size=10,
                  seq_length=8, ffn_hidden_size=96, mlp=mlp)
    assert m.mlp_matrices == matrices and m.gated_mlp == (matrices == 3)
    assert m.expert_params() == matrices * 64 * 96 + ((matrices - 1) * 96 + 64 if m.bias else 0)
    if mlp != "gelu":  # Nemotron-4 / Grok-1 set norm etc. themselves; defaults are Llama's
        assert (m.norm, m.position_embedding, m.tie_embeddings, m.bias) == ("rmsnorm", "rope", False, False)


def test_unknown_mlp_kind_named():
    m = ModelSpec("t", num_layers=1, hidden_size=64, num_attention_heads=4, vocab_size=10,
                  seq_length=8, mlp="relu")
    with pytest.raises(ValueError, match="mlp must be one of gelu, squared-relu, swiglu, geglu; got 'relu'"):
        m.check()


def test_head_dim_independent_of_hidden_mistral_nemo():
    """Mistral-Nemo-Base-2407: hidden 5120, 32 heads of 128 (Q is 4096 wide, not 5120); the HF model
    card's safetensors total is 12,247,782,400 parameters."""
    m = ModelSpec("nemo", num_layers=40, hidden_size=5120, num_attention_heads=32, vocab_size=131072,
                  seq_length=4096, num_kv_heads=8, ffn_hidden_size=14336, mlp="swiglu", head_dim=128)
    assert (m.q_size, m.kv_hidden_size) == (4096, 1024)
    assert m.attention_params_per_layer() == 5120 * (4096 + 2 * 1024) + 4096 * 5120
    assert m.num_params() == 12_247_782_400
    derived = ModelSpec("d", num_layers=1, hidden_size=5120, num_attention_heads=32, vocab_size=10, seq_length=8)
    assert derived.head_dim == 160 and derived.q_size == 5120


def test_qk_norm_sandwich_norm_and_qkv_bias_params():
    kw = dict(num_layers=1, hidden_size=64, num_attention_heads=4, vocab_size=10, seq_length=8,
              mlp="swiglu", head_dim=32)
    plain = ModelSpec("p", **kw)
    assert ModelSpec("q", qk_norm=True, **kw).params_per_layer() - plain.params_per_layer() == 2 * 32
    assert ModelSpec("s", sandwich_norm=True, **kw).params_per_layer() - plain.params_per_layer() == 2 * 64
    # Qwen2: biases on Q, K, V only (4 heads x 32 = 128 wide each)
    assert ModelSpec("b", qkv_bias=True, **kw).params_per_layer() - plain.params_per_layer() == 3 * 128


def test_sliding_window_flops_fraction():
    kw = dict(num_layers=6, hidden_size=64, num_attention_heads=4, vocab_size=10, seq_length=8)
    assert ModelSpec("full", **kw).attention_flops_fraction() == 1.0
    assert ModelSpec("wide", sliding_window=8, **kw).attention_flops_fraction() == 1.0
    # window 2 over 8 positions: keys per query 1,2,2,2,2,2,2,2 = 15 of the causal 36
    assert ModelSpec("swa", sliding_window=2, **kw).attention_flops_fraction() == pytest.approx(15 / 36)
    # every 3rd layer global (2 of 6): (2 + 4 * 15/36) / 6
    alt = ModelSpec("alt", sliding_window=2, sliding_window_pattern=3, **kw)
    assert alt.attention_flops_fraction() == pytest.approx((2 + 4 * 15 / 36) / 6)


@pytest.mark.parametrize("kw, message", [
    ({"sliding_window_pattern": 1, "sliding_window": 4}, "sliding_window_pattern 1 makes every layer global"),
    ({"sliding_window": -1}, "sliding_window must be >= 0, got -1"),
    ({"hidden_size": 66}, "hidden_size 66 is not divisible by num_attention_heads 4 (or set head_dim)"),
    ({"max_position_embeddings": 4}, "seq_length 8 exceeds the learned position table's max_position_embeddings 4"),
])
def test_attention_shape_rejections(kw, message):
    base = dict(num_layers=1, hidden_size=64, num_attention_heads=4, vocab_size=10, seq_length=8)
    with pytest.raises(ValueError) as err:
        ModelSpec("t", **{**base, **kw}).check()
    assert message in str(err.value)


def test_learned_position_table_rows():
    m = ModelSpec("gpt2", num_layers=1, hidden_size=64, num_attention_heads=4, vocab_size=10,
                  seq_length=8, max_position_embeddings=32)
    assert m.embedding_params() == (10 + 32) * 64


@pytest.mark.parametrize("name, published, source", [
    ("llama3.1-8b", 8.03e9, "Hugging Face meta-llama/Llama-3.1-8B: 8.03B params"),
    ("llama3.1-70b", 70.6e9, "Hugging Face meta-llama/Llama-3.1-70B: 70.6B params"),
    ("llama3.1-405b", 405e9, "Dubey et al. 2024, Table 3: 405B"),
    ("mixtral-8x22b", 141e9, "Mistral AI, Mixtral 8x22B announcement (2024): 141B total"),
    ("nemotron4-15b", 15.6e9, "Parmar et al. 2024 (Nemotron-4 15B), §2: 3.2B embedding + 12.5B non-embedding"),
    ("nemotron4-340b", 341.0e9, "Adler et al. 2024 (Nemotron-4 340B), Table 1: 9.4B embedding + 331.6B non-embedding"),
    ("qwen3-235b-a22b", 235e9, "Qwen/Qwen3-235B-A22B model card: 235B total"),
    ("gpt-oss-120b", 116.83e9, "OpenAI gpt-oss model card (2025), Table 1: 116.83B total"),
    ("deepseek-v3", 671e9, "DeepSeek-AI 2024 (DeepSeek-V3 Technical Report), §1: 671B total (MTP module excluded)"),
])
def test_todays_presets_published_counts(name, published, source):
    assert MODEL_PRESETS[name].num_params() == pytest.approx(published, rel=0.005), source


def test_grok1_count_matches_xai_figure_without_the_embedding():
    """xAI's README: 314B parameters. The blocks hold 314.9B; the tied 131072 x 6144 embedding adds
    0.8B (315.7B total, 0.54% above 314B), so xAI's figure is the non-embedding count."""
    m = MODEL_PRESETS["grok-1"]
    assert m.num_params() - m.embedding_params() == pytest.approx(314e9, rel=0.005)
    assert m.num_layers * m.norms_per_layer == 64 * 4  # rms_norm .. rms_norm_3 per decoder layer


@pytest.mark.parametrize("name, active, source", [
    # OpenAI counts the activated parameters without the input embedding lookup
    ("gpt-oss-120b", 5.13e9, "OpenAI gpt-oss model card, Table 1: 5.13B active"),
    ("mixtral-8x22b", 39e9, "Mistral AI announcement: 39B active"),
])
def test_todays_presets_active_counts(name, active, source):
    m = MODEL_PRESETS[name]
    lookup = m.vocab_size * m.hidden_size if name.startswith("gpt-oss") else 0
    assert m.num_active_params() - lookup == pytest.approx(active, rel=0.005), source


def test_deepseek_v3_active_count_as_rounded_in_the_report():
    """DeepSeek-V3 report §1: "37B activated for each token", a rounded figure: 36.63B without the
    embedding lookup (the convention that also gives DeepSeek-V2's 21B below)."""
    m = MODEL_PRESETS["deepseek-v3"]
    assert round((m.num_active_params() - m.vocab_size * m.hidden_size) / 1e9) == 37


def test_deepseek_v3_layer_structure():
    m = MODEL_PRESETS["deepseek-v3"]
    assert (m.num_moe_layers, m.moe_first_dense_layers, m.is_mla) == (58, 3, True)
    # MLA (DeepSeek-V2 eq. 37-47): q 7168->1536->128x192, kv 7168->512+64, 512->128x(128+128), o 16384->7168
    assert m.mla_params_per_layer() == 7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 + 512 * 128 * 256
    assert m.attention_params_per_layer() == m.mla_params_per_layer() + 128 * 128 * 7168
    # routed 256 x 3 x 7168 x 2048, one shared expert of the same width, the 7168 x 256 router
    assert m.mlp_params_per_layer() == 257 * 3 * 7168 * 2048 + 7168 * 256
    assert m.dense_layer_params() - m.attention_params_per_layer() - 2 * 7168 == 3 * 7168 * 18432


def test_mla_kv_cache_matches_deepseek_v2_table1():
    """DeepSeek-V2 Table 1: MLA caches (d_c + d_h^R)·l elements per token, d_c = 4·d_h and
    d_h^R = d_h/2, i.e. 4.5·d_h·l against MHA's 2·n_h·d_h·l."""
    v2 = ModelSpec("deepseek-v2", num_layers=60, hidden_size=5120, num_attention_heads=128, vocab_size=102400,
                   seq_length=4096, ffn_hidden_size=12288, mlp="swiglu", num_experts=160, moe_top_k=6,
                   moe_ffn_hidden_size=1536, moe_shared_expert_ffn_hidden_size=2 * 1536, moe_first_dense_layers=1,
                   q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64, head_dim=192, v_head_dim=128)
    d_h = 128
    assert v2.kv_cache_elements_per_token_per_layer() == 4.5 * d_h
    mha = ModelSpec("mha", num_layers=60, hidden_size=5120, num_attention_heads=128, head_dim=d_h,
                    vocab_size=10, seq_length=8)
    assert mha.kv_cache_elements_per_token_per_layer() == 2 * 128 * d_h
    # DeepSeek-V2 paper §1: 236B total, 21B activated per token (without the embedding lookup)
    assert v2.num_params() == pytest.approx(236e9, rel=0.005)
    assert round((v2.num_active_params() - v2.vocab_size * v2.hidden_size) / 1e9) == 21


@pytest.mark.parametrize("kw, message", [
    ({"moe_first_dense_layers": 3}, "moe_first_dense_layers 3 needs an MoE model"),
    ({"kv_lora_rank": 64, "qk_rope_head_dim": 0}, "qk_rope_head_dim 0 must be in 1..head_dim-1"),
    ({"kv_lora_rank": 64, "qk_rope_head_dim": 8, "num_kv_heads": 2}, "num_kv_heads 2 must equal num_attention_heads 4"),
])
def test_moe_and_mla_rejections(kw, message):
    base = dict(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=10, seq_length=8)
    with pytest.raises(ValueError) as err:
        ModelSpec("t", **{**base, **kw}).check()
    assert message in str(err.value)


def test_parallel_block_params_differ_only_by_its_norms():
    """A parallel attention + MLP block holds the sequential block's weights; GPT-J's shared ln_1 is one
    norm per layer, GPT-NeoX's two norms (input_layernorm, post_attention_layernorm) are two."""
    seq = ModelSpec("gpt", num_layers=4, hidden_size=256, num_attention_heads=8, vocab_size=1000, seq_length=64)
    shared = ModelSpec("gptj", num_layers=4, hidden_size=256, num_attention_heads=8, vocab_size=1000, seq_length=64,
                       parallel_attn_mlp=True)
    neox = ModelSpec("neox", num_layers=4, hidden_size=256, num_attention_heads=8, vocab_size=1000, seq_length=64,
                     parallel_attn_mlp=True, parallel_norms=2)
    assert (seq.norms_per_layer, shared.norms_per_layer, neox.norms_per_layer) == (2, 1, 2)
    assert neox.num_params() == seq.num_params()
    assert seq.num_params() - shared.num_params() == 4 * seq.norm_params()


@pytest.mark.parametrize("kw, message", [
    (dict(parallel_attn_mlp=True, parallel_norms=0), "parallel_norms must be 1 (one shared norm, GPT-J) or 2"),
    (dict(parallel_norms=2), "parallel_norms = 2 needs parallel_attn_mlp = true"),
    (dict(parallel_attn_mlp=True, num_experts=4, moe_top_k=2), "parallel_attn_mlp with num_experts > 1"),
    (dict(parallel_attn_mlp=True, kv_lora_rank=32, qk_rope_head_dim=8), "parallel_attn_mlp with kv_lora_rank > 0"),
    (dict(parallel_attn_mlp=True, sandwich_norm=True), "parallel_attn_mlp with sandwich_norm"),
])
def test_parallel_block_rejections(kw, message):
    spec = ModelSpec("x", num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=100, seq_length=16, **kw)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        spec.check()
