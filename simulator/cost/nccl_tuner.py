"""NCCL's tuning model: latencies and bandwidth factors per algorithm and protocol.

NCCL picks, for every collective call, the (algorithm, protocol) pair with the smallest predicted
time latency + size / bandwidth (src/graph/tuning.cc, ncclTopoTuneModel / ncclTopoGetAlgoTime).
This module holds those constants; ``cost/collectives`` supplies the bandwidth part from flows
over the real links and makes the same choice. One NCCL version throughout: 2.30.7 (NVIDIA/nccl
tag v2.30.7-1, src/graph/tuning.cc ncclTunerConstantsDefaults and ncclTopoTuneModel; earlier
versions' figures are noted where they differ).
"""

from __future__ import annotations

import math

from ..units import GB, US
from .nccl_env import DEFAULT, NcclEnv

NCCL_VERSION = "2.30.7"
# Which algorithms implement each op. "hierarchical" is not an NCCL algorithm (Horovod/Megatron
# style two-level all-reduce); it is offered as an explicit choice, never picked automatically.
# Not ported: PAT (all-gather / reduce-scatter with one GPU per node only, ncclPatEnable), NVLS
# all-gather / reduce-scatter inside one node (no flows for multicast gathers; on 8 x H100 the
# 2.30.7 model never picks it: NVLS's 25 us and 0.85 x 7/9 of NVLink lose to ring LL below
# ~6.7 MB and to ring LL128 above ~1.7 MB), CollNet.
ALGORITHMS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("ring", "tree", "nvls", "nvls_tree", "hierarchical"),
    "all_gather": ("ring",),
    "reduce_scatter": ("ring",),
    "broadcast": ("ring",),
    "all_to_all": ("direct",),
    "send_recv": ("p2p",),
}
AUTO_EXCLUDED = ("hierarchical",)
PROTOCOLS = ("ll", "ll128", "simple")
_P = {p: i for i, p in enumerate(PROTOCOLS)}

# ncclTunerConstantsDefaults.baseLatencies [algorithm][protocol], us (LL, LL128, Simple); Tree/Simple
# is 8.4 since 2.23 (0 before).
BASE_LAT_US = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "nvls": (0.0, 0.0, 0.0),
               "nvls_tree": (0.0, 0.0, 0.0)}
# ncclTunerConstantsDefaults.hwLatencies [NVLINK | NET][algorithm][protocol], us per step. Since 2.23
# Tree/Simple is 4.0 over NVLink (was 28) and 14 over the network (was 28); since 2.21 NVLS and
# NVLSTree are 25 us over NVLink (was 23); NVLSTree's network step is 20.9 us in 2.30 (was 14).
# The PCI row (nodes without NVLink) is not ported: every cluster here has NVLink.
HW_LAT_US = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "nvls": (0.0, 0.0, 25.0),
               "nvls_tree": (0.0, 0.0, 25.0)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0), "nvls": (0.0, 0.0, 18.0),
            "nvls_tree": (0.0, 0.0, 20.9)},
}
# graphs[a]->latencyInter (the NIC's latency property, added to interLat, twice with Simple for the
# flush) is 0: net_ib/init.cc and net_socket.cc leave props->latency "Not set".
# ncclTopoTuneModel's model refinements of the bus bandwidth:
RING_LL128_EFFICIENCY = 0.92  # "busBw * (0.92 /*120.0/128.0*/)" (2.19 took 0.7 at ppn < 2)
TREE_EFFICIENCY = 0.92  # "if (a == NCCL_ALGO_TREE && coll == ncclFuncAllReduce) busBw = min(busBw*.92, ...)"
TREE_LL_EFFICIENCY = 1.0 / 3.8  # "busBw * 1.0 / 3.8" for Tree/LL
TREE_LL128_EFFICIENCY_1NODE = 7.0 / 9.0  # "nNodes == 1 ? 7.0 / 9.0 : 120.0 / 128.0"
TREE_LL128_EFFICIENCY = 120.0 / 128.0
# Ring/LL: "busBw = std::min(llMaxBw, busBw * .5)" since 2.21 (2.19: 1/4 across nodes or for
# all-reduce, 1/3 otherwise): each 8 B LL store carries 4 B of data and a 4 B flag.
RING_LL_EFFICIENCY = 0.5
# nvlsEfficiency[compCap] (2.28 on; 2.19-2.27 took 5/6 for every GPU): NVLink SHARP multimem traffic
# runs at this fraction of the NVLink rate. NCCL's NVLS busBw per channel is bwIntra x eff x
# (nCh - 1)/nCh x 2 with nCh = nRanks channels of bwIntra = NVLink / (nRanks + 1) each, which is
# exactly S(1 + 1/n) each way per GPU at eff x NVLink (cost/algorithms.nvls_flows); it applies to
# the NVLink flows only, so that the network part of NVLSTree runs at the NICs' rate.
NVLS_EFFICIENCY = {"hopper": 0.85, "blackwell": 0.74}


def nvls_efficiency(architecture: str) -> float:
    """nvlsEfficiency of the GPU generation (NVLS needs Hopper or later; others take Hopper's)."""
    return NVLS_EFFICIENCY.get(architecture, NVLS_EFFICIENCY["hopper"])


# Per-channel bandwidth ceilings (ncclTunerConstantsDefaults, GB/s of bus bandwidth per channel),
# indexed by nNodes = 1, 2, >2 ("index2"), rows by GPU generation (compCapIndex).
PER_CH_MAX_TREE_GBPS = {"ampere": (24.0, 23.6, 17.8), "hopper": (38.7, 41.4, 36.0),
                        "blackwell": (70.0, 42.8, 24.0)}  # perChMaxTreeBws
PER_CH_MAX_TREE_LL128_GBPS = {"ampere": (20.0, 20.0, 20.0), "hopper": (36.7, 36.7, 29.0),
                              "blackwell": (55.6, 31.67, 20.0)}  # perChMaxTreeLL128Bws
PER_CH_MAX_RING_LL128_GBPS = {"ampere": (20.0, 20.0, 20.0), "hopper": (36.7, 36.7, 36.7),
                              "blackwell": (40.0, 40.0, 40.0)}  # perChMaxRingLL128Bws
# perChMaxNVLSTreeBws: "bw = min(intraBw, interBw, perChMaxNVLSTreeBw)" per NVLS channel; the search
# gives one NVLS channel per head, a GPU with its own NIC. 2 x 8 H100 with 8 x 400 Gb/s measure 467
# GB/s busbw at 8 GB (dstack Nebius example) against the 8 x 57.7 = 462 of this ceiling.
PER_CH_MAX_NVLS_TREE_GBPS = {"hopper": (0.0, 57.7, 45.5), "blackwell": (0.0, 96.0, 80.0)}
# llMaxBws: one node by GPU generation (row compCapIndex), across nodes by host CPU (row 1 for AMD,
# row 0 for Intel and others; the Hopper/Blackwell rows' N2/N4 cells are only read on one node).
LL_MAX_GBPS_1NODE = {"ampere": 87.7, "hopper": 141.0, "blackwell": 2 * 141.0}
LL_MAX_GBPS_MULTI = {"amd": (22.5, 19.0), "intel": (39.0, 20.4)}
# Host CPUs: DGX A100 has 2 x AMD EPYC 7742, DGX H100/H200 2 x Intel Xeon 8480C (DGX datasheets).
# DGX B200 has 2 x Intel Xeon 8570; GB200's Grace (Arm) takes tuning.cc's non-AMD rows too, but the
# hardware files name no host CPU, so Blackwell counts as x86 (DGX B200) for NVLSTree's correction.
CPU_VENDOR = {"ampere": "amd", "hopper": "intel", "blackwell": "intel"}
NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0}  # getNetOverhead: x86 Intel 1 us, x86 AMD 2 us, else 1
# tuning.cc treeCorrectionFactor[protocol][log2(bytes/64)], 64 B .. 256 MB: "Trees are not
# perfectly sticking to the model for medium sizes"; Tree all-reduce reads the first 23 entries,
# NVLSTree all 24, on Blackwell with x86 hosts only (ncclTopoGetAlgoTime).
TREE_CORRECTION = {
    "ll": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0,
           1.0, 1.0, 1.0, 1.0),
    "ll128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9,
              .9, 1.0, 1.0, 1.0),
    "simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8,
               .9, .9, .9),
}
TREE_CORRECTION_ENTRIES = {"tree": 23, "nvls_tree": 24}
# NCCL runs all-to-all as grouped send/recv (P2P kernels, one channel per peer), which do not reach
# the collective kernels' bandwidth: NVIDIA/nccl#1138 measures 19.83 GB/s alltoall busbw on two
# DGX-class nodes (8 A100, 4 x 200 Gb/s NICs) against 22.5 GB/s that N/(N-1) x the per-GPU NIC
# bandwidth (at IB_EFFICIENCY) gives: 0.88.
ALL_TO_ALL_EFFICIENCY = 0.88
# enqueue.cc NCCL_P2P_LL_THRESHOLD = 16384: a send uses LL up to this many bytes per P2P channel.
P2P_LL_THRESHOLD_BYTES = 16384


def protocols_for(algorithm: str) -> tuple[str, ...]:
    """NVLS and NVLSTree run Simple only; P2P-based algorithms use LL or Simple; the others all three."""
    if algorithm in ("nvls", "nvls_tree"):
        return ("simple",)
    if algorithm in ("direct", "p2p"):
        return ("ll", "simple")
    return PROTOCOLS


def efficiency(algorithm: str, protocol: str, op: str, num_nodes: int) -> float:
    """Fraction of the links' bandwidth the (algorithm, protocol) pair delivers (tuning.cc's
    multiplicative refinements; the ceilings are ``max_busbw_Bps``)."""
    if protocol not in protocols_for(algorithm):
        raise ValueError(f"algorithm {algorithm!r} has no protocol {protocol!r}; "
                         f"known: {', '.join(protocols_for(algorithm))}")
    if algorithm in ("nvls", "nvls_tree"):
        return 1.0  # nvls_efficiency is in the NVLink flows' sizes (cost/algorithms.nvls_flows)
    if algorithm == "direct":
        return ALL_TO_ALL_EFFICIENCY
    if algorithm == "tree":
        if protocol == "ll":
            return TREE_EFFICIENCY * TREE_LL_EFFICIENCY
        if protocol == "ll128":
            return TREE_EFFICIENCY * (TREE_LL128_EFFICIENCY_1NODE if num_nodes == 1 else TREE_LL128_EFFICIENCY)
        return TREE_EFFICIENCY
    return 1.0 if algorithm == "p2p" else {"ll": RING_LL_EFFICIENCY, "ll128": RING_LL128_EFFICIENCY,
                                           "simple": 1.0}[protocol]


def tree_correction(algorithm: str, protocol: str, size_bytes: float, architecture: str = "") -> float:
    """treeCorrectionFactor at log2i(nBytes >> 6) for Tree all-reduce, and for NVLSTree on Blackwell
    with x86 hosts (ncclTopoGetAlgoTime); 1.0 elsewhere and below 64 B (log2i(0) = -1)."""
    if algorithm == "nvls_tree" and architecture != "blackwell":
        return 1.0
    entries = TREE_CORRECTION_ENTRIES.get(algorithm, 0)
    index = (int(size_bytes) >> 6).bit_length() - 1
    return TREE_CORRECTION[protocol][index] if 0 <= index < entries else 1.0


def max_busbw_Bps(algorithm: str, protocol: str, architecture: str, num_nodes: int,
                  channels: int, ring_channels: int = 0) -> float:
    """Bus-bandwidth ceiling of NCCL's tuner (inf when none), composed in ncclTopoTuneModel's order:
    Tree: min(x .92, nCh x perChMaxTree), then LL: min(/ 3.8, llMax), LL128: min(x 120/128 (7/9 on
    one node), nCh x perChMaxTreeLL128); Ring: LL min(x .5, llMax), LL128 min(x .92, nCh x
    perChMaxRingLL128) with ``ring_channels`` channels (0: no ring ceiling); NVLSTree: nCh x
    perChMaxNVLSTree. ``channels`` is the trees' and NVLSTree's channel count."""
    k = 0 if num_nodes == 1 else 1 if num_nodes == 2 else 2
    inf = float("inf")
    if algorithm == "nvls_tree":
        table = PER_CH_MAX_NVLS_TREE_GBPS.get(architecture)
        return channels * table[k] * GB if table else inf
    ll_max = ll_max_Bps(architecture, num_nodes) if protocol == "ll" else inf
    if algorithm == "tree":
        tree = PER_CH_MAX_TREE_GBPS.get(architecture)
        cap = channels * tree[k] * GB if tree else inf
        if protocol == "ll":
            return min(cap * TREE_LL_EFFICIENCY, ll_max)
        if protocol == "ll128":
            ll128 = PER_CH_MAX_TREE_LL128_GBPS.get(architecture)
            eff = TREE_LL128_EFFICIENCY_1NODE if num_nodes == 1 else TREE_LL128_EFFICIENCY
            return min(cap * eff, channels * ll128[k] * GB if ll128 else inf)
        return cap
    if algorithm == "ring":
        if protocol == "ll128" and ring_channels and architecture in PER_CH_MAX_RING_LL128_GBPS:
            return ring_channels * PER_CH_MAX_RING_LL128_GBPS[architecture][k] * GB
        return ll_max
    return inf


def ll_max_Bps(architecture: str, num_nodes: int) -> float:
    """llMaxBws: by GPU generation on one node, by host CPU vendor across nodes (inf if unknown)."""
    if num_nodes == 1:
        ll = LL_MAX_GBPS_1NODE.get(architecture)
    else:
        vendor = CPU_VENDOR.get(architecture)
        ll = LL_MAX_GBPS_MULTI[vendor][0 if num_nodes == 2 else 1] if vendor else None
    return ll * GB if ll is not None else float("inf")


def net_overhead_us(architecture: str, protocol: str) -> float:
    """tuning.cc getNetOverhead: "Inter-node rings still have to launch nsteps * net overhead": 1 us
    per step on Intel (and other) hosts, 2 us on AMD ones, x3 with Simple."""
    us = NET_OVERHEAD_US.get(CPU_VENDOR.get(architecture, ""), 1.0)
    return us * 3 if protocol == "simple" else us


def ring_latency_s(protocol: str, nsteps: int, n_inter: int, architecture: str = "",
                   ppn: int = 0) -> tuple[float, float]:
    """(base, per-step average) for a ring of ``nsteps`` steps, ``n_inter`` of them crossing nodes:
    baseLat + (nsteps - nInterSteps) * max(intraLat, netOverhead) + nInterSteps * interLat
    (tuning.cc; the net overhead only when the ring spans nodes; "With ppn=1 latencies are fully
    exposed, use the Tree network latency" for interLat, since 2.23)."""
    p = _P[protocol]
    intra = HW_LAT_US["nvlink"]["ring"][p]
    if n_inter > 0:
        intra = max(intra, net_overhead_us(architecture, protocol))
    inter = HW_LAT_US["net"]["tree" if ppn == 1 else "ring"][p]
    total = (nsteps - n_inter) * intra + n_inter * inter
    return BASE_LAT_US["ring"][p] * US, (total / nsteps if nsteps else 0.0) * US


def bcast_step_latency_s(protocol: str, hw: str) -> float:
    """One of a ring broadcast's nRanks steps: tuning.cc's branch for rings without sameChannels
    (every channel its own GPU order, as the simulator's rings; with sameChannels NCCL charges one
    step in all) charges hwLat of the ring, of the tree with Simple ("Add some chunk latency")."""
    return HW_LAT_US[hw]["tree" if protocol == "simple" else "ring"][_P[protocol]] * US


# tuning.cc ncclTopoGetAlgoTime: "Plateau effect of ring": a Simple all-reduce ring across nodes has
# its latency x1.4 (x1.9 before Ampere, minCompCap < 80) once nBytes / (nChannels * nRanks) >= 64.
RING_PLATEAU_FACTOR = {"volta": 1.9}
RING_PLATEAU_FACTOR_DEFAULT = 1.4
RING_PLATEAU_MIN_BYTES = 64


def ring_plateau(op: str, protocol: str, num_nodes: int, size_bytes: float, channels: int,
                 n: int, architecture: str) -> float:
    """Latency factor of the ring plateau effect (1.0 where it does not apply)."""
    if (op == "all_reduce" and protocol == "simple" and num_nodes > 1
            and size_bytes / (channels * n) >= RING_PLATEAU_MIN_BYTES):
        return RING_PLATEAU_FACTOR.get(architecture, RING_PLATEAU_FACTOR_DEFAULT)
    return 1.0


def ring_inter_steps(op: str, n: int, num_nodes: int) -> int:
    """nInterSteps of tuning.cc (2.23 on): 2 (nNodes - 1) for all-reduce, nNodes - 1 for all-gather /
    reduce-scatter; 0 inside one node (2.19 took 2 nNodes for all-reduce)."""
    if num_nodes <= 1:
        return 0
    return 2 * (num_nodes - 1) if op == "all_reduce" else num_nodes - 1


def step_latency_s(algorithm: str, protocol: str, hw: str) -> float:
    """hwLat of one step of ``algorithm`` over NVLink ("nvlink") or the network ("net")."""
    return HW_LAT_US[hw][algorithm][_P[protocol]] * US


def base_latency_s(algorithm: str, protocol: str) -> float:
    return BASE_LAT_US[algorithm][_P[protocol]] * US


def tree_latency_s(protocol: str, num_nodes: int, ppn: int) -> float:
    """Tree: baseLat + 2 * ((ppn - 1) * intraLat + log2i(nNodes) * interLat) (tuning.cc)."""
    p = _P[protocol]
    hops = ((ppn - 1) * HW_LAT_US["nvlink"]["tree"][p]
            + int(math.log2(num_nodes)) * HW_LAT_US["net"]["tree"][p])
    return (BASE_LAT_US["tree"][p] + 2 * hops) * US


def nvls_tree_latency_s(num_nodes: int) -> float:
    """NVLSTree: intraLat + 2 * log2i(nNodes) * interLat, no base latency (tuning.cc)."""
    hops = int(math.log2(num_nodes))
    return (HW_LAT_US["nvlink"]["nvls_tree"][2] + 2 * hops * HW_LAT_US["net"]["nvls_tree"][2]) * US


def nvls_latency_s(num_nodes: int) -> float:
    """NVLS: intraLat (+ interLat across nodes), no base latency (tuning.cc)."""
    return (HW_LAT_US["nvlink"]["nvls"][2] + (HW_LAT_US["net"]["nvls"][2] if num_nodes > 1 else 0.0)) * US


def p2p_latency_s(protocol: str, num_nodes: int) -> float:
    """A P2P transfer (and each peer of an all-to-all, all issued at once) is one ring step:
    ring baseLat + one hwLat step over NVLink or the network."""
    return base_latency_s("ring", protocol) + step_latency_s("ring", protocol, "net" if num_nodes > 1 else "nvlink")


def p2p_protocol(bytes_per_peer: float, n_ranks: int = 2, num_nodes: int = 1, nic_GBps: float = 0.0,
                 env: NcclEnv = DEFAULT) -> str:
    """enqueue.cc addP2pToPlan: LL when the send's bytes <= its P2P channels x NCCL_P2P_LL_THRESHOLD."""
    channels = p2p_send_channels(bytes_per_peer, n_ranks, num_nodes, nic_GBps, env)
    return "ll" if bytes_per_peer <= channels * P2P_LL_THRESHOLD_BYTES else "simple"


# --- P2P channels (NCCL 2.30.7, src/enqueue.cc addP2pToPlan / scheduleP2pTasksToPlan) ----------------
# A send runs on nChannels P2P channels, each one CTA; the count depends on the size, so small and
# medium sends run on few channels. paths.cc ncclTopoGetNchannels gives an NVLink peer
# 2 * path_bw / nvlBw channels, pow2Up'ed (ncclTopoComputeP2pChannels); NVSwitch nodes print
# "32 p2p channels, 32 p2p channels per peer" (NCCL INFO on 8 x A100 and on p5.48xlarge 8 x H100).
# NCCL_MAX_NCHANNELS caps both through nChannels (``NcclEnv.p2p_channels``).
P2P_NVL_CHANNELS = 32
P2P_NVL_CHANNELS_PER_PEER = 32
# paths.cc NCCL_P2P_PER_CHANNEL_NET_BW = 14 GB/s: NCCL's figure for what one P2P channel carries; it
# gives a network peer max(NICs, ceil(NIC GB/s / 14)) channels. One P2P channel is one CTA running
# the same copy loop over either transport, so it bounds NVLink P2P channels too.
P2P_PER_CHANNEL_GBPS = 14.0
# NCCL_MAX_DEV_WORK_P2P_PER_BATCH (device.h): peers per work batch in paths.cc's per-peer halving.
P2P_PEERS_PER_BATCH = 8
# init.cc computeBuffSizes: p2pChunkSize = NCCL_P2P_NVL_CHUNKSIZE (512 KB) inside an NVLink node,
# NCCL_P2P_NET_CHUNKSIZE (128 KB) once the communicator spans nodes; a fabric's vendor may set both
# (``NcclEnv.p2p_nvl_chunk_bytes`` / ``p2p_net_chunk_bytes``).


def _pow2_up(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def p2p_channels_per_peer(num_nodes: int, n_ranks: int, nic_GBps: float, env: NcclEnv = DEFAULT) -> int:
    """p2pnChannelsPerPeer: 32 over NVLink; across nodes max(1 NIC, ceil(NIC / 14 GB/s)), pow2Up,
    halved while it times ceil(nRanks / 8) exceeds the P2P channels (paths.cc); never above them."""
    p2p = env.p2p_channels(P2P_NVL_CHANNELS)
    if num_nodes <= 1:
        return min(P2P_NVL_CHANNELS_PER_PEER, p2p)
    per_peer = _pow2_up(max(1, math.ceil(nic_GBps / P2P_PER_CHANNEL_GBPS)))
    while per_peer * -(-n_ranks // P2P_PEERS_PER_BATCH) > p2p and per_peer > 1:
        per_peer //= 2
    return min(per_peer, p2p)


def p2p_send_channels(size_bytes: float, n_ranks: int, num_nodes: int, nic_GBps: float = 0.0,
                      env: NcclEnv = DEFAULT) -> int:
    """Channels one send of ``size_bytes`` runs on (enqueue.cc): nChannelsMin is the per-peer count
    halved until nChannelsMin * nRanks <= p2pnChannels; a send starts on min(nChannelsMin,
    ceil(bytes / minPartSize)) and doubles while its part exceeds maxPartSize (chunk * 32 in one
    node, one chunk across nodes) and the count stays <= half the per-peer maximum."""
    most = p2p_channels_per_peer(num_nodes, n_ranks, nic_GBps, env)
    least = most
    while least * n_ranks > env.p2p_channels(P2P_NVL_CHANNELS) and least > 1:
        least //= 2
    step = env.p2p_nvl_chunk_bytes if num_nodes <= 1 else env.p2p_net_chunk_bytes
    min_part, max_part = (step // 8, step * 32) if num_nodes <= 1 else (step // 2, step)
    size = max(1, int(size_bytes))
    channels = max(1, min(least, -(-size // min_part)))
    part = max(min_part, -(-size // channels))
    while part > max_part and channels <= most // 2:
        channels *= 2
        part = -(-size // channels)
    return channels


def p2p_max_Bps(size_bytes: float, n_ranks: int, num_nodes: int, nic_GBps: float = 0.0,
                env: NcclEnv = DEFAULT) -> float:
    """Bandwidth ceiling of one send: its channels times what one P2P channel carries."""
    return p2p_send_channels(size_bytes, n_ranks, num_nodes, nic_GBps, env) * P2P_PER_CHANNEL_GBPS * GB


# --- NVLS channels (NCCL 2.30.7) ------------------------------------------------------------------
# transport/nvls.cc: NVLS_NCHANNELS_SM90 16 and NVLS_NCHANNELS_SM100 32 channels (multi-node); the
# chunking of NVLSTree and Tree/Simple pipelines is in ``cost/nccl_fill``.
NVLS_CHANNELS = {"hopper": 16, "blackwell": 32}
