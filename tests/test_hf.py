"""Hugging Face config.json import."""

import json
from dataclasses import asdict

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
    spec = ModelSpec(**fields)
    assert without_name(spec) == without_name(MODEL_PRESETS["llama3-8b"])
    assert spec.num_params() == 8_030_261_248


def test_mixtral_matches_preset_but_context(tmp_path):
    spec = ModelSpec(**load_hf_config(write(tmp_path, MIXTRAL)))
    assert spec.num_experts == 8 and spec.moe_top_k == 2 and spec.seq_length == 32768
    preset = MODEL_PRESETS["mixtral-8x7b"]
    assert spec.num_params() == preset.num_params()
    assert spec.num_active_params() == preset.num_active_params()


def test_gpt2_keys():
    f = hf_config_to_fields(GPT2, "gpt2")
    assert (f["num_layers"], f["hidden_size"], f["num_attention_heads"], f["seq_length"]) == (
        12, 768, 12, 1024)
    assert (f["mlp"], f["norm"], f["position_embedding"], f["tie_embeddings"], f["bias"]) == (
        "gelu", "layernorm", "learned", True, True)
    spec = ModelSpec(**f)
    assert spec.ffn_hidden_size == 3072 and spec.num_kv_heads == 12
    assert spec.num_params() == 124_439_808  # GPT-2 small, as counted by transformers


def test_gpt_neox_keys():
    spec = ModelSpec(**hf_config_to_fields(NEOX, "pythia-160m"))
    assert (spec.mlp, spec.norm, spec.position_embedding, spec.tie_embeddings, spec.bias) == (
        "gelu", "layernorm", "rope", False, True)
    assert spec.num_params() == 162_322_944  # pythia-160m, as counted by transformers


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


def test_unsupported_activation():
    with pytest.raises(ValueError, match="hidden_act 'gelu'"):
        hf_config_to_fields(dict(LLAMA3_8B, hidden_act="gelu"))


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
