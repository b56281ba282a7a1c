"""TP / SP / CP / EP split rules: one rank's share of each op, and parameters per rank."""

import pytest

from simulator.model.opgraph import build_op_graph
from simulator.model.presets import MODEL_PRESETS
from simulator.model.spec import ModelSpec
from simulator.strategy.sharding import (params_per_rank, shard_op, shard_ops,
                                         shard_ops_backward)

GPT = ModelSpec("gpt", num_layers=4, hidden_size=128, num_attention_heads=8, vocab_size=1024,
                seq_length=64)
LLAMA = ModelSpec("llama", num_layers=2, hidden_size=128, num_attention_heads=8, num_kv_heads=4,
                  ffn_hidden_size=320, vocab_size=512, seq_length=64, mlp="swiglu")
MOE = ModelSpec("moe", num_layers=2, hidden_size=128, num_attention_heads=8, num_kv_heads=4,
                ffn_hidden_size=192, vocab_size=512, seq_length=64, mlp="swiglu", num_experts=8,
                moe_top_k=2)


def op(ops, name):
    return next(o for o in ops if o.name == name)


def total_flops(works):
    return sum(w.flops for w in works)


@pytest.mark.parametrize("model", [GPT, LLAMA])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_tp_ranks_sum_to_unsharded_gemm_and_attention_flops(model, tp):
    g = build_op_graph(model, 2)
    for o in g.layer + g.head:
        if o.kind in ("gemm", "attention"):
            assert tp * shard_op(o, tp, False, 1, 1).flops == o.fwd_flops, o.name


def test_column_row_heads_vocab_shapes():
    g = build_op_graph(LLAMA, 1)
    t = 64
    assert shard_op(op(g.layer, "qkv"), 4, False, 1, 1).shape == (t, (128 + 2 * 64) // 4, 128)
    assert shard_op(op(g.layer, "attn_out"), 4, False, 1, 1).shape == (t, 128, 32)
    assert shard_op(op(g.layer, "fc1"), 4, False, 1, 1).shape == (t, 160, 128)
    assert shard_op(op(g.layer, "fc2"), 4, False, 1, 1).shape == (t, 128, 80)
    assert shard_op(op(g.layer, "act"), 4, False, 1, 1).shape == (t, 80)
    assert shard_op(op(g.layer, "attn_core"), 4, False, 1, 1).shape == (1, 2, 64, 64, 16)
    assert shard_op(op(g.head, "lm_head"), 4, False, 1, 1).shape == (t, 128, 128)
    assert shard_op(op(g.head, "loss"), 4, False, 1, 1).shape == (t, 128)


def test_gemm_bytes_column_keeps_full_input():
    g = build_op_graph(GPT, 1)
    w = shard_op(op(g.layer, "fc1"), 4, False, 1, 1)
    m, n, k = 64, 512 // 4, 128
    assert w.bytes == 2 * (m * k + k * n + m * n)


def test_vocab_padded_when_not_divisible():
    m = ModelSpec("v", num_layers=1, hidden_size=64, num_attention_heads=4, vocab_size=1001,
                  seq_length=16)
    g = build_op_graph(m, 1)
    assert shard_op(op(g.head, "lm_head"), 4, False, 1, 1).shape == (16, 251, 64)


def test_sequence_parallel_divides_norm_and_residual_bytes():
    g = build_op_graph(GPT, 2)
    for name in ("ln1", "attn_residual", "ln2", "mlp_residual"):
        o = op(g.layer, name)
        assert shard_op(o, 4, False, 1, 1).bytes == o.fwd_bytes  # replicated under TP alone
        assert shard_op(o, 4, True, 1, 1).bytes == o.fwd_bytes / 4
        assert shard_op(o, 4, True, 1, 1).shape == (2 * 64 // 4, 128)
    o = op(g.head, "final_norm")
    assert shard_ops_backward((o,), 4, True, 1, 1, "B")[0].bytes == o.bwd_bytes / 4


def test_sequence_parallel_leaves_gemm_work_unchanged():
    g = build_op_graph(GPT, 2)
    for o in g.layer:
        if o.kind in ("gemm", "attention"):
            assert shard_op(o, 4, True, 1, 1) == shard_op(o, 4, False, 1, 1)


@pytest.mark.parametrize("model", [GPT, LLAMA, MOE])
@pytest.mark.parametrize("cp", [2, 4])
def test_cp_divides_all_flops(model, cp):
    g = build_op_graph(model, 1)
    ops = g.embed + g.layer + g.head
    assert total_flops(shard_ops(ops, 1, False, cp, 1)) == pytest.approx(
        total_flops(shard_ops(ops, 1, False, 1, 1)) / cp, rel=1e-12)


def test_cp_attention_keeps_full_kv():
    g = build_op_graph(LLAMA, 2)
    a = op(g.layer, "attn_core")
    w = shard_op(a, 2, False, 4, 1)
    assert w.shape == (2, 4, 16, 64, 16)
    assert w.flops == a.fwd_flops / 8
    q, kv = 2 * 4 * 16 * 16, 2 * 2 * 64 * 16  # per-rank query heads x seq_q/cp; kv heads x full seq
    assert w.bytes == 2 * (2 * q + 2 * kv)
    assert shard_ops_backward((a,), 2, False, 4, 1, "B")[0].bytes == 2 * (4 * q + 4 * kv)


def test_ep_divides_expert_weights_not_flops():
    g = build_op_graph(MOE, 1)
    fc1 = op(g.layer, "expert_fc1")
    for ep in (1, 2, 8):
        w = shard_op(fc1, 1, False, 1, ep)
        rows, n, k = w.shape
        assert rows == 64 * 2 and w.flops == fc1.fwd_flops  # tokens dispatched = tokens received
        assert w.bytes == 2 * (rows * k + (8 // ep) * k * n + rows * n)


def test_expert_tensor_parallel_column_then_row():
    g = build_op_graph(MOE, 1)
    assert shard_op(op(g.layer, "expert_fc1"), 2, True, 1, 4).shape == (128, 192, 128)
    assert shard_op(op(g.layer, "expert_fc2"), 2, True, 1, 4).shape == (128, 128, 96)
    assert shard_op(op(g.layer, "expert_act"), 2, True, 1, 4).shape == (128, 96)
    assert shard_op(op(g.layer, "router"), 2, True, 1, 4).shape == (32, 8, 128)  # SP tokens


def test_backward_parts():
    g = build_op_graph(LLAMA, 2)
    ops = g.embed + g.layer + g.head
    b = shard_ops_backward(ops, 2, True, 1, 1, "B")
    w = shard_ops_backward(ops, 2, True, 1, 1, "W")
    bw = shard_ops_backward(ops, 2, True, 1, 1, "BW")
    assert total_flops(b) + total_flops(w) == total_flops(bw)
    assert total_flops(bw) == 2 * total_flops(shard_ops(ops, 2, True, 1, 1))
    assert {x.kind for x in w} == {"gemm", "embedding"}
    assert "embed" not in [x.name for x in b]
    assert "attn_residual" in [x.name for x in b]  # the residual stream's two gradients are summed
    assert bw[0].name == "loss" and bw[-1].name == "embed"  # reverse program order
    assert sum(x.bytes for x in b + w) == pytest.approx(sum(x.bytes for x in bw))
    with pytest.raises(ValueError, match="backward part"):
        shard_ops_backward(ops, 1, False, 1, 1, "X")


def test_indivisible_splits_raise():
    g = build_op_graph(LLAMA, 1)
    with pytest.raises(ValueError, match="attention heads 8 is not divisible by 3"):
        shard_op(op(g.layer, "attn_core"), 3, False, 1, 1)
    with pytest.raises(ValueError, match="key/value heads 4 is not divisible by 8"):
        shard_op(op(g.layer, "attn_core"), 8, False, 1, 1)
    with pytest.raises(ValueError, match="seq_q 64 is not divisible by 3"):
        shard_op(op(g.layer, "attn_core"), 1, False, 3, 1)
    with pytest.raises(ValueError, match="num_experts 8 is not divisible by ep 3"):
        shard_op(op(build_op_graph(MOE, 1).layer, "expert_fc1"), 1, False, 1, 3)
    with pytest.raises(ValueError, match="tp must be >= 1"):
        shard_op(op(g.layer, "qkv"), 0, False, 1, 1)


@pytest.mark.parametrize("model", [GPT, LLAMA, MOE])
def test_params_per_rank_single_rank_is_whole_model(model):
    g = build_op_graph(model, 1)
    p = params_per_rank(g, 1, 1, model.num_layers, True, True)
    assert p["dense"] + p["expert"] == model.num_params()


def test_params_per_rank_gpt_tp_closed_form():
    """Megatron TP, per layer: 12h²/t + 7h/t (weights, column biases) + 6h (row biases, norms)."""
    g = build_op_graph(GPT, 1)
    h, t, v, s = 128, 4, 1024, 64
    mid = params_per_rank(g, t, 1, 2, False, False)
    assert mid == {"dense": 2 * (12 * h * h // t + 7 * h // t + 6 * h), "expert": 0}
    first = params_per_rank(g, t, 1, 2, True, False)
    assert first["dense"] - mid["dense"] == v * h // t + s * h  # position table replicated


def test_tied_embedding_copy_on_last_stage():
    g = build_op_graph(GPT, 1)
    h, v = 128, 1024
    stages = [params_per_rank(g, 1, 1, 2, True, False), params_per_rank(g, 1, 1, 2, False, True)]
    assert sum(s["dense"] for s in stages) == GPT.num_params() + v * h
    assert stages[1]["dense"] == params_per_rank(g, 1, 1, 2, False, False)["dense"] + v * h + 2 * h
    untied = build_op_graph(LLAMA, 1)
    stages = [params_per_rank(untied, 2, 1, 1, True, False),
              params_per_rank(untied, 2, 1, 1, False, True)]
    # untied: the head stage holds its own LM head, nothing is duplicated
    assert sum(s["dense"] for s in stages) == params_per_rank(untied, 2, 1, 2, True, True)["dense"]


def test_params_per_rank_sums_over_tp_to_model():
    for model in (LLAMA, MOE):  # bias-free: every weight is split or replicated, no overlap besides
        g = build_op_graph(model, 1)
        full = params_per_rank(g, 1, 1, model.num_layers, True, True)
        p = params_per_rank(g, 2, 1, model.num_layers, True, True)
        norms = (2 * model.num_layers + 1) * model.hidden_size
        routers = model.num_layers * model.router_params_per_layer()
        assert 2 * (p["dense"] + p["expert"]) - (norms + routers) == full["dense"] + full["expert"]


def test_params_per_rank_moe_experts():
    g = build_op_graph(MOE, 1)
    h, f, e = 128, 192, 8
    for tp, ep in ((1, 1), (1, 4), (2, 8)):
        p = params_per_rank(g, tp, ep, 2, False, False)
        assert p["expert"] == 2 * (e // ep) * 3 * h * f // tp
    mixtral = MODEL_PRESETS["mixtral-8x7b"]
    p = params_per_rank(build_op_graph(mixtral, 1), 1, 8, mixtral.num_layers, True, True)
    assert p["expert"] == mixtral.num_layers * mixtral.expert_params()  # one expert per rank


def test_backward_gemms_run_their_own_shapes_and_the_fused_pass_costs_both():
    from simulator.cost.compute import RooflineCompute
    from simulator.hardware.gpus import GPU_PRESETS
    big = ModelSpec("g", num_layers=1, hidden_size=2048, num_attention_heads=16, vocab_size=4096, seq_length=4096)
    fc1 = (op(build_op_graph(big, 1).layer, "fc1"),)
    (fwd,) = shard_ops(fc1, 1, False, 1, 1)
    (b,), (w,), (bw,) = (shard_ops_backward(fc1, 1, False, 1, 1, part) for part in ("B", "W", "BW"))
    m, n, k = fwd.shape
    # dX = dY·Wᵀ: (m, k) output reduced over n; dW = Xᵀ·dY: (k, n) output reduced over m
    assert b.shape == (m, k, n) and w.shape == (k, n, m) and bw.shape == fwd.shape
    assert b.flops == w.flops == fwd.flops and bw.flops == 2 * fwd.flops
    for gpu in ("a100-sxm4-80gb", "h100-sxm5-80gb"):
        rc = RooflineCompute(GPU_PRESETS[gpu], "bf16")
        assert rc.op_time_s(bw) == pytest.approx(rc.op_time_s(b) + rc.op_time_s(w), rel=1e-12)
        # input gradient: k = 8192 against 2048 forward, a longer main loop; its 4096 x 2048 output
        # is 128 tiles: one full wave on 132 H100 SMs, 1.19 waves on 108 A100 SMs
        assert (rc.op_time_s(b) < rc.op_time_s(fwd)) is (gpu == "h100-sxm5-80gb")
