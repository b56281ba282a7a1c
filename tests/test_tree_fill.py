"""Tree/Simple's pipeline fill (cost/nccl_fill): a chunk of NCCL_BUFFSIZE / 8 crosses every hop of the
tree in turn before the bandwidth term's steady state; closed forms on GCP A3 Mega (TCPXO: Ring/Tree,
Simple only, NCCL_BUFFSIZE 8 MiB) and on DGX H100 clusters."""

from pathlib import Path

import pytest

from simulator.cost import collectives, nccl_fill
from simulator.cost.collectives import collective_time_s, plan_collective
from simulator.cost.nccl_env import DEFAULT, TCPXO
from simulator.engine.network import simulate_plan
from simulator.hardware.hwfile import read_cluster_file
from simulator.hardware.topology import FABRIC_EFFICIENCY, NVLINK_EFFICIENCY, build_topology
from simulator.tasks import Collective

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[1]
A3_MEGA = read_cluster_file(ROOT / "scenarios" / "clusters" / "gcp-a3-mega.toml")


def _coll(size: int, ranks) -> Collective:
    return Collective("all_reduce", float(size), tuple(ranks), "dp")


def test_chunk_is_an_eighth_of_the_buffer_or_a_channels_share():
    assert DEFAULT.buffsize_bytes == 4 * MiB and TCPXO.buffsize_bytes == 8 * MiB
    assert nccl_fill.tree_simple_chunk_bytes(128 * MiB, 16, 8 * MiB) == 1 * MiB
    assert nccl_fill.tree_simple_chunk_bytes(128 * MiB, 16, 4 * MiB) == MiB / 2
    assert nccl_fill.tree_simple_chunk_bytes(4 * MiB, 16, 8 * MiB) == MiB / 4  # the share is less


def test_fill_is_every_hop_but_the_slowest_one_chunk_at_a_time():
    """2 x 8 GPUs, 16 channels: 7 NVLink hops up and 7 down, 1 network hop up and 1 down, less the
    slowest (a network hop, which the bandwidth term counts)."""
    nvl, net, c = 370e9, 190e9, 1 * MiB
    fill = nccl_fill.tree_simple_fill_s(128 * MiB, 8, 2, 16, 8 * MiB, nvl, net)
    assert fill == pytest.approx(14 * c * 16 / nvl + 2 * c * 16 / net - c * 16 / net, rel=1e-12)
    # four nodes: two network hops each way; one GPU per node: no NVLink hop
    assert nccl_fill.tree_simple_fill_s(128 * MiB, 1, 4, 2, 4 * MiB, nvl, net) == pytest.approx(
        3 * (MiB / 2) * 2 / net, rel=1e-12)
    assert nccl_fill.tree_simple_fill_s(128 * MiB, 8, 1, 16, 8 * MiB, nvl, net) == 0.0


def test_a3_mega_tree_simple_all_reduce_carries_the_fill_at_its_links_rates():
    """The time NCCL's tuner model gives plus the fill at the A3 Mega links' rates (a GPU's NVLink,
    the node's 8 NICs) over NCCL's 16 channels, in the closed form and through the flow network."""
    topo = build_topology(A3_MEGA.with_nodes(2))
    coll = _coll(128 * MiB, range(16))
    plan = plan_collective(coll, topo)
    assert plan.algorithm == "tree/simple"
    alone = collectives._estimate(topo, "all_reduce", 128.0 * MiB, tuple(range(16)), "tree", "simple")
    nvl = 450e9 * NVLINK_EFFICIENCY["hopper"]
    net = 8 * 200e9 / 8 * FABRIC_EFFICIENCY["tcpxo"]
    c = 1 * MiB
    fill = 14 * c * 16 / nvl + c * 16 / net
    assert fill == pytest.approx(721e-6, abs=1e-6)  # the README's figure
    t = collective_time_s(coll, topo)
    assert t == pytest.approx(alone + fill, rel=1e-9)
    assert simulate_plan(plan, topo.capacity_Bps) == pytest.approx(t, rel=1e-9)


def test_the_fill_neither_changes_nccls_choice_nor_touches_other_protocols():
    """NCCL picks by its own model, without any fill: on A3 Mega (Ring and Tree, Simple) the pick is
    the fill-less argmin; LL128 trees and rings forward line by line or by ring steps and carry none."""
    topo = build_topology(A3_MEGA.with_nodes(4))
    group = tuple(range(32))
    for size in (64.0 * 1024, 1.0 * MiB, 64.0 * MiB, 1024.0 * MiB):
        alg, proto, _ = collectives._pick(topo, "all_reduce", size, group, None)
        times = {(a, p): collectives._estimate(topo, "all_reduce", size, group, a, p)
                 for a, p in collectives._candidates("all_reduce", size, group, topo, None)}
        assert (alg, proto) == min(times, key=times.__getitem__)
    shape = _shape(topo, group)
    assert collectives._pipeline_fill_s(topo, "tree", "simple", 64.0 * MiB, shape, 1e-9) > 0.0
    assert collectives._pipeline_fill_s(topo, "tree", "ll128", 64.0 * MiB, shape, 1e-9) == 0.0
    assert collectives._pipeline_fill_s(topo, "ring", "simple", 64.0 * MiB, shape, 1e-9) == 0.0


def _shape(topo, group):
    from simulator.cost.algorithms import group_shape
    return group_shape(group, topo)


def test_a_group_uneven_over_its_nodes_fills_along_its_longest_chain():
    """One rank on the first node, four on the second: the chain that fills is the second node's (3
    NVLink hops each way), the network hop is the one between the nodes' heads."""
    topo = build_topology(A3_MEGA.with_nodes(2))
    group = (0, 8, 9, 10, 11)
    shape = _shape(topo, group)
    assert not shape.uniform and shape.ppn == 4
    fill = collectives._pipeline_fill_s(topo, "tree", "simple", 64.0 * MiB, shape, 1e-9)
    channels = TCPXO.collective_channels(1, 2)
    c = nccl_fill.tree_simple_chunk_bytes(64.0 * MiB, channels, 8 * MiB)
    nvl = 450e9 * NVLINK_EFFICIENCY["hopper"]
    net = 200e9 / 8 * FABRIC_EFFICIENCY["tcpxo"]
    assert fill == pytest.approx(6 * c * channels / nvl + 2 * c * channels / net - c * channels / net, rel=1e-9)
    assert collective_time_s(_coll(64 * MiB, group), topo) > 0
