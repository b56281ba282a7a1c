"""NCCL variables in a cluster description (hardware/nccl_vars): parsed with NCCL's syntax, applied over
the fabric's vendor environment (cost/nccl_env.env_for), refused in one line when not modelled."""

import subprocess
import sys
from dataclasses import replace

import pytest

from simulator.cost.collectives import plan_collective
from simulator.cost.nccl_env import DEFAULT, TCPX, env_for
from simulator.hardware.clusters import CLUSTER_PRESETS
from simulator.hardware.hwfile import cluster_from_table
from simulator.hardware.nccl_vars import parse_nccl_env
from simulator.hardware.topology import build_topology
from simulator.tasks import Collective


def test_each_variable_sets_its_field():
    env = dict(parse_nccl_env("cluster", {"NCCL_ALGO": "Ring,tree", "NCCL_PROTO": "simple", "NCCL_MIN_NCHANNELS": 4,
                                          "NCCL_MAX_NCHANNELS": "16", "NCCL_P2P_NET_CHUNKSIZE": 2097152,
                                          "NCCL_P2P_NVL_CHUNKSIZE": 1048576, "NCCL_BUFFSIZE": 8388608,
                                          "NCCL_P2P_PXN_LEVEL": 0}))
    assert env == {"algorithms": ("ring", "tree"), "protocols": ("simple",), "min_channels": 4, "max_channels": 16,
                   "p2p_net_chunk_bytes": 2097152, "p2p_nvl_chunk_bytes": 1048576, "buffsize_bytes": 8388608,
                   "pxn": False}


def test_a_caret_excludes_as_nccl_does():
    # NCCL_ALGO=^NVLS,CollNetDirect: everything but those; an unmodelled algorithm may be excluded
    assert dict(parse_nccl_env("c", {"NCCL_ALGO": "^NVLS,NVLSTree,CollNetDirect"}))["algorithms"] == ("ring", "tree")
    assert dict(parse_nccl_env("c", {"NCCL_PROTO": "^LL"}))["protocols"] == ("simple", "ll128")


@pytest.mark.parametrize("table, message", [
    ({"NCCL_ALGO": "PAT"}, "cluster.nccl_env.NCCL_ALGO = 'PAT': unknown or unmodelled ['pat']"),
    ({"NCCL_PROTO": "^Simple,LL,LL128"}, "leaves nothing to run"),
    ({"NCCL_MAX_NCHANNELS": 65}, "NCCL_MAX_NCHANNELS must be an integer in 1..64, got 65"),
    ({"NCCL_MIN_NCHANNELS": 8, "NCCL_MAX_NCHANNELS": 4}, "NCCL_MIN_NCHANNELS = 8 above NCCL_MAX_NCHANNELS = 4"),
    ({"NCCL_P2P_PXN_LEVEL": True}, "NCCL_P2P_PXN_LEVEL must be an integer in 0..2"),
    ({"NCCL_NVLS_ENABLE": 0}, "set cluster.nvls instead"),
    ({"NCCL_IB_QPS_PER_CONNECTION": 4}, "'NCCL_IB_QPS_PER_CONNECTION' is not modelled"),
])
def test_bad_variables_are_one_line_errors(table, message):
    with pytest.raises(ValueError) as exc:
        parse_nccl_env("cluster", table)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_the_job_environment_overrides_the_fabric_one():
    a3 = replace(CLUSTER_PRESETS["dgx-h100"], fabric="tcpx")
    env = env_for(replace(a3, nccl_env=parse_nccl_env("c", {"NCCL_MAX_NCHANNELS": 16, "NCCL_P2P_PXN_LEVEL": 2})))
    assert (env.max_channels, env.min_channels, env.pxn, env.unpack) == (16, 8, True, True)  # the rest stays TCPX's
    assert env_for(a3) is TCPX and env_for(CLUSTER_PRESETS["dgx-h100"]) is DEFAULT


def test_a_pinned_algorithm_is_what_the_collective_runs():
    """nccl-tests under NCCL_ALGO=Ring NCCL_PROTO=Simple: a 1 MB all-reduce on two DGX H100 nodes runs a
    Simple ring, slower than the tree/LL128 NCCL's tuner picks by itself."""
    table = {"preset": "dgx-h100", "num_nodes": 2}
    free = build_topology(cluster_from_table(table))
    pinned = build_topology(cluster_from_table(dict(table, nccl_env={"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"})))
    c = Collective("all_reduce", float(1 << 20), tuple(range(16)), "dp")
    assert plan_collective(c, free).algorithm == "tree/ll128"  # NCCL 2.30.7's tuner (README, Hardware as data)
    assert plan_collective(c, pinned).algorithm == "ring/simple"


def test_the_collective_command_takes_them_and_refuses_bad_ones():
    base = [sys.executable, "-m", "simulator", "collective", "--cluster", "dgx-h100", "--nodes", "2", "--op",
            "all_reduce", "--size-bytes", "1048576", "--set"]
    ok = subprocess.run(base + ['cluster.nccl_env={NCCL_ALGO="Ring", NCCL_PROTO="Simple"}'], capture_output=True,
                        text=True)
    assert ok.returncode == 0 and "ring/simple" in ok.stdout
    bad = subprocess.run(base + ['cluster.nccl_env={NCCL_ALGO="CollNetChain"}'], capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "NCCL_ALGO" in bad.stderr
