"""The representative-rank mode charges the flows of every concurrent sibling group: the same times as the
full simulation on multi-leaf fat-tree and rail-optimized clusters, oversubscribed or not."""

import pytest
import simpy

from simulator.cost.collectives import plan_collective
from simulator.cost.siblings import (fast_mode_cost, merge_plans, shared_binding_links,
                                     sibling_groups)
from simulator.engine.network import FlowNetwork, simulate_plan
from simulator.hardware.topology import SPINE, build_topology
from simulator.pipeline import simulate
from simulator.scenario import scenario_from_dict
from simulator.strategy.mesh import DeviceMesh
from simulator.tasks import Collective, TaskGraphBuilder

SMALL_GPT = {"num_layers": 2, "hidden_size": 512, "num_attention_heads": 8, "vocab_size": 8192,
             "seq_length": 1024}


def scn(cluster: dict, par: dict, batch: int, model: dict = SMALL_GPT):
    return scenario_from_dict({"model": dict(model), "cluster": cluster, "parallelism": par,
                               "training": {"global_batch_size": batch, "micro_batch_size": 1}})


# 40 one-GPU nodes: two HDR leaves of 20 ports; oversubscription 20 leaves one uplink per leaf.
ONE_GPU_NODES = {"preset": "dgx-a100-80gb", "num_nodes": 40, "gpus_per_node": 1, "nics_per_node": 1,
                 "topology": "fat-tree", "oversubscription": 20}


def test_sibling_groups_of_each_axis():
    mesh = DeviceMesh(pp=2, dp=4, cp=1, tp=2)
    assert sibling_groups(mesh, mesh.group("dp", 0), "all_reduce") == ((0, 2, 4, 6), (1, 3, 5, 7))
    assert sibling_groups(mesh, mesh.group("tp", 8), "all_gather") == ((8, 9), (10, 11), (12, 13), (14, 15))
    # a send keeps its direction: stage 1 -> 0 copies all go backwards, one per (dp, tp)
    back = sibling_groups(mesh, (8, 0), "send_recv")
    assert len(back) == 8 and all(a == b + 8 for a, b in back)
    ring = DeviceMesh(pp=1, dp=1, cp=2, tp=1)
    assert sibling_groups(ring, (0, 1), "send_recv") == ((0, 1), (1, 0))  # both ring directions
    moe = DeviceMesh(pp=1, dp=8, cp=1, tp=1, ep=4)
    assert sibling_groups(moe, moe.group("ep", 0), "all_to_all") == ((0, 1, 2, 3), (4, 5, 6, 7))
    # a block of the DP axis (hybrid sharding inside blocks of 4 replicas): the other blocks
    blocks = DeviceMesh(pp=1, dp=8, cp=1, tp=2)
    assert sibling_groups(blocks, (0, 2, 4, 6), "all_reduce") == ((0, 2, 4, 6), (1, 3, 5, 7), (8, 10, 12, 14),
                                                                  (9, 11, 13, 15))
    with pytest.raises(ValueError, match="overlap"):
        sibling_groups(mesh, (0, 1, 2), "all_reduce")


def test_two_groups_sharing_a_leaf_uplink_each_get_half_of_it_in_both_modes():
    s = scn(ONE_GPU_NODES, {"tp": 2, "pp": 1, "dp": 20}, 20)
    topo = build_topology(s.cluster)
    assert topo.capacity_Bps[("leaf0", SPINE)] == topo.capacity_Bps[("nic0.0", "leaf0")]
    assert shared_binding_links(topo) == "leaf uplinks oversubscribed 20:1"
    mesh = DeviceMesh(pp=1, dp=20, cp=1, tp=2)
    groups = sibling_groups(mesh, mesh.group("dp", 0), "all_reduce")
    assert groups == (tuple(range(0, 40, 2)), tuple(range(1, 40, 2)))
    plans = [plan_collective(Collective("all_reduce", 2**26, g, "dp"), topo, "ring") for g in groups]
    latency = sum(st.latency_s * st.repeat for st in plans[0].steps)
    alone = simulate_plan(plans[0], topo.capacity_Bps) - latency
    # fast mode: the representative's plan carries its sibling's flows
    fast = simulate_plan(merge_plans(plans), topo.capacity_Bps) - latency
    # full mode: each group runs its own plan on the shared network
    env = simpy.Environment()
    net = FlowNetwork(env, topo.capacity_Bps)
    ends = []

    def run(plan):
        yield from net.run(plan)
        ends.append(env.now - latency)

    for p in plans:
        env.process(run(p))
    env.run()
    # the ring hop that leaves leaf0 is the slowest: alone at the NIC rate, shared it gets half
    assert fast == pytest.approx(2 * alone, rel=1e-9)
    assert ends == pytest.approx([2 * alone, 2 * alone], rel=1e-9)
    # and end to end, through the whole pipeline
    assert simulate(s).metrics["iteration_time_s"] == pytest.approx(
        simulate(s, full=True).metrics["iteration_time_s"], rel=1e-9)


@pytest.mark.parametrize("oversubscription", [1, 4])
def test_fat_tree_dp_all_reduce_at_64_nodes_takes_the_same_time_in_fast_and_full_mode(oversubscription):
    s = scn({"preset": "dgx-h100", "num_nodes": 64, "topology": "fat-tree", "oversubscription": oversubscription},
            {"tp": 8, "pp": 1, "dp": 64}, 64)
    fast, full = simulate(s), simulate(s, full=True)

    def all_reduce_s(res):
        return max(e.end_s - e.start_s for e in res.trace.events if "grad_all_reduce" in e.name)

    assert len(fast.graph.ranks) == 1 and len(full.graph.ranks) == 512
    assert all_reduce_s(fast) == pytest.approx(all_reduce_s(full), rel=1e-9)
    assert fast.metrics["iteration_time_s"] == pytest.approx(full.metrics["iteration_time_s"], rel=1e-9)


# Multi-leaf clusters with TP/PP/DP/CP/EP mixes where the sibling groups' flows meet on shared links
# (oversubscribed leaf uplinks, NICs shared by two GPUs); each pair simulates in about a second.
AGREEMENT = {
    "fat-a100-8n-os4-tp2pp2dp16": ({"preset": "dgx-a100-80gb", "num_nodes": 8, "topology": "fat-tree",
                                    "oversubscription": 4}, {"tp": 2, "pp": 2, "dp": 16}, 32, SMALL_GPT),
    "fat-a100-16n-os2-tp2cp2pp2dp16": ({"preset": "dgx-a100-80gb", "num_nodes": 16, "topology": "fat-tree",
                                        "oversubscription": 2}, {"tp": 2, "cp": 2, "pp": 2, "dp": 16}, 16,
                                       SMALL_GPT),
    "rail-a100-24n-os3-nic4-tp1pp2dp96": ({"preset": "dgx-a100-80gb", "num_nodes": 24, "nics_per_node": 4,
                                           "oversubscription": 3}, {"tp": 1, "pp": 2, "dp": 96}, 96, SMALL_GPT),
    "fat-a100-8n-os4-tp2pp2dp16-zero3-sp": ({"preset": "dgx-a100-80gb", "num_nodes": 8, "topology": "fat-tree",
                                             "oversubscription": 4},
                                            {"tp": 2, "pp": 2, "dp": 16, "zero_stage": 3, "sequence_parallel": True},
                                            32, SMALL_GPT),
    "fat-a100-8n-os4-interleaved-zero1": ({"preset": "dgx-a100-80gb", "num_nodes": 8, "topology": "fat-tree",
                                           "oversubscription": 4},
                                          {"tp": 2, "pp": 2, "dp": 16, "schedule": "interleaved-1f1b",
                                           "virtual_stages": 2, "zero_stage": 1}, 32,
                                          dict(SMALL_GPT, num_layers=4)),
    "rail-h100-16n-os3-moe-tp2ep4pp2dp32": ({"preset": "dgx-h100", "num_nodes": 16, "oversubscription": 3},
                                            {"tp": 2, "ep": 4, "pp": 2, "dp": 32}, 32,
                                            dict(SMALL_GPT, num_experts=8, moe_top_k=2)),
}


@pytest.mark.parametrize("case", sorted(AGREEMENT))
def test_fast_mode_agrees_with_full_on_multi_leaf_clusters(case):
    cluster, par, batch, model = AGREEMENT[case]
    s = scn(cluster, par, batch, model)
    assert shared_binding_links(build_topology(s.cluster))  # the sibling flows matter here
    fast, full = simulate(s), simulate(s, full=True)
    assert fast.metrics["iteration_time_s"] == pytest.approx(full.metrics["iteration_time_s"], rel=0.02)


def test_a_collective_without_symmetric_copies_falls_back_to_full():
    topo = build_topology(scn(ONE_GPU_NODES, {"tp": 2, "pp": 1, "dp": 20}, 20).cluster)
    mesh = DeviceMesh(pp=1, dp=20, cp=1, tp=2)
    b = TaskGraphBuilder()
    # ranks 0, 1 under leaf0 and 25 under leaf1: its copy shifted by one TP rank, (1, 0, 24), overlaps it
    b.add("odd", "comm", 0, "comm_dp", "comm_dp", (), comm=Collective("all_reduce", 1e6, (0, 1, 25), "dp"))
    graph = b.build((0,), False, {})

    class Net:
        def duration_s(self, task):
            return None

        def comm_plan(self, task):
            return plan_collective(task.comm, topo)

    cost, why = fast_mode_cost(Net(), mesh, graph, topo)
    assert cost is None and "overlap" in why


@pytest.mark.parametrize("alg", ["ring", "torch-allgather", "a2a", "all-gather"])
@pytest.mark.parametrize("nodes, tp, cp", [(2, 4, 4), (4, 4, 8)])
def test_fast_mode_agrees_with_full_when_a_cp_group_spans_nodes(alg, nodes, tp, cp):
    """A CP ring across nodes has hops of two kinds (NVLink inside a node, the NICs between nodes): each
    rank's next step waits for the block it receives, so the representative, whose incoming hop is the
    ring's wrap-around, is one of the ranks the slowest hop holds back, as in the full simulation."""
    model = dict(SMALL_GPT, seq_length=8192, num_attention_heads=32)  # a2a: 32 / tp / cp heads each
    dp = nodes * 8 // (tp * cp)
    s = scn({"preset": "dgx-h100", "num_nodes": nodes},
            {"tp": tp, "cp": cp, "dp": dp, "sequence_parallel": True, "cp_algorithm": alg}, dp, model)
    fast, full = simulate(s), simulate(s, full=True)
    assert fast.metrics["iteration_time_s"] == pytest.approx(full.metrics["iteration_time_s"], rel=1e-9)


def _fast_cost(s):
    from simulator.cost.model import CostModel
    from simulator.strategy.lower import lower
    plan, topo = lower(s, False), build_topology(s.cluster)
    return fast_mode_cost(CostModel(s, topo, None), plan.mesh, plan.graph, topo)


def test_unequal_sibling_copies_of_a_stage_s_transfers_fall_back_to_full(capsys):
    """Under oversubscribed trunks the CP pairs of one DP replica sit under one leaf and the other's
    cross a trunk: the representative would take the slowest copy of every transfer, stage after stage
    (+3% here), where each replica goes at its own pace. Detected (``copy_crossings``) and run in full."""
    s = scn({"preset": "dgx-a100-80gb", "num_nodes": 16, "topology": "fat-tree", "oversubscription": 4},
            {"tp": 8, "cp": 2, "pp": 2, "dp": 4, "sequence_parallel": True}, 32,
            dict(SMALL_GPT, num_layers=8, seq_length=8192, mlp="swiglu"))
    cost, why = _fast_cost(s)
    assert cost is None and "cross the oversubscribed leaf uplinks unequally" in why
    fast = simulate(s).metrics["iteration_time_s"]
    assert "notice: simulating every rank (--full)" in capsys.readouterr().err
    assert fast == simulate(s, full=True).metrics["iteration_time_s"]


def test_pipeline_hand_offs_with_unequal_copies_keep_the_fast_mode():
    cluster, par, batch, model = AGREEMENT["fat-a100-8n-os4-tp2pp2dp16"]
    cost, why = _fast_cost(scn(cluster, par, batch, model))
    assert cost is not None and why == "" and not cost.unequal
