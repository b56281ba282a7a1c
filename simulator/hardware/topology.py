"""Topology: the cluster as directed links (NVSwitch, PCIe, NICs, leaf/spine switches) and routes.

Each link (u, v) carries an application-level bandwidth (datasheet line rate x the protocol
efficiency of its link type) and a latency; ``cost/collectives`` routes flows over these links and
``engine/network`` shares their bandwidth. Routes are computed in closed form, never by search.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from ..units import GB, NS, US
from .clusters import TOPOLOGIES, ClusterSpec
from .link_table import SPINE, LinkLayout, LinkTable

if TYPE_CHECKING:
    import networkx as nx

LinkId = tuple  # (u, v): a directed edge of Topology.graph

# Application-level efficiency per link type: the fraction of the line rate that bulk
# GPU-initiated transfers reach. One constant per link type, never per measurement.
# - NVLink: NCCL's topology model (src/graph/topo.h) counts SM80_NVLINK_BW = 20.0 GB/s per
#   25 GB/s NVLink3 link and SM90_NVLINK_BW = 20.6 GB/s per NVLink4 link; NCCL maintainers:
#   "the app-level bandwidth is 80% of the peak bandwidth" (NVIDIA/nccl#1054) and "370GB/s in
#   each direction" on H100 (NVIDIA/nccl#1442): 128 B payloads with headers, both directions.
#   NVLink5 (Blackwell): SM100_NVLINK_BW = 40.1 GB/s per 50 GB/s link (same file).
NVLINK_EFFICIENCY = {"ampere": 20.0 / 25.0, "hopper": 20.6 / 25.0, "blackwell": 40.1 / 50.0}
# - InfiniBand: "CX-7 NICs at NDR rate (400Gbps) should achieve up to 48-49GB/s per NIC"
#   (NVIDIA/nccl-tests#267, NVIDIA); SimAI (aliyun/SimAI calbusbw.h) uses 23.5 of 25 GB/s for
#   ConnectX-6 HDR and 48.5 of 50 GB/s for ConnectX-7 NDR. 0.96 is the middle of 0.94-0.98.
IB_EFFICIENCY = 0.96
# - Other fabrics: the same transfer engine, scaled by the share of the wire their per-packet
#   headers leave to payload, relative to InfiniBand's (4096 B MTU; LRH 8 + BTH 12 + ICRC 4 + VCRC 2
#   = 26 B per packet: 0.9937). RoCEv2 (4096 B MTU): Ethernet preamble/SFD 8 + header 14 + FCS 4 +
#   inter-frame gap 12, IPv4 20, UDP 8, BTH 12, ICRC 4 = 82 B: 0.9804 (IBTA RoCEv2 annex A17).
#   GPUDirect-TCPX/TCPXO (GCP A3; IP MTU 8,244 B as Google's setup guides create the data VPCs):
#   IPv4 20 + TCP with timestamps 32 inside it, Ethernet framing 38 outside: 8,192 / 8,282 = 0.9891.
_IB_PAYLOAD = 4096 / (4096 + 26)
FABRIC_EFFICIENCY = {"infiniband": IB_EFFICIENCY,
                     "roce": IB_EFFICIENCY * (4096 / (4096 + 82)) / _IB_PAYLOAD,
                     "tcpx": IB_EFFICIENCY * (8192 / 8282) / _IB_PAYLOAD,
                     "tcpxo": IB_EFFICIENCY * (8192 / 8282) / _IB_PAYLOAD}
# - PCIe: SimAI calbusbw.h A100_PCIE_BW = 32*0.8 and H100_PCIE_BW = 64*0.8 GB/s (TLP headers,
#   128b/130b encoding and flow-control credits).
PCIE_EFFICIENCY = 0.8

# Per-link latency, seconds. NCCL's tuner (src/graph/tuning.cc, hwLat, LL protocol) charges
# 0.6 us per NVLink step (GPU -> NVSwitch -> GPU: two links), 1.0 us per PCIe step (two links) and
# 2.7 us per network step (GPU -> PCIe -> NIC -> leaf -> NIC -> PCIe -> GPU: four PCIe links, the
# rest on the two NIC links). Crossing the spine adds two switch hops of ~130 ns port-to-port
# (NVIDIA Quantum QM8700 / Quantum-2 QM9700 datasheets).
LINK_LATENCY_S = {"nvlink": 0.3 * US, "pcie": 0.5 * US, "nic": (2.7 - 4 * 0.5) / 2 * US,
                  "leaf-spine": 130 * NS}

# Leaf switch radix: NVIDIA Quantum QM8700 (HDR 200 Gb/s) has 40 ports, Quantum-2 QM9700
# (NDR 400 Gb/s) 64 ports; half face the nodes, half the spines (DGX SuperPOD reference
# architectures: 20-node A100 and 32-node H100 scalable units, one leaf per rail per unit).
HDR_LEAF_PORTS = 40
NDR_LEAF_PORTS = 64
NDR_GBPS = 400

# The spine layer under adaptive routing. InfiniBand switches pick, per packet, the least loaded of
# the uplinks that lead to the destination (NVIDIA, "InfiniBand Cluster Bring-up Procedure":
# adaptive routing is enabled by default in opensm.conf, TREE algorithm for fat trees), and NCCL
# uses adaptive-routing-capable transfers on InfiniBand by default (NCCL 2.6.4 release notes;
# NCCL_IB_ADAPTIVE_ROUTING, default 1 on IB). In the fluid limit a leaf's uplinks then act as one
# trunk of ``spine_planes`` x the port rate in each direction, shared max-min by every flow that
# leaves (or enters) the leaf, instead of one statically hashed plane per flow. Its name: ``SPINE``.


class _Gpu(NamedTuple):
    """A GPU's place and the links its routes start and end with, one tuple per link shared by every
    route that crosses it (a route used to make its own: ~170k tuples for DeepSeek-V3's all-to-alls,
    each walked by the garbage collector)."""

    node: int
    local: int
    rail: int
    leaf: str
    up: LinkId  # GPU -> its node's NVSwitch
    down: LinkId  # NVSwitch -> GPU
    out: tuple[LinkId, ...]  # GPU -> PCIe switch -> NIC -> leaf
    into: tuple[LinkId, ...]  # leaf -> NIC -> PCIe switch -> GPU
    spine: tuple[LinkId, LinkId]  # its leaf -> the spine layer, and back


@dataclass(frozen=True, slots=True, eq=False)
class Topology:
    """The cluster's link graph with per-link capacity (bytes/s per direction) and latency."""

    cluster: ClusterSpec
    capacity_Bps: LinkTable  # LinkId -> application-level bytes/s in the link's direction
    latency_s: LinkTable  # LinkId -> seconds
    layout: LinkLayout  # which links exist, by name, and the leaves' NIC-facing ports (link_table)
    spine_planes: int = 0  # uplinks per leaf, one to each spine plane, trunked by adaptive routing
    _routes: dict = field(default_factory=dict, repr=False)  # src * num_gpus + dst -> route
    _p2p: dict = field(default_factory=dict, repr=False)  # the same -> p2p_route
    _gpus: dict = field(default_factory=dict, repr=False)  # rank -> _Gpu
    # Scratch space for values derived from this topology by the layers above (collective plans
    # and times), so they live and die with it instead of in a global cache.
    memo: dict = field(default_factory=dict, repr=False)

    @property
    def graph(self) -> nx.DiGraph:
        """The links as a networkx DiGraph (edge attributes capacity_Bps, latency_s), built on first
        use: the simulation itself needs only the capacity and latency maps and the routes, and a
        16k-GPU graph costs a noticeable part of a run to build (networkx itself a fifth of a second
        to import, so it is imported here)."""
        g = self.memo.get("graph")
        if g is None:
            import networkx as nx

            g = self.memo["graph"] = nx.DiGraph()
            g.add_edges_from((u, v, {"capacity_Bps": b, "latency_s": self.latency_s[(u, v)]})
                             for (u, v), b in self.capacity_Bps.items())
        return g

    @property
    def num_gpus(self) -> int:
        return self.cluster.num_gpus

    @property
    def leaf_down_ports(self) -> int:
        """NIC-facing ports per leaf switch."""
        return self.layout.leaf_down_ports

    def _check(self, rank: int) -> None:
        if not 0 <= rank < self.cluster.num_gpus:
            raise ValueError(f"rank {rank} is outside the cluster's {self.cluster.num_gpus} GPUs")

    def node_of(self, rank: int) -> int:
        self._check(rank)
        return rank // self.cluster.gpus_per_node

    def local_of(self, rank: int) -> int:
        self._check(rank)
        return rank % self.cluster.gpus_per_node

    def rail_of(self, rank: int) -> int:
        """Index of the NIC (rail) a GPU uses: GPU i -> NIC i * nics // gpus (``LinkLayout.rail``)."""
        self._check(rank)
        return self.layout.rail(rank)

    def nic_name(self, rank: int) -> str:
        return f"nic{self.node_of(rank)}.{self.rail_of(rank)}"

    def leaf_name(self, node: int, rail: int) -> str:
        return self.layout.leaf_name(node, rail)

    def _gpu(self, rank: int) -> _Gpu:
        """The GPU's place and first and last links, made once per GPU (routes are built from them),
        and entered in the link tables with the kinds they are known to have (no name to parse when
        the engine looks them up); ``rank`` checked by the caller."""
        g = self._gpus.get(rank)
        if g is None:
            node, local = divmod(rank, self.cluster.gpus_per_node)
            rail = self.layout.rail(rank)
            gpu, nvs, pcie, nic = f"gpu{rank}", f"nvs{node}", f"pcie{rank}", f"nic{node}.{rail}"
            leaf = self.leaf_name(node, rail)
            g = self._gpus[rank] = _Gpu(
                node, local, rail, leaf, (gpu, nvs), (nvs, gpu), ((gpu, pcie), (pcie, nic), (nic, leaf)),
                ((leaf, nic), (nic, pcie), (pcie, gpu)), ((leaf, SPINE), (SPINE, leaf)))
            self._enter(g)
        return g

    def _enter(self, g: _Gpu) -> None:
        """``g``'s links into both tables (those of the fabric only where it exists)."""
        known = [(g.up, "nvlink"), (g.down, "nvlink"), (g.out[0], "pcie"), (g.out[1], "pcie"), (g.into[1], "pcie"),
                 (g.into[2], "pcie")]
        if self.cluster.num_nodes > 1:
            known += [(g.out[2], "nic"), (g.into[0], "nic")]
            if self.layout.has_spine():
                known += [(g.spine[0], "leaf-spine"), (g.spine[1], "leaf-spine")]
        self.capacity_Bps.enter(known)
        self.latency_s.enter(known)

    def _key(self, src_rank: int, dst_rank: int) -> int:
        """The routes' cache key of a pair of GPUs (ValueError outside the cluster)."""
        n = self.cluster.num_gpus
        if not (0 <= src_rank < n and 0 <= dst_rank < n):
            self._check(src_rank)
            self._check(dst_rank)
        return src_rank * n + dst_rank

    def route(self, src_rank: int, dst_rank: int) -> tuple[LinkId, ...]:
        """Links from one GPU to another: NVSwitch inside a node, else PCIe -> NIC -> fabric."""
        key = self._key(src_rank, dst_rank)
        cached = self._routes.get(key)
        if cached is None:
            cached = self._routes[key] = self._between(self._gpu(src_rank), self._gpu(dst_rank), src_rank == dst_rank)
        return cached

    def _between(self, a: _Gpu, b: _Gpu, same: bool) -> tuple[LinkId, ...]:
        if same:
            return ()
        if a.node == b.node:
            return (a.up, b.down)
        if a.leaf != b.leaf:
            return a.out + (a.spine[0], b.spine[1]) + b.into
        return a.out + b.into

    def p2p_route(self, src_rank: int, dst_rank: int) -> tuple[LinkId, ...]:
        """Links of NCCL's point-to-point path (send/recv, and all-to-all, which NCCL runs as grouped
        send/recv) between GPUs on different nodes: PXN. NCCL sends to a peer through the NIC its own
        node attaches to the GPU with the peer's local index (the peer's rail), relaying over NVLink
        through that GPU when it is not the sender (src/graph/search.cc ncclTopoGetNetDev,
        NCCL_P2P_PXN_LEVEL = 2 "use PXN as much as possible", NCCL_PXN_DISABLE = 0), so a transfer
        between rails leaves on the receiver's rail instead of crossing the spine. Same node or same
        rail: ``route``."""
        key = self._key(src_rank, dst_rank)
        cached = self._p2p.get(key)
        if cached is None:
            cached = self._p2p[key] = self._pxn(src_rank, dst_rank, self._gpu(src_rank), self._gpu(dst_rank))
        return cached

    def p2p_routes(self, group: tuple[int, ...]) -> list[tuple[LinkId, ...]]:
        """``p2p_route`` of every ordered pair of distinct ranks of ``group``, row by row (an
        all-to-all's transfers), the GPUs looked up once."""
        for r in group:
            self._check(r)
        n, cache = self.cluster.num_gpus, self._p2p
        gpus = [self._gpu(r) for r in group]
        out = []
        for a, ga in zip(group, gpus):
            for b, gb in zip(group, gpus):
                if a != b:
                    links = cache.get(a * n + b)
                    if links is None:
                        links = cache[a * n + b] = self._pxn(a, b, ga, gb)
                    out.append(links)
        return out

    def _pxn(self, src_rank: int, dst_rank: int, a: _Gpu, b: _Gpu) -> tuple[LinkId, ...]:
        """``p2p_route``'s links: ``route`` itself, or the NVLink hop to the proxy and its route."""
        hop: tuple = ()
        if a.node != b.node and a.rail != b.rail:
            src_rank = a.node * self.cluster.gpus_per_node + b.local  # the proxy
            proxy = self._gpu(src_rank)
            hop, a = (a.up, proxy.down), proxy
        key = src_rank * self.cluster.num_gpus + dst_rank
        links = self._routes.get(key)
        if links is None:
            links = self._routes[key] = self._between(a, b, src_rank == dst_rank)
        return hop + links if hop else links

    def translation_period_ranks(self) -> int:
        """Ranks in the smallest block of whole nodes whose NICs fill whole leaves: shifting a group by
        a multiple of it maps its links onto links of the same capacities (every leaf trunk is alike),
        so collective costs are memoised per shifted group; 0 when there are no leaves."""
        c = self.cluster
        if self.leaf_down_ports <= 0:
            return 0
        if c.topology == "rail-optimized":
            return self.leaf_down_ports * c.gpus_per_node
        return self.leaf_down_ports // math.gcd(self.leaf_down_ports, c.nics_per_node) * c.gpus_per_node

    def host_route(self, rank: int, to_host: bool = True) -> tuple[LinkId, ...]:
        """GPU <-> host memory over PCIe (ZeRO-Offload traffic), through the GPU's PCIe switch."""
        g, p, h = f"gpu{rank}", f"pcie{rank}", f"host{self.node_of(rank)}"
        return ((g, p), (p, h)) if to_host else ((h, p), (p, g))

    def link_kind(self, link: LinkId) -> str:
        """nvlink | pcie | nic | leaf-spine, from the names of the link's end points."""
        u, v = link
        if u.startswith("nvs") or v.startswith("nvs"):
            return "nvlink"
        if u.startswith("pcie") or v.startswith("pcie"):
            return "pcie"
        if u.startswith("nic") or v.startswith("nic"):
            return "nic"
        return "leaf-spine"

    def route_latency_s(self, src_rank: int, dst_rank: int) -> float:
        return sum(self.latency_s[link] for link in self.route(src_rank, dst_rank))


def build_topology(cluster: ClusterSpec) -> Topology:
    """Build the link graph: per node NVSwitch, per GPU a PCIe switch to its NIC and the host,
    and for more than one node the leaf/spine fabric (rail-optimized or fat tree)."""
    c = cluster
    for name, value in (("num_nodes", c.num_nodes), ("gpus_per_node", c.gpus_per_node),
                        ("nics_per_node", c.nics_per_node)):
        if value < 1:
            raise ValueError(f"cluster.{name} must be >= 1, got {value}")
    if c.nics_per_node > c.gpus_per_node:
        raise ValueError(f"cluster.nics_per_node ({c.nics_per_node}) exceeds gpus_per_node "
                         f"({c.gpus_per_node}); each NIC serves at least one GPU")
    if c.topology not in TOPOLOGIES:
        raise ValueError(f"cluster.topology {c.topology!r} unknown; "
                         f"known: {', '.join(TOPOLOGIES)}")
    if c.oversubscription < 1.0:
        raise ValueError(f"cluster.oversubscription must be >= 1.0, got {c.oversubscription}")
    arch = c.gpu.architecture
    if arch not in NVLINK_EFFICIENCY:
        raise ValueError(f"no NVLink efficiency for gpu architecture {arch!r}; "
                         f"known: {', '.join(NVLINK_EFFICIENCY)}")
    nvlink = c.nvlink_bandwidth_Bps * NVLINK_EFFICIENCY[arch]
    pcie = c.pcie_bandwidth_Bps * PCIE_EFFICIENCY
    if c.fabric not in FABRIC_EFFICIENCY:
        raise ValueError(f"cluster.fabric {c.fabric!r} unknown; known: {', '.join(FABRIC_EFFICIENCY)}")
    nic = c.nic_bandwidth_Bps * FABRIC_EFFICIENCY[c.fabric]
    nic_Gbps = c.nic_bandwidth_Bps * 8 / GB
    ports = NDR_LEAF_PORTS if nic_Gbps >= NDR_GBPS else HDR_LEAF_PORTS
    down = ports // 2
    planes = max(1, round(down / c.oversubscription))
    # Each leaf has `planes` uplinks at the NIC port rate (oversubscription = down / up), trunked by
    # adaptive routing (SPINE). The tables fill in a link's entry when it is first used (link_table).
    layout = LinkLayout(c.num_nodes, c.gpus_per_node, c.nics_per_node, c.topology == "rail-optimized", down)
    cap = LinkTable(layout, {"nvlink": nvlink, "pcie": pcie, "nic": nic, "leaf-spine": nic * planes})
    lat = LinkTable(layout, LINK_LATENCY_S)
    return Topology(c, cap, lat, layout, planes)
