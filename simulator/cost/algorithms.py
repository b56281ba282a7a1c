"""How NCCL's algorithms move a collective's bytes: each one as phases of concurrent flows.

Ring (one ring per rail used, rail-aligned across nodes, as NCCL builds one ring per NIC), double
binary tree, NVLink SHARP inside a node and NVLSTree across nodes, hierarchical, direct all-to-all and P2P; sizes are for a 1-byte
collective, so ``cost/collectives`` scales them and adds NCCL's latencies.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat

from ..hardware.topology import Topology
from . import nccl_tuner as tuner
from .nccl_env import env_for
from .plan import Flow, make_flows


@dataclass(frozen=True, slots=True)
class GroupShape:
    """How a group sits on the nodes: nodes in order of first appearance, ranks per node."""

    n: int
    per_node: tuple[tuple[int, ...], ...]  # each node's ranks, sorted by local index
    uniform: bool  # every node holds the same local indices
    rails: int  # distinct NICs among one node's ranks (uniform groups), else 1

    @property
    def num_nodes(self) -> int:
        return len(self.per_node)

    @property
    def ppn(self) -> int:
        return max(len(r) for r in self.per_node)


def group_shape(group: tuple[int, ...], topo: Topology) -> GroupShape:
    """How ``group`` sits on ``topo``'s nodes, made once per group and topology (a step asks again
    for each collective of a group: GPT-3 175B at DP 128, 666 times for 63 groups)."""
    memo = topo.memo.setdefault("group_shape", {})
    shape = memo.get(group)
    if shape is None:
        shape = memo[group] = _group_shape(group, topo)
    return shape


def _group_shape(group: tuple[int, ...], topo: Topology) -> GroupShape:
    nodes: dict[int, list[int]] = {}
    for r in group:
        nodes.setdefault(topo.node_of(r), []).append(r)
    per_node = tuple(tuple(sorted(rs)) for rs in nodes.values())
    locals_ = {tuple(topo.local_of(r) for r in rs) for rs in per_node}
    uniform = len(locals_) == 1
    rails = len({topo.rail_of(r) for r in per_node[0]}) if uniform else 1
    return GroupShape(len(group), per_node, uniform, rails)


@dataclass(frozen=True, slots=True)
class Phase:
    """``repeat`` identical steps of concurrent flows, with the latency class of their steps."""

    repeat: int
    tag: str  # latency class: ring | bcast | tree | nvls | p2p | intra | inter
    flows: tuple[Flow, ...]  # bytes per step for a collective of size 1 byte


def _flow(topo: Topology, src: int, dst: int, size: float) -> Flow:
    return Flow(topo.route(src, dst), size)


def ring_orders(shape: GroupShape, group: tuple[int, ...]) -> list[tuple[int, ...]]:
    """One ring per rail used when a uniform group spans nodes (NCCL builds one ring per NIC):
    ring c enters node j at local position (c*step - j) mod ppn and leaves it from the GPU that
    precedes it, whose rail the next node enters on, so inter-node hops stay on one rail."""
    if shape.num_nodes == 1 or not shape.uniform or shape.ppn == 1:
        return [tuple(group)]
    ppn, step = shape.ppn, shape.ppn // shape.rails
    orders = []
    for c in range(shape.rails):
        order: list[int] = []
        for j, ranks in enumerate(shape.per_node):
            s = (c * step - j) % ppn
            order.extend(ranks[s:] + ranks[:s])
        orders.append(tuple(order))
    return orders


def ring_hops(topo: Topology, orders: list[tuple[int, ...]], size: float,
               chain: bool = False) -> tuple[Flow, ...]:
    flows = []
    for order in orders:
        n = len(order)
        for i in range(n - 1 if chain else n):
            flows.append(_flow(topo, order[i], order[(i + 1) % n], size))
    return tuple(flows)


def tree_flows(topo: Topology, shape: GroupShape) -> tuple[Flow, ...]:
    """Double binary tree (NCCL): per channel an intra-node chain to the node's head GPU and two
    complementary binary trees over the nodes (each node is interior in at most one), each tree
    carrying half the data; reduce (up) and broadcast (down) pipelined, so all flows concurrent."""
    big = shape.num_nodes > 1 and shape.uniform and shape.ppn > 1
    channels = shape.rails if big else 1
    step = shape.ppn // channels
    n_nodes = shape.num_nodes
    flows: list[Flow] = []
    for c in range(channels):
        heads = []
        for ranks in shape.per_node:
            s = (c * step) % len(ranks)
            chain = ranks[s:] + ranks[:s]
            heads.append(chain[0])
            for a, b in zip(chain, chain[1:]):
                flows += [_flow(topo, a, b, 1 / channels), _flow(topo, b, a, 1 / channels)]
        half = 1 / (2 * channels)
        for j, parent in double_tree_edges(n_nodes):
            flows += [_flow(topo, heads[j], heads[parent], half),
                      _flow(topo, heads[parent], heads[j], half)]
    return tuple(flows)


def nvls_flows(topo: Topology, group: tuple[int, ...]) -> tuple[Flow, ...]:
    """NVLink SHARP: multimem.ld_reduce pulls every shard through the switch (S out per GPU, S/n
    back), multimem.st multicasts each reduced shard (S/n out, S in): S(1 + 1/n) each way, at
    nvlsEfficiency of the NVLink rate (carried as that many more bytes)."""
    n = len(group)
    node = topo.node_of(group[0])
    per_gpu = (1 + 1 / n) / tuner.nvls_efficiency(topo.cluster.gpu.architecture)
    flows = []
    for r in group:
        flows += [Flow(((f"gpu{r}", f"nvs{node}"),), per_gpu),
                  Flow(((f"nvs{node}", f"gpu{r}"),), per_gpu)]
    return tuple(flows)


def double_tree_edges(n_nodes: int) -> list[tuple[int, int]]:
    """(child, parent) node indices of NCCL's two complementary binary trees (the second mirrors the
    first, so each node is interior in at most one); each tree carries half of the data."""
    edges = []
    for mirror in (False, True):
        for j in range(n_nodes):
            q = n_nodes - 1 - j if mirror else j
            if q == 0:
                continue
            pq = (q - 1) // 2
            edges.append((j, n_nodes - 1 - pq if mirror else pq))
    return edges


def nvls_tree_flows(topo: Topology, shape: GroupShape) -> tuple[Flow, ...]:
    """NCCL's NVLSTree all-reduce: inside each node NVLink SHARP reduces and multicasts as in
    ``nvls_flows``; the node-reduced shard of local rank k (S/ppn) goes up and the result comes back
    down a double binary tree over the nodes between the k-th GPUs (through their NICs), pipelined,
    so all flows run at once."""
    ppn = shape.ppn
    flows: list[Flow] = []
    for ranks in shape.per_node:
        flows += nvls_flows(topo, ranks)
    half = 1 / (2 * ppn)
    for child, parent in double_tree_edges(shape.num_nodes):
        for a, b in zip(shape.per_node[child], shape.per_node[parent]):
            flows += [_flow(topo, a, b, half), _flow(topo, b, a, half)]
    return tuple(flows)


def hierarchical_phases(topo: Topology, shape: GroupShape) -> list[Phase]:
    if not shape.uniform:
        raise ValueError("algorithm 'hierarchical' needs the same local GPUs on every node; "
                         f"group has {[len(r) for r in shape.per_node]} GPUs per node")
    ppn, n_nodes = shape.ppn, shape.num_nodes
    intra = tuple(f for ranks in shape.per_node for f in ring_hops(topo, [ranks], 1 / ppn))
    rails = [tuple(ranks[k] for ranks in shape.per_node) for k in range(ppn)]
    inter = ring_hops(topo, rails, 1 / (ppn * n_nodes))
    phases = [Phase(ppn - 1, "intra", intra), Phase(2 * (n_nodes - 1), "inter", inter),
              Phase(ppn - 1, "intra", intra)]
    return [p for p in phases if p.repeat > 0]


def _p2p_flow(topo: Topology, src: int, dst: int, size: float) -> Flow:
    """A point-to-point transfer on NCCL's P2P path: PXN across rails (``Topology.p2p_route``) unless
    the fabric's environment sets NCCL_P2P_PXN_LEVEL=0 (``NcclEnv.pxn``), then the sender's own NIC."""
    pxn = env_for(topo.cluster).pxn
    return Flow(topo.p2p_route(src, dst) if pxn else topo.route(src, dst), size)


def direct_flows(topo: Topology, group: tuple[int, ...]) -> tuple[Flow, ...]:
    """all_to_all: NCCL's grouped send/recv, one transfer per ordered pair of ranks (PXN as above)."""
    if env_for(topo.cluster).pxn:
        routes = topo.p2p_routes(group)
    else:
        routes = [topo.route(a, b) for a in group for b in group if a != b]
    return make_flows(routes, repeat(1 / len(group)), repeat(1.0))


def p2p_flows(topo: Topology, group: tuple[int, ...]) -> tuple[Flow, ...]:
    """send_recv: (src, dst) is one transfer; a longer group shifts by one around the group,
    every rank sending to the next (nccl-tests sendrecv_perf)."""
    if len(group) == 2:
        return (_p2p_flow(topo, group[0], group[1], 1.0),)
    n = len(group)
    return tuple(_p2p_flow(topo, group[i], group[(i + 1) % n], 1.0) for i in range(n))
