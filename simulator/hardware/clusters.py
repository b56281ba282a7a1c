"""Cluster specifications (nodes of GPUs on one NVLink domain, NICs into a leaf/spine fabric).

The presets are data: one TOML file per cluster under simulator/data/hardware/clusters/ (DGX A100,
DGX H100/H200, DGX B200, GB200 NVL72), each figure with its datasheet source, read on first use by
``hardware/hwfile``; a scenario names its own file with ``cluster.hardware = "path.toml"``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .gpus import GPUSpec
from .nccl_vars import NcclValue
from .preset_files import PresetFiles

TOPOLOGIES = ("fat-tree", "rail-optimized")
# Inter-node fabrics: InfiniBand, RoCE (RDMA over Converged Ethernet v2), and Google's GPUDirect-TCPX
# (A3 High) and GPUDirect-TCPXO (A3 Mega), GPU-direct transfers over TCP. The link efficiency of each
# is in hardware/topology, the NCCL settings its vendor prescribes in cost/nccl_tuner.
FABRICS = ("infiniband", "roce", "tcpx", "tcpxo")


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    name: str
    gpu: GPUSpec
    num_nodes: int
    gpus_per_node: int  # GPUs in one NVLink domain (a DGX node; a whole GB200 NVL72 rack)
    nvlink_bandwidth_Bps: float  # per GPU, per direction, into the node's NVSwitch fabric
    nics_per_node: int
    nic_bandwidth_Bps: float  # per NIC, per direction
    pcie_bandwidth_Bps: float  # GPU <-> host, per direction (offload traffic)
    nvls: bool  # NVSwitch supports in-switch reduction (NVLink SHARP, NVSwitch gen3)
    topology: str = "rail-optimized"  # inter-node network
    oversubscription: float = 1.0  # leaf uplink oversubscription ratio (1.0 = non-blocking)
    fabric: str = "infiniband"  # one of FABRICS
    # NCCL variables the job exports over the fabric's own environment, as (cost.nccl_env.NcclEnv field,
    # value) pairs (hardware/nccl_vars: ``[cluster.nccl_env]``)
    nccl_env: tuple[tuple[str, NcclValue], ...] = ()

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    def with_nodes(self, num_nodes: int) -> "ClusterSpec":
        return replace(self, num_nodes=num_nodes)


CLUSTER_PRESETS: PresetFiles = PresetFiles("clusters")
