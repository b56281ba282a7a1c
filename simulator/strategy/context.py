"""LowerCtx: the state shared while lowering one scenario into a task graph.

It owns the TaskGraphBuilder and small helpers that append compute and communication tasks for
one rank, so that ``layer_emit``, ``grad_sync`` and ``lower`` read as the framework's program order.
Activation memory rides on compute tasks: ``alloc_next`` makes the rank's next compute kernel
allocate, ``free_last`` makes its latest one release (tasks.Task.mem_delta_bytes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..model.opgraph import OpGraph
from ..tasks import Collective, OpWork, TaskGraphBuilder
from .stage_units import LayerMemory
from .blocking_tp import TPTraffic, tp_traffic
from .blocks import LayerBlocks
from .sharding import heads_per_tp_rank
from .mesh import DeviceMesh

if TYPE_CHECKING:  # scenario is this layer's reader and imports strategy: a type-only import
    from ..scenario import Scenario

COMPUTE = "compute"
# Stream of the asynchronous TP collectives of the backward (Megatron-LM launches them with
# async_op=True on NCCL's own stream and overlaps them with the weight-gradient GEMM).
COMM_TP = "comm_tp"
_ACTIVATION_CATEGORIES = ("compute", "recompute")


@dataclass
class LowerCtx:
    scn: Scenario
    mesh: DeviceMesh
    graph: OpGraph
    blocks: LayerBlocks
    full: bool
    builder: TaskGraphBuilder = field(default_factory=TaskGraphBuilder)
    # per layer index: its blocks (shared by the layers of one template, ``blocks.layer_blocks``) and
    # its activation deltas (``activation_memory.layer_memory``); empty: every layer is ``blocks``
    layers: tuple[LayerBlocks, ...] = ()
    layer_mem: tuple[LayerMemory, ...] = ()
    _sync_keys: dict = field(default_factory=dict)
    _sync_seq: dict = field(default_factory=dict)
    _pending_alloc: dict = field(default_factory=dict)  # rank -> bytes the next kernel allocates
    _last_kernel: dict = field(default_factory=dict)  # rank -> latest compute task with work
    _stage: dict = field(default_factory=dict)  # rank -> pipeline stage (cache)
    _groups: dict = field(default_factory=dict)  # (axis, rank) -> group (cache)
    _collectives: dict = field(default_factory=dict)  # Collective interning: one object per distinct value
    _tp_traffic: TPTraffic | None = None

    # ---- shorthands -----------------------------------------------------------------------
    @property
    def par(self):
        return self.scn.parallel

    @property
    def dtype_bytes(self) -> int:
        return self.scn.training.dtype_bytes

    def full_activation_bytes(self) -> float:
        """b·(s/cp)·h elements in the training dtype: the TP collectives' buffer (nccl-tests size of an
        all-reduce, of a reduce-scatter's input, of an all-gather's output) outside FP8's gathers, and
        what a pipeline send carries (``blocking_tp.TPTraffic``)."""
        return self.traffic().bytes()

    def tp_bytes(self, site: str = "") -> float:
        """Bytes of a layer's TP/SP collective at TE gather ``site`` ("" for others; blocking_tp.TPTraffic)."""
        return self.traffic().bytes(site)

    @property
    def cp_tokens(self) -> int:
        """Tokens of one CP rank's block of a micro-batch: b·(s/cp)."""
        return self.scn.training.micro_batch_size * (self.scn.model.seq_length // self.par.cp)

    def cp_block_bytes(self, width: int) -> float:
        """A CP rank's block of a tensor ``width`` wide across the heads, on one TP rank (1/tp of the width)."""
        return self.cp_tokens * width / self.par.tp * self.dtype_bytes

    def kv_block_bytes(self) -> float:
        """K and V of one CP rank's block on one TP rank: its K/V heads (``heads_per_tp_rank``), K at
        head_dim and V at v_head_dim wide (MLA's differ)."""
        m = self.scn.model
        return self.cp_tokens * heads_per_tp_rank(m.num_kv_heads, self.par.tp) * (m.head_dim + m.v_head_dim) \
            * self.dtype_bytes

    def traffic(self) -> TPTraffic:
        if self._tp_traffic is None:
            self._tp_traffic = tp_traffic(self.scn)
        return self._tp_traffic

    def layer_blocks(self, layer: int) -> LayerBlocks:
        """The blocks of layer ``layer`` (its template's, ``OpGraph.layer_ops``)."""
        return self.layers[layer] if self.layers else self.blocks

    def transient_bytes(self, layer: int) -> float:
        """Bytes a recomputed layer re-materialises from its recompute until its backward ends."""
        return self.layer_mem[layer].transient if self.layer_mem else 0.0

    def recompute_alloc_bytes(self, layer: int) -> float:
        """Bytes a recomputed layer's first recompute task allocates (``LayerMemory.recompute_alloc``)."""
        return self.layer_mem[layer].recompute_alloc if self.layer_mem else 0.0

    def stage(self, rank: int) -> int:
        s = self._stage.get(rank)
        if s is None:
            s = self._stage[rank] = self.mesh.stage_of(rank)
        return s

    def group(self, axis: str, rank: int) -> tuple[int, ...]:
        g = self._groups.get((axis, rank))
        if g is None:
            g = self._groups[(axis, rank)] = self.mesh.group(axis, rank)
        return g

    # ---- activation memory on compute tasks ------------------------------------------------
    def alloc_next(self, rank: int, nbytes: float) -> None:
        """The rank's next compute kernel allocates ``nbytes`` (at its start)."""
        if nbytes:
            self._pending_alloc[rank] = self._pending_alloc.get(rank, 0.0) + nbytes

    def free_last(self, rank: int, nbytes: float) -> None:
        """The rank's latest compute kernel releases ``nbytes`` (at its end); a negative amount is an
        allocation, applied to the next kernel instead."""
        if nbytes < 0:
            self.alloc_next(rank, -nbytes)
        elif nbytes:
            tid = self._last_kernel[rank]
            old = self.builder.task(tid).mem_delta_bytes
            if old > 0:
                raise ValueError(f"task {self.builder.task(tid).name!r} both allocates {old} and frees {nbytes} bytes")
            self.builder.set_mem(tid, old - nbytes)

    def sync_key(self, rank: int, group: tuple[int, ...]) -> int:
        """The barrier key of ``rank``'s next collective over ``group``: every simulated participant
        emits its copy in the same order, so the copies are numbered per group."""
        seq = self._sync_seq.get((rank, group), 0)
        self._sync_seq[(rank, group)] = seq + 1
        return self._sync_keys.setdefault((group, seq), len(self._sync_keys))

    # ---- task constructors ---------------------------------------------------------------
    def compute(self, rank: int, name: str, work: tuple[OpWork, ...], deps=(), category: str = "compute",
                **meta) -> int:
        kernel = bool(work) and category in _ACTIVATION_CATEGORIES
        if kernel and self._pending_alloc.get(rank):
            if meta.get("mem_delta_bytes", 0.0) < 0:
                raise ValueError(f"task {name!r} would both allocate and free activations")
            meta["mem_delta_bytes"] = meta.get("mem_delta_bytes", 0.0) + self._pending_alloc.pop(rank)
        tid = self.builder.add(name, "compute", rank, COMPUTE, category, deps, work=work,
                               stage=self.stage(rank), **meta)
        if kernel:
            self._last_kernel[rank] = tid
        return tid

    def host(self, rank: int, name: str, work: tuple[OpWork, ...], deps=(), **meta) -> int:
        return self.builder.add(name, "host", rank, "host", "optimizer", deps, work=work,
                                stage=self.stage(rank), **meta)

    def comm(self, rank: int, stream: str, name: str, op: str, size_bytes: float, group: tuple[int, ...],
             axis: str, category: str, deps=(), overlap: tuple = (), **meta) -> int:
        sync = -1
        if len(group) > 1 and op != "send_recv" and (self.full or axis == "pp"):
            # In symmetric mode only a pipeline-axis group (the tied-embedding all-reduce) holds more
            # than one simulated representative; every other group has one and needs no barrier.
            sync = self.sync_key(rank, group)
        key = (op, float(size_bytes), group, axis, overlap)
        c = self._collectives.get(key)
        if c is None:
            c = self._collectives[key] = Collective(*key)
        return self.builder.add(name, "comm", rank, stream, category, deps, comm=c, stage=self.stage(rank),
                                sync_key=sync, **meta)

    def tp_collective(self, rank: int, name: str, op: str, size_bytes: float, deps=(), stream: str = COMPUTE,
                      overlap: tuple = (), **meta) -> int | None:
        """A TP/SP collective; blocking on the compute stream unless another ``stream`` is given
        (Megatron runs the forward ones in the critical path). None when tp = 1. ``overlap``: (site,
        GEMM work) when tp_comm_overlap chunks it under that GEMM (cost/tp_overlap)."""
        if self.par.tp == 1:
            return None
        return self.comm(rank, stream, name, op, size_bytes, self.group("tp", rank), "tp", "comm_tp", deps,
                         overlap, **meta)

    def join(self, rank: int, name: str, deps, **meta) -> int | None:
        """One task id standing for all of ``deps`` (a zero-work wait on the compute stream when
        there are several); None when there are none."""
        deps = tuple(d for d in deps if d is not None)
        if len(deps) <= 1:
            return deps[0] if deps else None
        return self.builder.add(name, "compute", rank, COMPUTE, "compute", deps, stage=self.stage(rank), **meta)
