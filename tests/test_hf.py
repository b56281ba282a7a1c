"""Hugging Face config.json import."""

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from simulator.model.hf import hf_config_to_fields, load_hf_config
from simulator.model.presets import MODEL_PRESETS
from simulator.model.spec import ModelSpec

# meta-llama/Meta-Llama-3-8B config.json as released
LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 8192,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.40.0.dev0", "use_cache": True, "vocab_size": 128256,
}
# mistralai/Mixtral-8x7B-v0.1 config.json (abridged to the keys that matter plus a few others)
MIXTRAL = {
    "architectures": ["MixtralForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
    "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "num_local_experts": 8, "rms_norm_eps": 1e-05,
    "rope_theta": 1e6, "sliding_window": None, "tie_word_embeddings": False, "vocab_size": 32000,
}
# openai-community/gpt2 config.json (abridged)
GPT2 = {
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
    "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_inner": None, "n_layer": 12,
    "n_positions": 1024, "vocab_size": 50257,
}
# EleutherAI/pythia-160m config.json (abridged)
NEOX = {
    "architectures": ["GPTNeoXForCausalLM"], "hidden_act": "gelu", "hidden_size": 768,
    "intermediate_size": 3072, "max_position_embeddings": 2048, "model_type": "gpt_neox",
    "num_attention_heads": 12, "num_hidden_layers": 12, "rotary_pct": 0.25,
    "tie_word_embeddings": False, "use_parallel_residual": True, "vocab_size": 50304,
}


def write(tmp_path, cfg, folder="model"):
    d = tmp_path / folder
    d.mkdir()
    p = d / "config.json"
    p.write_text(json.dumps(cfg))
    return p


def without_name(spec):
    d = asdict(spec)
    d.pop("name")
    return d


def test_llama3_8b_matches_preset(tmp_path):
    fields = load_hf_config(write(tmp_path, LLAMA3_8B, "Meta-Llama-3-8B"))
    assert fields["name"] == "Meta-Llama-3-8B"
    spec = ModelSpec(**fields, seq_length=8192)  # the sequence length comes from the scenario
    assert without_name(spec) == without_name(MODEL_PRESETS["llama3-8b"])
    assert spec.num_params() == 8_030_261_248


def test_mixtral_matches_preset(tmp_path):
    fields = load_hf_config(write(tmp_path, MIXTRAL))
    assert "seq_length" not in fields  # max_position_embeddings is the context limit, not the training length
    spec = ModelSpec(**fields, seq_length=4096)
    assert spec.num_experts == 8 and spec.moe_top_k == 2
    preset = MODEL_PRESETS["mixtral-8x7b"]
    assert spec.num_params() == preset.num_params()
    assert spec.num_active_params() == preset.num_active_params()


def test_gpt2_keys():
    f = hf_config_to_fields(GPT2, "gpt2")
    assert (f["num_layers"], f["hidden_size"], f["num_attention_heads"], f["max_position_embeddings"]) == (
        12, 768, 12, 1024)
    assert (f["mlp"], f["norm"], f["position_embedding"], f["tie_embeddings"], f["bias"]) == (
        "gelu", "layernorm", "learned", True, True)
    spec = ModelSpec(**f, seq_length=512)  # training shorter than the table keeps its 1024 rows
    assert spec.ffn_hidden_size == 3072 and spec.num_kv_heads == 12
    assert spec.num_params() == 124_439_808  # GPT-2 small, as counted by transformers


def test_gpt_neox_keys():
    """Pythia trains with parallel attention + MLP blocks, two norms both applied to the layer input
    (GPTNeoXLayer with use_parallel_residual, its default); use_parallel_residual = false gives the
    sequential block with the same parameters."""
    spec = ModelSpec(**hf_config_to_fields(NEOX, "pythia-160m"), seq_length=2048)
    assert (spec.mlp, spec.norm, spec.position_embedding, spec.tie_embeddings, spec.bias) == (
        "gelu", "layernorm", "rope", False, True)
    assert (spec.parallel_attn_mlp, spec.parallel_norms, spec.norms_per_layer) == (True, 2, 2)
    assert spec.num_params() == 162_322_944  # pythia-160m, as counted by transformers
    default = dict(NEOX)
    default.pop("use_parallel_residual")  # GPTNeoXConfig's default: parallel
    assert hf_config_to_fields(default)["parallel_attn_mlp"] is True
    sequential = ModelSpec(**hf_config_to_fields(dict(NEOX, use_parallel_residual=False)), seq_length=2048)
    assert (sequential.parallel_attn_mlp, sequential.parallel_norms) == (False, 1)
    assert sequential.num_params() == spec.num_params()


def test_gptj_keys():
    """EleutherAI/gpt-j-6b: a parallel block with one shared ln_1 (GPTJBlock), bias-free q/k/v, biased
    MLP, untied LM head, rotary over the first rotary_dim = 64 of each 256-wide head, n_inner null = 4h."""
    spec = spec_of("gpt-j-6b", seq_length=2048)
    assert (spec.parallel_attn_mlp, spec.parallel_norms, spec.norms_per_layer) == (True, 1, 1)
    assert (spec.num_layers, spec.hidden_size, spec.num_attention_heads, spec.head_dim, spec.ffn_hidden_size) == (
        28, 4096, 16, 256, 16384)
    assert (spec.bias, spec.qkv_bias, spec.tie_embeddings, spec.position_embedding, spec.dropout) == (
        True, False, False, "rope", False)
    # one norm per layer: the sequential block of the same shapes has one more
    assert replace(spec, parallel_attn_mlp=False).num_params() - spec.num_params() == 28 * 2 * 4096


@pytest.mark.parametrize("change, key", [
    ({"rotary": False}, "config.json rotary = false"),
    ({"rotary_dim": 512}, "config.json rotary_dim = 512: must be at most the head dimension 256"),
    ({"activation_function": "relu"}, 'config.json activation_function = "relu"'),
])
def test_gptj_unrepresentable_keys_refused_by_name(change, key):
    cfg = dict(json.loads((DATA / "gpt-j-6b" / "config.json").read_text()), **change)
    with pytest.raises(ValueError) as err:
        hf_config_to_fields(cfg)
    assert key in str(err.value) and "\n" not in str(err.value)


def test_file_stem_names_non_config_files(tmp_path):
    p = tmp_path / "my-llama.json"
    p.write_text(json.dumps(LLAMA3_8B))
    assert load_hf_config(p)["name"] == "my-llama"


def test_unknown_architecture():
    cfg = dict(LLAMA3_8B, model_type="t5", architectures=["T5ForConditionalGeneration"])
    with pytest.raises(ValueError, match="model_type 't5'"):
        hf_config_to_fields(cfg)
    cfg.pop("model_type")
    with pytest.raises(ValueError, match="architectures"):
        hf_config_to_fields(cfg)


def test_architectures_used_when_model_type_absent():
    cfg = dict(LLAMA3_8B)
    cfg.pop("model_type")
    assert hf_config_to_fields(cfg)["mlp"] == "swiglu"


def test_missing_field_named():
    cfg = dict(GPT2)
    cfg.pop("n_embd")
    with pytest.raises(ValueError, match="hidden_size / n_embd"):
        hf_config_to_fields(cfg)


def test_activations_map_to_mlp_kinds():
    # LlamaMLP computes down(act(gate(x)) * up(x)): GELU there is GeGLU
    assert hf_config_to_fields(dict(LLAMA3_8B, hidden_act="gelu"))["mlp"] == "geglu"
    with pytest.raises(ValueError, match='config.json hidden_act = "relu": only silu, swish, gelu'):
        hf_config_to_fields(dict(LLAMA3_8B, hidden_act="relu"))


def test_bad_type():
    with pytest.raises(ValueError, match="num_hidden_layers"):
        hf_config_to_fields(dict(LLAMA3_8B, num_hidden_layers="32"))


def test_unreadable_and_invalid_files(tmp_path):
    with pytest.raises(ValueError, match="cannot be read"):
        load_hf_config(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_hf_config(bad)


# ---- published config.json files (tests/data/hf/<checkpoint>/config.json, copied from the
# Hugging Face repositories of the same name) against their published parameter counts ------------
DATA = Path(__file__).parent / "data" / "hf"


def spec_of(folder: str, seq_length: int = 4096) -> ModelSpec:
    spec = ModelSpec(**load_hf_config(DATA / folder / "config.json"), seq_length=seq_length)
    spec.check()
    return spec


@pytest.mark.parametrize("folder, published, source", [
    ("Llama-3.1-8B", 8.03e9, "Hugging Face meta-llama/Llama-3.1-8B: 8.03B params"),
    ("Llama-3.1-70B", 70.6e9, "Hugging Face meta-llama/Llama-3.1-70B: 70.6B params"),
    ("Llama-3.1-405B", 405e9, "Dubey et al. 2024 (The Llama 3 Herd of Models), Table 3: 405B"),
    ("Llama-3.2-1B", 1.23e9, "meta-llama/Llama-3.2-1B model card: 1.23B params (tied embeddings)"),
    ("Llama-3.2-3B", 3.21e9, "meta-llama/Llama-3.2-3B model card: 3.21B params"),
    ("Mistral-7B-v0.1", 7.24e9, "Hugging Face mistralai/Mistral-7B-v0.1: 7.24B params"),
    ("Mistral-Nemo-Base-2407", 12.2e9, "Hugging Face mistralai/Mistral-Nemo-Base-2407: 12.2B params"),
    ("Mixtral-8x7B-v0.1", 46.7e9, "Jiang et al. 2024 (Mixtral of Experts): 47B total (46.7B)"),
    ("Mixtral-8x22B-v0.1", 141e9, "Mistral AI, Mixtral 8x22B announcement: 141B total"),
    ("Qwen2.5-7B", 7.61e9, "Qwen/Qwen2.5-7B model card: 7.61B"),
    ("Qwen3-8B", 8.2e9, "Qwen/Qwen3-8B model card: 8.2B"),
    ("Qwen3-30B-A3B", 30.5e9, "Qwen/Qwen3-30B-A3B model card: 30.5B total"),
    ("Qwen3-235B-A22B", 235e9, "Qwen/Qwen3-235B-A22B model card: 235B total"),
    ("gemma-2-2b", 2.61e9, "Hugging Face google/gemma-2-2b: 2.61B params"),
    ("gemma-2-9b", 9.24e9, "Hugging Face google/gemma-2-9b: 9.24B params"),
    ("gemma-3-1b-pt", 1.0e9, "Gemma 3 Technical Report (2025), Table 1: 1B"),
    ("Phi-3-mini-4k-instruct", 3.82e9, "Hugging Face microsoft/Phi-3-mini-4k-instruct: 3.82B params"),
    ("gpt-oss-120b", 116.83e9, "OpenAI gpt-oss model card (2025), Table 1: 116.83B total"),
    ("gpt-oss-20b", 20.91e9, "OpenAI gpt-oss model card (2025), Table 1: 20.91B total"),
    ("gpt2", 124e6, "Radford et al. 2019 / Hugging Face openai-community/gpt2: 124M params"),
    # parallel attention + MLP blocks
    ("gpt-neox-20b", 20_554_567_680, "EleutherAI/gpt-neox-20b model card: n_parameters 20554567680 "
                                     "(Black et al. 2022, GPT-NeoX-20B: 20B)"),
    ("gpt-j-6b", 6_053_381_344, "EleutherAI/gpt-j-6b model card: n_parameters 6053381344"),
])
def test_published_configs_param_counts(folder, published, source):
    spec = spec_of(folder, seq_length=1024 if folder == "gpt2" else 4096)
    assert spec.num_params() == pytest.approx(published, rel=0.005), source


@pytest.mark.parametrize("folder, active, source", [
    ("Mixtral-8x7B-v0.1", 12.9e9, "Jiang et al. 2024: 13B active (12.9B)"),
    ("Mixtral-8x22B-v0.1", 39e9, "Mistral AI announcement: 39B active"),
    # OpenAI counts the unembedding but not the embedding lookup among the active parameters
    ("gpt-oss-120b", 5.13e9, "OpenAI gpt-oss model card, Table 1: 5.13B active"),
    ("gpt-oss-20b", 3.61e9, "OpenAI gpt-oss model card, Table 1: 3.61B active"),
])
def test_published_active_counts(folder, active, source):
    spec = spec_of(folder)
    embedding = spec.vocab_size * spec.hidden_size if folder.startswith("gpt-oss") else 0
    assert spec.num_active_params() - embedding == pytest.approx(active, rel=0.005), source


def test_qwen3_moe_active_counts_truncated_as_published():
    """Qwen names its MoE models by the activated count truncated: A3B is 3.35B, A22B 22.19B."""
    assert int(spec_of("Qwen3-30B-A3B").num_active_params() / 1e8) == 33  # card: 3.3B activated
    assert int(spec_of("Qwen3-235B-A22B").num_active_params() / 1e9) == 22  # card: 22B activated


def test_architecture_details_read():
    nemo = spec_of("Mistral-Nemo-Base-2407")
    assert (nemo.head_dim, nemo.q_size) == (128, 4096)  # not hidden/heads = 160
    mistral = spec_of("Mistral-7B-v0.1")
    assert (mistral.sliding_window, mistral.sliding_window_pattern) == (4096, 0)
    g2, g3 = spec_of("gemma-2-9b"), spec_of("gemma-3-1b-pt")
    assert (g2.mlp, g2.sandwich_norm, g2.tie_embeddings, g2.sliding_window_pattern) == ("geglu", True, True, 2)
    assert (g3.qk_norm, g3.sliding_window, g3.sliding_window_pattern) == (True, 512, 6)
    oss = spec_of("gpt-oss-120b")
    assert (oss.bias, oss.qkv_bias, oss.sliding_window, oss.sliding_window_pattern) == (True, True, 128, 2)
    assert (oss.num_experts, oss.moe_top_k) == (128, 4)
    q3 = spec_of("Qwen3-30B-A3B")
    assert (q3.qk_norm, q3.moe_ffn_hidden_size, q3.num_experts, q3.moe_top_k) == (True, 768, 128, 8)
    qwen2 = spec_of("Qwen2.5-7B")
    assert (qwen2.bias, qwen2.qkv_bias) == (False, True)  # Qwen2Attention: q/k/v biases only
    nemotron = spec_of("Nemotron-Mini-4B")
    assert (nemotron.mlp, nemotron.norm, nemotron.head_dim, nemotron.bias) == ("squared-relu", "layernorm", 128, False)
    phi3 = spec_of("Phi-3-mini-4k-instruct")
    assert phi3.sliding_window == 2047 and phi3.dropout is False
    assert spec_of("gpt2", 1024).dropout is True


def test_phi3_window_reduces_attention_flops():
    phi3 = spec_of("Phi-3-mini-4k-instruct", seq_length=4096)
    s, w = 4096, 2047
    assert phi3.attention_flops_fraction() == pytest.approx((w * (w + 1) / 2 + (s - w) * w) / (s * (s + 1) / 2))


@pytest.mark.parametrize("change, message", [
    ({"sliding_window": 4096, "model_type": "llama"}, "key 'sliding_window' (model_type 'llama') is not understood"),
    ({"attention_bias": True}, "config.json attention_bias = true: attention biases without MLP biases"),
    ({"use_sliding_window": True, "model_type": "qwen2"}, "config.json use_sliding_window = true"),
    ({"layer_types": ["full_attention", "sliding_attention"] * 16}, "config.json layer_types"),
    ({"mystery_feature": 1}, "key 'mystery_feature' (model_type 'llama') is not understood"),
])
def test_every_unrepresentable_key_refused_by_name(change, message):
    cfg = dict(LLAMA3_8B, **change)
    if "layer_types" in change:
        cfg.update(model_type="mistral", sliding_window=4096)
    with pytest.raises(ValueError) as err:
        hf_config_to_fields(cfg)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_qwen3_moe_dense_layers_list_refused_and_sparse_step_read():
    cfg = json.loads((DATA / "Qwen3-30B-A3B" / "config.json").read_text())
    with pytest.raises(ValueError, match="mlp_only_layers"):
        hf_config_to_fields(dict(cfg, mlp_only_layers=[0, 1]))
    # Qwen3MoeDecoderLayer: an MoE layer when (layer_idx + 1) % decoder_sparse_step == 0, else a dense MLP
    assert hf_config_to_fields(cfg)["moe_layer_interval"] == 1
    fields = hf_config_to_fields(dict(cfg, decoder_sparse_step=2))
    m = ModelSpec(**fields, seq_length=4096)
    assert fields["moe_layer_interval"] == 2 and m.num_moe_layers == m.num_layers // 2
    assert [m.has_dense_mlp(i) for i in range(4)] == [True, False, True, False]


def test_dropout_read_from_config():
    assert hf_config_to_fields(dict(LLAMA3_8B, attention_dropout=0.1))["dropout"] is True
    assert hf_config_to_fields(LLAMA3_8B)["dropout"] is False


def test_deepseek_v3_config():
    """deepseek-ai/DeepSeek-V3 config.json: num_nextn_predict_layers = 1 is one MTP module; the main
    model is 671B (DeepSeek-V3 report §1) and matches the preset; the Hugging Face checkpoint's 685B
    (model card: "671B of the Main Model weights and 14B of the Multi-Token Prediction (MTP) Module
    weights") stores the module with its own copies of the shared embedding and output head."""
    cfg = json.loads((DATA / "DeepSeek-V3" / "config.json").read_text())
    spec = ModelSpec(**hf_config_to_fields(cfg, "deepseek-v3"), seq_length=4096)
    assert spec.mtp_layers == 1
    copies = 2 * spec.vocab_size * spec.hidden_size
    assert spec.num_params() + copies == pytest.approx(685e9, rel=0.005)
    main = replace(spec, mtp_layers=0)
    assert main.num_params() == pytest.approx(671e9, rel=0.005)
    assert without_name(main) == without_name(MODEL_PRESETS["deepseek-v3"])


def test_tied_small_qwen():
    assert spec_of("Qwen2.5-0.5B").tie_embeddings is True  # Qwen2.5-0.5B ties, the 7B does not
    assert spec_of("Qwen2.5-7B").tie_embeddings is False


# keys that make a published config unrepresentable on purpose (refused by their own tests): set to the
# representable value so that the unknown key is what gets refused (none today: every config imports)
NEUTRAL: dict = {}


@pytest.mark.parametrize("folder", sorted(p.name for p in DATA.iterdir() if (p / "config.json").is_file()))
def test_an_unknown_key_in_any_published_config_is_refused_by_name(folder):
    cfg = dict(json.loads((DATA / folder / "config.json").read_text()), **NEUTRAL.get(folder, {}))
    hf_config_to_fields(cfg)  # representable as published (with NEUTRAL)
    with pytest.raises(ValueError) as err:
        hf_config_to_fields(dict(cfg, moe_mystery_router_mode="hash"))
    assert "'moe_mystery_router_mode'" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("folder, active, lookup_counted, source", [
    ("Qwen3-30B-A3B", 3.3e9, True, "Qwen/Qwen3-30B-A3B model card: 3.3B activated (3.35B, embeddings included)"),
    ("DeepSeek-V3", 37e9, False, "DeepSeek-V3 Technical Report §1: 37B activated"),
    ("Mixtral-8x22B-v0.1", 39e9, True, "Mistral AI announcement: 39B active"),
    ("gpt-oss-120b", 5.13e9, False, "OpenAI gpt-oss model card, Table 1: 5.13B active (unembedding only)"),
])
def test_forward_flops_are_two_per_published_active_weight(folder, active, lookup_counted, source):
    """Per token, the op graph's forward GEMMs outside the attention core cost 2 FLOPs per active
    weight (Kaplan et al. 2020, C = 2N), N the activated count without the embedding lookup (no GEMM);
    against the published count, with the lookup added back where the publisher counts it."""
    from simulator.model.opgraph import build_op_graph

    cfg = dict(json.loads((DATA / folder / "config.json").read_text()), **NEUTRAL.get(folder, {}))
    # the published activated count is the main model's (DeepSeek-V3's MTP module excluded)
    spec = replace(ModelSpec(**hf_config_to_fields(cfg, folder), seq_length=4096), mtp_layers=0)
    g = build_op_graph(spec, 1)
    core = sum(o.fwd_flops for i in range(spec.num_layers) for o in g.layer_ops(i) if o.kind == "attention")
    per_token = (g.fwd_flops() - core) / (2 * spec.seq_length)
    lookup = spec.vocab_size * spec.hidden_size
    assert per_token == pytest.approx(spec.num_active_params() - (0 if spec.tie_embeddings else lookup), rel=1e-3)
    assert per_token + lookup_counted * lookup == pytest.approx(active, rel=0.02), source


def test_gpt_neox_and_gpt_j_counts_as_the_readme_quotes_them():
    """README: GPT-NeoX-20B exactly its model card's 20,554,567,680; GPT-J-6B -0.04% of its card's
    6,053,381,344 (its bias-free attention output projection and its LM head's bias are not
    distinguished)."""
    assert spec_of("gpt-neox-20b", seq_length=4096).num_params() == 20_554_567_680
    assert round(100 * (spec_of("gpt-j-6b", seq_length=4096).num_params() / 6_053_381_344 - 1), 2) == -0.04
