"""SMs a communication kernel holds, and what that costs the compute kernels that run beside it.

An NCCL collective is a CUDA kernel of one CTA per channel, each CTA resident on one SM for the whole
collective (NCCL's device code loops over its channel's chunks); a tensor-core GEMM's CTAs need most
of an SM's shared memory, so they cannot share an SM with it, and a GEMM launched beside a running
collective gets the SMs the collective left: fewer SMs, other wave quantization. An NVIDIA forum
measurement shows the effect at its worst (developer forum thread 337991, "Compute-Communication
Overlap Causes Severe GEMM Performance Degradation because of Tail Effect", H100: a 132-CTA GEMM
next to a 24-CTA ncclAllGather nearly doubles, its spilled CTAs running as a second wave).
Transformer Engine's userbuffers take the same view (``set_sm_margin``: the GEMM is launched on the
SMs the communication kernel leaves; cost/tp_overlap charges those sites already).

Channel counts follow NCCL 2.30.7's source (ring search, channel duplication, per-size reduction);
memory-bound kernels keep their time (HBM, not SMs, bounds them), copies to and from the host run
on copy engines and hold no SM.
"""

from __future__ import annotations

from ..hardware.clusters import ClusterSpec
from ..tasks import Collective
from . import nccl_tuner as tuner
from .algorithms import GroupShape
from .compute import RooflineCompute
from .nccl_env import env_for

# src/graph/topo.h: NCCL's figure for one NVLink's bandwidth, GB/s (SM80_NVLINK_BW 20.0,
# SM90_NVLINK_BW 20.6, SM100_NVLINK_BW 40.1) against the datasheet's per-link 25 GB/s (NVLink3/4)
# and 50 GB/s (NVLink5): the ring search sees a GPU's NVLink bandwidth at this ratio.
NCCL_NVLINK_RATIO = {"ampere": 20.0 / 25.0, "hopper": 20.6 / 25.0, "blackwell": 40.1 / 50.0}
# src/graph/search.cc: the first (highest) intra-node ring speed the search tries, GB/s per channel
# (speedArrayIntra[0] 40, sm90SpeedArrayIntra[0] 60, sm100SpeedArrayIntra[0] 90). Behind an NVSwitch
# every speed fits, so the search keeps the top one and packs floor(NVLink / speed) channels.
TOP_INTRA_SPEED_GBPS = {"ampere": 40.0, "hopper": 60.0, "blackwell": 90.0}
# src/include/device.h MAXCHANNELS 64; the ring search stops at MAXCHANNELS / 2 channels.
MAX_CHANNELS = 64
MAX_SEARCH_CHANNELS = MAX_CHANNELS // 2
# src/include/device.h NCCL_{SIMPLE,LL,LL128}_MAX_NTHREADS and NCCL_*_THREAD_THRESHOLD (tuning.cc
# prints "threadThresholds 8/8/64 | 128/8/64": LL, LL128, Simple; ring LL x nRanks).
MAX_THREADS = {"simple": 512, "ll": 512, "ll128": 640}
THREAD_THRESHOLD = {"simple": 64, "ll": 8, "ll128": 8}


def _search_dup(channels: int, speed_GBps: float, architecture: str) -> int:
    """search.cc ncclTopoDupChannels: a graph at >= 25 GB/s per channel is run on twice the
    channels at half the speed, except on sm90+ below 50 GB/s with more than 4 channels."""
    if speed_GBps < 25.0 or (architecture != "ampere" and speed_GBps < 50.0 and channels > 4):
        return channels
    return min(2 * channels, MAX_SEARCH_CHANNELS)


def ring_channels(cluster: ClusterSpec, num_nodes: int, rails: int) -> int:
    """comm->nChannels of a communicator spanning ``num_nodes`` nodes (``rails`` NICs per node used).

    Inside one node: floor(NVLink / top speed) searched rings, duplicated (search.cc), doubled
    (connect.cc "nChannels * 2"): 24 on DGX H100 and DGX A100, as NCCL prints on them. Across nodes:
    one searched ring per NIC at the NIC's speed (under 50 GB/s: not duplicated), doubled, and doubled
    again on sm90+ below 16 ("4 compute channels per search channel"): 16 on 2 x 8 H100 with 4 or 8
    NICs ("16 coll channels" in NCCL INFO of such a system)."""
    arch = cluster.gpu.architecture
    if num_nodes <= 1:
        speed = TOP_INTRA_SPEED_GBPS.get(arch, TOP_INTRA_SPEED_GBPS["hopper"])
        nvlink_GBps = cluster.nvlink_bandwidth_Bps / 1e9 * NCCL_NVLINK_RATIO.get(arch, 1.0)
        searched = max(1, min(MAX_SEARCH_CHANNELS, int(nvlink_GBps // speed)))
        return min(MAX_CHANNELS, 2 * _search_dup(searched, speed, arch))
    channels = min(MAX_CHANNELS, 2 * max(1, rails))
    if arch != "ampere" and channels < 16:
        channels = min(MAX_CHANNELS, 2 * channels)
    return channels


def collective_ctas(coll: Collective, algorithm: str, shape: GroupShape, cluster: ClusterSpec) -> int:
    """CTAs (one per channel, each on its own SM) of the kernel that runs ``coll`` with ``algorithm``
    ("ring/simple", "nvls_tree/simple", "p2p/ll", ...); 0 for host copies and empty collectives."""
    if coll.axis == "host" or coll.size_bytes <= 0 or len(coll.group) < 2 or algorithm == "none":
        return 0
    alg, _, proto = algorithm.partition("/")
    n, nodes = len(coll.group), shape.num_nodes
    nic_GBps = cluster.nic_bandwidth_Bps / 1e9
    env = env_for(cluster)  # the fabric's NCCL environment bounds the P2P channels (cost/nccl_env)
    if coll.op == "send_recv":
        return tuner.p2p_send_channels(coll.size_bytes, n, nodes, nic_GBps, env)
    if coll.op == "all_to_all":  # grouped sends, one per peer, each on its P2P channels
        per_peer = tuner.p2p_send_channels(coll.size_bytes / n, n, nodes, nic_GBps, env)
        return min(env.p2p_channels(tuner.P2P_NVL_CHANNELS), (n - 1) * per_peer)
    if alg in ("nvls", "nvls_tree"):  # enqueue.cc: nc = nvlsChannels, never reduced by size
        return tuner.NVLS_CHANNELS.get(cluster.gpu.architecture, tuner.NVLS_CHANNELS["hopper"])
    return _size_reduced(ring_channels(cluster, nodes, shape.rails), coll.size_bytes, proto or "simple",
                         n if alg == "ring" else 1)


def _size_reduced(channels: int, size_bytes: float, protocol: str, ll_ranks: int) -> int:
    """enqueue.cc: ``while (nBytes < nc * nt * threadThreshold) nc--`` (ring LL's threshold is
    multiplied by nRanks, tuning.cc)."""
    threshold = THREAD_THRESHOLD.get(protocol, 64) * (ll_ranks if protocol == "ll" else 1)
    per_channel = MAX_THREADS.get(protocol, 512) * threshold
    return max(1, min(channels, int(size_bytes // per_channel)))


def with_sms_taken(roofline: RooflineCompute, sms_taken: int, margin_known: bool = False) -> RooflineCompute:
    """The roofline of the same GPU with ``sms_taken`` SMs held by other kernels (the forum's second
    wave comes from quantizing GEMM waves on the SMs left). A GEMM's kernel is chosen for the whole
    GPU, unless ``margin_known``: Transformer Engine's ``set_sm_margin`` tells cuBLAS the SMs left
    (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET)."""
    return roofline.on_sms(roofline.eff.num_sms - max(0, sms_taken), chosen_for_them=margin_known)
