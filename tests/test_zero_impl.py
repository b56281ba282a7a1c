"""ZeRO-3 and FSDP as DeepSpeed and PyTorch run them (strategy/zero_impl): bytes per step against the
ZeRO paper's closed forms, all-gathers per step against the bucket rules, FULL_SHARD vs SHARD_GRAD_OP,
HSDP's node-local gathers, FSDP2's copy kernels, and the scenario rules."""

import re

import pytest

from simulator.defaults import default_sharding
from simulator.scenario import scenario_from_dict
from simulator.scenario_checks import ScenarioError
from simulator.strategy.lower import lower
from simulator.strategy.zero_impl import (DS_PREFETCH_BUCKET, Fetch, coalesce, hsdp_groups, step_bytes_per_rank,
                                          step_gather_count)

SMALL = {"num_layers": 4, "hidden_size": 1024, "num_attention_heads": 16, "vocab_size": 32000, "seq_length": 1024}
# two layers of GPT-3 175B's width: every Linear is larger than the prefetch bucket
WIDE = {"num_layers": 2, "hidden_size": 12288, "num_attention_heads": 96, "vocab_size": 1024, "seq_length": 128}
TINY = {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "vocab_size": 1024, "seq_length": 128}


def scn(model=TINY, dp=4, m=1, nodes=1, training=None, **par):
    par.setdefault("dp", dp)
    return scenario_from_dict({"model": dict(model), "parallelism": par,
                               "cluster": {"preset": "dgx-a100-80gb", "num_nodes": nodes,
                                           "gpus_per_node": dp // nodes, "nics_per_node": min(8, dp // nodes)},
                               "training": {"global_batch_size": dp * m, **(training or {})}})


def gathers(graph):
    """The parameter fetches of the passes (DeepSpeed's post-step gather of its persistent tensors is
    tested in tests/test_ds2021_persistent.py)."""
    return [t for t in graph.tasks if t.comm is not None and t.comm.op == "all_gather" and t.comm.axis == "dp"
            and "persistent_param_all_gather" not in t.name]


def dp_bytes(graph, n):
    """Bytes one rank sends per step per collective kind (ring: (n-1)/n of the buffer, all-reduce twice)."""
    out = {"all_gather": 0.0, "reduce_scatter": 0.0, "all_reduce": 0.0}
    for t in graph.tasks:
        if t.comm is not None and t.comm.axis == "dp" and t.comm.op in out:
            out[t.comm.op] += t.comm.size_bytes * (n - 1) / n * (2 if t.comm.op == "all_reduce" else 1)
    return out


def test_default_implementation_per_stage():
    assert [default_sharding(z) for z in range(4)] == ["megatron-distopt", "megatron-distopt", "deepspeed", "fsdp2"]
    assert scn(zero_stage=3).parallel.sharding == "fsdp2"
    assert scn(zero_stage=1).parallel.sharding == "megatron-distopt"


def test_ddp_sends_2x_and_zero3_3x_the_parameters_per_step():
    bf16 = {"grad_dtype": "bf16"}
    ddp = lower(scn(zero_stage=0, training=bf16))
    phi = ddp.stage_params[0]["dense"]
    want = step_bytes_per_rank("megatron-distopt", 0, phi, 4, 2, 2)
    assert dp_bytes(ddp.graph, 4) == pytest.approx(want)
    assert sum(want.values()) == pytest.approx(2 * phi * 2 * 3 / 4)  # 2 x params x 2 bytes x (n-1)/n
    fsdp = lower(scn(zero_stage=3, sharding="fsdp1", training=bf16))
    root = sum(t.comm.size_bytes for t in gathers(fsdp.graph) if re.match(r"F0\.(embed|head)\.", t.name)) / 2
    want3 = step_bytes_per_rank("fsdp1", 3, phi, 4, 2, 2, root_params=root)
    assert dp_bytes(fsdp.graph, 4) == pytest.approx(want3)
    # the ZeRO paper's ratio for the blocks: 3 Phi against DDP's 2 Phi (the root unit is gathered once)
    assert sum(step_bytes_per_rank("fsdp1", 3, phi, 4, 2, 2).values()) == pytest.approx(1.5 * sum(want.values()))


def test_deepspeed_gathers_one_coalesced_fetch_per_prefetch_bucket():
    # SMALL: per layer qkv 3.1M, proj 1.0M, fc1 4.2M, fc2 4.2M elements (biases and norms below the
    # persistence threshold stay whole); embedding 32000*1024 + 1024*1024 = 33.8M. Forward:
    # [embed, L0, L1.qkv, L1.proj] reaches 50.6M >= 50M, then the rest (33.6M) -> 2 fetches.
    # The whole model (84M) is within stage3_max_reuse_distance, so nothing is re-gathered backward.
    g = lower(scn(SMALL, zero_stage=3, sharding="deepspeed", m=2)).graph
    ag = gathers(g)
    assert len(ag) == 2 * 2 and all(t.name.startswith("F") for t in ag)
    sizes = sorted(t.comm.size_bytes / 2 for t in ag[:2])
    assert sizes == [33_554_432, 50_593_792]


def test_deepspeed_regathers_for_the_recompute_and_what_the_reuse_distance_does_not_keep():
    # WIDE: each Linear (qkv 453M, proj 151M, fc1 604M, fc2 604M) is its own fetch; the embedding
    # (14M) joins layer 0's qkv in the forward: 1 + 3 + 4 = 8 fetches. Backward without recompute:
    # layer 1's fc2 is reused at once (distance 0 < 1e9) and kept, every other submodule and the
    # embedding are re-gathered: 8. With full recompute each layer re-gathers its 4 Linears for the
    # recompute, then the 3 whose distance 2 x (rest of the layer) >= 1e9, and the embedding: 15.
    g = lower(scn(WIDE, zero_stage=3, sharding="deepspeed")).graph
    names = [t.name for t in gathers(g)]
    assert sum(n.startswith("F") for n in names) == 8 and sum(n.startswith("B") for n in names) == 8
    g = lower(scn(WIDE, zero_stage=3, sharding="deepspeed", recompute="full")).graph
    names = [t.name for t in gathers(g)]
    assert sum(n.startswith("F") for n in names) == 8 and sum(n.startswith("B") for n in names) == 15
    # bytes: forward everything, recompute both layers, backward all but each layer's fc2 (4h^2)
    h = WIDE["hidden_size"]
    layer, embed, fc2 = 12 * h * h, (WIDE["vocab_size"] + WIDE["seq_length"]) * h, 4 * h * h
    want = (embed + 2 * layer) + 2 * layer + (embed + 2 * (layer - fc2))
    assert sum(t.comm.size_bytes for t in gathers(g)) == 2 * want


def test_coalesce_closes_a_fetch_at_the_bucket_and_counts_per_step():
    b = DS_PREFETCH_BUCKET
    fetches = coalesce([30e6, 30e6, 10e6, 0.0, 100e6], [0, 0, 1, 1, 2], b)
    assert b == 50e6 and fetches == [Fetch((0,), 60e6, tensors=2), Fetch((1, 2), 110e6, tensors=2)]
    assert step_gather_count({"F": fetches, "B": fetches[:1]}, 3) == 9


@pytest.mark.parametrize("impl", ["fsdp1", "fsdp2"])
def test_shard_grad_op_gathers_once_per_unit_and_full_shard_per_pass(impl):
    m = 2
    units = ["embed", "L0", "L1", "L2", "L3", "head"]
    g = lower(scn(zero_stage=2, sharding=impl, m=m)).graph
    fwd = [t.name for t in gathers(g)]
    assert len(fwd) == m * len(units) and all(n.startswith("F") for n in fwd)
    assert {n.split(".")[1] for n in fwd} == set(units)
    rs = [t for t in g.tasks if t.comm is not None and t.comm.op == "reduce_scatter"]
    assert len(rs) == m * len(units)  # every unit's gradients, every micro-batch
    g = lower(scn(zero_stage=3, sharding=impl, m=m)).graph
    names = [t.name for t in gathers(g)]
    assert sum(n.startswith("F") for n in names) == m * len(units)
    assert sum(n.startswith("B") for n in names) == m * 4  # the blocks; the root unit stays gathered


def test_fsdp_recompute_runs_on_the_gathered_unit_without_another_gather():
    plain = lower(scn(zero_stage=3, sharding="fsdp1")).graph
    recompute = lower(scn(zero_stage=3, sharding="fsdp1", recompute="full")).graph
    assert len(gathers(plain)) == len(gathers(recompute))


def test_fsdp2_copies_gathered_units_out_and_gradients_in():
    g = lower(scn(zero_stage=3, sharding="fsdp2")).graph
    copies = [t for t in g.tasks if t.name.endswith("fsdp2_copy_out")]
    assert len(copies) == len(gathers(g))
    assert all(t.stream == "compute" for t in copies)
    by_id = {t.id: t for t in g.tasks}
    for t in copies:  # each copy-out reads and writes the unit it waits for
        ag = [by_id[d] for d in t.deps if by_id[d].comm is not None]
        assert ag and t.work[0].bytes == 2 * sum(a.comm.size_bytes for a in ag)
    chunk_cat = [t for t in g.tasks if t.name.endswith("fsdp2_chunk_cat")]
    assert len(chunk_cat) == len([t for t in g.tasks if t.comm is not None and t.comm.op == "reduce_scatter"])
    assert not [t for t in lower(scn(zero_stage=3, sharding="fsdp1")).graph.tasks if "fsdp2" in t.name]


def test_hsdp_gathers_inside_the_node_and_all_reduces_shards_across_nodes():
    plan = lower(scn(dp=16, nodes=2, zero_stage=3, sharding="fsdp1", shard_group_size=8))
    node = lambda r: r // 8  # noqa: E731
    ag = gathers(plan.graph)
    assert ag and all(len({node(r) for r in t.comm.group}) == 1 for t in ag)
    rs = [t for t in plan.graph.tasks if t.comm is not None and t.comm.op == "reduce_scatter"]
    ar = [t for t in plan.graph.tasks if t.comm is not None and t.comm.op == "all_reduce" and t.comm.axis == "dp"]
    assert all(len(t.comm.group) == 8 for t in rs) and len(ar) == len(rs)
    assert all(t.comm.group == (0, 8) for t in ar)
    assert sum(t.comm.size_bytes for t in ar) == pytest.approx(sum(t.comm.size_bytes for t in rs) / 8)
    assert hsdp_groups(tuple(range(16)), 9, 8) == (tuple(range(8, 16)), (1, 9))


@pytest.mark.parametrize("par, msg", [
    ({"zero_stage": 3, "sharding": "zero"}, "parallelism.sharding 'zero' is unknown"),
    ({"zero_stage": 3, "sharding": "megatron-distopt"}, "runs zero_stage 0 or 1, got zero_stage = 3"),
    ({"zero_stage": 1, "sharding": "fsdp2"}, "needs zero_stage 2 (SHARD_GRAD_OP) or 3"),
    ({"zero_stage": 1, "sharding": "deepspeed-2021"}, "2021 ZeRO-3 engine: it needs zero_stage 3, got zero_stage = 1"),
    ({"zero_stage": 3, "sharding": "fsdp1", "shard_group_size": 3}, "shard_group_size = 3 does not divide dp*cp"),
    ({"zero_stage": 3, "sharding": "deepspeed", "shard_group_size": 2}, "needs sharding fsdp1 or fsdp2"),
])
def test_bad_sharding_settings_are_one_line_errors(par, msg):
    with pytest.raises(ScenarioError, match=re.escape(msg)) as exc:
        scn(**par)
    assert "\n" not in str(exc.value)


def test_deepspeed_prefetches_only_under_the_live_parameter_limit():
    # 530B's Linears (qkv 1.26e9, proj 0.42e9, fc1 1.68e9, fc2 1.68e9 elements): a fetch is prefetched
    # only while the submodule before it holds fewer than stage3_max_live_parameters = 1e9
    f = coalesce([1.26e9, 0.42e9, 1.68e9, 1.68e9, 1.26e9], [0, 0, 0, 0, 1])
    assert [x.prefetch for x in f] == [True, False, True, False, False]
    # lowered: 175B-wide layers prefetch every Linear, so layer 1's first gather waits only for the
    # compute before layer 0 began; a fetch that may not be prefetched waits for layer 0 itself
    wide = lower(scn(WIDE, zero_stage=3, sharding="deepspeed")).graph
    by_id = {t.id: t for t in wide.tasks}
    first = _first_fetch(gathers(wide), "F0.L1.")
    assert not by_id[first.deps[0]].name.startswith("F0.L0")
    huge = dict(WIDE, hidden_size=20480, num_attention_heads=128)
    g = lower(scn(huge, zero_stage=3, sharding="deepspeed")).graph
    by_id = {t.id: t for t in g.tasks}
    first = _first_fetch(gathers(g), "F0.L1.")  # layer 1's qkv, after layer 0's fc2 (1.68e9 live)
    assert by_id[first.deps[0]].name == "F0.L0.mlp"
    assert sum(by_id[t.deps[0]].name == "F0.L0.mlp" for t in gathers(g) if t.name.startswith("F0.L1.")) == 3


def _first_fetch(tasks, prefix):
    """The earliest fetch (lowest .g<k> index) among the gathers named ``prefix``..."""
    return min((t for t in tasks if t.name.startswith(prefix)), key=lambda t: int(re.search(r"\.g(\d+)\.", t.name)[1]))


def test_a_small_all_gather_over_hundreds_of_ranks_pays_every_ring_step():
    # NCCL's tuner (tuning.cc): baseLat + (nRanks - nNodes) intra-node steps, each at least the net
    # overhead of an inter-node ring (getNetOverhead, AMD hosts on DGX A100), + (nNodes - 1) network
    # steps for a ring all-gather: a ZeRO-3 fetch over 384 ranks costs ~1 ms before any byte moves
    from simulator.cost import nccl_tuner as tuner
    from simulator.cost.collectives import collective_time_s
    from simulator.hardware.clusters import CLUSTER_PRESETS
    from simulator.hardware.topology import build_topology
    from simulator.tasks import Collective
    from simulator.units import US
    topo = build_topology(CLUSTER_PRESETS["dgx-a100-80gb"].with_nodes(48))
    t = collective_time_s(Collective("all_gather", 8.0, tuple(range(384)), "dp"), topo, "ring/ll")
    ll = 0
    intra = max(tuner.HW_LAT_US["nvlink"]["ring"][ll], tuner.net_overhead_us("ampere", "ll"))
    want = (tuner.BASE_LAT_US["ring"][ll] + (384 - 48) * intra + 47 * tuner.HW_LAT_US["net"]["ring"][ll]) * US
    assert t == pytest.approx(want, rel=1e-3) and t > 0.3e-3


@pytest.mark.parametrize("par", [
    {"zero_stage": 3, "sharding": "deepspeed", "recompute": "full"},
    {"zero_stage": 3, "sharding": "deepspeed"},
    {"zero_stage": 3, "sharding": "fsdp2"},
    {"zero_stage": 2, "sharding": "fsdp1"},
])
def test_the_static_estimate_counts_the_gathers_the_lowering_issues(par):
    from simulator.explore.estimate_streams import gathered_params as _gathered_params
    s = scn(WIDE, m=2, **par)
    lowered = sum(t.comm.size_bytes for t in gathers(lower(s).graph))
    assert _gathered_params(s, 0) * s.training.dtype_bytes * s.num_microbatches == lowered


def test_deepspeed_2021_gathers_each_tensor_alone_with_host_work_per_rank():
    """DeepSpeed 2021 issues one all-gather per parameter tensor of a coalesced fetch, each after a
    host task: a zero-filled full buffer and one copy kernel per rank (with its view op), issued at the
    eager host floor: one eager kernel op each."""
    from simulator.cost.compute import EAGER_KERNEL_HOST_S, RooflineCompute
    from simulator.hardware.gpus import GPU_PRESETS
    new = lower(scn(SMALL, zero_stage=3, sharding="deepspeed", m=2)).graph
    old = lower(scn(SMALL, zero_stage=3, sharding="deepspeed-2021", m=2)).graph
    fetches = [f for f in new.tasks if f in gathers(new)]
    per_tensor = [t for t in gathers(old) if not t.name.startswith("persistent")]  # the post-step one: below
    # the same bytes, one collective per tensor: SMALL's first fetch holds embed + 4 + 2 tensors
    assert sum(t.comm.size_bytes for t in per_tensor) == pytest.approx(sum(t.comm.size_bytes for t in fetches))
    assert len(per_tensor) > len(fetches)
    hosts = [t for t in old.tasks if t.name.endswith(".host") and ".param_all_gather" in t.name]
    assert len(hosts) == len(per_tensor) and all(t.stream == "compute" for t in hosts)
    rc = RooflineCompute(GPU_PRESETS["a100-sxm4-80gb"], "bf16")
    eff = rc.eff
    host = hosts[0]
    full = next(t.comm.size_bytes for t in per_tensor if t.name == host.name[:-len(".host")])
    gpu = 4 * (2 * full / 4 / rc.mem_Bps + eff.kernel_overhead_s) + full / rc.mem_Bps + eff.kernel_overhead_s
    assert rc.work_time_s(host.work) == pytest.approx(max(gpu, 5 * EAGER_KERNEL_HOST_S))
    assert rc.work_time_s(host.work, eager=False) == pytest.approx(gpu)


def test_deepspeed_2021_host_work_grows_with_the_group():
    """The per-rank host work of one list all-gather is proportional to the ranks (half the compute and
    twice the host work per gather at 1,536 GPUs against 768 in Narayanan et al. 2021 Table 2)."""
    from simulator.cost.compute import RooflineCompute
    from simulator.hardware.gpus import GPU_PRESETS
    from simulator.strategy.zero_impl import list_all_gather_host_work
    rc = RooflineCompute(GPU_PRESETS["a100-sxm4-80gb"], "bf16")
    from simulator.cost.compute import EAGER_KERNEL_HOST_S
    t = {n: rc.work_time_s(list_all_gather_host_work(n, 906e6)) for n in (384, 768, 1536)}
    # host-bound: one eager kernel dispatch per rank plus the zero fill's
    assert t == pytest.approx({n: (n + 1) * EAGER_KERNEL_HOST_S for n in (384, 768, 1536)})
    assert t[1536] > 1.1e-2  # 1,536 x 7.4 us


def test_deepspeed_2021_synchronizes_the_device_and_all_reduces_gradient_buckets():
    """Each 2021 gather's host task waits for every earlier collective of the rank (torch.cuda.
    synchronize); gradients are all-reduced per reduce_bucket_size bucket (contiguous_gradients =
    false), each after the previous bucket (reduction_stream.synchronize): 2x a reduce-scatter's bytes,
    after allreduce_and_copy's flatten, divide and copy-back kernels."""
    g = lower(scn(SMALL, zero_stage=3, sharding="deepspeed-2021", m=2, training={"grad_dtype": "bf16"})).graph
    by_id = {t.id: t for t in g.tasks}
    comm_before = set()
    for t in g.tasks:
        if t.name.endswith(".host") and ".param_all_gather" in t.name:
            earlier = {c for c in comm_before if by_id[c].stream in ("comm_dp", "comm_dp_rs")}
            last = {max((c for c in earlier if by_id[c].stream == s), default=None) for s in ("comm_dp", "comm_dp_rs")}
            assert {x for x in last if x is not None} <= set(t.deps)
        if t.comm is not None:
            comm_before.add(t.id)
    reductions = [t for t in g.tasks if t.comm is not None and t.comm.axis == "dp" and t.stream == "comm_dp_rs"]
    assert reductions and all(t.comm.op == "all_reduce" for t in reductions)
    phi = lower(scn(SMALL, zero_stage=3, sharding="deepspeed-2021", m=2)).stage_params[0]["dense"]
    assert sum(t.comm.size_bytes for t in reductions) == pytest.approx(2 * phi * 2)  # 2 micro-batches, bf16
    for prev, t in zip(reductions, reductions[1:]):
        kernels = by_id[t.deps[0]]  # flatten, divide, copy back: 6 bytes per bucket byte, on the compute stream
        assert kernels.name.endswith(".flatten_div_copy") and kernels.stream == "compute"
        assert kernels.work[0].bytes == pytest.approx(6 * t.comm.size_bytes)
        host = by_id[kernels.deps[0]]
        assert host.name.endswith(".host") and prev.id in host.deps
    # the optimizer step waits for every bucket's all-reduce
    step = [t for t in g.tasks if "adam" in t.name.lower() or "optimizer" in t.name.lower()]
    waited = {d for t in step for d in t.deps}
    assert reductions[-1].id in waited


def test_the_search_bound_prices_deepspeed_2021_host_work_and_stays_a_lower_bound():
    """One rule for the lowering and the search estimator: the bound adds the per-tensor host work the
    lowering charges on the compute stream, and stays below the simulated step."""
    from simulator.explore.estimate import EstimateCache, time_lower_bound
    from simulator.explore.estimate_streams import ds2021_host_s as _ds2021_host_s
    from simulator.pipeline import simulate
    old = scn(SMALL, zero_stage=3, sharding="deepspeed-2021", m=2)
    new = scn(SMALL, zero_stage=3, sharding="deepspeed", m=2)
    host = _ds2021_host_s(old, EstimateCache(), 0)
    assert host > 0 and _ds2021_host_s(new, EstimateCache(), 0) == 0.0
    hosts = [t for t in lower(old).graph.tasks if t.name.endswith((".host", ".persistent_copy_out"))
             and "param_all_gather" in t.name or t.name.endswith(".persistent_copy_out")]
    assert any(t.name.startswith("persistent") for t in hosts)
    cost = EstimateCache().cost(old)
    assert host == pytest.approx(sum(cost.duration_s(t) for t in hosts))
    bound = time_lower_bound(old)[0]
    assert bound >= time_lower_bound(new)[0] and bound <= simulate(old).metrics["iteration_time_s"]
