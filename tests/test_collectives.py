"""Collective algorithms: closed-form times and volumes, NCCL-like choices, the command."""

from dataclasses import replace

import pytest
import simpy

from simulator.cost import nccl_tuner as tuner
from simulator.cost.algorithms import group_shape, ring_orders
from simulator.cost.collectives import (busbw_factor, choose_algorithm, collective_time_s,
                                        plan_collective)
from simulator.engine.network import FlowNetwork, simulate_plan
from simulator.explore.collective import SWEEP_SIZES, run_collective, sweep_collective
from simulator.hardware.clusters import CLUSTER_PRESETS
from simulator.hardware.topology import IB_EFFICIENCY, build_topology
from simulator.tasks import Collective

A100 = CLUSTER_PRESETS["dgx-a100-80gb"]
H100 = CLUSTER_PRESETS["dgx-h100"]
GiB = 2 ** 30
US = 1e-6


def _coll(op, size, group):
    return Collective(op, float(size), tuple(group), "dp")


def test_ring_all_reduce_on_an_uncontended_ring_is_the_closed_form():
    topo = build_topology(A100)
    n, size = 8, 1 * GiB
    b = topo.capacity_Bps[("gpu0", "nvs0")]
    alpha = tuner.HW_LAT_US["nvlink"]["ring"][2] * US
    base = tuner.BASE_LAT_US["ring"][2] * US
    plan = plan_collective(_coll("all_reduce", size, range(n)), topo, "ring/simple")
    expected = base + 2 * (n - 1) / n * size / b + 2 * (n - 1) * alpha
    assert simulate_plan(plan, topo.capacity_Bps) == pytest.approx(expected, rel=1e-12)
    assert collective_time_s(_coll("all_reduce", size, range(n)), topo,
                             "ring/simple") == pytest.approx(expected, rel=1e-12)


def test_small_message_ring_latency_grows_with_the_steps():
    topo = build_topology(A100)
    base = tuner.BASE_LAT_US["ring"][0] * US
    step = tuner.HW_LAT_US["nvlink"]["ring"][0] * US
    for n in (2, 4, 8):
        t = collective_time_s(_coll("all_reduce", 8, range(n)), topo, "ring/ll")
        assert t == pytest.approx(base + 2 * (n - 1) * step, rel=1e-3)
    nodes = build_topology(A100.with_nodes(8))
    t_ag = collective_time_s(_coll("all_gather", 8, range(0, 64, 8)), nodes, "ring/ll")
    # one GPU per node: "With ppn=1 latencies are fully exposed, use the Tree network latency"
    inter = tuner.HW_LAT_US["net"]["tree"][0] * US
    assert t_ag == pytest.approx(base + 7 * inter, rel=1e-3)  # 7 steps, all across nodes


def test_multi_node_ring_uses_every_nic_and_keeps_hops_on_one_rail():
    topo = build_topology(A100.with_nodes(4))
    group = tuple(range(32))
    orders = ring_orders(group_shape(group, topo), group)
    assert len(orders) == 8 and all(sorted(o) == list(group) for o in orders)
    exits = {}
    for o in orders:
        hops = [(a, b) for a, b in zip(o, o[1:] + o[:1]) if topo.node_of(a) != topo.node_of(b)]
        assert len(hops) == 4
        assert sum(topo.rail_of(a) == topo.rail_of(b) for a, b in hops) == 3  # all but wrap
        for a, _ in hops:
            exits[topo.nic_name(a)] = exits.get(topo.nic_name(a), 0) + 1
    assert set(exits.values()) == {1} and len(exits) == 32  # each NIC carries one ring
    # NIC-bound: busbw = 8 NICs x 24 GB/s, the nccl-tests figure of 4 DGX A100
    size = 8 * GiB
    t = collective_time_s(_coll("all_reduce", size, group), topo, "ring/simple")
    # tuning.cc: nInterSteps = 2 (nNodes - 1); intra-node steps of an inter-node ring pay at least the
    # net overhead, 2 us x 3 (Simple) on DGX A100's AMD hosts (> NVLink's 3.4 us); x1.4 for the
    # ring plateau of a Simple all-reduce across nodes (ncclTopoGetAlgoTime, Ampere and later)
    lat = (tuner.BASE_LAT_US["ring"][2] + (62 - 6) * max(tuner.HW_LAT_US["nvlink"]["ring"][2], 6.0)
           + 6 * tuner.HW_LAT_US["net"]["ring"][2]) * US * tuner.RING_PLATEAU_FACTOR_DEFAULT
    assert t == pytest.approx(lat + 2 * 31 / 32 * size / (8 * 25e9 * IB_EFFICIENCY), rel=1e-12)


def test_hierarchical_all_reduce_nic_volume_is_the_closed_form():
    nodes, g, size = 4, 8, 64e6
    topo = build_topology(A100.with_nodes(nodes))
    plan = plan_collective(_coll("all_reduce", size, range(nodes * g)), topo,
                           "hierarchical/simple")
    nic_out = sum(f.size_bytes * step.repeat for step in plan.steps for f in step.flows
                  for link in f.links if link[0].startswith("nic") and link[1].startswith("leaf"))
    # each GPU sends 2(N-1)/N of its S/g shard across the network
    assert nic_out == pytest.approx(nodes * g * 2 * (nodes - 1) / nodes * size / g, rel=1e-12)
    env = simpy.Environment()
    net = FlowNetwork(env, topo.capacity_Bps)
    env.process(net.run(plan))
    env.run()
    moved = sum(b for (u, v), (b, _) in net.link_stats().items()
                if u.startswith("nic") and v.startswith("leaf"))
    assert moved == pytest.approx(2 * (nodes - 1) * size, rel=1e-12)


def test_all_to_all_sends_s_over_n_to_every_peer():
    topo = build_topology(A100.with_nodes(2))
    n, size = 16, 32e6
    plan = plan_collective(_coll("all_to_all", size, range(n)), topo, "direct/simple")
    (step,) = plan.steps
    assert len(step.flows) == n * (n - 1)
    pairs = {(f.links[0][0], f.links[-1][1]) for f in step.flows}
    assert len(pairs) == n * (n - 1)
    for f in step.flows:  # payload S/n; the wire carries it at the all-to-all efficiency
        assert f.size_bytes * tuner.ALL_TO_ALL_EFFICIENCY == pytest.approx(size / n, rel=1e-12)


def test_multi_node_all_to_all_follows_n_over_n_minus_1_times_the_nic():
    for nodes in (2, 4):
        topo = build_topology(H100.with_nodes(nodes))
        n = 8 * nodes
        t = collective_time_s(_coll("all_to_all", 4 * GiB, range(n)), topo, "direct/simple")
        busbw = 4 * GiB / t * busbw_factor("all_to_all", n)
        law = nodes / (nodes - 1) * 50e9 * IB_EFFICIENCY * tuner.ALL_TO_ALL_EFFICIENCY
        assert busbw == pytest.approx(law * (n - 1) / n, rel=2e-3)


def test_choice_switches_from_tree_to_ring_with_size_across_nodes():
    topo = build_topology(A100.with_nodes(4))
    group = tuple(range(32))
    assert choose_algorithm("all_reduce", 8, group, topo) == "tree"
    assert choose_algorithm("all_reduce", 4 * GiB, group, topo) == "ring"
    sizes = [2 ** k for k in range(3, 34)]
    picks = [choose_algorithm("all_reduce", s, group, topo) for s in sizes]
    first_ring = picks.index("ring")
    assert set(picks[:first_ring]) == {"tree"} and set(picks[first_ring:]) == {"ring"}
    assert choose_algorithm("all_gather", 8, group, topo) == "ring"


def test_nvls_only_on_nvlink_sharp_nodes_and_wins_large_all_reduce():
    h = build_topology(H100)
    assert choose_algorithm("all_reduce", GiB, tuple(range(8)), h) == "nvls"
    t = collective_time_s(_coll("all_reduce", 8 * GiB, range(8)), h, "nvls")
    # S(1 + 1/n) each way at nvlsEfficiency 0.85 (Hopper) of 18 x 20.6 GB/s, + 25 us (NCCL 2.30.7 tuning.cc)
    expected = 25 * US + 8 * GiB * (1 + 1 / 8) / (18 * 20.6e9 * 0.85)
    assert t == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="NVLink SHARP"):
        plan_collective(_coll("all_reduce", GiB, range(8)), build_topology(A100), "nvls")
    with pytest.raises(ValueError, match="spans 2 nodes"):
        plan_collective(_coll("all_reduce", GiB, range(16)), build_topology(H100.with_nodes(2)),
                        "nvls")


def test_static_time_equals_the_engine_alone_for_every_algorithm():
    topo = build_topology(H100.with_nodes(4))
    cases = [("all_reduce", range(32), a) for a in ("ring", "tree", "hierarchical")]
    cases += [("all_reduce", range(8, 16), "nvls"), ("all_gather", range(0, 32, 8), "ring"),
              ("reduce_scatter", range(32), "ring"), ("broadcast", range(16), "ring"),
              ("all_to_all", range(16), "direct"), ("send_recv", (3, 27), "p2p")]
    for op, group, alg in cases:
        for size in (4096, 3e8):
            coll = _coll(op, size, group)
            plan = plan_collective(coll, topo, alg)
            assert plan.algorithm.startswith(alg)
            assert simulate_plan(plan, topo.capacity_Bps) == pytest.approx(
                collective_time_s(coll, topo, alg), rel=1e-9), (op, alg, size)


def test_send_recv_is_one_flow_at_the_path_bottleneck():
    topo = build_topology(A100.with_nodes(2))
    size = GiB
    plan = plan_collective(_coll("send_recv", size, (1, 9)), topo)
    assert plan.algorithm == "p2p/simple"
    (step,) = plan.steps
    assert len(step.flows) == 1 and step.flows[0].links == topo.route(1, 9)
    lat = (tuner.BASE_LAT_US["ring"][2] + tuner.HW_LAT_US["net"]["ring"][2]) * US
    expected = lat + size / (25e9 * IB_EFFICIENCY)  # the NIC, not PCIe (25.6 GB/s), binds
    assert simulate_plan(plan, topo.capacity_Bps) == pytest.approx(expected, rel=1e-12)


def test_intra_node_times_are_the_same_on_every_node_and_trivial_groups_are_free():
    topo = build_topology(A100.with_nodes(4))
    t0 = collective_time_s(_coll("all_gather", 1e6, range(8)), topo)
    t3 = collective_time_s(_coll("all_gather", 1e6, range(24, 32)), topo)
    assert t0 == t3 > 0
    assert collective_time_s(_coll("all_reduce", 1e6, (5,)), topo) == 0.0
    assert plan_collective(_coll("all_reduce", 0, range(8)), topo).steps == ()


def test_bad_requests_name_the_problem():
    topo = build_topology(A100)
    with pytest.raises(ValueError, match="cannot run all_gather"):
        plan_collective(_coll("all_gather", 1e6, range(8)), topo, "tree")
    with pytest.raises(ValueError, match="no protocol 'll128'"):
        plan_collective(_coll("all_to_all", 1e6, range(8)), topo, "direct/ll128")
    with pytest.raises(ValueError, match="repeats a rank"):
        collective_time_s(_coll("all_reduce", 1e6, (0, 1, 1)), topo)
    with pytest.raises(ValueError, match="rank 9"):
        collective_time_s(_coll("all_reduce", 1e6, (0, 9)), topo)
    with pytest.raises(ValueError, match="size_bytes"):
        collective_time_s(_coll("all_reduce", -1, (0, 1)), topo)
    with pytest.raises(ValueError, match="same local GPUs"):
        plan_collective(_coll("all_reduce", 1e6, (0, 1, 8)), build_topology(A100.with_nodes(2)),
                        "hierarchical")


def test_busbw_factors_follow_nccl_tests():
    assert busbw_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert busbw_factor(op, 8) == pytest.approx(7 / 8)
    assert busbw_factor("send_recv", 8) == busbw_factor("broadcast", 8) == 1.0


def test_run_collective_reports_nccl_tests_figures():
    row = run_collective(A100, "all_reduce", 2 * GiB, "ring")
    assert set(row) == {"op", "num_gpus", "size_bytes", "time_s", "algbw_GBps", "busbw_GBps",
                        "algorithm"}
    assert row["num_gpus"] == 8 and row["algorithm"] == "ring/simple"
    assert row["algbw_GBps"] == pytest.approx(2 * GiB / row["time_s"] / 1e9)
    assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * 14 / 8)
    assert SWEEP_SIZES[0] == 8 and SWEEP_SIZES[-1] == 8 * GiB and len(SWEEP_SIZES) == 31
    rows = sweep_collective(A100, "all_gather", sizes=(8, 2 ** 20, 2 ** 30))
    assert [r["size_bytes"] for r in rows] == [8, 2 ** 20, 2 ** 30]
    assert rows[0]["busbw_GBps"] < rows[1]["busbw_GBps"] < rows[2]["busbw_GBps"]
    with pytest.raises(ValueError, match="unknown collective op"):
        run_collective(A100, "gather", 1e6)
    with pytest.raises(ValueError, match="at least 2 GPUs"):
        run_collective(replace(A100, gpus_per_node=1, nics_per_node=1), "all_reduce", 1e6)


def test_nvls_tree_across_two_nodes_runs_at_nccl_per_channel_ceiling():
    """NVLSTree: NVLink SHARP inside each node (S(1 + 1/8) each way at 0.85 of the NVLink rate) and
    S/8 per GPU through its NIC each way; on DGX H100 both allow more than NCCL 2.30.7's ceiling of
    57.7 GB/s bus bandwidth per NVLS channel on 2 nodes (8 heads, one per NIC), which binds;
    latency 25 + 2 x 20.9 us, plus the pipeline fill: 2 network hops of one 128 KB chunk for each of
    16 channels x 8 heads, at the same rate."""
    topo = build_topology(H100.with_nodes(2))
    size = 8 * GiB
    t = collective_time_s(_coll("all_reduce", size, range(16)), topo, "nvls_tree")
    nvlink = topo.capacity_Bps[("gpu0", "nvs0")]
    assert size * (1 + 1 / 8) / (nvlink * 0.85) < size * 2 * 15 / 16 / (8 * 57.7e9)
    fill_bytes = 2 * 16 * 8 * 128 * 1024
    expected = (25 + 2 * 20.9) * US + (size + fill_bytes) * 2 * 15 / 16 / (8 * 57.7e9)
    assert t == pytest.approx(expected, rel=1e-9)
    plan = plan_collective(_coll("all_reduce", size, range(16)), topo, "nvls_tree")
    nic_out = sum(f.size_bytes for s in plan.steps for f in s.flows if ("nic0.3", "leaf3.0") in f.links)
    nvl_out = sum(f.size_bytes for s in plan.steps for f in s.flows if ("gpu3", "nvs0") in f.links)
    # rank 3's shard (S/8) goes up one tree and comes down the other; NVLink carries S(1 + 1/8) at
    # 0.85 of its rate; both scaled alike by the ceiling's efficiency
    assert nic_out / nvl_out == pytest.approx((1 / 8) / ((1 + 1 / 8) / 0.85))
    assert nic_out > size / 8
    assert simulate_plan(plan, topo.capacity_Bps) == pytest.approx(t, rel=1e-9)
    assert choose_algorithm("all_reduce", 8 * GiB, tuple(range(16)), topo) == "nvls_tree"
    with pytest.raises(ValueError, match="at least 2 nodes"):
        plan_collective(_coll("all_reduce", GiB, range(8)), topo, "nvls_tree")
    with pytest.raises(ValueError, match="NVLink SHARP"):
        plan_collective(_coll("all_reduce", GiB, range(16)), build_topology(A100.with_nodes(2)), "nvls_tree")


def test_nvls_tree_is_nic_bound_on_slow_nics():
    """With 8 x 100 Gb/s NICs the S/8 per NIC of NVLSTree binds: t = S/8 / NIC rate + latency, the
    pipeline fill (2 hops x 16 channels x 8 heads x 128 KB) at the same rate."""
    slow = replace(H100, nic_bandwidth_Bps=12.5e9).with_nodes(2)
    topo = build_topology(slow)
    t = collective_time_s(_coll("all_reduce", 8 * GiB, range(16)), topo, "nvls_tree")
    fill_bytes = 2 * 16 * 8 * 128 * 1024
    assert t == pytest.approx((25 + 2 * 20.9) * US + (8 * GiB + fill_bytes) / 8 / (12.5e9 * IB_EFFICIENCY),
                              rel=1e-9)


def test_fabric_profiles_restrict_the_tuner_as_their_vendors_prescribe():
    """GPUDirect-TCPXO (A3 Mega): NCCL_ALGO=Ring,Tree, NCCL_PROTO=Simple; TCPX: Ring, Simple."""
    size, group = 4 * GiB, tuple(range(16))
    mega = build_topology(replace(H100, fabric="tcpxo", nvls=False).with_nodes(2))
    high = build_topology(replace(H100, fabric="tcpx", nvls=False).with_nodes(2))
    plan = plan_collective(_coll("all_reduce", size, group), mega)
    assert plan.algorithm in ("ring/simple", "tree/simple")
    assert plan_collective(_coll("all_reduce", 8, group), mega).algorithm.endswith("/simple")
    assert plan_collective(_coll("all_reduce", size, group), high).algorithm == "ring/simple"
    # an explicit choice still runs, and all-to-all / send-recv are P2P, not restricted
    assert plan_collective(_coll("all_reduce", 8, group), high, "tree/ll").algorithm == "tree/ll"
    assert plan_collective(_coll("all_to_all", 1024, group), high).algorithm == "direct/ll"


def test_nvls_tree_ceiling_beyond_two_nodes_and_ring_plateau():
    """NCCL 2.30.7's NVLSTree ceiling over more than 2 nodes is 45.5 GB/s per channel (Hopper), so 4 DGX
    H100 reach 8 x 45.5 GB/s busbw; latency 25 + 2 log2(4) x 20.9 us; pipeline fill over 2 log2(4)
    network hops of NCCL_NVLSTREE_MAX_CHUNKSIZE's 64 KB (4 nodes and more) per channel and head. The
    ring plateau (x1.4 latency) applies to Simple all-reduce across nodes only, from 64 B per
    channel and rank."""
    topo = build_topology(H100.with_nodes(4))
    size = 8 * GiB
    t = collective_time_s(_coll("all_reduce", size, range(32)), topo, "nvls_tree")
    fill_bytes = 4 * 16 * 8 * 64 * 1024
    assert t == pytest.approx((25 + 4 * 20.9) * US + (size + fill_bytes) * 2 * 31 / 32 / (8 * 45.5e9),
                              rel=1e-9)
    assert tuner.ring_plateau("all_reduce", "simple", 2, 16 * 16 * 64, 16, 16, "hopper") == 1.4
    assert tuner.ring_plateau("all_reduce", "simple", 2, 16 * 16 * 64 - 1, 16, 16, "hopper") == 1.0
    assert tuner.ring_plateau("all_reduce", "ll128", 2, GiB, 16, 16, "hopper") == 1.0
    assert tuner.ring_plateau("all_gather", "simple", 2, GiB, 16, 16, "hopper") == 1.0
    assert tuner.ring_plateau("all_reduce", "simple", 1, GiB, 16, 8, "hopper") == 1.0


def test_tuner_bandwidth_refinements_compose_as_nccl_2_30_7():
    """ncclTopoTuneModel's ceilings in its order: Tree min(x.92, nCh x perChMaxTree) then LL
    min(/3.8, llMax) or LL128 min(x k, nCh x perChMaxTreeLL128); Ring LL min(x.5, llMax), Ring LL128
    min(x.92, nCh x perChMaxRingLL128); llMax by GPU on one node (Hopper 141), by CPU across nodes."""
    G = 1e9
    assert tuner.efficiency("ring", "ll", "all_gather", 1) == 0.5
    assert tuner.max_busbw_Bps("ring", "ll", "hopper", 1, 8) == pytest.approx(141 * G)
    assert tuner.max_busbw_Bps("ring", "ll", "ampere", 2, 8) == pytest.approx(22.5 * G)  # AMD hosts
    assert tuner.max_busbw_Bps("ring", "ll", "hopper", 4, 8) == pytest.approx(20.4 * G)  # Intel hosts
    assert tuner.max_busbw_Bps("ring", "ll128", "hopper", 2, 8, 8) == pytest.approx(8 * 36.7 * G)
    assert tuner.max_busbw_Bps("ring", "ll128", "hopper", 1, 8) == float("inf")
    # one node: the tree ceiling x 7/9 (30.1 GB/s per channel) is below perChMaxTreeLL128's 36.7
    assert tuner.max_busbw_Bps("tree", "ll128", "hopper", 1, 8) == pytest.approx(8 * 38.7 * 7 / 9 * G)
    assert tuner.max_busbw_Bps("tree", "ll128", "hopper", 2, 8) == pytest.approx(8 * 36.7 * G)
    assert tuner.max_busbw_Bps("tree", "ll", "hopper", 2, 8) == pytest.approx(39 * G)  # llMax binds
    assert tuner.max_busbw_Bps("tree", "ll", "ampere", 1, 8) == pytest.approx(8 * 24 / 3.8 * G)
    assert tuner.max_busbw_Bps("nvls_tree", "simple", "blackwell", 4, 8) == pytest.approx(8 * 80 * G)
    # treeCorrectionFactor: log2i(nBytes >> 6), none below 64 B; NVLSTree only on Blackwell
    assert tuner.tree_correction("tree", "simple", 63) == 1.0
    assert tuner.tree_correction("tree", "simple", 64) == 0.9
    assert tuner.tree_correction("tree", "ll128", 2 ** 22) == 0.8  # 4 MB: entry 16 (2.19: 0.7)
    assert tuner.tree_correction("tree", "simple", 2 ** 29) == 1.0  # entry 23: Tree reads 23 entries
    assert tuner.tree_correction("nvls_tree", "simple", 2 ** 29, "blackwell") == 0.9
    assert tuner.tree_correction("nvls_tree", "simple", 2 ** 20, "hopper") == 1.0
    assert tuner.nvls_efficiency("hopper") == 0.85 and tuner.nvls_efficiency("blackwell") == 0.74


def test_ring_ll128_across_nodes_stops_at_its_per_channel_ceiling():
    """2 DGX H100, ring/LL128 all-reduce at 1 GiB: 8 ring channels (one per NIC) x 36.7 GB/s bus
    bandwidth bind before 0.92 x the NICs; latency baseLat 14 + 2(nNodes - 1) network steps of 4.0
    and 28 intra-node steps of max(1.9, 1 us net overhead) us."""
    topo = build_topology(H100.with_nodes(2))
    t = collective_time_s(_coll("all_reduce", GiB, range(16)), topo, "ring/ll128")
    lat = (14.0 + 2 * 4.0 + 28 * 1.9) * US
    assert t == pytest.approx(lat + GiB * 2 * 15 / 16 / (8 * 36.7e9), rel=1e-9)


def test_p2p_uses_ll_up_to_16_kb_per_channel_and_broadcast_steps_pay_tree_latency_with_simple():
    """addP2pToPlan: LL when bytes <= nChannels x NCCL_P2P_LL_THRESHOLD (16 KB); ring broadcast
    without sameChannels: nRanks x hwLat, the tree's with Simple (4.0 us over NVLink)."""
    assert tuner.p2p_protocol(16384) == "ll" and tuner.p2p_protocol(16385) == "simple"
    assert tuner.p2p_send_channels(130 * 1024, 8, 1) == 3 and tuner.p2p_protocol(130 * 1024, 8, 1) == "simple"
    assert tuner.p2p_protocol(48 * 1024, 8, 1) == "simple"  # one 64 KB part: one channel
    topo = build_topology(A100)
    t = collective_time_s(_coll("broadcast", 8, range(8)), topo, "ring/simple")
    assert t == pytest.approx((8.4 + 8 * 4.0) * US, rel=1e-3)


@pytest.mark.parametrize("op", ["all_reduce", "all_gather"])
def test_pruning_by_the_link_load_bound_never_changes_the_pick(op, monkeypatch):
    """Large phases skip the bound (it costs more than the numpy fluid timing it would spare); the bound
    only ever skips a candidate that loses, so pricing every candidate picks the same one, same time."""
    import simulator.cost.collectives as C
    group = tuple(range(0, 1040))  # 130 nodes: the ring and tree phases hold >= 1,024 flows
    topo = build_topology(A100.with_nodes(130))
    algs = ("ring", "tree") if op == "all_reduce" else ("ring",)
    assert not any(C._bound_pays(topo, op, group, alg) for alg in algs)

    def picks(prune_always: bool) -> list:
        topo = build_topology(A100.with_nodes(130))
        if prune_always:
            monkeypatch.setattr(C, "_bound_pays", lambda *a: True)
        out = [C._pick(topo, op, size, group, None) for size in (65536.0, 1e9)]
        monkeypatch.undo()
        return out

    assert picks(False) == picks(True)
