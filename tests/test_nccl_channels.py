"""NCCL's size-dependent channel and chunk rules: P2P channels per send (enqueue.cc addP2pToPlan)
and the NVLSTree chunk cuts and pipeline fill (enqueue.cc calcCollChunking), as exact values."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.cost import nccl_fill, nccl_tuner as tuner
from simulator.cost.collectives import collective_time_s, plan_collective
from simulator.engine.network import simulate_plan
from simulator.hardware.clusters import CLUSTER_PRESETS
from simulator.hardware.topology import build_topology
from simulator.tasks import Collective

A100 = CLUSTER_PRESETS["dgx-a100-80gb"]
H100 = CLUSTER_PRESETS["dgx-h100"]
MiB = 2 ** 20
US = 1e-6


def _coll(op, size, group):
    return Collective(op, float(size), tuple(group), "dp")


def test_p2p_send_channels_follow_add_p2p_to_plan_inside_a_node():
    """8 ranks on NVSwitch: 32 channels per peer halved to nChannelsMin = 4 (4 x 8 <= 32); a send
    doubles its channels while its part exceeds 32 x 512 KB = 16 MB, up to 32."""
    assert [tuner.p2p_send_channels(s, 8, 1) for s in (128 * MiB, 256 * MiB, 512 * MiB, 1024 * MiB)] \
        == [8, 16, 32, 32]
    # small sends: min(nChannelsMin, ceil(bytes / 64 KB))
    assert tuner.p2p_send_channels(64 * 1024, 8, 1) == 1
    assert tuner.p2p_send_channels(128 * 1024 + 1, 8, 1) == 3
    assert tuner.p2p_send_channels(1 * MiB, 8, 1) == 4
    # a 2-rank communicator starts from 16 channels (16 x 2 <= 32)
    assert tuner.p2p_send_channels(8 * MiB, 2, 1) == 16


def test_p2p_channels_across_nodes_come_from_the_nic_rate():
    """A network peer gets max(1, ceil(NIC GB/s / 14)) channels, pow2Up: 4 for 400 Gb/s (50 GB/s),
    2 for 200 Gb/s; 128 KB chunks, parts of at most one chunk."""
    assert tuner.p2p_channels_per_peer(2, 16, 50.0) == 4
    assert tuner.p2p_channels_per_peer(2, 16, 25.0) == 2
    # halved while per-peer x ceil(nRanks / 8) exceeds the 32 P2P channels
    assert tuner.p2p_channels_per_peer(2, 128, 50.0) == 2
    assert tuner.p2p_send_channels(256 * MiB, 16, 2, 50.0) == 4
    assert tuner.p2p_max_Bps(256 * MiB, 16, 2, 50.0) == 4 * 14e9


@given(st.integers(min_value=1, max_value=2 ** 33), st.sampled_from([2, 4, 8, 16, 64]),
       st.sampled_from([1, 2, 4]))
def test_p2p_channels_are_powers_of_two_at_most_the_per_peer_count(size, n_ranks, nodes):
    c = tuner.p2p_send_channels(size, n_ranks, nodes, 50.0)
    assert 1 <= c <= tuner.p2p_channels_per_peer(nodes, n_ranks, 50.0)
    assert tuner.p2p_send_channels(2 * size, n_ranks, nodes, 50.0) >= c


def test_send_recv_on_dgx_a100_runs_on_its_channels():
    """nccl-tests sendrecv over 8 A100: a 128 MB send runs on 8 channels of 14 GB/s = 112 GB/s, below
    NVLink; from 512 MB on (32 channels) NVLink binds again. Latency: ring Simple base + one NVLink
    step."""
    topo = build_topology(A100)
    lat = (tuner.BASE_LAT_US["ring"][2] + tuner.HW_LAT_US["nvlink"]["ring"][2]) * US
    coll = _coll("send_recv", 128 * MiB, range(8))
    t = collective_time_s(coll, topo)
    assert t == pytest.approx(lat + 128 * MiB / (8 * 14e9), rel=1e-9)
    assert simulate_plan(plan_collective(coll, topo), topo.capacity_Bps) == pytest.approx(t, rel=1e-9)
    nvlink = topo.capacity_Bps[("gpu0", "nvs0")]
    big = _coll("send_recv", 1024 * MiB, range(8))
    assert collective_time_s(big, topo) == pytest.approx(lat + 1024 * MiB / nvlink, rel=1e-9)


def test_nvls_tree_chunk_is_cut_at_medium_sizes():
    """concurrentOps = 16 channels x 8 heads = 128: 128 KB from 64 MB, 64 KB below, 32 KB below 8 MB."""
    ops = 16 * 8
    assert nccl_fill.nvls_tree_chunk_bytes(512 * MiB, ops, 2) == 128 * 1024
    assert nccl_fill.nvls_tree_chunk_bytes(64 * MiB, ops, 2) == 128 * 1024
    assert nccl_fill.nvls_tree_chunk_bytes(64 * MiB - 1, ops, 2) == 64 * 1024
    assert nccl_fill.nvls_tree_chunk_bytes(8 * MiB, ops, 2) == 64 * 1024
    assert nccl_fill.nvls_tree_chunk_bytes(8 * MiB - 1, ops, 2) == 32 * 1024
    # from 4 nodes on NCCL_NVLSTREE_MAX_CHUNKSIZE is 64 KB
    assert nccl_fill.nvls_tree_chunk_bytes(8 * 2 ** 30, ops, 4) == 64 * 1024


def test_nvls_tree_pipeline_fill_is_two_hops_of_one_chunk_per_pipeline():
    """2 nodes: 2 hops x 128 pipelines x chunk; a pipeline holding less than a chunk adds its whole
    share per hop (the collective's size)."""
    assert nccl_fill.nvls_tree_pipeline_bytes(512 * MiB, "hopper", 8, 2) == 2 * 128 * 128 * 1024
    assert nccl_fill.nvls_tree_pipeline_bytes(32 * MiB, "hopper", 8, 2) == 2 * 128 * 64 * 1024
    assert nccl_fill.nvls_tree_pipeline_bytes(1 * MiB, "hopper", 8, 2) == 2 * MiB


def test_the_tuner_picks_without_the_fill_and_the_time_includes_it():
    """NCCL chooses by its tuner's model, which has no pipeline fill: on 2 DGX H100 at 8 MB it
    picks NVLSTree, whose time then carries the fill (2 hops x 128 x 64 KB at the same rate)."""
    topo = build_topology(H100.with_nodes(2))
    coll = _coll("all_reduce", 8 * MiB, range(16))
    plan = plan_collective(coll, topo)
    assert plan.algorithm == "nvls_tree/simple"
    t = collective_time_s(coll, topo)
    rate = 8 * 57.7e9 * 16 / (2 * 15)  # algorithm bytes per second at NCCL's ceiling
    expected = (25 + 2 * 20.9) * US + (8 * MiB + 2 * 128 * 64 * 1024) / rate
    assert t == pytest.approx(expected, rel=1e-9)
    assert simulate_plan(plan, topo.capacity_Bps) == pytest.approx(t, rel=1e-9)
