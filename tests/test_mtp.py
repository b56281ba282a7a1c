"""Multi-token prediction (DeepSeek-V3 §2.2; Megatron-core mtp_num_layers; model.mtp_layers): the
module's ops, parameters and FLOPs, its place on the pipeline, and the shared embedding's copy."""

from dataclasses import replace

import pytest

from simulator.model.opgraph import build_op_graph, gemm_flops
from simulator.model.spec import ModelSpec
from simulator.scenario import scenario_from_dict
from simulator.strategy.lower import lower
from simulator.strategy.schedules import stage_map
from simulator.strategy.stage_units import chunk_layers, rank_param_counts

MOE = ModelSpec("m", num_layers=4, hidden_size=256, num_attention_heads=8, vocab_size=1024, seq_length=256,
                mlp="swiglu", num_experts=4, moe_top_k=2, moe_first_dense_layers=1)


def test_module_is_its_inputs_then_a_main_kind_layer_and_a_second_head():
    g0, g1 = build_op_graph(MOE, 2), build_op_graph(replace(MOE, mtp_layers=1), 2)
    names = [op.name for op in g1.mtp_layer]
    assert names[:4] == ["mtp_embed", "mtp_enorm", "mtp_hnorm", "mtp_eh_proj"]
    assert tuple(op.name for op in g1.mtp_layer[4:]) == tuple(op.name for op in g0.layer)  # the MoE kind
    assert g1.layer_ops(4) is g1.mtp_layer and g1.layer_ops(3) is g1.layer
    assert [op.name for op in g1.head] == ["final_norm", "lm_head", "loss", "mtp0_final_norm", "mtp0_lm_head",
                                           "mtp0_loss"]
    t, h, v = 2 * MOE.seq_length, MOE.hidden_size, MOE.vocab_size
    extra = sum(op.fwd_flops for op in g0.layer) + gemm_flops(t, h, 2 * h) + gemm_flops(t, v, h)
    assert g1.fwd_flops() - g0.fwd_flops() == pytest.approx(extra)


def test_parameters_of_the_module_exclude_the_shared_embedding_and_head():
    m = replace(MOE, mtp_layers=2)
    assert m.num_params() - MOE.num_params() == 2 * (MOE.params_per_layer() + 2 * 256 * 256 + 3 * MOE.norm_params())
    assert build_op_graph(m, 1).num_params() == m.num_params()
    inactive = (4 - 2) * MOE.expert_params()
    assert m.num_active_params() - MOE.num_active_params() == 2 * (m.mtp_module_params() - inactive)


@pytest.mark.parametrize("schedule, p, v, head_stage", [("1f1b", 4, 1, 3), ("interleaved-1f1b", 2, 2, 3),
                                                        ("zb-v", 2, 2, 3)])
def test_modules_follow_the_last_layer_on_the_heads_virtual_stage(schedule, p, v, head_stage):
    smap = stage_map(schedule, p)
    chunks = chunk_layers((4,) * p, v, smap, mtp_layers=2)
    last = 4 * p - 1
    assert chunks[head_stage][-3:] == (last, last + 1, last + 2)
    assert sorted(i for c in chunks for i in c) == list(range(4 * p + 2))


def test_lowering_runs_the_module_on_the_last_stage_with_its_all_to_alls_and_an_embedding_copy():
    raw = {"model": {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "vocab_size": 1024,
                     "seq_length": 256, "mlp": "swiglu", "num_experts": 4, "moe_top_k": 2, "mtp_layers": 1},
           "cluster": {"preset": "dgx-h100", "num_nodes": 1},
           "parallelism": {"tp": 1, "pp": 2, "dp": 4, "ep": 2},
           "training": {"global_batch_size": 8, "micro_batch_size": 1}}
    scn = scenario_from_dict(raw, default_name="t")
    plan = lower(scn)
    plan.graph.validate()
    mtp = [t for t in plan.graph.tasks if t.layer == 4]
    assert mtp and {plan.mesh.stage_of(t.rank) for t in mtp} == {1}
    assert any(t.comm is not None and t.comm.op == "all_to_all" for t in mtp)
    model = scn.model
    with_mtp = rank_param_counts(model, scn.parallel, 1)["dense"]
    without = rank_param_counts(replace(model, mtp_layers=0), scn.parallel, 1)["dense"]
    embed = model.vocab_size * model.hidden_size
    assert with_mtp - without == model.mtp_module_params() - 4 * model.expert_params() + embed


def test_a_negative_depth_is_refused_by_name():
    with pytest.raises(ValueError, match="mtp_layers"):
        replace(MOE, mtp_layers=-1).check()


def test_deepspeed_fetches_each_layer_by_its_own_submodules():
    """DeepSpeed ZeRO-3 gathers per submodule: a dense first layer and an MTP module (its 2h -> h
    projection) are fetched by their own templates' sizes, not the main layer's."""
    from simulator.strategy.sharding import layer_submodules

    h = 512
    m = replace(MOE, hidden_size=h, mtp_layers=1)
    subs = layer_submodules(build_op_graph(m, 1), 1, 1)
    assert len(subs) == 5 and subs[1] == subs[3]
    assert subs[0] != subs[1]  # the dense first layer's MLP
    assert sum(subs[4]) - sum(subs[1]) == 2 * h * h  # the projection; its norms stay persistent
