"""The compute cost model against the kernels measured on an H100 SXM (scenarios/calibration/h100/,
made by benchmarks/gpu_kernels.py and benchmarks/gpu_layer.py on a lent GPU): FP8 split accumulation,
whole layers, and the GEMM shapes of today's layers."""

import csv
import dataclasses
import json
from pathlib import Path

import pytest

from simulator.cost.compute import FP8_SPLIT_ACCUMULATOR_RATE, RooflineCompute
from simulator.hardware.gpus import GPU_PRESETS
from simulator.model.opgraph import build_op_graph, gemm_flops
from simulator.model.presets import MODEL_PRESETS
from simulator.strategy.sharding import shard_ops, shard_ops_backward
from simulator.tasks import OpWork

H100 = GPU_PRESETS["h100-sxm5-80gb"]
B200 = GPU_PRESETS["b200-sxm-180gb"]
MEASURED = Path(__file__).resolve().parents[1] / "scenarios" / "calibration" / "h100"


def _gemm(shape, precision="", backward=False):
    m, n, k = shape
    return OpWork("g", "gemm", gemm_flops(m, n, k), 0.0, shape, precision, backward)


def test_fp8_dgrad_and_wgrad_run_split_accumulators_on_hopper_only():
    shape = (8192, 8192, 8192)
    h100 = RooflineCompute(H100, "fp8")
    fprop, grad = (h100.op_time_s(_gemm(shape, "fp8", b)) for b in (False, True))
    over = h100.eff.kernel_overhead_s
    assert (grad - over) == pytest.approx((fprop - over) / FP8_SPLIT_ACCUMULATOR_RATE["hopper"], rel=1e-9)
    # BF16 GEMMs have one accumulator: forward and backward GEMMs of one shape take the same time
    assert h100.op_time_s(_gemm(shape, "", True)) == h100.op_time_s(_gemm(shape))
    b200 = RooflineCompute(B200, "fp8")
    assert b200.op_time_s(_gemm(shape, "fp8", True)) == b200.op_time_s(_gemm(shape, "fp8"))
    # still faster than the BF16 GEMM, never faster than half of it
    bf16 = h100.op_time_s(_gemm(shape))
    assert bf16 / 2 < grad < bf16


def test_fused_fp8_backward_gemm_prices_both_gradients_with_split_accumulators():
    rc = RooflineCompute(H100, "fp8")
    m, n, k = 4096, 14336, 4096
    fused = OpWork("fc1", "gemm", 2 * gemm_flops(m, n, k), 0.0, (m, n, k), "fp8", True)
    dgrad = rc.op_time_s(_gemm((m, k, n), "fp8", True))
    wgrad = rc.op_time_s(_gemm((k, n, m), "fp8", True))
    assert rc.op_time_s(fused) == pytest.approx(dgrad + wgrad, rel=1e-9)


def _layer_s(model, seq: int, attention: str) -> tuple[float, float]:
    """Forward and forward + backward seconds of one layer at TP 1, micro-batch 1, BF16."""
    m = dataclasses.replace(model, seq_length=seq)
    rc = RooflineCompute(H100, "bf16", attention)
    g = build_op_graph(m, 1, "bf16", attention=attention)
    fwd = sum(rc.op_time_s(w) for w in shard_ops(g.layer, 1, False, 1, 1))
    bwd = sum(rc.op_time_s(w) for w in shard_ops_backward(g.layer, 1, False, 1, 1, "BW", 4.0))
    return fwd, fwd + bwd


def test_a_llama_layer_costs_what_it_measured_on_an_h100():
    doc = json.loads((MEASURED / "gpu_layer.json").read_text())
    spec = doc["model"]
    model = MODEL_PRESETS["llama3.1-8b"]
    assert (model.hidden_size, model.ffn_hidden_size, model.num_attention_heads, model.num_kv_heads) == (
        spec["hidden"], spec["ffn"], spec["heads"], spec["kv_heads"])
    fwd, both = _layer_s(model, spec["seq"], "cudnn")
    assert fwd == pytest.approx(doc["forward_per_layer_s"], rel=0.05)
    assert both == pytest.approx(doc["fwd_bwd_per_layer_s"], rel=0.05)


def _measured_gemms(name: str, section: str):
    with open(MEASURED / name) as f:
        return [r for r in csv.DictReader(f) if r["section"] == section]


def test_measured_split_accumulation_rate_is_the_constant():
    rows = _measured_gemms("gpu_fp8_accum.csv", "fp8_accum")
    times: dict = {}
    for r in rows:
        base, acc = r["name"].rsplit(".", 1)
        times.setdefault((base, r["pass"]), {})[acc] = float(r["time_s"])
    ratios = [t["fast"] / t["split"] for t in times.values()]
    assert len(ratios) == 39
    assert sum(ratios) / len(ratios) == pytest.approx(FP8_SPLIT_ACCUMULATOR_RATE["hopper"], abs=5e-4)
