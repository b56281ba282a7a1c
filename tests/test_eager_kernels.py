"""Specification of ``training.kernels = "eager"`` (model/eager.py): the layer's norms, rotary embedding and
gated activation as plain PyTorch modules run them, one kernel per tensor op, against the closed forms
derived op by op in the module; the fused default unchanged; the memory autograd keeps; the scenario
field's errors."""

from __future__ import annotations

import pytest

from simulator.cost.compute import RooflineCompute
from simulator.hardware.gpus import GPU_PRESETS
from simulator.model.eager import RMSNORM_KERNELS, ROPE_KERNELS_PER_TENSOR
from simulator.model.opgraph import build_op_graph
from simulator.model.presets import MODEL_PRESETS
from simulator.pipeline import simulate_metrics
from simulator.scenario import scenario_from_dict
from simulator.scenario_checks import ScenarioError
from simulator.strategy.activation_memory import layer_activation_bytes
from simulator.tasks import OpWork

LLAMA = MODEL_PRESETS["llama3-8b"]
GPT = MODEL_PRESETS["gpt3-1.3b"]
D = 2  # bf16


def _ops(model, kernels, b=1):
    return {op.name: op for op in build_op_graph(model, b, "bf16", kernels=kernels).layer}


def test_eager_rmsnorm_moves_36_and_84_bytes_per_element_in_8_and_13_kernels():
    op, fused = _ops(LLAMA, "eager")["ln1"], _ops(LLAMA, "fused")["ln1"]
    n = LLAMA.seq_length * LLAMA.hidden_size
    assert (op.fwd_bytes, op.bwd_bytes) == (36 * n, 84 * n)  # 28 + 4d and 68 + 8d at d = 2
    assert op.kernels == RMSNORM_KERNELS == (8, 13)
    assert (fused.fwd_bytes, fused.bwd_bytes, fused.kernels) == (2 * D * n, 3 * D * n, (1, 1))


def test_eager_rope_casts_to_fp32_and_back_around_the_complex_product():
    op = _ops(LLAMA, "eager")["rope"]
    n = LLAMA.seq_length * (LLAMA.q_size + LLAMA.kv_hidden_size)
    assert (op.fwd_bytes, op.bwd_bytes) == (20 * n, 20 * n)  # (d + 4) + 8 + (4 + d) each way
    assert op.kernels == (2 * ROPE_KERNELS_PER_TENSOR,) * 2 == (6, 6)  # q and k


def test_eager_swiglu_is_silu_then_the_product():
    op = _ops(LLAMA, "eager")["act"]
    n = LLAMA.seq_length * LLAMA.ffn_hidden_size
    assert (op.fwd_bytes, op.bwd_bytes, op.kernels) == (5 * D * n, 9 * D * n, (2, 3))


def test_eager_squared_relu_and_the_experts_activation():
    nemotron = MODEL_PRESETS["nemotron4-15b"]  # squared ReLU, LayerNorm (one native kernel: unchanged)
    ops, fused = _ops(nemotron, "eager"), _ops(nemotron, "fused")
    n = nemotron.seq_length * nemotron.ffn_hidden_size
    assert (ops["act"].fwd_bytes, ops["act"].bwd_bytes, ops["act"].kernels) == (4 * D * n, 6 * D * n, (2, 2))
    assert ops["ln1"] == fused["ln1"]
    mixtral = _ops(MODEL_PRESETS["mixtral-8x7b"], "eager")["expert_act"]  # SwiGLU experts, on their rows
    assert mixtral.kernels == (2, 3) and mixtral.fwd_bytes == 5 * D * mixtral.shape[0] * mixtral.shape[1]


def test_eager_changes_nothing_else_and_nothing_in_a_gpt_layer():
    eager, fused = _ops(LLAMA, "eager"), _ops(LLAMA, "fused")
    assert {k for k in eager if eager[k] != fused[k]} == {"ln1", "ln2", "rope", "act"}
    # LayerNorm is one native kernel in PyTorch, GELU one, no RoPE: eager GPT runs the fused graph
    assert build_op_graph(GPT, 2, kernels="eager") == build_op_graph(GPT, 2, kernels="fused")
    assert build_op_graph(LLAMA, 1) == build_op_graph(LLAMA, 1, kernels="fused")  # the default
    head = {op.name: op for op in build_op_graph(LLAMA, 1, kernels="eager").head}
    assert head["final_norm"].kernels == RMSNORM_KERNELS


def test_each_eager_kernel_pays_its_overhead_and_its_launch():
    rc = RooflineCompute(GPU_PRESETS["a100-sxm4-80gb"], "bf16", "flash")
    one = OpWork("ln1", "norm", 0.0, 1e8, (1000, 100))
    eight = OpWork("ln1", "norm", 0.0, 1e8, (1000, 100), kernels=8)
    assert rc.op_time_s(eight) - rc.op_time_s(one) == pytest.approx(7 * rc.eff.kernel_overhead_s, rel=1e-9)
    assert (rc.kernel_launches(one), rc.kernel_launches(eight)) == (1, 8)


def test_eager_memory_keeps_each_rmsnorm_input_in_fp32_and_silus_output():
    s, h, f = LLAMA.seq_length, LLAMA.hidden_size, LLAMA.ffn_hidden_size
    for tp, sp in ((1, False), (4, True)):
        fused = layer_activation_bytes(LLAMA, 1, tp, sp, 1, "none", attention="flash")
        eager = layer_activation_bytes(LLAMA, 1, tp, sp, 1, "none", attention="flash", eager=True)
        r = tp if sp else 1
        assert eager - fused == pytest.approx(2 * 4 * s * h / r + D * s * f / tp, rel=1e-12)
        # full recompute keeps the layer input alone, whichever kernels run
        assert (layer_activation_bytes(LLAMA, 1, tp, sp, 1, "full", eager=True)
                == layer_activation_bytes(LLAMA, 1, tp, sp, 1, "full"))


def _raw(kernels, preset="llama3-8b", dtype="bf16"):
    return {"name": "eager", "model": {"preset": preset, "seq_length": 2048},
            "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1},
            "parallelism": {"dp": 8, "zero_stage": 3, "sharding": "fsdp2"},
            "training": {"global_batch_size": 8, "kernels": kernels, "dtype": dtype}}


def test_an_eager_llama_step_is_slower_and_an_eager_gpt_step_is_the_same():
    fused, eager = (simulate_metrics(scenario_from_dict(_raw(k))) for k in ("fused", "eager"))
    assert eager["iteration_time_s"] > fused["iteration_time_s"]
    assert eager["memory_bytes"]["activations"] > fused["memory_bytes"]["activations"]
    gpt = [simulate_metrics(scenario_from_dict(_raw(k, "gpt3-1.3b"))) for k in ("fused", "eager")]
    assert gpt[0]["iteration_time_s"] == gpt[1]["iteration_time_s"]


@pytest.mark.parametrize("kernels, dtype, message", [
    ("jit", "bf16", "training.kernels must be one of fused, eager, got 'jit'"),
    ("eager", "fp8", "training.kernels = \"eager\" cannot run dtype fp8"),
])
def test_bad_kernels_are_refused_by_name(kernels, dtype, message):
    with pytest.raises(ScenarioError, match=message.replace("(", r"\(")):
        scenario_from_dict(_raw(kernels, dtype=dtype))
