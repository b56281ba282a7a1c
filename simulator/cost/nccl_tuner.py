"""NCCL's tuning model: latencies and bandwidth factors per algorithm and protocol.

NCCL picks, for every collective call, the (algorithm, protocol) pair with the smallest predicted
time latency + size / bandwidth (src/graph/tuning.cc, ncclTopoTuneModel / ncclTopoGetAlgoTime).
This module holds those constants; ``cost/collectives`` supplies the bandwidth part from flows
over the real links and makes the same choice. Constants are NCCL 2.19's unless noted.
"""

from __future__ import annotations

import math

from ..units import GB, US

# Which algorithms implement each op. "hierarchical" is not an NCCL algorithm (Horovod/Megatron
# style two-level all-reduce); it is offered as an explicit choice, never picked automatically.
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

# tuning.cc baseLat [algorithm][protocol], microseconds (LL, LL128, Simple).
BASE_LAT_US = {"tree": (6.8, 14.0, 0.0), "ring": (6.6, 14.0, 8.4), "nvls": (0.0, 0.0, 0.0),
               "nvls_tree": (0.0, 0.0, 0.0)}
# tuning.cc hwLat [hardware][algorithm][protocol], microseconds per step (NVLink and network).
HW_LAT_US = {
    "nvlink": {"tree": (0.6, 1.25, 28.0), "ring": (0.6, 1.9, 3.4), "nvls": (0.0, 0.0, 23.0),
               "nvls_tree": (0.0, 0.0, 23.0)},
    "net": {"tree": (5.0, 8.5, 28.0), "ring": (2.7, 4.0, 14.0), "nvls": (0.0, 0.0, 18.0),
            "nvls_tree": (0.0, 0.0, 14.0)},
}
# tuning.cc model refinements of the bus bandwidth:
RING_LL128_EFFICIENCY = 0.92  # "busBw * 0.92 /*120.0/128.0*/": LL128 carries 120 B per 128 B line
TREE_EFFICIENCY = 0.92  # "if (a == NCCL_ALGO_TREE) busBw = std::min(busBw*.92, ...)"
TREE_LL_EFFICIENCY = 1.0 / 3.8  # "busBw*1.0/3.8" for Tree/LL
TREE_LL128_EFFICIENCY_1NODE = 7.0 / 9.0  # "nNodes == 1 ? 7.0/9.0 : 120.0/128.0"
TREE_LL128_EFFICIENCY = 120.0 / 128.0
# "ratio *= 5.0/6.0" for NVLS and NVLS_TREE: NVLink SHARP multimem traffic runs at 5/6 of the NVLink
# rate. cost/algorithms applies it to the NVLink flows only, so that the network part of NVLSTree
# runs at the NICs' rate.
NVLS_EFFICIENCY = 5.0 / 6.0
# Ring/LL: "busBw * ((nNodes > 1 || coll == AllReduce || coll == Reduce) ? 1.0/4.0 : 1.0/3.0)";
# an LL line carries 4 B of data and a 4 B flag in each 8 B store.
RING_LL_EFFICIENCY_MULTI = 1.0 / 4.0
RING_LL_EFFICIENCY_1NODE = 1.0 / 3.0
# Per-channel bandwidth ceilings (tuning.cc, GB/s of bus bandwidth per channel), indexed by
# nNodes = 1, 2, >2. Trees: perChMaxTreeBws / perChMaxTreeLL128Bws; LL: llMaxBws, picked by GPU
# generation inside one node and by CPU vendor across nodes.
PER_CH_MAX_TREE_GBPS = {"ampere": (24.0, 23.6, 17.8), "hopper": (38.7, 41.4, 36.0)}
PER_CH_MAX_TREE_LL128_GBPS = {"ampere": (20.0, 20.0, 20.0), "hopper": (36.7, 36.7, 29.0)}
# NVLSTree: NCCL 2.28 (src/graph/tuning.cc perChMaxNVLSTreeBws, Hopper {0.0, 57.7, 45.5}, Blackwell
# {0.0, 96.0, 43.1}, nNodes = 1, 2, >2) caps its bus bandwidth per NVLS channel; the search gives one
# NVLS channel per head, a GPU with its own NIC. 2.19-2.27 took min(bwIntra, bwInter) per channel
# with no ceiling, a bound NVLSTree does not reach: 2 x 8 H100 with 8 x 400 Gb/s measure 467 GB/s
# busbw at 8 GB (dstack Nebius example) against the 8 x 57.7 = 462 of this ceiling.
PER_CH_MAX_NVLS_TREE_GBPS = {"hopper": (0.0, 57.7, 45.5), "blackwell": (0.0, 96.0, 43.1)}
LL_MAX_GBPS_1NODE = {"ampere": 87.7, "hopper": 87.7}
LL_MAX_GBPS_MULTI = {"amd": (22.5, 19.0), "intel": (39.0, 20.4)}
# Host CPUs: DGX A100 has 2 x AMD EPYC 7742, DGX H100/H200 2 x Intel Xeon 8480C (DGX datasheets).
# DGX B200 has 2 x Intel Xeon 8570; GB200's Grace (Arm) takes tuning.cc's non-AMD rows.
CPU_VENDOR = {"ampere": "amd", "hopper": "intel", "blackwell": "intel"}
NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0}
# tuning.cc treeCorrectionFactor[protocol][log2(bytes/64)], 64 B .. 128 MB: "Trees are not
# perfectly sticking to the model for medium sizes".
TREE_CORRECTION = {
    "ll": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0,
           1.0, 1.0),
    "ll128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .5, .6, .6, .7, .7, .8, .9,
              .9, 1.0),
    "simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .5, .5, .6, .6, .7, .8,
               .9),
}
# NCCL runs all-to-all as grouped send/recv (P2P kernels, one channel per peer), which do not reach
# the collective kernels' bandwidth: NVIDIA/nccl#1138 measures 19.83 GB/s alltoall busbw on two
# DGX-class nodes (8 A100, 4 x 200 Gb/s NICs) against 22.5 GB/s that N/(N-1) x the per-GPU NIC
# bandwidth (at IB_EFFICIENCY) gives: 0.88.
ALL_TO_ALL_EFFICIENCY = 0.88
# NCCL sends P2P messages of up to NCCL_P2P_LL_THRESHOLD = 16384 bytes per peer with the LL
# protocol, larger ones with Simple (NCCL environment-variable documentation).
P2P_LL_THRESHOLD_BYTES = 16384


# NCCL settings a fabric's vendor prescribes for every job (NCCL_ALGO, NCCL_PROTO; NVLS off is the
# cluster's nvls = false): (algorithms, protocols) the tuner may pick for collectives.
# - GPUDirect-TCPX (GCP A3 High): NCCL_ALGO=Ring, NCCL_PROTO=Simple (Google's GPUDirect-TCPX NCCL
#   environment, as dstack's examples/clusters/a3high sets it).
# - GPUDirect-TCPXO (GCP A3 Mega): nccl-env-profile.sh shipped with the TCPXO plugin: NCCL_ALGO=Ring,Tree,
#   NCCL_PROTO=Simple, NCCL_NVLS_ENABLE=0.
FABRIC_NCCL: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "tcpx": (("ring",), ("simple",)),
    "tcpxo": (("ring", "tree"), ("simple",)),
}


def allowed(fabric: str, algorithm: str, protocol: str) -> bool:
    """Whether the fabric's prescribed NCCL settings let the tuner pick this pair (P2P-based
    all-to-all and send/recv are not collectives' algorithms and stay free)."""
    if fabric not in FABRIC_NCCL or algorithm in ("direct", "p2p"):
        return True
    algs, protos = FABRIC_NCCL[fabric]
    return algorithm in algs and protocol in protos


def protocols_for(algorithm: str) -> tuple[str, ...]:
    """NVLS and NVLSTree run Simple only; P2P-based algorithms use LL or Simple; the others all three."""
    if algorithm in ("nvls", "nvls_tree"):
        return ("simple",)
    if algorithm in ("direct", "p2p"):
        return ("ll", "simple")
    return PROTOCOLS


def efficiency(algorithm: str, protocol: str, op: str, num_nodes: int) -> float:
    """Fraction of the links' bandwidth the (algorithm, protocol) pair delivers (tuning.cc)."""
    if protocol not in protocols_for(algorithm):
        raise ValueError(f"algorithm {algorithm!r} has no protocol {protocol!r}; "
                         f"known: {', '.join(protocols_for(algorithm))}")
    if algorithm in ("nvls", "nvls_tree"):
        return 1.0  # NVLS_EFFICIENCY is in the NVLink flows' sizes (cost/algorithms.nvls_flows)
    alg = ALL_TO_ALL_EFFICIENCY if algorithm == "direct" else 1.0
    if algorithm == "tree":
        alg = TREE_EFFICIENCY
        if protocol == "ll":
            return alg * TREE_LL_EFFICIENCY
        if protocol == "ll128":
            return alg * (TREE_LL128_EFFICIENCY_1NODE if num_nodes == 1 else TREE_LL128_EFFICIENCY)
        return alg
    if protocol == "ll":
        multi = num_nodes > 1 or op == "all_reduce"
        return alg * (RING_LL_EFFICIENCY_MULTI if multi else RING_LL_EFFICIENCY_1NODE)
    if protocol == "ll128":
        return alg * RING_LL128_EFFICIENCY
    return alg


def tree_correction(protocol: str, size_bytes: float) -> float:
    index = int(size_bytes) >> 6
    index = index.bit_length() - 1 if index > 0 else 0
    table = TREE_CORRECTION[protocol]
    return table[index] if index < len(table) else 1.0


def max_busbw_Bps(algorithm: str, protocol: str, architecture: str, num_nodes: int,
                  channels: int) -> float:
    """Bus-bandwidth ceiling of NCCL's tuner (inf when none): trees and NVLSTree per channel, LL
    overall."""
    k = 0 if num_nodes == 1 else 1 if num_nodes == 2 else 2
    cap = float("inf")
    if algorithm == "nvls_tree" and architecture in PER_CH_MAX_NVLS_TREE_GBPS:
        return channels * PER_CH_MAX_NVLS_TREE_GBPS[architecture][k] * GB
    if algorithm == "tree" and architecture in PER_CH_MAX_TREE_GBPS:
        table = PER_CH_MAX_TREE_LL128_GBPS if protocol == "ll128" else PER_CH_MAX_TREE_GBPS
        cap = channels * table[architecture][k] * GB
    if protocol == "ll" and algorithm in ("ring", "tree"):
        if num_nodes == 1:
            ll = LL_MAX_GBPS_1NODE.get(architecture)
        else:
            vendor = CPU_VENDOR.get(architecture)
            ll = LL_MAX_GBPS_MULTI[vendor][k - 1] if vendor else None
        if ll is not None:
            cap = min(cap, ll * GB)
    return cap


def _hw(num_nodes: int) -> str:
    return "net" if num_nodes > 1 else "nvlink"


def net_overhead_us(architecture: str, protocol: str) -> float:
    """tuning.cc getNetOverhead: "Inter-node rings still have to launch nsteps * net overhead": 1 us
    per step on Intel (and other) hosts, 2 us on AMD ones, x3 with Simple."""
    us = NET_OVERHEAD_US.get(CPU_VENDOR.get(architecture, ""), 1.0)
    return us * 3 if protocol == "simple" else us


def ring_latency_s(protocol: str, nsteps: int, n_inter: int, architecture: str = "") -> tuple[float, float]:
    """(base, per-step average) for a ring of ``nsteps`` steps, ``n_inter`` of them crossing nodes:
    baseLat + (nsteps - nInterSteps) * max(intraLat, netOverhead) + nInterSteps * interLat
    (tuning.cc; the net overhead only when the ring spans nodes)."""
    p = _P[protocol]
    intra = HW_LAT_US["nvlink"]["ring"][p]
    if n_inter > 0:
        intra = max(intra, net_overhead_us(architecture, protocol))
    total = (nsteps - n_inter) * intra + n_inter * HW_LAT_US["net"]["ring"][p]
    return BASE_LAT_US["ring"][p] * US, (total / nsteps if nsteps else 0.0) * US


# tuning.cc ncclTopoGetAlgoTime (2.19-2.23): "Plateau effect of ring": a Simple all-reduce ring across
# nodes has its latency x1.4 (x1.9 before Ampere) once nBytes / (nChannels * nRanks) >= 64.
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
    """nInterSteps of tuning.cc: 2*nNodes for all-reduce (at most the 2(n-1) steps), nNodes-1
    for all-gather / reduce-scatter, nNodes for broadcast; 0 inside one node."""
    if num_nodes <= 1:
        return 0
    if op == "all_reduce":
        return min(2 * num_nodes, 2 * (n - 1))
    if op in ("all_gather", "reduce_scatter"):
        return num_nodes - 1
    return min(num_nodes, n - 1)


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
    lat = HW_LAT_US["nvlink"]["nvls"][2]
    if num_nodes > 1:
        lat += HW_LAT_US["net"]["nvls"][2]
    return lat * US


def p2p_latency_s(protocol: str, num_nodes: int) -> float:
    """A P2P transfer (and each peer of an all-to-all, all issued at once) is one ring step:
    ring baseLat + one hwLat step over NVLink or the network."""
    return base_latency_s("ring", protocol) + step_latency_s("ring", protocol, _hw(num_nodes))


def p2p_protocol(bytes_per_peer: float) -> str:
    return "ll" if bytes_per_peer <= P2P_LL_THRESHOLD_BYTES else "simple"


# --- P2P channels (NCCL 2.30.7, src/enqueue.cc addP2pToPlan / scheduleP2pTasksToPlan) ----------------
# A send runs on nChannels P2P channels, each one CTA; the count depends on the size, so small and
# medium sends run on few channels. paths.cc ncclTopoGetNchannels gives an NVLink peer
# 2 * path_bw / nvlBw channels, pow2Up'ed (ncclTopoComputeP2pChannels); NVSwitch nodes print
# "32 p2p channels, 32 p2p channels per peer" (NCCL INFO on 8 x A100 and on p5.48xlarge 8 x H100).
P2P_NVL_CHANNELS = 32
P2P_NVL_CHANNELS_PER_PEER = 32
# paths.cc NCCL_P2P_PER_CHANNEL_NET_BW = 14 GB/s: NCCL's figure for what one P2P channel carries; it
# gives a network peer max(NICs, ceil(NIC GB/s / 14)) channels. One P2P channel is one CTA running
# the same copy loop over either transport, so it bounds NVLink P2P channels too.
P2P_PER_CHANNEL_GBPS = 14.0
# NCCL_MAX_DEV_WORK_P2P_PER_BATCH (device.h): peers per work batch in paths.cc's per-peer halving.
P2P_PEERS_PER_BATCH = 8
# init.cc computeBuffSizes: p2pChunkSize = NCCL_P2P_NVL_CHUNKSIZE 512 KB inside an NVLink node,
# NCCL_P2P_NET_CHUNKSIZE 128 KB once the communicator spans nodes.
P2P_NVL_CHUNK_BYTES = 512 * 1024
P2P_NET_CHUNK_BYTES = 128 * 1024


def _pow2_up(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def p2p_channels_per_peer(num_nodes: int, n_ranks: int, nic_GBps: float) -> int:
    """p2pnChannelsPerPeer: 32 over NVLink; across nodes max(1 NIC, ceil(NIC / 14 GB/s)), pow2Up,
    halved while it times ceil(nRanks / 8) exceeds the 32 P2P channels (paths.cc)."""
    if num_nodes <= 1:
        return P2P_NVL_CHANNELS_PER_PEER
    per_peer = _pow2_up(max(1, math.ceil(nic_GBps / P2P_PER_CHANNEL_GBPS)))
    while per_peer * -(-n_ranks // P2P_PEERS_PER_BATCH) > P2P_NVL_CHANNELS and per_peer > 1:
        per_peer //= 2
    return min(per_peer, P2P_NVL_CHANNELS)


def p2p_send_channels(size_bytes: float, n_ranks: int, num_nodes: int, nic_GBps: float = 0.0) -> int:
    """Channels one send of ``size_bytes`` runs on (enqueue.cc): nChannelsMin is the per-peer count
    halved until nChannelsMin * nRanks <= p2pnChannels; a send starts on min(nChannelsMin,
    ceil(bytes / minPartSize)) and doubles while its part exceeds maxPartSize (chunk * 32 in one
    node, one chunk across nodes) and the count stays <= half the per-peer maximum."""
    most = p2p_channels_per_peer(num_nodes, n_ranks, nic_GBps)
    least = most
    while least * n_ranks > P2P_NVL_CHANNELS and least > 1:
        least //= 2
    step = P2P_NVL_CHUNK_BYTES if num_nodes <= 1 else P2P_NET_CHUNK_BYTES
    min_part, max_part = (step // 8, step * 32) if num_nodes <= 1 else (step // 2, step)
    size = max(1, int(size_bytes))
    channels = max(1, min(least, -(-size // min_part)))
    part = max(min_part, -(-size // channels))
    while part > max_part and channels <= most // 2:
        channels *= 2
        part = -(-size // channels)
    return channels


def p2p_max_Bps(size_bytes: float, n_ranks: int, num_nodes: int, nic_GBps: float = 0.0) -> float:
    """Bandwidth ceiling of one send: its channels times what one P2P channel carries."""
    return p2p_send_channels(size_bytes, n_ranks, num_nodes, nic_GBps) * P2P_PER_CHANNEL_GBPS * GB


# --- NVLSTree chunking (NCCL 2.30.7) -------------------------------------------------------------
# transport/nvls.cc: NVLS_NCHANNELS_SM90 16 and NVLS_NCHANNELS_SM100 32 channels (multi-node);
# NCCL_NVLS_CHUNKSIZE 128 KB; NCCL_NVLSTREE_MAX_CHUNKSIZE defaults to 64 KB from 4 nodes on, else the
# chunk size.
NVLS_CHANNELS = {"hopper": 16, "blackwell": 32}
NVLS_CHUNK_BYTES = 128 * 1024
NVLS_TREE_MAX_CHUNK_BYTES_4NODES = 64 * 1024
# enqueue.cc calcCollChunking, NVLS_TREE: the chunk is cut to 256K / 128K / 64K / 32K while nBytes is
# below 32 / 16 / 4 / 1 x concurrentOps x chunk (concurrentOps = nChannels x nHeads).
NVLS_TREE_CHUNK_CUTS = ((32, 262144), (16, 131072), (4, 65536), (1, 32768))


def nvls_tree_chunk_bytes(size_bytes: float, concurrent_ops: int, num_nodes: int) -> int:
    chunk = NVLS_CHUNK_BYTES if num_nodes < 4 else min(NVLS_CHUNK_BYTES, NVLS_TREE_MAX_CHUNK_BYTES_4NODES)
    for times, floor in NVLS_TREE_CHUNK_CUTS:
        if size_bytes < times * concurrent_ops * chunk and chunk > floor:
            chunk = floor
    return chunk


def nvls_tree_pipeline_bytes(size_bytes: float, architecture: str, heads: int, num_nodes: int) -> float:
    """Bytes of the collective whose transfer time the NVLSTree pipeline adds before the first
    chunk comes back: the collective runs as concurrentOps = channels x heads independent
    pipelines, each moving its share in chunks; Simple forwards a chunk only once it has arrived
    whole (store and forward), so each of the 2 x log2(nNodes) network hops of the tree (the hops
    tuning.cc charges interLat for) holds one chunk per pipeline: a chunk's worth of time at the
    pipeline's rate, i.e. ops x chunk bytes of the collective (all of it when a pipeline holds
    less than a chunk)."""
    ops = NVLS_CHANNELS.get(architecture, NVLS_CHANNELS["hopper"]) * max(1, heads)
    chunk = nvls_tree_chunk_bytes(size_bytes, ops, num_nodes)
    hops = 2 * int(math.log2(num_nodes))
    return hops * min(float(size_bytes), float(ops * chunk))
