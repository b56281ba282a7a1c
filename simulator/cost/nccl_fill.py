"""Pipeline fill of NCCL's store-and-forward collectives: the time their tuner's model leaves out.

NCCL's Simple protocol forwards a chunk only once it has arrived whole (ProtoSimple<1, 1>: one step
per chunk, posted when its data is written). A collective whose chunks cross several hops in turn
therefore takes, beyond the steady-state bandwidth term (one chunk per step at the slowest hop's
rate, which ``cost/collectives`` times through the links), the time its first chunk needs to cross
every other hop: the pipeline's fill. NCCL's tuner (tuning.cc) has no such term, so it picks
without it (``collectives._pick``) and the chosen algorithm's time then carries it. Two pipelines:

- NVLSTree (NVLink SHARP inside each node, a tree between nodes): its concurrentOps = channels x
  heads pipelines, each holding one chunk per network hop of the tree;
- Tree with Simple (double binary tree between nodes, a chain inside each): a channel's first chunk
  climbs the node's chain and the tree, then comes down the same way (runTreeSplit), hop by hop.

NCCL 2.30.7 throughout (src/enqueue.cc calcCollChunking, src/device/all_reduce.h).
"""

from __future__ import annotations

import math

from .nccl_tuner import NVLS_CHANNELS

# --- NVLSTree chunking ----------------------------------------------------------------------------
# NCCL_NVLS_CHUNKSIZE 128 KB; NCCL_NVLSTREE_MAX_CHUNKSIZE defaults to 64 KB from 4 nodes on, else the
# chunk size (transport/nvls.cc).
NVLS_CHUNK_BYTES = 128 * 1024
NVLS_TREE_MAX_CHUNK_BYTES_4NODES = 64 * 1024
# enqueue.cc calcCollChunking, NVLS_TREE: the chunk is cut to 256K / 128K / 64K / 32K while nBytes is
# below 32 / 16 / 4 / 1 x concurrentOps x chunk (concurrentOps = nChannels x nHeads).
NVLS_TREE_CHUNK_CUTS = ((32, 262144), (16, 131072), (4, 65536), (1, 32768))
# --- Tree/Simple chunking -------------------------------------------------------------------------
# include/device.h: NCCL_STEPS 8 steps per connection buffer; enqueue.cc calcCollChunking: stepSize =
# buffSizes[SIMPLE] / NCCL_STEPS and chunkSteps = 1 for every algorithm but Ring, and Tree/Simple
# keeps that chunk at every size (only Tree/LL128, CollNet, NVLS and NVLSTree cut theirs).
NCCL_STEPS = 8


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


def tree_simple_chunk_bytes(size_bytes: float, channels: int, buffsize_bytes: int) -> float:
    """One chunk of a Tree/Simple collective: NCCL_BUFFSIZE / NCCL_STEPS, or a channel's whole share
    of the collective when that is less."""
    return min(buffsize_bytes / NCCL_STEPS, size_bytes / max(1, channels))


def tree_simple_fill_s(size_bytes: float, ppn: int, num_nodes: int, channels: int, buffsize_bytes: int,
                       nvlink_Bps: float, network_Bps: float) -> float:
    """Seconds a Tree/Simple all-reduce's pipeline takes to fill: each channel's first chunk crosses
    the node's chain up (ppn - 1 NVLink hops) and the tree up (log2i(nNodes) network hops), then the
    same hops down, one hop after the other (store and forward). The ``channels`` run side by side,
    so a hop moves a chunk at its link's rate over the channels sharing it: ``nvlink_Bps`` a GPU's
    NVLink, ``network_Bps`` the NICs of a node the group uses. The slowest hop's chunk is the one the
    bandwidth term already counts. 0 inside one node (NCCL's tree runs across nodes)."""
    if num_nodes < 2 or size_bytes <= 0:
        return 0.0
    chunk = tree_simple_chunk_bytes(size_bytes, channels, buffsize_bytes)
    nvlink_hop_s = chunk * channels / nvlink_Bps if ppn > 1 else 0.0
    network_hop_s = chunk * channels / network_Bps
    hops_s = 2 * (ppn - 1) * nvlink_hop_s + 2 * int(math.log2(num_nodes)) * network_hop_s
    return hops_s - max(nvlink_hop_s, network_hop_s)
