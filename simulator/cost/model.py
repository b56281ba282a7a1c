"""CostModel: the one object the engine asks "how long?" for every task of a scenario.

Compute and host work are static (roofline or calibrated tables); TP collectives inside a node are
costed statically by their algorithm (they own the GPU's NVLink ports), those overlapped with a GEMM
by what the overlap leaves exposed (cost/tp_overlap); every other transfer returns
a CommPlan that the engine runs through the shared-bandwidth network, the ZeRO-Offload copies to and
from host memory included: they cross the GPU's PCIe link that its NIC traffic crosses too.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import TYPE_CHECKING

from ..hardware.topology import Topology
from ..strategy.ub_config import BULK_SITES, SCATTER_SITES, OverlapSite, load_ub_config
from ..tasks import Collective, OpWork, Task
from .algorithms import group_shape
from .collectives import collective_time_s, plan_collective
from .compute import RooflineCompute, gemm_shape, with_host_floor_s
from .fairshare import isolated_time_s
from .plan import CommPlan, CommStep, Flow
from .sm_share import collective_ctas, with_sms_taken
from .tp_overlap import chunking, exposed_comm_s

if TYPE_CHECKING:  # type-only imports: the calibrated tables are imported where a run asks for them
    from ..scenario import Scenario
    from .calibrated import CalibrationTables

# ZeRO-Offload's CPU-Adam (Ren et al. 2021, §5.1 and Table 3): ~0.2 s per step for 1B parameters on
# one DGX-2 node's CPU (2 x Xeon Platinum 8168); the node's GPUs share it.
CPU_ADAM_PARAMS_PER_S_PER_NODE = 5.0e9


class CostModel:
    def __init__(self, scn: Scenario, topo: Topology, tables: CalibrationTables | None = None) -> None:
        self.scn = scn
        self.topo = topo
        self.roofline = RooflineCompute(scn.cluster.gpu, scn.training.dtype, scn.training.attention,
                                        scn.cluster.num_gpus)
        self.tables = tables  # cost.calibrated.CalibrationTables | None
        self.missing: set[str] = set()
        self._work_cache: dict[int, float] = {}
        self._static_comm: dict = {}
        self._host_plans: dict = {}
        self.algorithms = dict(scn.cost.collective_algorithms)
        self.ub = dict(load_ub_config(scn.parallel.tp_comm_overlap_cfg).sites)  # userbuffers settings per TP site
        self._contended: dict[tuple[int, bool], RooflineCompute] = {}  # (SMs taken, margin known) -> roofline
        self._ctas: dict[Collective, int] = {}
        self._ctas_of: dict[int, tuple[Collective, int]] = {}  # by identity (memo_by_collective)
        self._ratios: dict[tuple[int, int], float] = {}  # (work, SMs taken) -> ratio

    # ---- engine protocol ----------------------------------------------------------------------
    def duration_s(self, task: Task) -> float | None:
        if task.kind == "compute":
            key = id(task.work)
            t = self._work_cache.get(key)
            if t is None:
                t = self._work_cache[key] = self._work_time_s(task.work)
            return t
        if task.kind == "host":
            params = sum(w.shape[0] for w in task.work if w.shape)
            return params / (CPU_ADAM_PARAMS_PER_S_PER_NODE / self.scn.cluster.gpus_per_node)
        c = task.comm
        assert c is not None, task.name  # a comm task carries its Collective (tasks.TaskGraphBuilder)
        if c.axis == "tp" and self._in_one_node(c.group):
            ckey = (c.op, c.size_bytes, len(c.group), c.overlap)
            t = self._static_comm.get(ckey)
            if t is None:
                t = collective_time_s(c, self.topo, self.algorithms.get(c.op))
                if c.overlap and c.overlap[0] not in BULK_SITES:  # a bulk site's time is its collective's
                    t = self._overlapped_s(c, t)
                self._static_comm[ckey] = t
            return t
        return None

    def comm_plan(self, task: Task) -> CommPlan:
        c = task.comm
        assert c is not None, task.name
        if c.axis == "host":
            return self._host_plan(c)[0]
        return plan_collective(c, self.topo, self.algorithms.get(c.op))

    def isolated_s(self, task: Task) -> float:
        """The transfer's time with the network to itself (what the engine's run of its plan takes
        alone, ``cost/collectives``): the baseline against which contention is measured."""
        c = task.comm
        assert c is not None, task.name
        if c.axis == "host":
            return self._host_plan(c)[1]
        return collective_time_s(c, self.topo, self.algorithms.get(c.op))

    def _overlapped_s(self, c: Collective, comm_s: float) -> float:
        """What a TP collective chunked under its GEMM leaves exposed (cost/tp_overlap), run as the
        scenario's userbuffers configuration says at its site."""
        site, gemm = c.overlap
        s, tp = self.ub[site], len(c.group)
        reduce_s = 0.0
        if s.method == "ring_exchange" and site in SCATTER_SITES:  # sum of the tp chunks received: read all, write one
            nbytes = c.size_bytes * (1 + 1 / tp)
            reduce_s = self.roofline.op_time_s(OpWork(f"{site}.ub_sum", "elementwise", 0.0, nbytes, (int(nbytes), 1)))
        return exposed_comm_s(site, s, self._work_time_s((gemm,)), comm_s, tp, self._chunk_s(s, gemm, tp), reduce_s)

    def _chunk_s(self, s: OverlapSite, gemm: OpWork, tp: int) -> float:
        """One chunk's GEMM at a userbuffers site: its share of the rows (the sequence), on the SMs
        the site's communication leaves; a calibrated table's GEMM scaled by the roofline's ratio."""
        parts, sms, chosen = chunking(s, tp)
        m, n, k = gemm_shape(gemm)
        part = replace(gemm, flops=gemm.flops / parts, bytes=gemm.bytes / parts, shape=(-(-m // parts), n, k))
        # set_sm_margin: the chunk's kernel is chosen for the SMs the communication leaves
        rc = self._roofline_beside(sms, margin_known=chosen)
        ratio = rc.op_time_s(part) / self.roofline.op_time_s(gemm)
        return ratio * self._work_time_s((gemm,))

    # ---- SMs held by communication kernels (cost/sm_share) --------------------------------------
    def kernel_ctas(self, task: Task) -> int:
        """SMs the task's communication kernel holds while it runs: NCCL's CTAs (cost/sm_share, a bulk
        site left to NCCL included); a userbuffers bulk site's configured SMs; 0 for compute, host copies
        and the userbuffers sites chunked under their GEMM (cost/tp_overlap charges those SMs already)."""
        c = task.comm
        if task.kind != "comm" or c is None or c.axis == "host":
            return 0
        if c.overlap:
            name = c.overlap[0]
            if name not in BULK_SITES:  # chunked under its GEMM: cost/tp_overlap charges its SMs already
                return 0
            if self.ub[name].method != "nccl":  # a userbuffers bulk kernel on its configured SMs
                return self.ub[name].sms_held
        return memo_by_collective(self._ctas_of, self._ctas, task, self._collective_ctas)

    def _collective_ctas(self, task: Task) -> int:
        c = task.comm
        assert c is not None, task.name  # kernel_ctas asks only for communication tasks
        algorithm = plan_collective(c, self.topo, self.algorithms.get(c.op)).algorithm
        return collective_ctas(c, algorithm, group_shape(c.group, self.topo), self.scn.cluster)

    def contention_ratio(self, task: Task, sms_taken: int) -> float:
        """How much longer the compute task runs on the SMs that ``sms_taken`` leave than on the whole
        GPU (the roofline's ratio; calibrated tables, measured on the whole GPU, are scaled by it)."""
        key = (id(task.work), sms_taken)
        r = self._ratios.get(key)
        if r is None:
            rc = self._roofline_beside(sms_taken)
            eager = not self.scn.training.cuda_graphs
            alone = self.roofline.work_time_s(task.work, eager)
            r = self._ratios[key] = rc.work_time_s(task.work, eager) / alone if alone > 0 else 1.0
        return r

    def _roofline_beside(self, sms_taken: int, margin_known: bool = False) -> RooflineCompute:
        """The roofline on the SMs ``sms_taken`` leave (memoised; the whole GPU's for none taken)."""
        if not sms_taken:
            return self.roofline
        key = (sms_taken, margin_known)
        rc = self._contended.get(key)
        if rc is None:
            rc = self._contended[key] = with_sms_taken(self.roofline, sms_taken, margin_known)
        return rc

    def _host_plan(self, c: Collective) -> tuple[CommPlan, float]:
        """A device-to-host ("d2h") or host-to-device ("h2d") copy: one flow over the GPU's PCIe
        link and its switch's link to the host (``Topology.host_route``), after the links'
        latencies; with its time alone (the links' capacities carry PCIE_EFFICIENCY)."""
        key = (c.op, c.size_bytes, c.group)
        hit = self._host_plans.get(key)
        if hit is None:
            route = self.topo.host_route(c.group[0], to_host=c.op == "d2h")
            latency = sum(self.topo.latency_s[link] for link in route)
            plan = CommPlan("pcie-copy", (CommStep(latency, (Flow(route, c.size_bytes),)),))
            alone = latency + isolated_time_s((c.size_bytes,), (route,), (1.0,), self.topo.capacity_Bps)
            hit = self._host_plans[key] = (plan, alone)
        return hit

    # ---- helpers ----------------------------------------------------------------------------------
    def _in_one_node(self, group: tuple[int, ...]) -> bool:
        g = self.scn.cluster.gpus_per_node
        return group[0] // g == group[-1] // g

    def _work_time_s(self, work) -> float:
        eager = not self.scn.training.cuda_graphs
        if self.tables is None:
            return self.roofline.work_time_s(work, eager)
        kernels_s = host_s = 0.0
        for op in work:
            if op.kind == "host":  # host-side time, not a kernel: no table holds it
                host_s += self.roofline.op_time_s(op)
                continue
            t = self.tables.lookup_s(op, self.scn.training.dtype)
            if t is None:
                self.missing.add(f"{op.kind}:{op.name}")
                t = self.roofline.op_time_s(op)
            elif op.kind in ("gemm", "attention"):  # one GPU's measured kernels; the job's slowest GPU
                t /= self.roofline.slowest_ratio
            kernels_s += t
        launches = sum(self.roofline.kernel_launches(op) for op in work)
        return with_host_floor_s(kernels_s, host_s, launches, eager)

    def warn_missing(self) -> None:
        if self.missing:
            print(f"warning: calibration tables lack {len(self.missing)} op(s), roofline used for: "
                  f"{', '.join(sorted(self.missing))}", file=sys.stderr)


def memo_by_collective(by_id: dict, by_value: dict, task: Task, answer):
    """``answer(task)`` memoised by the task's Collective: first by its identity (the tasks of one
    shape share the object; a lookup by identity skips hashing its group, thousands of ranks), else
    by value (equal collectives of other shapes)."""
    comm = task.comm
    hit = by_id.get(id(comm))
    if hit is not None and hit[0] is comm:
        return hit[1]
    value = by_value.get(comm)
    if value is None:
        value = by_value[comm] = answer(task)
    by_id[id(comm)] = (comm, value)
    return value
