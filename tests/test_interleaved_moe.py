"""MoE layers interleaved with dense ones (ModelSpec.moe_layer_interval: Llama 4 Maverick's
interleave_moe_layer_step 2, Megatron-core moe_layer_freq [0, 1] * 24): which layers are MoE, what they
count, what the op graph and the lowering give each, and the Llama 4 presets against Meta's figures."""

import pytest

from simulator.model.opgraph import build_op_graph
from simulator.model.presets import MODEL_PRESETS
from simulator.model.spec import ModelSpec
from simulator.pipeline import simulate
from simulator.scenario import scenario_from_dict

KW = dict(num_layers=6, hidden_size=64, num_attention_heads=4, vocab_size=128, seq_length=32, mlp="swiglu",
          ffn_hidden_size=256, num_experts=4, moe_top_k=1, moe_ffn_hidden_size=96)


def test_every_n_th_layer_is_moe_after_the_first_dense_ones():
    m = ModelSpec("m", moe_layer_interval=2, **KW)
    assert [m.has_dense_mlp(i) for i in range(6)] == [True, False, True, False, True, False]  # HF: (i + 1) % 2
    assert m.num_moe_layers == 3
    both = ModelSpec("m", moe_layer_interval=2, moe_first_dense_layers=3, **KW)
    assert [both.has_dense_mlp(i) for i in range(6)] == [True, True, True, False, True, False]
    every = ModelSpec("m", **KW)
    assert not any(every.has_dense_mlp(i) for i in range(6)) and every.num_moe_layers == 6
    assert not m.has_dense_mlp(6)  # an MTP layer is of the main (MoE) kind
    dense_model = ModelSpec("d", **{**KW, "num_experts": 1})
    assert not any(dense_model.has_dense_mlp(i) for i in range(6))


def test_parameters_count_each_layer_by_its_kind():
    m = ModelSpec("m", moe_layer_interval=3, **KW)
    assert m.num_moe_layers == 2
    assert m.num_params() == (m.embedding_params() + 2 * m.params_per_layer() + 4 * m.dense_layer_params()
                              + m.head_params())
    inactive = (4 - 1) * m.expert_params()
    assert m.num_active_params() == m.num_params() - 2 * inactive


def test_the_op_graph_gives_each_layer_its_template():
    m = ModelSpec("m", moe_layer_interval=2, **KW)
    g = build_op_graph(m, 1)
    kinds = [g.layer_ops(i) for i in range(6)]
    assert kinds[0] == kinds[2] == kinds[4] == g.dense_layer and kinds[1] == kinds[3] == kinds[5] == g.layer
    assert g.num_params() == m.num_params()
    assert not any(op.name.startswith("router") for op in g.dense_layer)


@pytest.mark.parametrize("bad", [0, 7])
def test_an_interval_outside_the_layers_is_refused(bad):
    with pytest.raises(ValueError, match=f"moe_layer_interval {bad} must be 1"):
        ModelSpec("m", moe_layer_interval=bad, **KW).check()
    with pytest.raises(ValueError, match="moe_layer_interval 2 must be 1"):
        ModelSpec("d", moe_layer_interval=2, **{**KW, "num_experts": 1}).check()


def test_llama4_presets_match_metas_parameter_counts():
    scout, maverick = MODEL_PRESETS["llama4-scout"], MODEL_PRESETS["llama4-maverick"]
    # Meta's model cards: 17B active for both; 109B and 400B total (the text model counts 107.8B / 400.7B)
    for m in (scout, maverick):
        assert round(m.num_active_params() / 1e9) == 17
    assert maverick.num_params() == pytest.approx(400e9, rel=0.005)
    assert scout.num_params() == pytest.approx(109e9, rel=0.02)
    # the figures the README and the presets' docstring quote
    assert [round(m.num_params() / 1e9, 1) for m in (scout, maverick)] == [107.8, 400.7]
    assert [round(m.num_active_params() / 1e9, 1) for m in (scout, maverick)] == [17.2, 17.2]
    assert (scout.num_moe_layers, maverick.num_moe_layers) == (48, 24)


def test_an_interleaved_moe_step_lowers_and_runs_with_expert_parallelism():
    raw = {"model": {"preset": "llama4-maverick", "num_layers": 4, "seq_length": 1024},
           "cluster": {"preset": "dgx-h100", "num_nodes": 2},
           "parallelism": {"tp": 2, "pp": 2, "dp": 4, "ep": 8, "etp": 1, "sequence_parallel": True},
           "training": {"global_batch_size": 16, "micro_batch_size": 1}}
    res = simulate(scenario_from_dict(raw, default_name="maverick-4"))
    names = {t.name for t in res.graph.tasks if t.name.startswith("F0.L")}
    # layers 1 and 3 route their tokens (dispatch, experts, combine); layers 0 and 2 are dense MLPs
    assert {f"F0.L{i}.{op}" for i in (1, 3) for op in ("dispatch", "experts", "combine")} <= names
    assert not {n for n in names if n.startswith(("F0.L0.", "F0.L2.")) and n.endswith(("dispatch", "combine"))}
    assert res.metrics["iteration_time_s"] > 0 and res.metrics["fits_in_memory"]
