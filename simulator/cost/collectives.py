"""Collectives decomposed the way NCCL runs them, as steps of concurrent flows over the real links.

Algorithms: ring (one ring per rail used, rail-aligned across nodes, as NCCL's channels), double
binary tree, NVLink SHARP (NVLS), hierarchical (intra-node reduce-scatter, inter-node ring,
intra-node all-gather), direct all-to-all and P2P. The choice of algorithm and protocol follows
NCCL's tuner (``cost/nccl_tuner``): the smallest latency + bandwidth time, where the bandwidth
time comes from max-min fair flows over the topology (``cost/fairshare``).
"""

from __future__ import annotations

from ..hardware.topology import Topology
from ..units import GB
from ..tasks import COLLECTIVE_OPS, Collective
from . import nccl_fill, nccl_tuner as tuner
from .nccl_env import DEFAULT, NcclEnv, env_for
from .algorithms import (GroupShape, Phase, direct_flows, group_shape, hierarchical_phases,
                         nvls_flows, nvls_tree_flows, p2p_flows, ring_hops, ring_orders, tree_flows)
from .fairshare import ARRAY_MIN_FLOWS, isolated_time_s
from .plan import CommPlan, CommStep, make_flows


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests doc/PERFORMANCE.md: busbw = algbw x this factor."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def _memo(topo: Topology, name: str) -> dict:
    return topo.memo.setdefault(name, {})


def _memoised(topo: Topology, name: str, key: tuple, build):
    """``build()`` once per key, kept in the topology's memo table ``name``."""
    memo = _memo(topo, name)
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = build()
    return hit


def _unit_phases(topo: Topology, op: str, group: tuple[int, ...], algorithm: str
                 ) -> tuple[tuple[Phase, ...], float]:
    """Phases of a 1-byte collective and their bandwidth time (seconds per byte, run alone).

    Phases name concrete links, so they are memoised per group; the time per byte is memoised per
    group shifted to the first scalable unit (``Topology.translation_period_ranks``): every DP group
    of a large run is a shifted copy of another, and fluid-timing each one alone is the costly part."""
    phases = _phases(topo, op, group, algorithm)
    bw_memo = _memo(topo, "collective_bw")
    bkey = (op, _shifted(topo, group), algorithm)
    bw = bw_memo.get(bkey)
    if bw is None:
        bw = bw_memo[bkey] = sum(ph.repeat * isolated_time_s([f.size_bytes for f in ph.flows],
                                                             [f.links for f in ph.flows],
                                                             [f.weight for f in ph.flows], topo.capacity_Bps)
                                 for ph in phases)
    return phases, bw


def _shifted(topo: Topology, group: tuple[int, ...]) -> tuple[int, ...]:
    """``group`` shifted to the first scalable unit (``Topology.translation_period_ranks``): its
    links' capacities, and so every time of it run alone, are those of ``group``."""
    period = topo.translation_period_ranks()
    shift = (min(group) // period) * period if period else 0
    return tuple(r - shift for r in group) if shift else group


def _phases(topo: Topology, op: str, group: tuple[int, ...], algorithm: str) -> tuple[Phase, ...]:
    return _memoised(topo, "collective_phases", (op, group, algorithm),
                     lambda: _build_unit_phases(topo, op, group, algorithm))


def _build_unit_phases(topo: Topology, op: str, group: tuple[int, ...], algorithm: str) -> tuple[Phase, ...]:
    shape = group_shape(group, topo)
    n = shape.n
    if algorithm == "ring":
        orders = ring_orders(shape, group)
        r = len(orders)
        if op == "all_reduce":
            phases = [Phase(2 * (n - 1), "ring", ring_hops(topo, orders, 1 / (n * r)))]
        elif op in ("all_gather", "reduce_scatter"):
            phases = [Phase(n - 1, "ring", ring_hops(topo, orders, 1 / (n * r)))]
        else:  # broadcast: a pipelined chain from the root, group[0]
            root = group[0]
            chains = [o[o.index(root):] + o[:o.index(root)] for o in orders]
            phases = [Phase(1, "bcast", ring_hops(topo, chains, 1 / r, chain=True))]
    elif algorithm == "tree":
        phases = [Phase(1, "tree", tree_flows(topo, shape))]
    elif algorithm == "nvls":
        phases = [Phase(1, "nvls", nvls_flows(topo, group))]
    elif algorithm == "nvls_tree":
        phases = [Phase(1, "nvls", nvls_tree_flows(topo, shape))]
    elif algorithm == "hierarchical":
        phases = hierarchical_phases(topo, shape)
    elif algorithm == "direct":
        phases = [Phase(1, "p2p", direct_flows(topo, group))]
    else:
        phases = [Phase(1, "p2p", p2p_flows(topo, group))]
    return tuple(phases)


def _latencies(algorithm: str, protocol: str, op: str, shape: GroupShape,
               phases: tuple[Phase, ...], architecture: str = "", size: float = 0.0,
               env: NcclEnv = DEFAULT) -> tuple[float, list[float]]:
    """(base latency, per-step latency of each phase), from NCCL's tuner constants."""
    n_nodes = shape.num_nodes
    hw = "net" if n_nodes > 1 else "nvlink"
    if algorithm == "ring":
        ph = phases[0]
        if ph.tag == "bcast":  # tuning.cc: baseLat + nsteps * hwLat, nsteps = nRanks
            lat = shape.n * tuner.bcast_step_latency_s(protocol, hw)
            return tuner.base_latency_s("ring", protocol), [lat]
        base, step = tuner.ring_latency_s(protocol, ph.repeat, tuner.ring_inter_steps(op, shape.n, n_nodes),
                                          architecture, shape.ppn)
        # NCCL's channels: twice the rings it searched, within the environment's bounds (NcclEnv)
        channels = env.collective_channels(len(phases[0].flows) // shape.n, n_nodes)
        plateau = tuner.ring_plateau(op, protocol, n_nodes, size, channels, shape.n, architecture)
        return base * plateau, [step * plateau]
    if algorithm == "tree":
        return 0.0, [tuner.tree_latency_s(protocol, n_nodes, shape.ppn)]
    if algorithm == "nvls":
        return 0.0, [tuner.nvls_latency_s(n_nodes)]
    if algorithm == "nvls_tree":
        return 0.0, [tuner.nvls_tree_latency_s(n_nodes)]
    if algorithm == "hierarchical":
        per_tag = {"intra": tuner.step_latency_s("ring", protocol, "nvlink"),
                   "inter": tuner.step_latency_s("ring", protocol, "net")}
        return tuner.base_latency_s("ring", protocol), [per_tag[ph.tag] for ph in phases]
    return 0.0, [tuner.p2p_latency_s(protocol, n_nodes)]


def _feasible(algorithm: str, shape: GroupShape, topo: Topology) -> str:
    """'' when the algorithm can run this group, else the reason."""
    if algorithm in ("nvls", "nvls_tree") and not topo.cluster.nvls:
        return f"cluster {topo.cluster.name!r} has no NVLink SHARP (cluster.nvls = false)"
    if algorithm == "nvls" and shape.num_nodes > 1:
        return (f"NVLS reduces inside one NVSwitch node; group spans {shape.num_nodes} nodes "
                "(NCCL runs nvls_tree there; NVLS with in-network SHARP reduction is not modelled)")
    if algorithm == "nvls_tree":
        if shape.num_nodes < 2:
            return "NVLSTree needs a group over at least 2 nodes (NCCL disables it on one node)"
        if not shape.uniform or shape.ppn < 2:
            return "NVLSTree needs the same local GPUs, at least 2, on every node"
    if algorithm == "hierarchical" and not shape.uniform:
        return "hierarchical needs the same local GPUs on every node"
    return ""


def _candidates(op: str, size_bytes: float, group: tuple[int, ...], topo: Topology,
                algorithm: str | None) -> list[tuple[str, str]]:
    if op not in tuner.ALGORITHMS:
        raise ValueError(f"unknown collective op {op!r}; known: {', '.join(COLLECTIVE_OPS)}")
    shape = group_shape(group, topo)
    forced_proto = None
    env = env_for(topo.cluster)
    if algorithm is None:
        algs = [a for a in tuner.ALGORITHMS[op] if a not in tuner.AUTO_EXCLUDED
                and not _feasible(a, shape, topo)]
    else:
        alg, _, forced_proto = algorithm.partition("/")
        if alg not in tuner.ALGORITHMS[op]:
            raise ValueError(f"algorithm {algorithm!r} cannot run {op}; "
                             f"known: {', '.join(tuner.ALGORITHMS[op])}")
        why = _feasible(alg, shape, topo)
        if why:
            raise ValueError(f"algorithm {alg!r} for {op} over {len(group)} ranks: {why}")
        if forced_proto and forced_proto not in tuner.protocols_for(alg):
            raise ValueError(f"algorithm {alg!r} has no protocol {forced_proto!r}; "
                             f"known: {', '.join(tuner.protocols_for(alg))}")
        algs = [alg]
    out = []
    for alg in algs:
        if forced_proto:
            protos: tuple[str, ...] = (forced_proto,)
        elif alg in ("direct", "p2p"):
            per_peer = size_bytes / len(group) if alg == "direct" else size_bytes
            protos = (tuner.p2p_protocol(per_peer, shape.n, shape.num_nodes, topo.cluster.nic_bandwidth_Bps / GB,
                                         env),)
        else:
            protos = tuner.protocols_for(alg)
        out += [(alg, p) for p in protos if algorithm is not None or env.allows(alg, p)]
    return out


def _check(coll: Collective, topo: Topology) -> None:
    if coll.size_bytes < 0:
        raise ValueError(f"collective size_bytes must be >= 0, got {coll.size_bytes}")
    if len(set(coll.group)) != len(coll.group):
        raise ValueError(f"collective group {coll.group} repeats a rank")
    for r in coll.group:
        topo.node_of(r)


def _efficiency(topo: Topology, op: str, size: float, shape: GroupShape, alg: str,
                proto: str, bw_s_per_byte: float) -> float:
    """Fraction of the links' rate the collective reaches: the protocol's factor, NCCL's tree
    correction for medium sizes, and NCCL's bus-bandwidth ceilings (tuning.cc)."""
    eff = tuner.efficiency(alg, proto, op, shape.num_nodes)
    arch = topo.cluster.gpu.architecture
    channels = shape.rails if shape.uniform else 1
    # Ring channels of NCCL's ring graph across nodes: one per NIC (ncclTopoDupChannels leaves a
    # Hopper graph under 50 GB/s per channel, an Ampere one under 25, undoubled); inside one node it
    # doubles them to <= 30 GB/s per channel on DGX H100 / 20 on DGX A100, under the LL128 ceiling.
    ring_channels = channels if shape.num_nodes > 1 else 0
    cap = tuner.max_busbw_Bps(alg, proto, arch, shape.num_nodes, channels, ring_channels)
    if alg == "p2p":  # a send runs on as many P2P channels as its size earns (enqueue.cc)
        cap = tuner.p2p_max_Bps(size, shape.n, shape.num_nodes, topo.cluster.nic_bandwidth_Bps / GB,
                                env_for(topo.cluster))
    if cap < float("inf") and bw_s_per_byte > 0:
        # NCCL converts bus to algorithm bandwidth with 1/2 for trees and nRanks/nSteps for rings
        # (and, since 2.28, for NVLS / NVLSTree: tuning.cc "ratio *= (1.0 * nRanks) / nsteps").
        ratio = 0.5 if alg == "tree" else 1 / busbw_factor(op, shape.n)
        eff = min(eff, cap * ratio * bw_s_per_byte)
    # ncclTopoGetAlgoTime scales the tuned (capped) bandwidth by the tree correction
    return eff * tuner.tree_correction(alg, proto, size, arch)


def _estimate(topo: Topology, op: str, size: float, group: tuple[int, ...],
              alg: str, proto: str, bw: float | None = None, fill: bool = False) -> float:
    """Uncontended seconds of one algorithm/protocol as NCCL's tuner models it, plus (``fill``) the
    pipeline fill it leaves out; ``bw`` (seconds per byte) overrides the fluid-timed value, e.g.
    with a lower bound of it (the time is non-decreasing in ``bw``)."""
    phases, bw_s = _unit_phases(topo, op, group, alg) if bw is None else (_phases(topo, op, group, alg), bw)
    shape = group_shape(group, topo)
    base, lats = _latencies(alg, proto, op, shape, phases, topo.cluster.gpu.architecture, size,
                            env_for(topo.cluster))
    eff = _efficiency(topo, op, size, shape, alg, proto, bw_s)
    if fill:
        base += _pipeline_fill_s(topo, alg, proto, size, shape, bw_s / eff)
    return base + sum(p.repeat * lat for p, lat in zip(phases, lats)) + bw_s * size / eff


def _pipeline_fill_s(topo: Topology, alg: str, proto: str, size: float, shape: GroupShape,
                     s_per_byte: float) -> float:
    """Time a store-and-forward pipeline takes to fill (``cost/nccl_fill``): NVLSTree's at the rate
    the collective runs, Tree/Simple's hop by hop at its links' rates; 0 for the other algorithms."""
    if alg == "nvls_tree":
        return s_per_byte * nccl_fill.nvls_tree_pipeline_bytes(size, topo.cluster.gpu.architecture,
                                                               shape.rails, shape.num_nodes)
    if alg != "tree" or proto != "simple" or shape.num_nodes < 2:
        return 0.0
    env = env_for(topo.cluster)
    nics = shape.rails if shape.uniform else 1
    channels = env.collective_channels(nics, shape.num_nodes)
    chain = next(ranks for ranks in shape.per_node if len(ranks) == shape.ppn)  # a node of the longest chain
    nvlink = _route_Bps(topo, chain[0], chain[1]) if shape.ppn > 1 else float("inf")
    network = nics * _route_Bps(topo, shape.per_node[0][0], shape.per_node[1][0])
    return nccl_fill.tree_simple_fill_s(size, shape.ppn, shape.num_nodes, channels, env.buffsize_bytes,
                                        nvlink, network)


def _route_Bps(topo: Topology, src: int, dst: int) -> float:
    """What one flow from ``src`` to ``dst`` gets alone: its route's slowest link."""
    return min(topo.capacity_Bps[link] for link in topo.route(src, dst))


def _bw_lower_bound(topo: Topology, op: str, group: tuple[int, ...], alg: str) -> float:
    """Seconds per byte no schedule of the phases can beat: each phase lasts at least as long as
    its most loaded link needs to carry its bytes (cheap next to fluid-timing the flows). Per byte,
    so one per (op, group, algorithm), whatever the size and protocol, and per group shifted to the
    first scalable unit (``_shifted``): memoised."""
    return _memoised(topo, "bw_lower_bound", (op, _shifted(topo, group), alg),
                     lambda: _link_bound(topo, op, group, alg))


def _bound_pays(topo: Topology, op: str, group: tuple[int, ...], alg: str) -> bool:
    """Whether the link-load bound is cheaper than the fluid timing it may spare: fewer flows in the
    largest phase than the array form of max-min sharing starts at (``fairshare.ARRAY_MIN_FLOWS``)."""
    return max((len(ph.flows) for ph in _phases(topo, op, group, alg)), default=0) < ARRAY_MIN_FLOWS


def _link_bound(topo: Topology, op: str, group: tuple[int, ...], alg: str) -> float:
    total = 0.0
    for ph in _phases(topo, op, group, alg):
        load: dict = {}
        for f in ph.flows:
            for link in f.links:
                load[link] = load.get(link, 0.0) + f.size_bytes * f.weight
        total += ph.repeat * max((b / topo.capacity_Bps[link] for link, b in load.items()), default=0.0)
    return total


def _best(topo: Topology, op: str, size: float, group: tuple[int, ...],
          algorithm: str | None) -> tuple[str, str, float]:
    """(algorithm, protocol, uncontended seconds) of the candidate NCCL's tuner picks, memoised."""
    return _memoised(topo, "collective_best", (op, size, group, algorithm),
                     lambda: _pick(topo, op, size, group, algorithm))


def _pick(topo: Topology, op: str, size: float, group: tuple[int, ...],
          algorithm: str | None) -> tuple[str, str, float]:
    best = None
    for alg, proto in _candidates(op, size, group, topo, algorithm):
        # skip the costly fluid timing of a candidate whose lower bound already loses (the bound is a
        # Python pass over every flow's links: from ARRAY_MIN_FLOWS flows on, the fluid timing runs in
        # numpy and costs less than the bound, which can only skip a candidate that would lose anyway)
        if best is not None and _bound_pays(topo, op, group, alg) and _estimate(
                topo, op, size, group, alg, proto, _bw_lower_bound(topo, op, group, alg)) >= best[2]:
            continue
        t = _estimate(topo, op, size, group, alg, proto)
        if best is None or t < best[2]:
            best = (alg, proto, t)
    if best is None:
        raise ValueError(f"no algorithm can run {op} over {len(group)} ranks")
    # NCCL picks by its tuner's model; the chosen one then also pays what that model leaves out
    return best[0], best[1], _estimate(topo, op, size, group, best[0], best[1], fill=True)


def _canonical(group: tuple[int, ...], topo: Topology) -> tuple[int, ...]:
    """A group inside one node costs the same on every node: key it by local indices."""
    node = topo.node_of(group[0])
    if all(topo.node_of(r) == node for r in group):
        return tuple(topo.local_of(r) for r in group)
    return group


def choose_algorithm(op: str, size_bytes: float, group: tuple[int, ...], topo: Topology) -> str:
    """NCCL's rule: the algorithm whose best protocol predicts the smallest time for this size
    and group shape (ring for large messages, tree for small ones across nodes, NVLS on H100)."""
    if len(group) < 2:
        return "none"
    return _best(topo, op, float(size_bytes), _canonical(tuple(group), topo), None)[0]


def collective_time_s(coll: Collective, topo: Topology, algorithm: str | None = None) -> float:
    """Uncontended time of the collective: what ``plan_collective``'s plan takes alone."""
    _check(coll, topo)
    if len(coll.group) < 2 or coll.size_bytes == 0:
        return 0.0
    return _best(topo, coll.op, float(coll.size_bytes), _canonical(coll.group, topo), algorithm)[2]


def _plan(topo: Topology, op: str, size: float, group: tuple[int, ...],
          algorithm: str | None) -> CommPlan:
    return _memoised(topo, "collective_plans", (op, size, group, algorithm),
                     lambda: _build_plan(topo, op, size, group, algorithm))


def _build_plan(topo: Topology, op: str, size: float, group: tuple[int, ...],
                algorithm: str | None) -> CommPlan:
    alg, proto, _ = _best(topo, op, size, group, algorithm)
    phases, bw = _unit_phases(topo, op, group, alg)
    shape = group_shape(group, topo)
    base, lats = _latencies(alg, proto, op, shape, phases, topo.cluster.gpu.architecture, size,
                            env_for(topo.cluster))
    scale = size / _efficiency(topo, op, size, shape, alg, proto, bw)
    base += _pipeline_fill_s(topo, alg, proto, size, shape, bw * scale / size)
    steps = [CommStep(base)] if base > 0 else []
    for ph, lat in zip(phases, lats):
        flows = make_flows([f.links for f in ph.flows], [f.size_bytes * scale for f in ph.flows],
                           [f.weight for f in ph.flows])
        steps.append(CommStep(lat, flows, ph.repeat))
    return CommPlan(f"{alg}/{proto}", tuple(steps))


def plan_collective(coll: Collective, topo: Topology, algorithm: str | None = None) -> CommPlan:
    """The collective as CommSteps of flows over ``topo``'s links; ``algorithm`` ("ring", "tree",
    "nvls", "hierarchical", "direct", "p2p", optionally "/ll", "/ll128" or "/simple") overrides
    the tuner. The plan's algorithm reads "<algorithm>/<protocol>"."""
    _check(coll, topo)
    if len(coll.group) < 2 or coll.size_bytes == 0:
        return CommPlan("none", ())
    return _plan(topo, coll.op, float(coll.size_bytes), tuple(coll.group), algorithm)
