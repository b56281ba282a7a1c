"""Hardware as data: the preset files load to the figures the code held before, user files and
[cluster.gpu] tables are checked field by field, the new presets have their NVLink domains."""

import math
from dataclasses import replace

import pytest

from simulator.hardware.clusters import CLUSTER_PRESETS, ClusterSpec
from simulator.hardware.gpus import GPU_PRESETS
from simulator.hardware.hwfile import cluster_from_table, gpu_from_table, read_cluster_file, read_gpu_file
from simulator.hardware.preset_files import DATA_DIR
from simulator.hardware.topology import build_topology

TFLOP, GB, MiB = 1e12, 1e9, 2 ** 20

# The presets as simulator/hardware/gpus.py and clusters.py held them in code before they became files.
OLD_GPUS = {
    "a100-sxm4-40gb": ({"bf16": 312, "fp16": 312, "fp32": 156}, 1555, 40960, "ampere"),
    "a100-sxm4-80gb": ({"bf16": 312, "fp16": 312, "fp32": 156}, 2039, 81920, "ampere"),
    "h100-sxm5-80gb": ({"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "fp32": 494.7}, 3350, 81559, "hopper"),
    "h200-sxm-141gb": ({"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "fp32": 494.7}, 4800, 143771, "hopper"),
}
OLD_CLUSTERS = {  # gpu, nvlink GB/s, NIC Gb/s, PCIe GB/s, nvls
    "dgx-a100-40gb": ("a100-sxm4-40gb", 300, 200, 32, False),
    "dgx-a100-80gb": ("a100-sxm4-80gb", 300, 200, 32, False),
    "dgx-h100": ("h100-sxm5-80gb", 450, 400, 64, True),
    "dgx-h200": ("h200-sxm-141gb", 450, 400, 64, True),
}


@pytest.mark.parametrize("name", sorted(OLD_GPUS))
def test_gpu_presets_load_from_their_files_to_the_old_numbers(name):
    peaks, hbm, mib, arch = OLD_GPUS[name]
    spec = read_gpu_file(DATA_DIR / "gpus" / f"{name}.toml")
    assert spec == GPU_PRESETS[name]
    assert spec.peak_flops_per_s == {k: v * TFLOP for k, v in peaks.items()}
    assert spec.hbm_bandwidth_Bps == hbm * GB
    assert spec.memory_capacity_bytes == mib * MiB
    assert spec.architecture == arch


@pytest.mark.parametrize("name", sorted(OLD_CLUSTERS))
def test_cluster_presets_load_from_their_files_to_the_old_numbers(name):
    gpu, nvlink, nic, pcie, nvls = OLD_CLUSTERS[name]
    spec = read_cluster_file(DATA_DIR / "clusters" / f"{name}.toml")
    assert spec == CLUSTER_PRESETS[name]
    assert spec == ClusterSpec(name=name, gpu=GPU_PRESETS[gpu], num_nodes=1, gpus_per_node=8,
                               nvlink_bandwidth_Bps=nvlink * GB, nics_per_node=8, nic_bandwidth_Bps=nic * 1e9 / 8,
                               pcie_bandwidth_Bps=pcie * GB, nvls=nvls, topology="rail-optimized",
                               oversubscription=1.0, fabric="infiniband")


def test_every_preset_file_loads_and_is_listed():
    for kind, presets in (("gpus", GPU_PRESETS), ("clusters", CLUSTER_PRESETS)):
        stems = sorted(p.stem for p in (DATA_DIR / kind).glob("*.toml"))
        assert stems == sorted(presets)
    assert {"dgx-b200", "gb200-nvl72"} <= set(CLUSTER_PRESETS)
    assert {"h100-pcie-80gb", "h200-sxm-141gb", "b200-sxm-180gb", "gb200"} <= set(GPU_PRESETS)


def test_new_presets_carry_their_datasheet_figures():
    b200 = CLUSTER_PRESETS["dgx-b200"]
    assert (b200.gpus_per_node, b200.nvlink_bandwidth_Bps, b200.nics_per_node) == (8, 900 * GB, 8)
    assert b200.gpu.peak("bf16") == 2250 * TFLOP and b200.gpu.peak("fp8") == 4500 * TFLOP
    nvl72 = CLUSTER_PRESETS["gb200-nvl72"]
    assert (nvl72.gpus_per_node, nvl72.nics_per_node, nvl72.nvls) == (72, 72, True)
    assert nvl72.gpu.memory_capacity_bytes == 186 * GB and nvl72.gpu.architecture == "blackwell"


def test_a_gb200_nvl72_group_of_64_stays_inside_nvlink():
    topo = build_topology(CLUSTER_PRESETS["gb200-nvl72"].with_nodes(2))
    for a in range(64):
        for b in (0, 31, 63):
            if a != b:
                assert {topo.link_kind(link) for link in topo.route(a, b)} == {"nvlink"}
    # rank 72 sits in the second rack: the route leaves through the NICs
    assert "nic" in {topo.link_kind(link) for link in topo.route(0, 72)}


def test_a_user_cluster_file_with_an_inline_gpu(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text('name = "grand-teton"\ngpus_per_node = 8\nnvlink_bandwidth_GBps = 450\nnics_per_node = 8\n'
                 'nic_bandwidth_Gbps = 400\nfabric = "roce"\npcie_bandwidth_GBps = 64\nnvls = true\n'
                 '[gpu]\npreset = "h100-sxm5-80gb"\nname = "h100-96gb-500w"\nmemory_capacity_GB = 96\ntdp_W = 500\n')
    c = read_cluster_file(f)
    assert c.fabric == "roce" and c.num_nodes == 1 and c.gpu.name == "h100-96gb-500w"
    assert c.gpu.memory_capacity_bytes == 96 * GB and c.gpu.tdp_W == 500
    assert c.gpu.peak("bf16") == GPU_PRESETS["h100-sxm5-80gb"].peak("bf16")


@pytest.mark.parametrize("table, message", [
    ({"preset": "dgx-h100", "nic_bandwidth_Gbps": math.nan}, "cluster.nic_bandwidth_Gbps must be a finite number > 0, got nan"),
    ({"preset": "dgx-h100", "nvlink_bandwidth_GBps": -1}, "cluster.nvlink_bandwidth_GBps must be a finite number > 0, got -1"),
    ({"preset": "dgx-h100", "oversubscription": 0.5}, "cluster.oversubscription must be a finite number >= 1"),
    ({"preset": "dgx-h100", "gpus_per_node": 0}, "cluster.gpus_per_node must be a positive integer, got 0"),
    ({"preset": "dgx-h100", "nics_per_node": 16}, "cluster.nics_per_node (16) exceeds gpus_per_node (8)"),
    ({"preset": "dgx-h100", "fabric": "myrinet"}, "cluster.fabric 'myrinet' is unknown"),
    ({"preset": "dgx-h100", "gpu": {"hbm_bandwidth_GBps": math.inf}}, "cluster.gpu.hbm_bandwidth_GBps must be a finite number"),
    ({"preset": "dgx-h100", "gpu": {"peak_tflops": {"bf16": "fast"}}}, "cluster.gpu.peak_tflops.bf16 must be a number"),
    ({"preset": "dgx-h100", "gpu": {"architecture": "volta"}}, "cluster.gpu.architecture 'volta' is unknown"),
    ({"preset": "dgx-h100", "speed": 1}, "[cluster] unknown key(s) ['speed']"),
    ({"name": "x", "gpu": "h100-sxm5-80gb"}, "[cluster] needs gpus_per_node"),
])
def test_bad_hardware_values_name_the_field(table, message):
    with pytest.raises(ValueError) as exc:
        cluster_from_table(table)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_gpu_table_needs_its_fields_without_a_preset():
    with pytest.raises(ValueError, match=r"\[gpu\] needs architecture"):
        gpu_from_table({"name": "g", "peak_tflops": {"bf16": 1}, "hbm_bandwidth_GBps": 1, "memory_capacity_GB": 1})
    g = gpu_from_table({"name": "g", "architecture": "hopper", "peak_tflops": {"bf16": 1},
                        "hbm_bandwidth_GBps": 2, "memory_capacity_GB": 3})
    assert (g.peak("bf16"), g.hbm_bandwidth_Bps, g.memory_capacity_bytes) == (TFLOP, 2 * GB, 3 * GB)
    assert replace(g, tdp_W=1.0).tdp_W == 1.0


def test_a_scenario_names_its_hardware_file_and_overrides_its_gpu(tmp_path):
    from simulator.scenario import load_scenario
    (tmp_path / "hw").mkdir()
    (tmp_path / "hw" / "rack.toml").write_text((DATA_DIR / "clusters" / "dgx-h100.toml").read_text())
    scn = tmp_path / "s.toml"
    scn.write_text('[model]\npreset = "gpt3-1.3b"\n[cluster]\nhardware = "hw/rack.toml"\nnum_nodes = 2\n'
                   'nic_bandwidth_Gbps = 200\n[cluster.gpu]\nhbm_bandwidth_GBps = 4000\n'
                   '[parallelism]\ntp = 8\n[training]\nglobal_batch_size = 16\n')
    s = load_scenario(scn)
    assert s.cluster.num_gpus == 16 and s.cluster.nic_bandwidth_Bps == 25e9
    assert s.cluster.gpu.hbm_bandwidth_Bps == 4000 * GB and s.cluster.gpu.architecture == "hopper"


def test_collective_takes_the_scenario_cluster_fields(tmp_path, capsys):
    import json
    from simulator.__main__ import main
    f = tmp_path / "a3.toml"
    f.write_text((DATA_DIR / "clusters" / "dgx-h100.toml").read_text())
    args = ["collective", "--hardware", str(f), "--nodes", "2", "--op", "all_gather", "--size-bytes", "1e9", "--json"]
    assert main(args) == 0
    fast = json.loads(capsys.readouterr().out)["busbw_GBps"]
    assert main(args + ["--set", "cluster.nic_bandwidth_Gbps=200", "--set", "cluster.fabric=tcpxo"]) == 0
    slow = json.loads(capsys.readouterr().out)["busbw_GBps"]
    assert slow < 0.6 * fast
    assert main(args + ["--set", "cluster.nics_per_node=0"]) == 2
    assert "cluster.nics_per_node must be a positive integer, got 0" in capsys.readouterr().err
    assert main(args + ["--set", "training.dtype=fp8"]) == 2
