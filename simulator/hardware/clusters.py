"""Cluster specifications (DGX nodes: NVSwitch inside, InfiniBand between) and their presets.

Sources:
- DGX A100 user guide / datasheet: 8 A100 SXM4, 6 NVSwitch (NVLink3: 12 links x 25 GB/s =
  300 GB/s per GPU per direction), 8 ConnectX-6 HDR 200 Gb/s compute NICs (one per GPU), PCIe
  Gen4 x16 host links (32 GB/s per direction, theoretical), 2 x AMD EPYC 7742.
- DGX H100 user guide / datasheet: 8 H100 SXM5, 4 NVSwitch gen3 (NVLink4: 18 links x 25 GB/s =
  450 GB/s per GPU per direction) with NVLink SHARP, 8 ConnectX-7 NDR 400 Gb/s compute NICs,
  PCIe Gen5 x16 (64 GB/s per direction, theoretical), 2 x Intel Xeon 8480C.
- DGX H200: the DGX H100 platform with H200 GPUs (NVIDIA DGX H200 datasheet).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..units import GB, gbit_per_s_to_bytes_per_s
from .gpus import GPU_PRESETS, GPUSpec

TOPOLOGIES = ("fat-tree", "rail-optimized")


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    name: str
    gpu: GPUSpec
    num_nodes: int
    gpus_per_node: int
    nvlink_bandwidth_Bps: float  # per GPU, per direction, into the node's NVSwitch fabric
    nics_per_node: int
    nic_bandwidth_Bps: float  # per NIC, per direction
    pcie_bandwidth_Bps: float  # GPU <-> host, per direction (offload traffic)
    nvls: bool  # NVSwitch supports in-switch reduction (NVLink SHARP, NVSwitch gen3)
    topology: str = "rail-optimized"  # inter-node network
    oversubscription: float = 1.0  # leaf uplink oversubscription ratio (1.0 = non-blocking)

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    def with_nodes(self, num_nodes: int) -> "ClusterSpec":
        return replace(self, num_nodes=num_nodes)


def _dgx(name: str, gpu: str, nvlink_GBps: float, nic_Gbps: float, pcie_GBps: float,
         nvls: bool) -> ClusterSpec:
    return ClusterSpec(name=name, gpu=GPU_PRESETS[gpu], num_nodes=1, gpus_per_node=8,
                       nvlink_bandwidth_Bps=nvlink_GBps * GB, nics_per_node=8,
                       nic_bandwidth_Bps=gbit_per_s_to_bytes_per_s(nic_Gbps),
                       pcie_bandwidth_Bps=pcie_GBps * GB, nvls=nvls)


CLUSTER_PRESETS: dict[str, ClusterSpec] = {
    c.name: c
    for c in (
        _dgx("dgx-a100-40gb", "a100-sxm4-40gb", 300, 200, 32, False),
        _dgx("dgx-a100-80gb", "a100-sxm4-80gb", 300, 200, 32, False),
        _dgx("dgx-h100", "h100-sxm5-80gb", 450, 400, 64, True),
        _dgx("dgx-h200", "h200-sxm-141gb", 450, 400, 64, True),
    )
}
