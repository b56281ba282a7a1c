"""Scenario loading: presets, overrides, derived dp, the default rules and every rejection message."""

from pathlib import Path

import pytest

from simulator.defaults import default_virtual_stages, split_layers
from simulator.scenario import ScenarioError, apply_overrides, load_scenario, scenario_from_dict


def base(**sections):
    raw = {"model": {"preset": "gpt3-175b"}, "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 128},
           "parallelism": {"tp": 8, "pp": 16}, "training": {"global_batch_size": 1536}}
    for k, v in sections.items():
        raw.setdefault(k, {}).update(v)
    return raw


def test_preset_fields_dp_derived_and_microbatches():
    s = scenario_from_dict(base())
    assert s.model.num_layers == 96 and s.model.hidden_size == 12288
    assert s.parallel.dp == 8 and s.num_gpus == 1024
    assert s.num_microbatches == 192
    assert s.parallel.layers_per_stage == (6,) * 16
    assert s.training.grad_dtype == "fp32"


def test_fields_override_presets():
    s = scenario_from_dict(base(model={"num_layers": 48}, cluster={"nic_bandwidth_Gbps": 400}))
    assert s.model.num_layers == 48
    assert s.cluster.nic_bandwidth_Bps == 50e9


def test_set_overrides_parse_toml_values():
    raw = apply_overrides(base(), ["parallelism.tp=4", "parallelism.sequence_parallel=true", "name=x"]
                          [:2])
    s = scenario_from_dict(raw)
    assert s.parallel.tp == 4 and s.parallel.sequence_parallel is True and s.parallel.dp == 16


def test_layer_split_rule_llama3_405b():
    assert split_layers(126, 16) == (7,) + (8,) * 14 + (7,)
    assert split_layers(10, 4) == (2, 3, 3, 2)
    assert sum(split_layers(95, 8)) == 95


def test_default_virtual_stages_rule():
    assert default_virtual_stages(96, 16) == 2  # 6 layers per stage -> 2 chunks
    assert default_virtual_stages(105, 35) == 3  # 3 layers per stage -> 3 chunks
    assert default_virtual_stages(16, 16) == 1


@pytest.mark.parametrize("sections, message", [
    ({"model": {"num_attention_heads": 12, "num_kv_heads": 12}}, "tp = 8 does not divide model.num_attention_heads = 12"),
    ({"parallelism": {"tp": 7}}, "tp*pp*cp = 7*16*1 = 112 does not divide the 1024 GPUs"),
    ({"parallelism": {"dp": 4}}, "dp*tp*pp*cp = 4*8*16*1 = 512 != 1024 GPUs"),
    ({"training": {"global_batch_size": 100}}, "global_batch_size = 100 is not divisible by micro_batch_size*dp = 1*8"),
    ({"model": {"preset": "gpt-9"}}, "model.preset 'gpt-9' is unknown"),
    ({"cluster": {"preset": "dgx-z"}}, "cluster.preset 'dgx-z' is unknown"),
    ({"model": {"hidden_size": -5}}, "model.hidden_size must be positive, got -5"),
    ({"model": {"colour": 1}}, "[model] unknown key(s) ['colour']"),
    ({"model": {"mlp": "relu"}}, "model.mlp must be one of gelu, squared-relu, swiglu, geglu; got 'relu'"),
    ({"model": {"sliding_window": 512}, "training": {"attention": "unfused"}},
     "model.sliding_window = 512 needs training.attention = 'flash'"),
    ({"model": {"num_experts": 8, "moe_top_k": 2, "moe_ffn_hidden_size": 1540}},
     "parallelism.tp = 8 does not divide model.moe_ffn_hidden_size = 1540"),
    ({"parallelism": {"tp": "8"}}, "parallelism.tp must be int, got '8'"),
    ({"parallelism": {"zero_stage": 4}}, "zero_stage must be 0..3, got 4"),
    ({"parallelism": {"schedule": "interleaved-1f1b", "virtual_stages": 7}}, "virtual_stages = 7 exceeds the layers"),
    ({"parallelism": {"ep": 2}}, "ep = 2 does not divide model.num_experts = 1"),
    ({"parallelism": {"offload_optimizer": True}}, "offload_optimizer needs zero_stage >= 1"),
    ({"parallelism": {"layers_per_stage": [6, 6]}}, "layers_per_stage = [6, 6] must have pp = 16"),
    ({"model": {"parallel_attn_mlp": "yes"}}, "model.parallel_attn_mlp must be bool, got 'yes'"),
    ({"model": {"parallel_attn_mlp": True, "parallel_norms": 3}},
     "model.parallel_norms must be 1 (one shared norm, GPT-J) or 2 (GPT-NeoX), got 3"),
    ({"model": {"parallel_norms": 2}}, "model.parallel_norms = 2 needs parallel_attn_mlp = true"),
    ({"model": {"parallel_attn_mlp": True, "num_experts": 8, "moe_top_k": 2}},
     "model.parallel_attn_mlp with num_experts > 1 is not modelled"),
    ({"model": {"parallel_attn_mlp": True}, "parallelism": {"recompute": "selective", "recompute_modules": ["mlp"]}},
     "recompute_modules: 'mlp' (Megatron-Core's recompute_mlp"),
])
def test_rejections_name_key_and_numbers(sections, message):
    with pytest.raises(ScenarioError) as err:
        scenario_from_dict(base(**sections))
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_file_errors(tmp_path):
    with pytest.raises(ScenarioError, match="does not exist"):
        load_scenario(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\npreset = 1")
    with pytest.raises(ScenarioError, match="malformed TOML"):
        load_scenario(bad)
    ok = tmp_path / "ok.toml"
    ok.write_text('[model]\npreset = "gpt3-1.3b"\n[cluster]\nnum_nodes = 1\n[training]\nglobal_batch_size = 8\n')
    s = load_scenario(ok)
    assert s.name == "ok" and s.parallel.dp == 8
    with pytest.raises(ScenarioError, match="--set 'tp=4'"):
        load_scenario(ok, ["tp=4"])


@pytest.mark.parametrize("mlp", ["squared-relu", "geglu"])
def test_nemotron_and_grok_mlp_kinds_load(mlp):
    """Nemotron-4 (squared ReLU) and Grok-1 (GeGLU) rows of the shared validation file load."""
    scn = scenario_from_dict(base(model={"mlp": mlp, "norm": "layernorm"}))
    assert scn.model.mlp == mlp and scn.model.norm == "layernorm" and scn.model.bias is False


def test_preset_overrides_rederive_head_dim_and_position_table():
    """A preset's derived head_dim (hidden/heads) and position table follow the file's overrides."""
    m = scenario_from_dict(base(model={"hidden_size": 6144, "num_attention_heads": 48,
                                       "num_kv_heads": 48, "seq_length": 4096})).model
    assert m.head_dim == 128 and m.max_position_embeddings == 4096
    m = scenario_from_dict(base(model={"head_dim": 64, "num_attention_heads": 192, "num_kv_heads": 192})).model
    assert m.head_dim == 64 and m.q_size == 12288


def test_window_rejected_with_message():
    with pytest.raises(ScenarioError, match="model.sliding_window_pattern 1 makes every layer global"):
        scenario_from_dict(base(model={"sliding_window": 1024, "sliding_window_pattern": 1}))


def test_hf_config_needs_the_training_sequence_length():
    from pathlib import Path
    data = Path(__file__).parent / "data" / "hf"
    raw = base(model={"preset": None})
    raw["model"] = {"hf_config": "Llama-3.1-8B/config.json"}
    raw["parallelism"] = {"tp": 8, "pp": 1}
    with pytest.raises(ScenarioError) as err:
        scenario_from_dict(raw, base_dir=data)
    assert "model.seq_length is required with model.hf_config" in str(err.value)
    raw["model"]["seq_length"] = 8192
    scn = scenario_from_dict(raw, base_dir=data)
    assert scn.model.seq_length == 8192 and scn.model.name == "Llama-3.1-8B"
    assert scn.model.num_params() == 8_030_261_248


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_numbers_are_refused_by_name(tmp_path, value):
    f = tmp_path / "s.toml"
    f.write_text('[model]\npreset = "gpt3-1.3b"\n[cluster]\npreset = "dgx-a100-80gb"\nnum_nodes = 1\n'
                 f'nic_bandwidth_Gbps = {value}\n[training]\nglobal_batch_size = 8\n')
    with pytest.raises(ScenarioError, match="cluster.nic_bandwidth_Gbps must be a finite number"):
        load_scenario(f)


def test_fp8_needs_a_gpu_with_fp8_tensor_cores():
    raw = {"model": {"preset": "gpt3-1.3b"}, "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1},
           "training": {"global_batch_size": 8, "dtype": "fp8"}}
    with pytest.raises(ScenarioError, match="training.dtype = 'fp8' needs FP8 tensor cores; cluster.gpu a100"):
        scenario_from_dict(raw)
    raw["cluster"]["preset"] = "dgx-h100"
    assert scenario_from_dict(raw).training.dtype == "fp8"


def test_a_presets_derived_sizes_follow_an_override():
    """A preset's multi-head attention and its 4h MLP are derived sizes: overriding the heads or the
    hidden size re-derives them (a GPT preset does not silently become grouped-query attention); a
    grouped-query preset keeps its KV heads."""
    from simulator.scenario import load_scenario
    root = Path(__file__).resolve().parents[1] / "scenarios"
    gpt = root / "gpt3-1.3b-8xa100.toml"
    m = load_scenario(gpt, ["model.hidden_size=4096"]).model
    assert (m.ffn_hidden_size, m.num_kv_heads) == (4 * 4096, m.num_attention_heads)
    m = load_scenario(gpt, ["model.num_attention_heads=32"]).model
    assert m.num_kv_heads == 32
    m = load_scenario(gpt, ["model.num_attention_heads=32", "model.num_kv_heads=8"]).model
    assert m.num_kv_heads == 8
    llama = load_scenario(root / "llama3-70b-torchtitan-64xa100.toml", ["model.num_attention_heads=32"]).model
    assert (llama.num_kv_heads, llama.ffn_hidden_size) == (8, 28672)
