"""Load-balanced causal CP (Megatron-Core's 2·cp-chunk split, Transformer Engine's KV-P2P ring, torch's
round-robin balancer): step 0 attends the local chunks with the causal mask, every later step a half
block without it. The same FLOPs per step; the later steps priced on the non-causal kernels, in torch's
ring (``cp_torch``) and in Transformer Engine's (``cp_te``), each with its own per-step copy and merge
kernels."""

import pytest

from simulator.cost.attention_eff import attention_efficiency
from simulator.cost.compute import RooflineCompute
from simulator.hardware.gpus import GPU_PRESETS
from simulator.strategy.blocks import later_step_work, split_work
from simulator.strategy.lower import lower
from simulator.tasks import OpWork
from test_lower import scn

H100 = GPU_PRESETS["h100-sxm5-80gb"]


def _core(b=1, heads=32, s_local=4096, cp=2, hd=128, backward=False):
    s = s_local * cp
    flops = 4.0 * b * heads * s_local * s * hd * (2 if backward else 1)
    return (OpWork("attn_core", "attention", flops, 0.0, (b, heads, s_local, s, hd), "", backward),)


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_later_steps_keep_the_flops_on_a_non_causal_half_block(cp):
    core = _core(cp=cp)
    first, later = split_work(core, cp)[0], later_step_work(core, cp)[0]
    assert first.causal and not later.causal
    assert later.flops == first.flops == core[0].flops / cp
    assert first.shape == (1, 32, 4096, 4096, 128) and later.shape == (1, 32, 4096, 2048, 128)


@pytest.mark.parametrize("impl", ["flash", "cudnn"])
@pytest.mark.parametrize("backward", [False, True])
def test_a_later_step_costs_what_the_non_causal_curve_says(impl, backward):
    """The same executed FLOPs (half the step's count) at the non-causal efficiency at half the keys
    against the causal one at the whole local length: their ratio is the time ratio."""
    rc = RooflineCompute(H100, "bf16", attention=impl)
    core = _core(backward=backward)
    first, later = split_work(core, 2)[0], later_step_work(core, 2)[0]
    causal = attention_efficiency("hopper", impl, backward, True, 128, 4096, 4096)
    non_causal = attention_efficiency("hopper", impl, backward, False, 128, 4096, 2048)
    over = rc.eff.kernel_overhead_s
    assert (rc.op_time_s(later) - over) / (rc.op_time_s(first) - over) == pytest.approx(causal / non_causal)
    assert rc.op_time_s(later) < rc.op_time_s(first)  # the mask's half-empty tiles are gone


@pytest.mark.parametrize("alg", ["torch-allgather", "ring"])
def test_both_rings_run_step_zero_causal_and_the_rest_without_the_mask(alg):
    g = lower(scn(cp=4, batch=1, cp_algorithm=alg)).graph
    for phase in ("F", "B"):
        steps = [t for t in g.tasks if t.layer == 0 and t.phase == phase and ".core" in t.name]
        masks = [[w.causal for w in t.work if w.kind == "attention"] for t in steps]
        assert masks == [[True], [False], [False], [False]]


@pytest.mark.parametrize("alg", ["ring", "all-gather", "torch-allgather", "a2a"])
@pytest.mark.parametrize("cp, pp", [(2, 1), (4, 2)])
def test_the_search_lower_bound_stays_below_the_simulated_step(alg, cp, pp):
    """The estimate takes the lowering's step works (the rings' later steps non-causal, TE's copy and
    merge kernels) and leaves out torch's merge bytes and every exchange: never above the simulation."""
    from simulator.explore.estimate import estimate
    from simulator.pipeline import simulate
    from simulator.scenario import scenario_from_dict
    dp = 16 // (2 * cp * pp)
    s = scenario_from_dict({"model": {"preset": "llama3-8b", "num_layers": 8, "seq_length": 16384},
                            "cluster": {"preset": "dgx-h100", "num_nodes": 2},
                            "parallelism": {"tp": 2, "cp": cp, "pp": pp, "dp": dp, "sequence_parallel": True,
                                            "cp_algorithm": alg, "recompute": "full", "zero_stage": 1},
                            "training": {"global_batch_size": 8 * dp, "micro_batch_size": 1}}, default_name="lb")
    assert estimate(s).time_lower_bound_s <= simulate(s).metrics["iteration_time_s"]
