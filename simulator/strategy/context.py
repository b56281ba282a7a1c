"""LowerCtx: the state shared while lowering one scenario into a task graph.

It owns the TaskGraphBuilder and small helpers that append compute and communication tasks for
one rank, so that ``layer_emit``, ``grad_sync`` and ``lower`` read as the framework's program order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..model.opgraph import OpGraph
from ..tasks import Collective, OpWork, TaskGraphBuilder
from .blocks import LayerBlocks
from .mesh import DeviceMesh

COMPUTE = "compute"


@dataclass
class LowerCtx:
    scn: object  # scenario.Scenario
    mesh: DeviceMesh
    graph: OpGraph
    blocks: LayerBlocks
    full: bool
    builder: TaskGraphBuilder = field(default_factory=TaskGraphBuilder)
    _sync_keys: dict = field(default_factory=dict)
    _sync_seq: dict = field(default_factory=dict)

    # ---- shorthands -----------------------------------------------------------------------
    @property
    def par(self):
        return self.scn.parallel

    @property
    def dtype_bytes(self) -> int:
        return self.scn.training.dtype_bytes

    def activation_bytes(self) -> float:
        """One micro-batch's hidden-state tensor on one rank: b·(s/cp)·h (divided by tp with SP)."""
        m = self.scn.model
        n = self.scn.training.micro_batch_size * (m.seq_length // self.par.cp) * m.hidden_size
        return n * self.dtype_bytes / (self.par.tp if self.par.sequence_parallel else 1)

    def full_activation_bytes(self) -> float:
        m = self.scn.model
        return self.scn.training.micro_batch_size * (m.seq_length // self.par.cp) * m.hidden_size * self.dtype_bytes

    # ---- task constructors ---------------------------------------------------------------
    def compute(self, rank: int, name: str, work: tuple[OpWork, ...], deps=(), category: str = "compute",
                **meta) -> int:
        return self.builder.add(name, "compute", rank, COMPUTE, category, deps, work=work,
                                stage=self.mesh.stage_of(rank), **meta)

    def host(self, rank: int, name: str, work: tuple[OpWork, ...], deps=(), **meta) -> int:
        return self.builder.add(name, "host", rank, "host", "optimizer", deps, work=work,
                                stage=self.mesh.stage_of(rank), **meta)

    def comm(self, rank: int, stream: str, name: str, op: str, size_bytes: float, group: tuple[int, ...],
             axis: str, category: str, deps=(), **meta) -> int:
        sync = -1
        if self.full and len(group) > 1 and op != "send_recv":
            # every simulated participant emits its copy in the same order: number them per group
            seq = self._sync_seq.get((rank, group), 0)
            self._sync_seq[(rank, group)] = seq + 1
            sync = self._sync_keys.setdefault((group, seq), len(self._sync_keys))
        return self.builder.add(name, "comm", rank, stream, category, deps,
                                comm=Collective(op, float(size_bytes), group, axis),
                                stage=self.mesh.stage_of(rank), sync_key=sync, **meta)

    def tp_collective(self, rank: int, name: str, op: str, size_bytes: float, deps=(), **meta) -> int | None:
        """A blocking TP/SP collective on the compute stream (Megatron runs them in the critical path)."""
        if self.par.tp == 1:
            return None
        return self.comm(rank, COMPUTE, name, op, size_bytes, self.mesh.group("tp", rank), "tp", "comm_tp",
                         deps, **meta)
