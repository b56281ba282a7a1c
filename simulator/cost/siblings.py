"""Sibling traffic of the representative-rank ("fast") mode: the flows of every concurrent copy of a collective.

The fast mode lowers one rank per pipeline stage (``DeviceMesh.representative``). Each of its collectives
has siblings: the same collective run at the same time by the other TP/CP/DP/EP groups of the stage
(DESIGN.md §5: symmetry is exploited, never assumed silently). Their flows cross the NICs, leaf uplinks
and spine links that the representative's flows cross, so ``SiblingCost`` gives the engine a plan that
carries every sibling's flows too: the representative's transfer ends when the last sibling's does, as
the slowest group sets the pace of a symmetric step. Sibling flows are explicit, never folded into
weights, because ECMP hashing and leaves that split a node's rails make sibling routes unequal.
"""

from __future__ import annotations

from typing import Any

from ..hardware.topology import SPINE, Topology
from ..strategy.mesh import DeviceMesh
from ..tasks import Collective, Task, TaskGraph
from .collectives import plan_collective
from .model import CostModel
from .plan import CommPlan, CommStep

# Mesh axes whose groups partition each stage's ranks (strategy/mesh.py DeviceMesh.group).
MESH_AXES = ("tp", "cp", "dp", "dp_cp", "tp_dp_cp", "ep", "edp", "etp", "pp")
# The axes of the exchanges every layer of every micro-batch waits for: where their sibling copies cross
# the trunks unequally, the representative's wait for the slowest copy compounds layer after layer
# (fast_mode_cost falls back to full). The step's gradient and parameter collectives and the pipeline
# hand-offs, off that chain or once per step, keep the fast mode (within 0.8%: benchmarks/fast_vs_full.py --random).
LAYER_AXES = ("tp", "cp", "ep", "etp")


def _stage_ranks(mesh: DeviceMesh, stage: int) -> range:
    per_stage = mesh.dp * mesh.cp * mesh.tp
    return range(stage * per_stage, (stage + 1) * per_stage)


def _mesh_axis(mesh: DeviceMesh, group: tuple[int, ...]) -> str | None:
    """The mesh axis whose group through ``group[0]`` holds exactly these ranks, if any."""
    members = set(group)
    for axis in MESH_AXES:
        g = mesh.group(axis, group[0])
        if len(g) == len(members) and set(g) == members:
            return axis
    return None


def _translated(mesh: DeviceMesh, group: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Images of ``group`` under every shift of the (dp, cp, tp) coordinates, pipeline stage kept:
    a send/recv pair or a tied-embedding pair of one stage maps onto its copy in every replica."""
    coords = [mesh.coords(r) for r in group]
    out = []
    for d in range(mesh.dp):
        for c in range(mesh.cp):
            for t in range(mesh.tp):
                out.append(tuple(mesh.rank(p, (dd + d) % mesh.dp, (cc + c) % mesh.cp, (tt + t) % mesh.tp)
                                 for p, dd, cc, tt in coords))
    return out


def sibling_groups(mesh: DeviceMesh, group: tuple[int, ...], op: str) -> tuple[tuple[int, ...], ...]:
    """Every distinct group that runs this collective concurrently with ``group`` (which comes first):
    for a collective over a mesh axis, the axis groups of the other ranks of the stage; for a send/recv
    (direction matters) or any other group, its disjoint copies in the (dp, cp, tp) replicas (a block
    of an axis, e.g. a hybrid-sharded group, gives the other blocks). Raises when the disjoint copies
    leave some rank uncovered: then the copies are not a symmetric set."""
    axis = None if op == "send_recv" else _mesh_axis(mesh, group)
    if axis is not None:
        stage = 0 if axis == "pp" else mesh.stage_of(group[0])
        candidates = [mesh.group(axis, r) for r in _stage_ranks(mesh, stage)]
    else:
        candidates = _translated(mesh, group)
    ordered = op == "send_recv"
    seen = {tuple(group) if ordered else frozenset(group)}
    out = [tuple(group)]
    used = set(group)
    covered = set(group)
    for g in candidates:
        key = g if ordered else frozenset(g)
        covered.update(g)
        if key in seen or (not ordered and not used.isdisjoint(key)):
            continue  # a shifted copy that straddles two groups (e.g. blocks of an axis) is no group
        seen.add(key)
        used.update(g)
        out.append(g)
    if covered - used:
        raise ValueError(f"sibling groups of {group[:4]}... overlap: the collective has no symmetric copies")
    return tuple(out)


def _signature(plan: CommPlan) -> tuple:
    return tuple((s.latency_s, s.repeat) for s in plan.steps)


def merge_plans(plans: list[CommPlan]) -> CommPlan:
    """One plan running ``plans`` together (the first is the representative's): step k carries every
    plan's step-k flows when their steps line up (same latencies and repeats, the usual case: the
    tuner picks one algorithm for all copies), else the others run beside it as concurrent sub-plans
    (``CommPlan.concurrent``). Plans without flows add nothing and are dropped."""
    first = plans[0]
    others = [p for p in plans[1:] if p.concurrent or any(s.flows for s in p.steps)]
    if not others:
        return first
    sig = _signature(first)
    if all(_signature(p) == sig and not p.concurrent for p in others):
        steps = tuple(CommStep(s.latency_s, s.flows + tuple(f for p in others for f in p.steps[k].flows), s.repeat)
                      for k, s in enumerate(first.steps))
        return CommPlan(first.algorithm, steps, first.concurrent)
    return CommPlan(first.algorithm, first.steps, first.concurrent + tuple(others))


def _shared_links(topo: Topology) -> tuple[set, bool, str]:
    """The links that carry several GPUs' traffic and can limit a flow, and why ('' when none can):
    the trunks of a leaf whose uplinks are narrower than the NICs under it (oversubscription), and,
    when the middle flag is set, the links of every NIC, which serves several GPUs."""
    c = topo.cluster
    trunks: set = set()
    reasons = []
    nics_shared = c.nics_per_node < c.gpus_per_node
    if nics_shared:
        reasons.append(f"{c.gpus_per_node // c.nics_per_node} GPUs share each NIC")
    if c.num_nodes > 1:
        nic_Bps = topo.capacity_Bps[("nic0.0", topo.leaf_name(0, 0))]  # every NIC link alike
        for leaf, nics in topo.layout.leaves().items():
            trunk = topo.capacity_Bps.get((leaf, SPINE))
            if trunk is not None and trunk < nics * nic_Bps * (1 - 1e-9):
                trunks |= {(leaf, SPINE), (SPINE, leaf)}
    if trunks:
        reasons.append(f"leaf uplinks oversubscribed {c.oversubscription:g}:1")
    return trunks, nics_shared, ", ".join(reasons)


def _is_nic_link(link: Any) -> bool:
    """Whether a link (a LinkId: a (u, v) pair of names) has a NIC at either end."""
    return link[0].startswith("nic") or link[1].startswith("nic")


def shared_binding_links(topo: Topology) -> str:
    """Why a link that carries several GPUs' traffic can limit a flow, or '' when none can: then each
    GPU's transfers only meet their own groups' and the representative alone is exact."""
    return _shared_links(topo)[2]


def fast_mode_cost(cost: CostModel, mesh: DeviceMesh, graph: TaskGraph,
                   topo: Topology) -> tuple[CostModel | SiblingCost | None, str]:
    """(TaskCost, '') for the representative-rank mode: ``cost`` itself when none of the
    representatives' flows crosses a shared link that can bind, else a SiblingCost charging the
    sibling flows that cross such links; (None, why) when some transfer has no symmetric set of
    copies: then only the full mode is exact and the caller falls back to it."""
    trunks, nics_shared, _ = _shared_links(topo)
    if not (trunks or nics_shared):
        return cost, ""
    network = [t for t in graph.tasks if t.kind == "comm" and cost.duration_s(t) is None]
    contact: set = set()
    for t in network:
        for step in cost.comm_plan(t).steps:
            for f in step.flows:
                contact.update(link for link in f.links if link in trunks or nics_shared and _is_nic_link(link))
    if not contact:
        return cost, ""
    sc = SiblingCost(cost, mesh, topo, frozenset(contact))
    try:
        for t in network:
            sc.comm_plan(t)
    except ValueError as err:
        return None, str(err)
    if sc.unequal:
        return None, (f"the sibling copies of {sc.unequal[0]} cross the oversubscribed leaf uplinks unequally "
                      f"({shared_binding_links(topo)}): the representative would wait for the slowest copy "
                      f"of every transfer, where each group goes at its own pace")
    return sc, ""


def copy_crossings(plans: list[CommPlan], contact: frozenset) -> list[tuple]:
    """How each copy (plan) crosses the shared links: step by step, the sorted numbers of trunk links
    (contact links without a NIC) its flows cross. Equal for copies that are images of one another
    under the fabric's symmetry; a copy whose groups sit under one leaf and one whose groups cross an
    oversubscribed trunk differ. NICs serving several GPUs are alike on every node."""
    trunks = frozenset(link for link in contact if not _is_nic_link(link))
    return [tuple(tuple(sorted(len(trunks.intersection(f.links)) for f in st.flows)) for st in p.steps)
            for p in plans]


def _touching(plan: CommPlan, links: frozenset) -> CommPlan:
    """``plan`` with only the flows that cross one of ``links`` (latencies kept)."""
    steps = tuple(CommStep(s.latency_s, tuple(f for f in s.flows if not links.isdisjoint(f.links)), s.repeat)
                  for s in plan.steps)
    return CommPlan(plan.algorithm, steps, tuple(_touching(p, links) for p in plan.concurrent))


class SiblingCost:
    """A TaskCost (``engine/sim``) for the fast mode: ``cost``'s static durations, and network plans
    that carry, besides the representative's flows, every sibling group's flows that cross one of the
    ``contact`` links (shared links that can bind and that the representatives' own flows cross).
    A sibling flow elsewhere meets only its own GPUs' traffic, the mirror image of the
    representative's, and is left out: it would change no time."""

    def __init__(self, cost: CostModel, mesh: DeviceMesh, topo: Topology, contact: frozenset) -> None:
        self.cost, self.mesh, self.topo, self.contact = cost, mesh, topo, contact
        self.algorithms = dict(getattr(cost, "algorithms", {}))
        self._plans: dict = {}  # id(Collective) -> (Collective, merged plan)
        self.unequal: list[str] = []  # transfers whose sibling copies cross the trunks unequally (copy_crossings)

    def duration_s(self, task: Task) -> float | None:
        return self.cost.duration_s(task)

    def isolated_s(self, task: Task) -> float:
        return self.cost.isolated_s(task)

    def comm_plan(self, task: Task) -> CommPlan:
        c = task.comm
        hit = self._plans.get(id(c))
        if hit is None:
            hit = self._plans[id(c)] = (c, self._build(task))
        return hit[1]

    def _build(self, task: Task) -> CommPlan:
        c = task.comm
        assert c is not None, task.name
        own = self.cost.comm_plan(task)
        if c.axis == "host":  # GPU <-> host copies cross only the GPU's own PCIe links
            return own
        alg = self.algorithms.get(c.op)
        others = [_touching(plan_collective(Collective(c.op, c.size_bytes, g, c.axis), self.topo, alg), self.contact)
                  for g in sibling_groups(self.mesh, c.group, c.op)[1:]]
        if c.axis in LAYER_AXES:
            crossings = copy_crossings([_touching(own, self.contact)] + others, self.contact)
            if any(x != crossings[0] for x in crossings[1:]):
                self.unequal.append(task.name)
        return merge_plans([own] + others)
