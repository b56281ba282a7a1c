"""DeepSpeed 2021 ZeRO-3's post-step gather of its persistent parameters (strategy/zero_impl,
grad_sync.ds2021_persistent_gather): which tensors persist, the bytes gathered, and the host time of
the Python copy-out loop over every (tensor, rank) pair, against closed forms."""

import pytest

from simulator.cost.compute import EAGER_KERNEL_HOST_S, EAGER_OP_HOST_S, RooflineCompute
from simulator.hardware.gpus import GPU_PRESETS
from simulator.model.opgraph import build_op_graph
from simulator.scenario import scenario_from_dict
from simulator.strategy.lower import lower
from simulator.strategy.sharding import param_tensors, unit_persistent_sizes
from simulator.strategy.zero_impl import (DS_PERSISTENCE_THRESHOLD, persistent_copy_host_work, persistent_gather_work,
                                          persistent_sizes)

H = 1024
MODEL = {"num_layers": 4, "hidden_size": H, "num_attention_heads": 16, "vocab_size": 32000, "seq_length": 1024}


def scn(sharding="deepspeed-2021", dp=8, **par):
    return scenario_from_dict({"model": MODEL, "parallelism": {"dp": dp, "zero_stage": 3, "sharding": sharding, **par},
                               "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1},
                               "training": {"global_batch_size": dp, "dtype": "fp16"}})


def test_a_gpt_layer_persists_its_biases_and_norms():
    """GPT layer: LayerNorm weight and bias twice, the four Linear biases persist (below
    stage3_param_persistence_threshold); the four weights are partitioned and fetched per use."""
    s = scn()
    g = build_op_graph(s.model, 1, "fp16")
    tensors = param_tensors(g, g.layer_ops(0), 1, 1)
    assert sorted(tensors) == sorted([H, H, 3 * H * H, 3 * H, H * H, H, H, H, 4 * H * H, 4 * H, 4 * H * H, H])
    assert sorted(persistent_sizes(tensors)) == sorted([H] * 6 + [3 * H, 4 * H])
    assert all(t >= DS_PERSISTENCE_THRESHOLD for t in set(tensors) - set(persistent_sizes(tensors)))
    assert unit_persistent_sizes(g, 1, 1, "head") == (H, H)  # the final LayerNorm; the head is tied
    assert unit_persistent_sizes(g, 1, 1, "embed") == ()  # word and position tables: one large tensor


@pytest.mark.parametrize("ranks,want_holders", [(8, 24), (384, 1152), (1536, 4608), (3000, 2458 + 2892 + 2836)])
def test_the_copy_out_costs_one_copy_and_three_view_ops_per_tensor_and_rank_holding_part_of_it(ranks, want_holders):
    """A tensor of n elements is padded to shards of ceil(n / ranks); each of the ceil(n / shard) ranks
    whose shard holds part of it costs three view ops and a copy kernel, at the eager host floor."""
    rc = RooflineCompute(GPU_PRESETS["a100-sxm4-80gb"], "fp16")
    sizes = (12288, 49152, 36864)
    # _allgather_params' own loop: rank i copies when its shard starts inside the tensor
    holders = sum(sum(1 for i in range(ranks) if i * -(-n // ranks) < n) for n in sizes)
    assert holders == want_holders  # 12288 over 3,000 ranks: shards of 5, the first 2,458 hold part
    want = holders * (EAGER_KERNEL_HOST_S + 3 * EAGER_OP_HOST_S)
    assert rc.work_time_s(persistent_copy_host_work(ranks, sizes, 2)) == pytest.approx(want)


def test_the_lowering_gathers_the_persistent_tensors_once_after_the_optimizer():
    """One all-gather per step, after the optimizer, of every rank's padded shards of every persistent
    tensor, then one copy-out task per unit holding any."""
    s = scn()
    g = lower(s).graph
    gather = [t for t in g.tasks if t.name == "persistent_param_all_gather"]
    assert len(gather) == 1 and gather[0].comm.group == tuple(range(8))
    graph = build_op_graph(s.model, 1, "fp16")
    sizes = [n for u in ["embed", "0", "1", "2", "3", "head"] for n in unit_persistent_sizes(graph, 1, 1, u)]
    assert gather[0].comm.size_bytes == sum(-(-n // 8) for n in sizes) * 8 * 2
    assert persistent_gather_work(8, tuple(sizes), 2)[1] == gather[0].comm.size_bytes
    by_id = {t.id: t for t in g.tasks}
    host = by_id[gather[0].deps[0]]
    assert host.name == "persistent_param_all_gather.host" and "optimizer" in by_id[host.deps[0]].name
    copies = [t for t in g.tasks if t.name.endswith(".persistent_copy_out")]
    assert [t.name for t in copies] == ["L0.persistent_copy_out", "L1.persistent_copy_out", "L2.persistent_copy_out",
                                        "L3.persistent_copy_out", "head.persistent_copy_out"]
    assert copies[0].deps == (gather[0].id,) and all(t.stream == "compute" for t in copies)


def test_todays_engine_gathers_each_persistent_tensor_alone_with_no_python_copy_out():
    """DeepSpeed since the coalesced gather (``_allgather_params_coalesced``): one all_gather_into_tensor
    per persistent tensor, all issued after the optimizer, no per-rank copy-out on the host."""
    s = scn("deepspeed")
    g = lower(s).graph
    graph = build_op_graph(s.model, 1, "fp16")
    sizes = [n for u in ["embed", "0", "1", "2", "3", "head"] for n in unit_persistent_sizes(graph, 1, 1, u)]
    gathers = [t for t in g.tasks if "persistent_param_all_gather" in t.name]
    assert [t.comm.size_bytes for t in gathers] == [-(-n // 8) * 8 * 2 for n in sizes]
    by_id = {t.id: t for t in g.tasks}
    assert all(len(t.deps) == 1 and "optimizer" in by_id[t.deps[0]].name for t in gathers)
    assert not [t for t in g.tasks if "persistent_copy_out" in t.name or t.name.startswith("persistent")]


def test_the_copy_out_grows_with_the_group():
    """Twice the ranks, twice the copy-out (each rank's shard of every persistent tensor is copied
    from Python): the mechanism that keeps Narayanan et al.'s 2021 ZeRO-3 step from shrinking."""
    rc = RooflineCompute(GPU_PRESETS["a100-sxm4-80gb"], "fp16")
    layer = (12288,) * 6 + (36864, 49152)
    t = {n: rc.work_time_s(persistent_copy_host_work(n, layer, 2)) for n in (384, 768, 1536)}
    assert t[768] == pytest.approx(2 * t[384]) and t[1536] == pytest.approx(2 * t[768])
    assert 96 * t[1536] > 20.0  # GPT-3 175B's 96 layers at 1,536 ranks: ~21 s per step


def test_deepspeed_live_params_follow_the_prefetch_rule():
    """A fetch and the next one while the first holds fewer than stage3_max_live_parameters (1e9):
    GPT-3 175B's submodules all prefetch (fc1 + fc2 the most); MT-NLG 530B's QKV and fc1/fc2 exceed the
    limit, so only the projection's successor (fc1) is prefetched beside it."""
    from simulator.strategy.zero_impl import deepspeed_live_params
    assert deepspeed_live_params([4.5e8, 1.5e8, 6e8, 6e8]) == (1.2e9, 6e8)
    assert deepspeed_live_params([1.26e9, 4.2e8, 1.68e9, 1.68e9]) == (4.2e8 + 1.68e9, 1.68e9)
    assert deepspeed_live_params([]) == (0.0, 0.0)
