"""PyTorch FSDP1's kernels around its collectives (strategy/fsdp1), as torch 2.1 runs them: the divide
factors, the bytes of each post-backward kernel, the shard cast before every all-gather, and where the
lowering puts them (after each unit's backward, before its reduce-scatter, on the all-gathers' stream)."""

import pytest

from simulator.scenario import scenario_from_dict
from simulator.strategy.fsdp1 import gradient_predivide_factor, post_backward_work, unshard_work
from simulator.strategy.lower import lower

TINY = {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "vocab_size": 1024, "seq_length": 128}
P = 1_000_000  # elements of one unit


def scn(m=1, grad_dtype="fp32", zero_stage=3, dp=4):
    return scenario_from_dict({"model": dict(TINY),
                               "parallelism": {"dp": dp, "zero_stage": zero_stage, "sharding": "fsdp1"},
                               "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1, "gpus_per_node": dp},
                               "training": {"global_batch_size": dp * m, "grad_dtype": grad_dtype}})


def by_name(work):
    return {w.name: w.bytes for w in work}


@pytest.mark.parametrize("world, pre", [(1, 1), (2, 2), (4, 2), (8, 4), (6, 4), (64, 8), (128, 16), (512, 32)])
def test_predivide_factor_is_torchs(world, pre):
    # DefaultState._get_gradient_predivide_factor: doubles while it divides the world size and
    # stays below world / factor (6 -> 4: the loop only checks divisibility before doubling)
    assert gradient_predivide_factor(world) == pre


def test_default_mixed_precision_casts_divides_and_reduces_in_fp32():
    # bf16 parameters, fp32 reduce (Composer DEFAULT), 128 ranks: predivide 16, postdivide 8
    first = by_name(post_backward_work(P, 128, 2, 4, accumulate=False))
    assert first == pytest.approx({"fsdp1_grad_flatten": 4 * P, "fsdp1_grad_cast": 6 * P,
                                   "fsdp1_grad_predivide": 8 * P, "fsdp1_grad_postdivide": 8 * P / 128})
    later = by_name(post_backward_work(P, 128, 2, 4, accumulate=True))
    assert later["fsdp1_grad_accumulate"] == pytest.approx(12 * P / 128)  # saved shard += shard, fp32


def test_pure_mixed_precision_reduces_in_bf16_then_casts_the_shard():
    work = by_name(post_backward_work(P, 8, 2, 2, accumulate=False))
    assert work == pytest.approx({"fsdp1_grad_flatten": 4 * P, "fsdp1_grad_predivide": 4 * P,
                                  "fsdp1_grad_postdivide": 4 * P / 8, "fsdp1_grad_shard_cast": 6 * P / 8})


def test_two_ranks_need_no_postdivide_and_hsdp_divides_by_the_whole_group():
    assert "fsdp1_grad_postdivide" not in by_name(post_backward_work(P, 2, 2, 4, False))
    # HSDP: 8-rank shards x 16 replicas = 128 -> postdivide 8 on the 8-rank shard
    assert by_name(post_backward_work(P, 8, 2, 4, False, dp_ranks=128))["fsdp1_grad_postdivide"] == 8 * P / 8


def test_each_all_gather_first_casts_the_fp32_shard():
    assert by_name(unshard_work(P, 8, 2)) == {"fsdp1_shard_cast": 6 * P / 8}
    assert unshard_work(P, 8, 4) == ()  # no mixed precision: the shard is gathered as is


def test_post_backward_kernels_follow_each_units_backward_and_precede_its_reduce_scatter():
    g = lower(scn(m=2)).graph
    tasks = g.tasks
    rs = [t for t in tasks if t.comm is not None and t.comm.op == "reduce_scatter"]
    ag = [t for t in tasks if t.comm is not None and t.comm.op == "all_gather"]
    # one process group: ProcessGroupNCCL's one stream for both
    assert {t.stream for t in rs} == {t.stream for t in ag} == {"comm_dp"}
    units = 4 + 2  # layers, embedding, head
    assert len(rs) == 2 * units
    for t in rs:
        post = tasks[t.deps[0]]
        assert post.name == t.name.replace("grad_reduce_scatter", "fsdp1_post_backward")
        assert post.stream == "compute" and post.category == "comm_dp"
        names = [w.name for w in post.work]
        assert ("fsdp1_grad_accumulate" in names) == t.name.startswith("B1.")  # the second micro-batch
    # interleaved: on the compute stream, layer 3's post-backward kernels run before layer 2's backward
    compute = [t.name for t in tasks if t.stream == "compute"]
    layer2 = min(i for i, n in enumerate(compute) if n.startswith("B0.L2.") and "param_all_gather" not in n)
    assert compute.index("B0.L3.attn.grad") < compute.index("B0.L3.fsdp1_post_backward") < layer2


def test_post_backward_bytes_per_micro_batch_are_the_closed_form():
    plan = lower(scn(m=1))
    per_rank = plan.stage_params[0]["dense"]
    post = [t for t in plan.graph.tasks if t.name.endswith("fsdp1_post_backward")]
    got = sum(w.bytes for t in post for w in t.work)
    # 4 ranks: predivide 2, postdivide 2; bf16 params, fp32 reduce: 4 + 6 + 8 + 8/4 bytes per parameter
    assert got == pytest.approx((4 + 6 + 8 + 8 / 4) * per_rank)


def test_fsdp1_step_is_longer_than_without_its_kernels_and_fsdp2_keeps_its_own():
    from simulator.pipeline import simulate
    t1 = simulate(scn()).metrics["iteration_time_s"]
    assert not [t for t in lower(scn()).graph.tasks if "fsdp2" in t.name]
    pure = simulate(scn(grad_dtype="bf16")).metrics["iteration_time_s"]
    assert pure < t1  # no fp32 cast, half the divide traffic, half the reduce-scatter bytes
