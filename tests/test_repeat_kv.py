"""PyTorch modules that repeat GQA's keys and values for SDPA (model/repeat_kv): the copy's bytes per element
of the query block, where it applies, and its place in the lowered layer."""

import pytest

from simulator.model.opgraph import build_op_graph
from simulator.model.presets import MODEL_PRESETS
from simulator.model.repeat_kv import repeat_bytes, repeats_kv
from simulator.scenario import scenario_from_dict
from simulator.strategy.lower import graph_args, lower


@pytest.mark.parametrize("preset, want", [
    ("llama3.1-8b", 2.5),  # 32 query heads, 8 K/V heads: K and V read (2 x 1/4), written 4 times (2)
    ("llama3.1-70b", 2.25),  # 64 and 8: rho = 1/8 (README: 2.5, 2.25 and 2.125 for the three Llama 3.1 sizes)
    ("llama3.1-405b", 2.125),  # 128 and 8
    ("llama2-7b", 0.0),  # multi-head: repeat_kv returns its input
    ("gpt3-175b", 0.0),
    ("deepseek-v3", 0.0),  # MLA: a key per query head, no repeat
])
def test_bytes_per_query_element_both_ways(preset, want):
    assert repeat_bytes(MODEL_PRESETS[preset]) == pytest.approx((want, want))


@pytest.mark.parametrize("preset, want", [("llama3.1-8b", True), ("mixtral-8x7b", True), ("qwen3-235b-a22b", True),
                                          ("gpt3-175b", False), ("llama2-7b", False), ("deepseek-v3", False)])
def test_which_presets_repeat(preset, want):
    """GQA presets repeat K and V; multi-head ones and MLA (a key per query head) do not."""
    assert repeats_kv(MODEL_PRESETS[preset]) == want


def _scn(module, kernels="eager", tp=2, model="llama3.1-8b"):
    return scenario_from_dict({"model": {"preset": model, "num_layers": 2, "seq_length": 4096},
                               "cluster": {"preset": "dgx-h100", "num_nodes": 1},
                               "parallelism": {"tp": tp, "dp": 8 // tp, "zero_stage": 3, "sharding": "fsdp2",
                                               "sequence_parallel": tp > 1},
                               "training": {"global_batch_size": 8 // tp, "micro_batch_size": 1,
                                            "attention": "flash", "kernels": kernels, "attention_module": module}},
                              default_name="repeat")


@pytest.mark.parametrize("kernels", ["eager", "fused"])
def test_sdpa_layers_carry_the_copy_before_the_core_split_like_the_query(kernels):
    s = _scn("sdpa", kernels)
    names = [op.name for op in build_op_graph(s.model, *graph_args(s)).layer]
    assert names.index("kv_repeat") == names.index("attn_core") - 1
    work = [w for t in lower(s).graph.tasks if t.layer == 0 and t.phase == "F" for w in t.work if w.name == "kv_repeat"]
    q_elements = 4096 * MODEL_PRESETS["llama3.1-8b"].q_size / 2  # one micro-batch, the query heads of a TP rank
    assert work and all(w.bytes == pytest.approx(2.5 * 2 * q_elements) for w in work)


def test_te_module_and_multi_head_models_have_none():
    te = _scn("te")
    assert "kv_repeat" not in [op.name for op in build_op_graph(te.model, *graph_args(te)).layer]
    mha = _scn("sdpa", model="llama2-7b")
    assert "kv_repeat" not in [op.name for op in build_op_graph(mha.model, *graph_args(mha)).layer]


def test_the_copy_makes_a_step_slower_never_faster():
    from simulator.pipeline import simulate_metrics
    with_copy, without = (simulate_metrics(_scn(m))["iteration_time_s"] for m in ("sdpa", "te"))
    assert with_copy > without


def test_eager_sdpa_keeps_the_repeated_k_and_v_in_place_of_k_and_v():
    """Without recompute an eager layer keeps SDPA's inputs, the repeated K and V: a query block each where
    the fused rule keeps K and V; per-op SAC and full recompute keep neither (they re-run the repeat)."""
    from simulator.strategy.activation_memory import layer_activation_bytes
    m = MODEL_PRESETS["llama3.1-8b"]
    tokens, t, d = m.seq_length * 2, 2, 2
    for recompute, extra in (("none", 2 * d * tokens * (m.q_size - m.kv_hidden_size) / t),
                             ("selective-op", 0.0), ("full", 0.0)):
        args = (m, 2, t, True, 1, recompute, d, 1, "flash")
        with_repeat = layer_activation_bytes(*args, eager=True, kv_repeat=True)
        assert with_repeat - layer_activation_bytes(*args, eager=True) == pytest.approx(extra)
    mha = MODEL_PRESETS["llama2-7b"]
    args = (mha, 2, t, True, 1, "none", d, 1, "flash")
    assert layer_activation_bytes(*args, eager=True, kv_repeat=True) == layer_activation_bytes(*args, eager=True)


def test_only_eager_sdpa_scenarios_keep_them():
    from simulator.strategy.stage_units import layer_memory
    stored = {(m, k): layer_memory(_scn(m, k), False, recompute="none").stored
              for m in ("sdpa", "te") for k in ("eager", "fused")}
    assert stored["sdpa", "eager"] > stored["te", "eager"]
    assert stored["sdpa", "fused"] == stored["te", "fused"]  # torch.compile's partitioner: not modelled
