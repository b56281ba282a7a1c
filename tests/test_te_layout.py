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


@pytest.mark.parametrize("model, attention, cp, mb, want", [
    (GPT3, "cudnn", 1, 1, (0.0, 0.0)),  # cuDNN takes sbh3d as it is, and writes dQKV interleaved
    (GPT3, "cudnn", 2, 1, (6.0, 6.0)),  # q, k, v made contiguous before TE's ring; the gradients concatenated
    (GPT3, "flash", 1, 1, (6.0, 6.0)),  # the interleaved views transposed (2 x 3); fa_prepare_bwd (2 x 3)
    (GPT3, "flash", 1, 4, (8.0, 6.0)),  # above micro-batch 1 the output's transpose copies too (2)
    (LLAMA8, "cudnn", 1, 1, (2.5, 3.0)),  # the query reshape (2), V made contiguous (2 x 1/4); the cat (2 x 1.5)
    (LLAMA8, "flash", 2, 1, (2.5, 3.0)),  # contiguous q, k, v at micro-batch 1: their transposes are views
    (LLAMA8, "flash", 2, 2, (7.5, 3.0)),  # above it: the transposes in (2 x 1.5) and out (2)
    (LLAMA2_7, "cudnn", 1, 1, (2.0, 6.0)),  # no reshape copy; V made contiguous; the cat of three full blocks
])
def test_bytes_per_query_element(model, attention, cp, mb, want):
    assert layout_bytes(model, attention, cp, mb) == pytest.approx(want)


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
    """README: per element of the query block, 0 to 10 bytes per byte of the dtype forward (at most 6 at
    micro-batch 1) and 0 to 6 backward, over every preset without MLA, both backends, with and without CP."""
    def span(mbs):
        got = [layout_bytes(m, a, cp, mb) for m in MODEL_PRESETS.values() if not m.is_mla
               for a in ("flash", "cudnn") for cp in (1, 2) for mb in mbs]
        return min(f for f, _ in got), max(f for f, _ in got), min(b for _, b in got), max(b for _, b in got)
    assert span((1, 2)) == (0.0, 10.0, 0.0, 6.0)
    assert span((1,))[1] == 6.0


def test_the_measured_copies_the_calibration_readme_quotes():
    """scenarios/calibration/README.md, from gpu_layout_copies.csv (the lent H100): the concatenations
    within 6% of the model's elementwise time, the strided gathers 1.4-2.0x it, the output transpose at
    micro-batch 1 a view (microseconds for 25 MB)."""
    import csv
    from pathlib import Path

    from simulator.cost.compute import RooflineCompute
    from simulator.hardware.gpus import GPU_PRESETS
    from simulator.tasks import OpWork
    path = Path(__file__).resolve().parents[1] / "scenarios" / "calibration" / "h100" / "gpu_layout_copies.csv"
    rows = {r["op"]: r for r in csv.DictReader(path.open())}
    rc = RooflineCompute(GPU_PRESETS["h100-sxm5-80gb"], "bf16")
    ratio = {op: float(r["time_s"]) / rc.op_time_s(OpWork(op, "elementwise", 0.0, float(r["bytes"])))
             for op, r in rows.items()}
    assert all(abs(ratio[op] - 1) < 0.06 for op in ("dqkv_interleave", "dqkv_cat"))
    strided = [ratio[op] for op in ("qkv_to_bshd", "query_reshape", "value_contiguous")]
    assert (round(min(strided), 1), round(max(strided), 1)) == (1.4, 2.0)
    assert float(rows["out_to_sbhd"]["time_s"]) < 5e-6 and float(rows["out_to_sbhd"]["bytes"]) > 25e6
    gbps = sorted(float(rows[op]["gbps"]) for op in ("qkv_to_bshd", "query_reshape", "value_contiguous"))
    assert (round(gbps[0] / 1e3, 1), round(gbps[-1] / 1e3, 1)) == (1.3, 1.8)
    cats = sorted(float(rows[op]["gbps"]) for op in ("dqkv_interleave", "dqkv_cat"))
    assert (round(cats[0] / 1e3, 1), round(cats[-1] / 1e3, 1)) == (2.5, 2.8)
