"""FlashAttention-2's varlen kernel on unpadded tokens (model/varlen, ``training.attention =
"flash-varlen"``): the copies around the kernel against their closed forms, the same kernel time as
"flash", the same model FLOPs, and the scenario rule."""

import pytest

from simulator.cost.compute import RooflineCompute
from simulator.hardware.gpus import GPU_PRESETS
from simulator.model.opgraph import build_op_graph
from simulator.model.spec import ModelSpec
from simulator.scenario import scenario_from_dict
from simulator.scenario_checks import ScenarioError
from simulator.strategy.sharding import shard_op

MPT = ModelSpec(name="mpt-like", num_layers=2, hidden_size=1024, num_attention_heads=8, vocab_size=1000,
                seq_length=512, mlp="gelu")
GQA = ModelSpec(name="gqa", num_layers=2, hidden_size=1024, num_attention_heads=8, num_kv_heads=2,
                vocab_size=1000, seq_length=512, mlp="swiglu")


def ops(model, attention, b=2):
    return {op.name: op for op in build_op_graph(model, b, "bf16", attention=attention).layer}


@pytest.mark.parametrize("model", [MPT, GQA], ids=["mha", "gqa"])
def test_unpad_and_pad_bytes_are_the_gathers_scatters_and_copies(model):
    b, d = 2, 2
    t = b * model.seq_length
    q, kv = model.num_attention_heads * model.head_dim, model.num_kv_heads * model.head_dim
    got = ops(model, "flash-varlen", b)
    names = list(got)
    assert names.index("qkv") < names.index("attn_unpad") == names.index("attn_core") - 1
    assert names.index("attn_pad") == names.index("attn_core") + 1 < names.index("attn_out")
    unpad, pad = got["attn_unpad"], got["attn_pad"]
    # forward: gather q, k, v (read + write); backward: zero-fill + scatter each, then the split's cat
    assert unpad.fwd_bytes == 2 * d * t * (q + 2 * kv)
    assert unpad.bwd_bytes == 5 * d * t * (q + 2 * kv)
    # forward: zero-fill + index_put of the output; backward: gather its gradient
    assert pad.fwd_bytes == 3 * d * t * q and pad.bwd_bytes == 2 * d * t * q
    assert unpad.fwd_flops == pad.fwd_flops == 0 and unpad.params == pad.params == 0


def test_flash_layout_has_no_copies_and_the_model_flops_do_not_change():
    plain, varlen = ops(MPT, "flash"), ops(MPT, "flash-varlen")
    assert set(varlen) - set(plain) == {"attn_unpad", "attn_pad"}
    g1 = build_op_graph(MPT, 2, "bf16", attention="flash")
    g2 = build_op_graph(MPT, 2, "bf16", attention="flash-varlen")
    assert g1.fwd_flops() == g2.fwd_flops() and g1.bwd_flops() == g2.bwd_flops()
    assert g1.num_params() == g2.num_params()


def test_copies_split_over_tp_like_the_qkv_output():
    unpad = ops(MPT, "flash-varlen")["attn_unpad"]
    assert shard_op(unpad, 4, False, 1, 1).bytes == pytest.approx(unpad.fwd_bytes / 4)


def test_the_kernel_is_flash_attention_2s():
    core = shard_op(ops(MPT, "flash")["attn_core"], 1, False, 1, 1)
    gpu = GPU_PRESETS["h100-sxm5-80gb"]
    assert RooflineCompute(gpu, "bf16", "flash-varlen").op_time_s(core) == RooflineCompute(gpu, "bf16", "flash").op_time_s(core)


def test_scenario_accepts_flash_varlen_and_names_the_options_otherwise():
    raw = {"model": {"preset": "gpt3-1.3b"}, "cluster": {"preset": "dgx-h100", "num_nodes": 1},
           "training": {"global_batch_size": 8, "attention": "flash-varlen"}}
    assert scenario_from_dict(raw).training.attention == "flash-varlen"
    raw["training"]["attention"] = "triton"
    with pytest.raises(ScenarioError, match="flash-varlen"):
        scenario_from_dict(raw)
