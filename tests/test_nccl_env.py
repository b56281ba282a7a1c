"""The NCCL environment of a fabric (cost/nccl_env): NCCL's defaults on InfiniBand and RoCE, the
settings Google prescribes for GPUDirect-TCPX / TCPXO, and what each changes in the collectives."""

from dataclasses import replace

import pytest

from simulator.cost import nccl_tuner as tuner
from simulator.cost.collectives import collective_time_s, plan_collective
from simulator.cost.nccl_env import DEFAULT, TCPX, TCPXO, env_for
from simulator.engine.network import simulate_plan
from simulator.hardware.clusters import CLUSTER_PRESETS
from simulator.hardware.topology import build_topology
from simulator.tasks import Collective

H100 = CLUSTER_PRESETS["dgx-h100"]
A3_HIGH = replace(H100, nics_per_node=4, nic_bandwidth_Bps=25e9, fabric="tcpx", nvls=False)
MiB = 2 ** 20
US = 1e-6


def _coll(op, size, group):
    return Collective(op, float(size), tuple(group), "dp")


def test_infiniband_and_roce_run_nccls_defaults():
    dgx = CLUSTER_PRESETS["dgx-h100"]
    assert env_for(dgx) is DEFAULT and env_for(replace(dgx, fabric="roce")) is DEFAULT
    assert env_for(replace(dgx, fabric="tcpx")) is TCPX and env_for(replace(dgx, fabric="tcpxo")) is TCPXO
    assert DEFAULT.allows("tree", "ll") and DEFAULT.pxn and not DEFAULT.unpack
    assert (DEFAULT.p2p_net_chunk_bytes, DEFAULT.p2p_nvl_chunk_bytes) == (128 * 1024, 512 * 1024)
    # twice the searched rings, no bounds: 8 rails of a DGX H100 give 16 channels
    assert DEFAULT.collective_channels(8, 2) == 16
    assert DEFAULT.p2p_channels(32) == 32


def test_vendor_algorithms_and_protocols():
    """TCPX: NCCL_ALGO=Ring, NCCL_PROTO=Simple; TCPXO's simple profile: Ring,Tree and Simple.
    P2P-based all-to-all and send/recv stay free."""
    assert TCPX.allows("ring", "simple") and not TCPX.allows("tree", "simple")
    assert not TCPX.allows("ring", "ll128") and TCPX.allows("p2p", "ll")
    assert TCPXO.allows("tree", "simple") and not TCPXO.allows("nvls_tree", "simple")
    assert TCPXO.allows("direct", "ll") and not TCPXO.allows("ring", "ll")


def test_channel_bounds_and_the_unpack_doubling():
    """connect.cc: x2 the searched rings; x2 again across nodes on an unpack network below 16;
    then NCCL_MAX_NCHANNELS (TCPX: 8) and NCCL_MIN_NCHANNELS (TCPXO: 4)."""
    assert replace(TCPX, max_channels=0, min_channels=0).collective_channels(4, 2) == 16
    assert replace(TCPX, max_channels=0, min_channels=0).collective_channels(4, 1) == 8
    assert replace(TCPX, max_channels=0, min_channels=0).collective_channels(8, 2) == 16
    assert TCPX.collective_channels(4, 2) == 8
    assert TCPXO.collective_channels(1, 2) == 4 and TCPXO.collective_channels(8, 2) == 16
    # p2pnChannels = pow2Up(min(nChannels, NCCL_MAX_P2P_NCHANNELS))
    assert TCPX.p2p_channels(32) == 8 and replace(TCPX, max_channels=12).p2p_channels(32) == 16


def test_max_nchannels_caps_p2p_channels_inside_a_node():
    """With NCCL_MAX_NCHANNELS=8 a node has 8 P2P channels, 8 per peer: a 1 GiB send doubles from 1
    channel (1 x 8 ranks <= 8) while its part exceeds 32 x 1 MiB (NCCL_P2P_NVL_CHUNKSIZE) and stops at
    8, where NCCL's defaults reach 32; at 14 GB/s a channel that is 112 GB/s over NVLink."""
    assert tuner.p2p_channels_per_peer(1, 8, 0.0, TCPX) == 8
    assert tuner.p2p_send_channels(1024 * MiB, 8, 1, 0.0, TCPX) == 8
    assert tuner.p2p_send_channels(1024 * MiB, 8, 1) == 32
    # the vendor's 1 MiB NVLink chunk: parts of 128 KiB at least (vs 64 KiB by default)
    assert tuner.p2p_send_channels(256 * 1024, 8, 1, 0.0, replace(TCPX, max_channels=0, min_channels=0)) == 2
    assert tuner.p2p_send_channels(256 * 1024, 8, 1) == 4
    topo = build_topology(A3_HIGH)
    coll = _coll("send_recv", 1024 * MiB, range(8))
    lat = (tuner.BASE_LAT_US["ring"][2] + tuner.HW_LAT_US["nvlink"]["ring"][2]) * US
    assert collective_time_s(coll, topo) == pytest.approx(lat + 1024 * MiB / (8 * 14e9), rel=1e-9)
    assert simulate_plan(plan_collective(coll, topo), topo.capacity_Bps) == pytest.approx(
        collective_time_s(coll, topo), rel=1e-9)


def test_p2p_across_nodes_uses_the_vendors_net_chunk():
    """Across nodes a send starts on ceil(bytes / half a NCCL_P2P_NET_CHUNKSIZE) channels: 512 KiB
    chunks on GCP make a 1 MiB send 4 parts of 256 KiB, where NCCL's 128 KiB chunk makes it 8 (of the
    8 a 100 GB/s NIC earns per peer)."""
    wide = replace(TCPX, max_channels=0, min_channels=0)
    assert tuner.p2p_send_channels(1 * MiB, 2, 2, 100.0, wide) == 4
    assert tuner.p2p_send_channels(1 * MiB, 2, 2, 100.0) == 8


def test_no_pxn_on_tcpx_sends_across_rails_from_the_senders_own_nic():
    """NCCL_P2P_PXN_LEVEL=0: GPU 0 (rail 0) sends to GPU 2 of the other node (rail 1) through its own
    NIC; with PXN (InfiniBand's default) it relays over NVLink to local GPU 2 and leaves on rail 1."""
    tcpx = build_topology(A3_HIGH.with_nodes(2))
    ib = build_topology(replace(A3_HIGH, fabric="infiniband").with_nodes(2))
    coll = _coll("send_recv", 64 * MiB, (0, 10))
    (flow,) = plan_collective(coll, tcpx).steps[-1].flows
    assert flow.links[0] == ("gpu0", "pcie0") and ("nic0.0", tcpx.leaf_name(0, 0)) in flow.links
    (flow,) = plan_collective(coll, ib).steps[-1].flows
    assert flow.links[0] == ("gpu0", "nvs0") and ("nic0.1", ib.leaf_name(0, 1)) in flow.links
    a2a = plan_collective(_coll("all_to_all", 64 * MiB, (0, 10)), tcpx).steps[-1].flows
    assert all(f.links[0][1].startswith("pcie") for f in a2a)


def test_tcpx_all_reduce_rings_run_on_eight_channels():
    """On 2 A3 High nodes: 4 rails, x2, x2 for unpack, clamped to NCCL_MAX_NCHANNELS = 8; the ring
    plateau (x1.4) holds from 64 B per channel and rank (8 x 16 x 64 B)."""
    topo = build_topology(A3_HIGH.with_nodes(2))
    plan = plan_collective(_coll("all_reduce", 8 * 16 * 64, range(16)), topo)
    below = plan_collective(_coll("all_reduce", 8 * 16 * 64 - 1, range(16)), topo)
    assert plan.algorithm == below.algorithm == "ring/simple"
    assert plan.steps[0].latency_s == pytest.approx(1.4 * below.steps[0].latency_s, rel=1e-12)
