"""Megatron-Core's attention through Transformer Engine (model/te_layout): the copies that lay Q, K, V out
for the kernel, per element of the query block, by backend, attention kind and CP."""

import pytest

from simulator.model.opgraph import build_op_graph
from simulator.model.presets import MODEL_PRESETS
from simulator.model.te_layout import layout_bytes, te_cp
from simulator.scenario import scenario_from_dict
from simulator.strategy.lower import graph_args, lower

GPT3 = MODEL_PRESETS["gpt3-175b"]  # multi-head, learned positions: the interleaved sbh3d layout
LLAMA8 = MODEL_PRESETS["llama3.1-8b"]  # GQA 32/8 with RoPE: K and V a quarter of Q each
LLAMA2_7 = MODEL_PRESETS["llama2-7b"]  # multi-head with RoPE


@pytest.mark.parametrize("model, attention, cp, want", [
    (GPT3, "cudnn", 1, (0.0, 0.0)),  # cuDNN takes sbh3d as it is, and writes dQKV interleaved
    (GPT3, "cudnn", 2, (6.0, 6.0)),  # q, k, v made contiguous before TE's ring; the gradients concatenated
    (GPT3, "flash", 1, (8.0, 6.0)),  # transposes in (2 x 3) and out (2); fa_prepare_bwd (2 x 3)
    (LLAMA8, "cudnn", 1, (2.5, 3.0)),  # the query reshape (2), V made contiguous (2 x 1/4); the cat (2 x 1.5)
    (LLAMA8, "flash", 2, (7.5, 3.0)),  # + the transposes in (2 x 1.5) and out (2)
    (LLAMA2_7, "cudnn", 1, (2.0, 6.0)),  # no reshape copy; V made contiguous; the cat of three full blocks
])
def test_bytes_per_query_element(model, attention, cp, want):
    assert layout_bytes(model, attention, cp) == pytest.approx(want)


@pytest.mark.parametrize("sharding, kernels, attention, want", [
    ("megatron-distopt", "fused", "cudnn", 2), ("megatron-distopt", "fused", "flash", 2),
    ("megatron-distopt", "fused", "unfused", 0), ("megatron-distopt", "eager", "flash", 0),
    ("fsdp2", "fused", "flash", 0), ("fsdp1", "fused", "flash-varlen", 0), ("deepspeed", "fused", "cudnn", 0)])
def test_only_megatron_core_through_te_pays_them(sharding, kernels, attention, want):
    assert te_cp(sharding, kernels, attention, "te", 2) == want
    assert te_cp(sharding, kernels, attention, "sdpa", 2) == 0  # PyTorch's SDPA on the projection's views


def _scn(sharding_zero, attention, model="llama3.1-8b", layers=2):
    zero, extra = sharding_zero
    return scenario_from_dict({"model": {"preset": model, "num_layers": layers, "seq_length": 4096},
                               "cluster": {"preset": "dgx-h100", "num_nodes": 1},
                               "parallelism": {"tp": 2, "dp": 4, "zero_stage": zero, **extra},
                               "training": {"global_batch_size": 8, "micro_batch_size": 1, "attention": attention}},
                              default_name="layout")


def test_the_lowering_carries_the_op_before_the_core_split_like_the_query():
    s = _scn((1, {}), "cudnn")
    g = lower(s).graph
    ops = [w for t in g.tasks if t.layer == 0 and t.phase == "F" for w in t.work if w.name == "qkv_layout"]
    q_elements = 4096 * LLAMA8.q_size / 2  # one micro-batch's tokens, the query heads of one TP rank
    assert ops and all(w.bytes == pytest.approx(2.5 * 2 * q_elements) for w in ops)
    graph = build_op_graph(s.model, *graph_args(s))
    names = [op.name for op in graph.layer]
    assert names.index("qkv_layout") == names.index("attn_core") - 1


def test_fsdp_and_mla_layers_have_none():
    fsdp = _scn((3, {}), "flash")
    assert "qkv_layout" not in [op.name for op in build_op_graph(fsdp.model, *graph_args(fsdp)).layer]
    mla = _scn((1, {}), "cudnn", model="deepseek-v3", layers=4)
    assert "qkv_layout" not in [op.name for op in build_op_graph(mla.model, *graph_args(mla)).layer]


def test_the_readme_s_range_over_the_presets():
    """README: per element of the query block, 0 to 10 bytes per byte of the dtype forward and 0 to 6
    backward, over every preset without MLA, both backends, with and without CP."""
    got = [layout_bytes(m, a, cp) for m in MODEL_PRESETS.values() if not m.is_mla
           for a in ("flash", "cudnn") for cp in (1, 2)]
    assert (min(f for f, _ in got), max(f for f, _ in got)) == (0.0, 10.0)
    assert (min(b for _, b in got), max(b for _, b in got)) == (0.0, 6.0)
