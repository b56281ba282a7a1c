"""Communication kernels hold SMs; compute beside them runs on the rest (cost/sm_share, engine/sm_contention)."""

from __future__ import annotations

import dataclasses

import pytest

from simulator.cost.compute import RooflineCompute
from simulator.cost.sm_share import collective_ctas, ring_channels, with_sms_taken
from simulator.engine.sm_contention import stretched_durations
from simulator.hardware.clusters import CLUSTER_PRESETS
from simulator.hardware.topology import build_topology
from simulator.cost.algorithms import group_shape
from simulator.pipeline import simulate
from simulator.scenario import ScenarioError, scenario_from_dict
from simulator.tasks import Collective, OpWork, Task, TaskGraph

H100 = CLUSTER_PRESETS["dgx-h100"]
A100 = CLUSTER_PRESETS["dgx-a100-80gb"]


@pytest.mark.parametrize("cluster,nodes,rails,channels", [
    (H100, 1, 8, 24),   # 6 searched rings at 60 GB/s, duplicated to 12 at 30, doubled: NCCL's 24 on DGX H100
    (A100, 1, 8, 24),   # 6 at 40, duplicated to 12 at 20, doubled
    (H100, 2, 8, 16),   # one ring per NIC, doubled
    (H100, 2, 4, 16),   # 4 rings, doubled, doubled again below 16 on sm90 ("16 coll channels" on 4 NICs)
    (A100, 4, 8, 16),
    (A100, 4, 1, 2),    # no extra doubling before Hopper
    (CLUSTER_PRESETS["dgx-b200"], 1, 8, 32),  # 721.8 GB/s / 90 = 8 rings, duplicated, doubled
])
def test_ring_channels_follow_nccls_search_and_duplication(cluster, nodes, rails, channels):
    assert ring_channels(cluster, nodes, rails) == channels


def test_collective_ctas_by_algorithm_size_and_kind():
    topo = build_topology(H100.with_nodes(2))
    node = group_shape(tuple(range(8)), topo)
    big = Collective("all_gather", 256e6, tuple(range(8)), "dp")
    assert collective_ctas(big, "ring/simple", node, H100) == 24
    # enqueue.cc: nc drops while nBytes < nc x 512 threads x 64 (Simple): 96 KiB -> 3 channels
    small = dataclasses.replace(big, size_bytes=3 * 512 * 64)
    assert collective_ctas(small, "ring/simple", node, H100) == 3
    assert collective_ctas(dataclasses.replace(big, size_bytes=100), "ring/simple", node, H100) == 1
    assert collective_ctas(dataclasses.replace(big, op="all_reduce"), "nvls/simple", node, H100) == 16
    assert collective_ctas(Collective("d2h", 1e9, (0,), "host"), "pcie-copy", node, H100) == 0
    send = Collective("send_recv", 64e6, (0, 8), "pp")
    # across nodes a peer gets pow2Up(ceil(50 GB/s NIC / 14 GB/s per P2P channel)) = 4 channels (paths.cc)
    assert collective_ctas(send, "p2p/simple", group_shape((0, 8), topo), H100) == 4
    # an all-to-all over the node: 7 peers, each 8 MB send on nChannelsMin = 4 channels (32 per peer
    # halved while x 8 ranks > 32, enqueue.cc): 28 CTAs, under the 32 P2P channels
    a2a = Collective("all_to_all", 64e6, tuple(range(8)), "ep")
    assert collective_ctas(a2a, "p2p/simple", node, H100) == 28


def test_p2p_ctas_follow_the_fabrics_nccl_environment():
    """The SMs a send holds are the P2P channels it runs on, under the same NCCL environment the
    collective's time uses (cost/nccl_env): with TCPX's NCCL_MAX_NCHANNELS=8 a 1 GiB send inside a
    node runs on 8 channels where NCCL's defaults give 32; an all-to-all stays within the 8 P2P
    channels."""
    a3_high = dataclasses.replace(H100, nics_per_node=4, nic_bandwidth_Bps=25e9, fabric="tcpx", nvls=False)
    group = tuple(range(8))
    send = Collective("send_recv", 2.0 ** 30, group, "pp")
    for cluster, ctas in ((H100, 32), (a3_high, 8)):
        shape = group_shape(group, build_topology(cluster))
        assert collective_ctas(send, "p2p/simple", shape, cluster) == ctas
    a2a = Collective("all_to_all", 2.0 ** 30, group, "ep")
    assert collective_ctas(a2a, "p2p/simple", group_shape(group, build_topology(a3_high)), a3_high) == 8


def test_a_one_wave_gemm_beside_24_ctas_takes_nearly_twice_as_long():
    # NVIDIA developer forum 337991 (H100): a 132-CTA GEMM next to a 24-CTA ncclAllGather nearly
    # doubles: 108 SMs left, 132 tiles in 2 waves, at the clock the power limit allows 108 busy SMs,
    # (132 / 108)^(1/3) above the full GPU's (measured here: 1.72x, gpu_contention.csv).
    rc = RooflineCompute(H100.gpu, "bf16")
    gemm = OpWork("g", "gemm", 2.0 * 1536 * 2816 * 8192, 0.0, (1536, 2816, 8192))  # 132 tiles, no remainder
    busy = with_sms_taken(rc, 24)
    overhead = rc.eff.kernel_overhead_s
    assert busy.op_time_s(gemm) - overhead == pytest.approx(
        2.0 * (rc.op_time_s(gemm) - overhead) / (132 / 108) ** (1 / 3), rel=1e-12)
    # an HBM-bound kernel keeps its time: bandwidth, not SMs, bounds it
    norm = OpWork("n", "norm", 0.0, 1e9)
    assert busy.op_time_s(norm) == rc.op_time_s(norm)
    assert with_sms_taken(rc, 0).op_time_s(gemm) == rc.op_time_s(gemm)


def _task(i, kind, stream, rank=0):
    return Task(i, f"t{i}", kind, rank, stream, "compute" if kind == "compute" else "comm_dp")


def _graph(tasks, shapes=()):
    streams: dict = {}
    for t in tasks:
        streams.setdefault((t.rank, t.stream), []).append(t.id)
    return TaskGraph(tuple(tasks), {k: tuple(v) for k, v in streams.items()}, tuple(sorted({t.rank for t in tasks})),
                     False, {}, tuple(shapes))


def test_stretch_is_the_overlap_times_the_slowdown():
    # compute 0 runs [0, 2], compute 1 [2, 3]; a 24-CTA collective runs [1, 2.5] beside them
    tasks = [_task(0, "compute", "compute"), _task(1, "compute", "compute"), _task(2, "comm", "comm")]
    start, end, dur = [0.0, 2.0, 1.0], [2.0, 3.0, 2.5], [2.0, 1.0, None]
    out = stretched_durations(_graph(tasks), start, end, dur, [0, 0, 24], lambda t, sms: 1.5 if sms == 24 else 9.0)
    assert out == [2.0 + 1.0 * 0.5, 1.0 + 0.5 * 0.5, None]
    # two collectives at once hold the sum of their CTAs
    tasks.append(_task(3, "comm", "comm2"))
    out = stretched_durations(_graph(tasks), start + [1.5], end + [2.0], dur + [None], [0, 0, 24, 8],
                              lambda t, sms: {24: 1.5, 32: 2.0}[sms])
    assert out[0] == pytest.approx(2.0 + 0.5 * 0.5 + 0.5 * 1.0)
    # another rank's collective leaves rank 0 alone; no overlap at all: nothing changes
    other = [_task(0, "compute", "compute"), _task(1, "comm", "comm", rank=1)]
    assert stretched_durations(_graph(other), [0.0, 0.0], [1.0, 1.0], [1.0, None], [0, 24], lambda t, s: 2.0) is None


def test_the_ratio_is_asked_once_per_shape_and_level():
    # compute 0 and 1 share a shape (one work): one question for both, each stretched by its overlap
    tasks = [_task(0, "compute", "compute"), _task(1, "compute", "compute"), _task(2, "comm", "comm")]
    asked = []

    def ratio(t, sms):
        asked.append((t.id, sms))
        return 1.5
    out = stretched_durations(_graph(tasks, (0, 0, 2)), [0.0, 2.0, 1.0], [2.0, 3.0, 2.5], [2.0, 1.0, None],
                              [0, 0, 24], ratio)
    assert out == [2.0 + 1.0 * 0.5, 1.0 + 0.5 * 0.5, None] and asked == [(0, 24)]


def test_static_times_equal_the_engines_first_run():
    """The first run of the SM-contention model without simpy: the engine's start and end of every
    task, exactly, with the tied embedding's barrier (two simulated ranks), a DualPipe plan's
    re-ordered streams (a MoE DualPipe pair), and full mode (a barrier per collective)."""
    from simulator.cost.model import CostModel
    from simulator.engine.sim import simulate_graph, task_durations
    from simulator.engine.sm_contention import static_times
    from simulator.strategy.lower import lower

    base = {"model": {"preset": "gpt3-1.3b", "num_layers": 8}, "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 2},
            "training": {"global_batch_size": 16}}
    plans = [({"tp": 2, "pp": 4, "dp": 2}, False), ({"tp": 2, "pp": 4, "dp": 2, "schedule": "dualpipe-v"}, False),
             ({"tp": 2, "pp": 2, "dp": 4, "schedule": "dualpipe"}, False), ({"tp": 2, "pp": 2, "dp": 4}, True),
             ({}, False), ({}, True)]
    moe_pairs = scenario_from_dict({
        "model": {"num_layers": 4, "hidden_size": 1024, "num_attention_heads": 8, "vocab_size": 1024, "seq_length": 1024,
                  "mlp": "swiglu", "num_experts": 16, "moe_top_k": 4},
        "cluster": {"preset": "dgx-h100", "num_nodes": 4},
        "parallelism": {"tp": 1, "pp": 2, "dp": 16, "ep": 16, "schedule": "dualpipe-v", "virtual_stages": 2},
        "training": {"global_batch_size": 128}})
    for par, full in plans:
        scn = scenario_from_dict({**base, "parallelism": par}) if par else moe_pairs
        topo = build_topology(scn.cluster)
        cost = CostModel(scn, topo)
        graph = lower(scn, full).graph
        dur = [cost.isolated_s(t) if d is None else d for t, d in zip(graph.tasks, task_durations(graph, cost))]
        run = simulate_graph(graph, cost, durations=dur)
        if not par:  # the pairs' streams are re-ordered: ids no longer rise along them
            assert any(a > b for ids in graph.streams.values() for a, b in zip(ids, ids[1:]))
        assert static_times(graph, dur) == (run.start_s, run.end_s), (par, full)
    assert static_times(graph, [float("inf")] * len(graph)) is None


def _dp_over_nodes(sm_contention: bool | None = None):
    raw = {"model": {"preset": "gpt3-1.3b"}, "parallelism": {"tp": 1, "pp": 1, "dp": 16},
           "cluster": {"preset": "dgx-h100", "num_nodes": 2}, "training": {"global_batch_size": 32}}
    if sm_contention is not None:
        raw["cost"] = {"sm_contention": sm_contention}
    return scenario_from_dict(raw)


def test_a_step_with_contention_is_slower_by_at_most_the_overlapped_slowdown():
    on, off = simulate(_dp_over_nodes()), simulate(_dp_over_nodes(False))
    t_on, t_off = on.metrics["iteration_time_s"], off.metrics["iteration_time_s"]
    assert t_on > t_off
    # never more than the DP traffic's whole time at the slowdown of its 16 CTAs on 132 SMs (x 2 waves)
    dp = sum(e.end_s - e.start_s for e in off.trace.on(off.trace.ranks()[0]) if e.category == "comm_dp")
    assert t_on - t_off <= dp * (2 * 132 / 116 - 1)
    assert _dp_over_nodes().cost.sm_contention is True


def test_sm_contention_must_be_a_boolean():
    with pytest.raises(ScenarioError, match="cost.sm_contention must be true or false, got 'yes'"):
        _dp_over_nodes("yes")  # type: ignore[arg-type]


def test_the_metric_is_the_busiest_ranks_stretch():
    on, off = simulate(_dp_over_nodes()).metrics, simulate(_dp_over_nodes(False)).metrics
    assert off["sm_contention_s"] == 0.0
    busy = on["busiest_rank"]["time_breakdown_s"]
    assert 0.0 < on["sm_contention_s"] < busy["compute"] + busy["recompute"]
    # the step grows by no more than the stretch of the rank that sets it (one DP-only stage)
    assert on["iteration_time_s"] - off["iteration_time_s"] <= on["sm_contention_s"] + 1e-12
