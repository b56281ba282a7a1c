"""torchtitan's per-op selective activation checkpointing (parallelism.recompute = "selective-op";
torchtitan distributed/activation_checkpoint.py SelectiveAC): the policy saves matmul and attention
outputs except every second matmul of a block, and the backward re-runs the rest of the block's
forward at once. The kept bytes and the re-run work in closed form, the lowering's recompute task, the
step between no and full recompute, the estimate's memory equal to the simulation's, the refusals."""

from __future__ import annotations

import pytest

from simulator.explore.estimate import EstimateCache, estimate
from simulator.model.presets import MODEL_PRESETS
from simulator.pipeline import simulate
from simulator.scenario import scenario_from_dict
from simulator.scenario_checks import ScenarioError
from simulator.strategy.activation_memory import layer_activation_bytes
from simulator.strategy.recompute import recomputed_forward


def _raw(recompute: str, preset: str = "llama3-8b", **par) -> dict:
    return {"model": {"preset": preset, "num_layers": 4}, "cluster": {"preset": "dgx-h100", "num_nodes": 1},
            "parallelism": {"tp": 1, "pp": 1, "zero_stage": 3, "recompute": recompute, **par},
            "training": {"global_batch_size": 16, "micro_batch_size": 2}}


@pytest.mark.parametrize("preset", ["llama3-8b", "gpt3-1.3b"])
def test_kept_bytes_are_the_saved_ops_outputs(preset):
    """Per token, in the training dtype: the layer input, q, v, the attention output, the gate's output
    (the whole fc1 output without a gate) and, with a gate, the down projection's h-wide output."""
    m = MODEL_PRESETS[preset]
    b, d = 2, 2
    kept = layer_activation_bytes(m, b, 1, False, 1, "selective-op", d, attention="flash")
    h, q, kv, f = m.hidden_size, m.num_attention_heads * m.head_dim, m.num_kv_heads * m.head_dim, m.ffn_hidden_size
    per_token = h + q + kv + h + f + (h if m.gated_mlp else 0)
    assert kept == pytest.approx(b * m.seq_length * per_token * d)
    none = layer_activation_bytes(m, b, 1, False, 1, "none", d, attention="flash")
    full = layer_activation_bytes(m, b, 1, False, 1, "full", d, attention="flash")
    assert full < kept < none


def test_the_rerun_is_the_forward_but_attention_and_the_odd_matmuls():
    """Llama's matmuls count q 1, k 2, v 3, o 4, gate 5, up 6, down 7: k, o and up are re-run (the
    fused QKV GEMM's k columns, the output projection, half the fused gate-up GEMM), with every
    non-matmul op of the forward; the attention core is not."""
    scn = scenario_from_dict(_raw("selective-op"), default_name="t")
    b = EstimateCache().layer_blocks(scn)[0]
    m = scn.model
    ops = recomputed_forward("selective-op", (), m, b).ops
    fwd = {w.name: w for seg in b.segments() for w in seg.fwd}
    assert not any(w.kind == "attention" for w in ops)
    others = {n for n, w in fwd.items() if w.kind not in ("gemm", "attention")}
    assert {w.name for w in ops if w.kind != "gemm"} == others
    gemms = {w.name: w for w in ops if w.kind == "gemm"}
    assert set(gemms) == {"qkv.mm1", "attn_out.mm0", "fc1.mm1"}
    qkv, fc1 = fwd["qkv"], fwd["fc1"]
    kv = m.num_kv_heads * m.head_dim
    assert gemms["qkv.mm1"].shape == (qkv.shape[0], kv, qkv.shape[2])
    assert gemms["qkv.mm1"].flops == pytest.approx(qkv.flops * kv / qkv.shape[1])
    assert gemms["attn_out.mm0"].flops == fwd["attn_out"].flops
    assert gemms["fc1.mm1"].flops == pytest.approx(fc1.flops / 2)
    assert recomputed_forward("selective-op", (), m, b).ops is ops  # one tuple per layer template


def test_the_step_sits_between_no_and_full_recompute():
    runs = {rc: simulate(scenario_from_dict(_raw(rc), default_name=rc)) for rc in ("none", "selective-op", "full")}
    t = {rc: r.metrics["iteration_time_s"] for rc, r in runs.items()}
    act = {rc: r.metrics["memory_bytes"]["activations"] for rc, r in runs.items()}
    assert t["none"] < t["selective-op"] < t["full"]
    assert act["full"] < act["selective-op"] < act["none"]
    r = runs["selective-op"]
    rank = r.graph.ranks[0]
    rec = [x for x in r.graph.tasks if x.rank == rank and x.category == "recompute"]
    assert len(rec) == 4 and all(x.name.endswith(".R.sac") for x in rec)  # one per layer and micro-batch
    scn = r.scenario
    assert estimate(scn).total_bytes == pytest.approx(r.metrics["memory_bytes"]["total"], rel=1e-9)


def test_under_float8_the_policy_keeps_the_same_outputs_and_reruns_the_casts():
    """torchao's Float8Linear calls aten.mm on its Float8Tensor arguments, which SAC's dispatch mode sees
    before the subclass turns it into _scaled_mm (modes dispatch before subclasses): the save list's
    aten.mm (torchtitan parallelize_llama.py at 9dec370 to e7c0cae) still counts and keeps every odd
    matmul's bf16 output. The re-run's GEMMs keep their FP8 precision and take their casts with them."""
    bf16 = scenario_from_dict(_raw("selective-op"), default_name="b")
    fp8 = scenario_from_dict({**_raw("selective-op"), "training": {"global_batch_size": 16, "micro_batch_size": 2,
                                                                   "dtype": "fp8", "fp8_recipe": "current"}},
                             default_name="f")
    m = bf16.model
    assert layer_activation_bytes(m, 2, 1, False, 1, "selective-op", 2, attention="flash", fp8=True) == \
        layer_activation_bytes(m, 2, 1, False, 1, "selective-op", 2, attention="flash")
    b = EstimateCache().layer_blocks(fp8)[0]
    ops = recomputed_forward("selective-op", (), m, b).ops
    assert {w.name for w in ops if w.kind == "gemm"} == {"qkv.mm1", "attn_out.mm0", "fc1.mm1"}
    assert {w.precision for w in ops if w.kind == "gemm"} == {"fp8"}
    casts = [w for seg in b.segments() for w in seg.fwd if w.kind != "gemm" and "fp8" in w.name]
    assert casts and all(w in ops for w in casts)
    t = {s.training.dtype: simulate(s).metrics["iteration_time_s"] for s in (bf16, fp8)}
    assert t["fp8"] < t["bf16"]


@pytest.mark.parametrize("raw, match", [
    (_raw("selective-op", tp=2), r"sequence-parallel TP and fused attention; got parallelism.sequence_parallel"),
    (_raw("selective-op", cp=2), r"got parallelism.cp = 2"),
    (_raw("selective-op", preset="mixtral-8x7b"), r"got model.num_experts = 8"),
    (_raw("selective-op", sharding="deepspeed"), r"got parallelism.sharding = 'deepspeed'"),
    ({**_raw("selective-op"), "training": {"global_batch_size": 16, "micro_batch_size": 2, "attention": "unfused"}},
     r"got training.attention = 'unfused'"),
])
def test_unmodelled_combinations_are_refused_by_name(raw, match):
    with pytest.raises(ScenarioError, match=match):
        scenario_from_dict(raw, default_name="bad")


def test_with_sequence_parallel_tp_the_rerun_gathers_each_block_input_again():
    """torchtitan's save list holds the reduce-scatters but not the all-gathers (parallelize_llama.py
    ``_save_list`` at 9dec370 and 820504e): per layer and micro-batch the re-run all-gathers the
    attention's input, re-runs the attention block's ops, all-gathers the MLP's input and re-runs the
    MLP block's; no reduce-scatter is re-run. The same ops as without TP, split at the MLP."""
    r = simulate(scenario_from_dict(_raw("selective-op", tp=2, sequence_parallel=True), default_name="tp"))
    rank = r.graph.ranks[0]
    rec = [x for x in r.graph.tasks if x.rank == rank and ".R." in x.name]
    per_layer = [x.name.split(".R.", 1)[1] for x in rec[:4]]
    assert per_layer == ["attn.all_gather", "sac", "mlp.all_gather", "sac_mlp"]
    assert len(rec) == 4 * 2 * 4 and not any("reduce_scatter" in x.name for x in rec)  # layers x micro-batches
    scn = r.scenario
    b = EstimateCache().layer_blocks(scn)[0]
    again = recomputed_forward("selective-op", (), scn.model, b)
    attn, mlp = again.ops_split
    assert again.ops == attn + mlp and mlp and all(w.name in ("ln2", "fc1.mm1", "act", "mlp_residual")
                                                   for w in mlp)
    assert estimate(scn).total_bytes == pytest.approx(r.metrics["memory_bytes"]["total"], rel=1e-9)


def test_with_tp_the_saved_reduce_scatters_and_the_whole_down_projection_are_kept():
    """Per token of the layer (s tokens, t ranks, sequence-parallel): the no-TP terms over t, plus the two
    reduce-scatter outputs (h/t each) and, with a gate, the down projection's partial sum for the
    whole sequence (h), which the policy saves as an mm output before its reduce-scatter."""
    m = MODEL_PRESETS["llama3-8b"]
    b, d, t = 2, 2, 4
    kept = layer_activation_bytes(m, b, t, True, 1, "selective-op", d, attention="flash")
    h, q, kv, f = m.hidden_size, m.num_attention_heads * m.head_dim, m.num_kv_heads * m.head_dim, m.ffn_hidden_size
    per_token = (h + q + kv + h + f) / t + h + 2 * h / t
    assert kept == pytest.approx(b * m.seq_length * per_token * d)
