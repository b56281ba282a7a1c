"""Topology: link capacities from datasheets x link efficiency, and closed-form routes."""

from dataclasses import replace

import pytest

from simulator.hardware.clusters import CLUSTER_PRESETS
from simulator.hardware.topology import (IB_EFFICIENCY, LINK_LATENCY_S, NVLINK_EFFICIENCY, PCIE_EFFICIENCY, SPINE,
                                         build_topology)

A100 = CLUSTER_PRESETS["dgx-a100-80gb"]
H100 = CLUSTER_PRESETS["dgx-h100"]


def test_intra_node_route_is_nvswitch_only():
    topo = build_topology(A100.with_nodes(2))
    assert topo.route(0, 5) == (("gpu0", "nvs0"), ("nvs0", "gpu5"))
    assert topo.route(13, 9) == (("gpu13", "nvs1"), ("nvs1", "gpu9"))
    assert {topo.link_kind(link) for link in topo.route(0, 5)} == {"nvlink"}
    assert topo.route(3, 3) == ()


def test_inter_node_same_rail_stays_on_its_leaf():
    topo = build_topology(A100.with_nodes(2))
    assert topo.route(2, 10) == (("gpu2", "pcie2"), ("pcie2", "nic0.2"), ("nic0.2", "leaf2.0"),
                                 ("leaf2.0", "nic1.2"), ("nic1.2", "pcie10"), ("pcie10", "gpu10"))


def test_rail_optimized_across_scalable_units_goes_through_one_spine_on_the_same_rail():
    # HDR leaves have 40 ports, 20 down: node 20 hangs from the second leaf of each rail.
    topo = build_topology(A100.with_nodes(40))
    route = topo.route(3, 20 * 8 + 3)
    names = [u for u, _ in route] + [route[-1][1]]
    assert names[:4] == ["gpu3", "pcie3", "nic0.3", "leaf3.0"]
    assert names[4].startswith("spine")
    assert names[5:] == ["leaf3.1", "nic20.3", "pcie163", "gpu163"]


def test_cross_rail_traffic_crosses_the_spine():
    topo = build_topology(A100.with_nodes(2))
    kinds = [topo.link_kind(link) for link in topo.route(0, 9)]
    assert kinds == ["pcie", "pcie", "nic", "leaf-spine", "leaf-spine", "nic", "pcie", "pcie"]
    assert topo.route(0, 9)[3][0] == "leaf0.0" and topo.route(0, 9)[4][1] == "leaf1.0"


def test_fat_tree_puts_a_nodes_nics_on_one_leaf():
    topo = build_topology(replace(A100.with_nodes(2), topology="fat-tree"))
    route = topo.route(0, 9)
    assert ("nic0.0", "leaf0") in route and ("leaf0", "nic1.1") in route
    assert not any(topo.link_kind(link) == "leaf-spine" for link in route)


def test_routes_are_cached_and_deterministic():
    a = build_topology(A100.with_nodes(64))
    b = build_topology(A100.with_nodes(64))
    assert a.route(5, 300) is a.route(5, 300)
    assert a.route(5, 300) == b.route(5, 300)


def test_adaptive_routing_trunks_a_leafs_uplinks():
    # every flow leaving leaf0.0 shares its one trunk to the spine layer: planes x the port rate
    a = build_topology(A100.with_nodes(64))
    ups = {a.route(0, d)[3] for d in range(21 * 8, 64 * 8, 8)}
    assert ups == {("leaf0.0", SPINE)}
    assert a.capacity_Bps[("leaf0.0", SPINE)] == pytest.approx(20 * 25e9 * IB_EFFICIENCY)
    assert a.capacity_Bps[(SPINE, "leaf0.2")] == a.capacity_Bps[("leaf0.0", SPINE)]


def test_capacities_are_line_rate_times_link_efficiency():
    topo = build_topology(A100.with_nodes(2))
    nvlink = topo.capacity_Bps[("gpu0", "nvs0")]
    assert nvlink == pytest.approx(300e9 * NVLINK_EFFICIENCY["ampere"])
    assert topo.capacity_Bps[("gpu0", "nvs0")] == pytest.approx(240e9)  # NCCL: 12 x 20 GB/s
    assert topo.capacity_Bps[("nic0.0", "leaf0.0")] == pytest.approx(25e9 * IB_EFFICIENCY)
    assert topo.capacity_Bps[("gpu0", "pcie0")] == pytest.approx(32e9 * PCIE_EFFICIENCY)
    h = build_topology(H100.with_nodes(1))
    assert h.capacity_Bps[("nvs0", "gpu7")] == pytest.approx(18 * 20.6e9)  # NCCL SM90: 20.6/link
    for link, cap in topo.capacity_Bps.items():
        assert topo.graph.edges[link]["capacity_Bps"] == cap
        assert topo.latency_s[link] > 0


def test_oversubscription_removes_leaf_uplinks():
    full = build_topology(A100.with_nodes(4))
    half = build_topology(replace(A100.with_nodes(4), oversubscription=2.0))
    assert full.spine_planes == 20 and half.spine_planes == 10
    assert half.capacity_Bps[("leaf0.0", SPINE)] == pytest.approx(full.capacity_Bps[("leaf0.0", SPINE)] / 2)
    assert build_topology(H100.with_nodes(2)).leaf_down_ports == 32  # NDR: 64-port leaves


def test_fewer_nics_than_gpus_share_them():
    topo = build_topology(replace(A100.with_nodes(2), nics_per_node=4))
    assert [topo.rail_of(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert topo.route(5, 13)[1] == ("pcie5", "nic0.2")


def test_host_route_goes_over_pcie():
    topo = build_topology(H100.with_nodes(2))
    assert topo.host_route(9) == (("gpu9", "pcie9"), ("pcie9", "host1"))
    assert topo.host_route(9, to_host=False) == (("host1", "pcie9"), ("pcie9", "gpu9"))
    assert all(topo.link_kind(link) == "pcie" for link in topo.host_route(9))


def test_single_node_has_no_fabric_and_large_clusters_build():
    assert not any(u.startswith("leaf") for u, _ in build_topology(A100).capacity_Bps)
    topo = build_topology(H100.with_nodes(256))
    # per GPU: NVLink, GPU-PCIe, PCIe-host, PCIe-NIC (both ways); per NIC 2; per leaf one trunk, 2 ways
    leaves = 8 * 256 // 32
    assert len(topo.capacity_Bps) == 2048 * 8 + 2048 * 2 + leaves * 2
    assert topo.graph.number_of_edges() == len(topo.capacity_Bps)


def test_bad_input_is_rejected():
    topo = build_topology(A100.with_nodes(1))
    with pytest.raises(ValueError, match="rank 8"):
        topo.route(0, 8)
    with pytest.raises(ValueError, match="oversubscription"):
        build_topology(replace(A100, oversubscription=0.5))
    with pytest.raises(ValueError, match="nics_per_node"):
        build_topology(replace(A100, nics_per_node=16))
    with pytest.raises(ValueError, match="topology"):
        build_topology(replace(A100, topology="torus"))


def test_p2p_routes_cross_rails_through_the_receivers_rail_gpu_pxn():
    # NCCL's P2P path (search.cc ncclTopoGetNetDev, P2P_PXN_LEVEL 2): GPU 1 of node 0 sends to GPU 3
    # of node 1 through NVLink to GPU 3 of node 0, whose NIC is on the receiver's rail
    topo = build_topology(replace(CLUSTER_PRESETS["dgx-h100"], num_nodes=2))
    assert topo.p2p_route(1, 11) == (("gpu1", "nvs0"), ("nvs0", "gpu3")) + topo.route(3, 11)
    assert SPINE not in {v for _, v in topo.p2p_route(1, 11)}
    assert SPINE in {v for _, v in topo.route(1, 11)}  # the plain route leaves on its own rail
    assert topo.p2p_route(3, 11) == topo.route(3, 11)  # same rail
    assert topo.p2p_route(1, 3) == topo.route(1, 3)  # same node


def test_an_all_to_all_across_rails_stays_off_an_oversubscribed_spine():
    from simulator.cost.collectives import collective_time_s
    from simulator.tasks import Collective
    # 32 nodes fill a leaf's 32 node ports per rail: at 4:1 its spine uplinks carry a quarter of them;
    # without PXN the cross-rail three quarters of the traffic would cross them (3.5x slower)
    a2a = Collective("all_to_all", 2 ** 28, tuple(range(256)), "ep")
    times = [collective_time_s(a2a, build_topology(replace(H100, num_nodes=32, oversubscription=o)))
             for o in (1.0, 4.0)]
    assert times[1] == pytest.approx(times[0], rel=1e-9)


def test_p2p_routes_of_a_group_are_its_pairs_p2p_routes():
    # PXN across rails (relayed over NVLink to the GPU on the peer's rail), route() on one node or rail
    topo = build_topology(H100.with_nodes(4))
    group = (0, 3, 9, 11, 17, 30)
    routes = topo.p2p_routes(group)
    assert routes == [topo.p2p_route(a, b) for a in group for b in group if a != b]
    assert topo.p2p_route(3, 9)[:2] == (("gpu3", "nvs0"), ("nvs0", "gpu1")) and topo.p2p_route(3, 9)[2:] == topo.route(1, 9)
    assert topo.p2p_route(3, 11) is topo.route(3, 11)
    with pytest.raises(ValueError):
        topo.p2p_routes((0, 32))
    with pytest.raises(ValueError):
        topo.route(-1, 3)


def _eager_links(c) -> dict:
    """The links and capacities as the topology built them before its tables were filled lazily: per
    GPU both directions of its NVSwitch, PCIe switch, host and NIC links; per node and rail its NIC's
    leaf link; per leaf (sorted) its spine trunk (a reference written out here, not the code's)."""
    topo = build_topology(c)
    nvl = c.nvlink_bandwidth_Bps * NVLINK_EFFICIENCY[c.gpu.architecture]
    pcie = c.pcie_bandwidth_Bps * PCIE_EFFICIENCY
    nic = c.nic_bandwidth_Bps * IB_EFFICIENCY
    out: dict = {}

    def add(u, v, b):
        out[(u, v)] = out[(v, u)] = b
    g, n = c.gpus_per_node, c.nics_per_node
    for r in range(c.num_gpus):
        node, nic_name = r // g, f"nic{r // g}.{r % g * n // g}"
        add(f"gpu{r}", f"nvs{node}", nvl)
        add(f"gpu{r}", f"pcie{r}", pcie)
        add(f"pcie{r}", f"host{node}", pcie)
        add(f"pcie{r}", nic_name, pcie)
    if c.num_nodes > 1:
        leaves = []
        for node in range(c.num_nodes):
            for rail in range(n):
                leaf = (f"leaf{rail}.{node // topo.leaf_down_ports}" if c.topology == "rail-optimized"
                        else f"leaf{(node * n + rail) // topo.leaf_down_ports}")
                leaves.append(leaf)
                add(f"nic{node}.{rail}", leaf, nic)
        if len(set(leaves)) > 1:
            for leaf in sorted(set(leaves)):
                add(leaf, SPINE, nic * topo.spine_planes)
    return out


@pytest.mark.parametrize("nodes, nics, kind", [(1, 8, "fat-tree"), (2, 8, "rail-optimized"), (3, 4, "fat-tree"),
                                               (21, 8, "rail-optimized"), (21, 2, "fat-tree"), (45, 1, "fat-tree"),
                                               (45, 8, "fat-tree")])
def test_link_tables_fill_in_on_use_what_the_eager_build_held(nodes, nics, kind):
    c = replace(A100, num_nodes=nodes, nics_per_node=nics, topology=kind)
    eager = _eager_links(c)
    names = sorted({x for link in eager for x in link}) + ["gpu01", "nic0.9", "leaf999", "spine0", "gpu-1"]
    topo = build_topology(c)
    assert dict.__len__(topo.capacity_Bps) == 0  # nothing made before it is used
    topo.p2p_routes(tuple(range(0, c.num_gpus, 3)))  # routes enter their GPUs' links, by kind
    assert 0 < dict.__len__(topo.capacity_Bps) and all(eager[k] == v for k, v in dict.items(topo.capacity_Bps))
    assert all(v == LINK_LATENCY_S[topo.link_kind(k)] for k, v in dict.items(topo.latency_s))
    for u in names[::7]:
        for v in names:  # a pair is a link exactly when the eager build had it, with its capacity
            assert ((u, v) in topo.capacity_Bps) == ((u, v) in eager), (u, v)
            assert topo.capacity_Bps.get((u, v)) == eager.get((u, v))
    with pytest.raises(KeyError):
        topo.capacity_Bps[("gpu0", f"nvs{nodes}")]
    # iterating fills in every link, in the eager build's order; then the tables are the same dicts
    assert list(topo.capacity_Bps.items()) == list(eager.items())
    assert topo.capacity_Bps == eager and not topo.capacity_Bps != eager and len(topo.latency_s) == len(eager)
    assert list(reversed(build_topology(c).capacity_Bps)) == list(reversed(eager))
    assert topo.graph.number_of_edges() == len(eager)


def test_a_large_clusters_tables_hold_only_the_links_of_the_gpus_a_route_used():
    import pickle
    topo = build_topology(H100.with_nodes(2048))
    route = topo.route(0, 16383)
    assert len(route) == 8 and all(topo.capacity_Bps[link] > 0 for link in route)
    # each end GPU's ten links, entered with their known kinds: NVSwitch, PCIe switch to NIC, NIC to
    # leaf and the leaf's trunk, both ways
    assert dict.__len__(topo.capacity_Bps) == dict.__len__(topo.latency_s) == 20
    copy = pickle.loads(pickle.dumps(topo.capacity_Bps))  # a plain dict of every link
    assert type(copy) is dict and len(copy) == 16384 * 8 + 2048 * 8 * 2 + 2 * len(topo.layout.leaves())
