"""The task-graph IR: per-rank compute and communication tasks with explicit dependencies.

Tasks describe work (FLOPs, bytes, collective kind and group), never time: ``cost/`` turns work
into seconds and ``engine/`` decides when each task runs. Program order on a stream is the order
of its task list; every other ordering constraint is an explicit dependency (DESIGN.md §5).
"""

from __future__ import annotations

from bisect import bisect_left

from dataclasses import dataclass, field
from typing import NamedTuple

TASK_KINDS = ("compute", "comm", "host")
# Breakdown categories of metrics.json time_breakdown_s (DESIGN.md §4.3), minus "bubble"
# which is idle time, not a task.
CATEGORIES = ("compute", "recompute", "comm_tp", "comm_cp", "comm_ep", "comm_pp", "comm_dp",
              "optimizer", "offload", "other")
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv",
                  "broadcast")
# Copies between a GPU and its node's host memory over PCIe (ZeRO-Offload), axis "host".
HOST_COPY_OPS = ("d2h", "h2d")


class InternalError(RuntimeError):
    """A broken invariant of the simulator itself (a deadlocked schedule or simulation, an impossible
    memory state): a bug to report, never the user's input, which is a ValueError (exit 2)."""


@dataclass(frozen=True, slots=True)
class OpWork:
    """One kernel's worth of work on one rank, already divided by the parallel split."""

    name: str
    kind: str  # gemm | attention | elementwise | norm | softmax | embedding | loss | optimizer | memcpy
    flops: float
    bytes: float  # HBM bytes read + written
    shape: tuple[int, ...] = ()  # gemm: (m, n, k); attention: (batch, heads, seq_q, seq_kv, head_dim)
    precision: str = ""  # "fp8": a Transformer Engine FP8 GEMM; "" = the training dtype
    backward: bool = False  # work of a backward pass (B, W or both): kernels that recompute know it
    kernels: int = 1  # kernels launched for it (eager PyTorch: one per tensor op, model/eager.py)
    causal: bool = True  # attention: the kernel applies the causal mask (a CP ring's later steps do not)


def gemm_grad_shapes(shape: tuple[int, int, int]) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """The two backward GEMMs of a forward (m, n, k) GEMM Y = X·W: the input gradient dX = dY·Wᵀ,
    an (m, k) output reduced over n, and the weight gradient dW = Xᵀ·dY, a (k, n) output reduced
    over m (Narayanan et al. 2021 §3.2)."""
    m, n, k = shape
    return (m, k, n), (k, n, m)


@dataclass(frozen=True, slots=True)
class Collective:
    """A collective (or P2P transfer) over ``group``, global ranks in ring order.

    ``size_bytes`` follows nccl-tests: the per-rank buffer for all_reduce / reduce_scatter input /
    all_to_all send buffer, the gathered output for all_gather, the message for send_recv.
    """

    op: str
    size_bytes: float
    group: tuple[int, ...]
    axis: str  # tp | cp | ep | pp | dp | host
    # TP collective overlapped with a GEMM (tp_comm_overlap): (site of cost/tp_overlap.UB_SITES, the
    # GEMM's OpWork); the task then costs only what the overlap leaves exposed
    overlap: tuple = ()


class Task(NamedTuple):
    """One task of the IR. Immutable like the other IR types, but a NamedTuple: a 1024-GPU step
    lowers to ~300k tasks and tuple construction is 3-4x cheaper than a frozen dataclass's."""

    id: int
    name: str
    kind: str  # compute | comm | host
    rank: int
    stream: str
    category: str
    deps: tuple[int, ...] = ()  # explicit dependencies (any stream); stream order is implicit
    work: tuple[OpWork, ...] = ()  # compute / host work
    comm: Collective | None = None
    stage: int = -1
    microbatch: int = -1
    chunk: int = -1
    phase: str = ""  # F | B | W | R (recompute) | O (optimizer) | "" (other)
    layer: int = -1
    mem_delta_bytes: float = 0.0  # activation/buffer memory: + allocated at start, - freed at end
    sync_key: int = -1  # full mode: the copies of one collective on every simulated participant

    @property
    def flops(self) -> float:
        return sum(w.flops for w in self.work)


@dataclass(frozen=True, slots=True)
class TaskGraph:
    """Tasks indexed by id, plus the program order of every (rank, stream)."""

    tasks: tuple[Task, ...]
    streams: dict  # (rank, stream) -> tuple of task ids in program order
    ranks: tuple[int, ...]  # simulated ranks
    full: bool  # True: every rank simulated; False: one representative per pipeline stage
    meta: dict = field(default_factory=dict)
    # per task, its shape: tasks of one shape were stamped from one template row (strategy/stamp)
    # and carry equal kind, stream, category, work, collective, phase and layer (what a cost model
    # reads), so what depends on those alone is computed once per shape; () when not known
    shapes: tuple[int, ...] = ()
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.tasks)

    def shape_tasks(self) -> dict[int, Task]:
        """A task of every shape: shape -> its last task (every task its own shape when the graph
        has none); made once per graph, for the passes that ask something once per shape."""
        one = self._memo.get("shape_tasks")
        if one is None:
            one = self._memo["shape_tasks"] = dict(zip(self.shapes or range(len(self.tasks)), self.tasks))
        return one

    def validate(self) -> None:
        """Raise ValueError on a malformed graph: bad ids, dangling deps, cycles, orphans."""
        n = len(self.tasks)
        if self.shapes and len(self.shapes) != n:
            raise ValueError(f"{len(self.shapes)} task shapes for {n} tasks")
        for i, t in enumerate(self.tasks):
            if t.id != i:
                raise ValueError(f"task {t.name!r} has id {t.id} at index {i}")
            if t.kind not in TASK_KINDS:
                raise ValueError(f"task {t.name!r} has kind {t.kind!r}; known: {TASK_KINDS}")
            if t.category not in CATEGORIES:
                raise ValueError(f"task {t.name!r} has category {t.category!r}")
            for d in t.deps:
                if not 0 <= d < n:
                    raise ValueError(f"task {t.name!r} depends on unknown task {d}")
            if t.comm is not None and t.comm.op not in (HOST_COPY_OPS if t.comm.axis == "host" else COLLECTIVE_OPS):
                raise ValueError(f"task {t.name!r} has {t.comm.axis} transfer op {t.comm.op!r}")
        seen = [0] * n
        for key, ids in self.streams.items():
            for i in ids:
                seen[i] += 1
                if (self.tasks[i].rank, self.tasks[i].stream) != key:
                    raise ValueError(f"task {self.tasks[i].name!r} listed on stream {key}")
        if any(c != 1 for c in seen):
            bad = next(i for i, c in enumerate(seen) if c != 1)
            raise ValueError(f"task {self.tasks[bad].name!r} is on {seen[bad]} streams, not 1")
        self._check_acyclic()

    def _check_acyclic(self) -> None:
        preds: list[list[int]] = [list(t.deps) for t in self.tasks]
        for ids in self.streams.values():
            for a, b in zip(ids, ids[1:]):
                preds[b].append(a)
        indeg = [len(p) for p in preds]
        succs: list[list[int]] = [[] for _ in self.tasks]
        for b, ps in enumerate(preds):
            for a in ps:
                succs[a].append(b)
        ready = [i for i, d in enumerate(indeg) if d == 0]
        done = 0
        while ready:
            i = ready.pop()
            done += 1
            for j in succs[i]:
                indeg[j] -= 1
                if indeg[j] == 0:
                    ready.append(j)
        if done != len(self.tasks):
            stuck = next(i for i, d in enumerate(indeg) if d > 0)
            raise ValueError(f"dependency cycle through task {self.tasks[stuck].name!r}")


class TaskGraphBuilder:
    """Mutable helper the lowering uses to append tasks in program order."""

    def __init__(self) -> None:
        self._tasks: list[Task] = []
        self._streams: dict[tuple[int, str], list[int]] = {}
        self._shapes: list[int] = []  # TaskGraph.shapes: a task added one by one is its own shape

    def add(self, name: str, kind: str, rank: int, stream: str, category: str,
            deps: tuple[int, ...] | list[int] = (), **fields) -> int:
        tid = len(self._tasks)
        self._tasks.append(Task(tid, name, kind, rank, stream, category, tuple(deps), **fields))
        self._shapes.append(tid)
        self._streams.setdefault((rank, stream), []).append(tid)
        return tid

    def task(self, tid: int) -> Task:
        return self._tasks[tid]

    def last_on(self, rank: int, stream: str) -> int | None:
        ids = self._streams.get((rank, stream))
        return ids[-1] if ids else None

    def last_before(self, rank: int, stream: str, tid: int) -> int | None:
        """The last task of (rank, stream) created before id ``tid``."""
        ids = self._streams.get((rank, stream), [])
        k = bisect_left(ids, tid)
        return ids[k - 1] if k else None

    def set_mem(self, tid: int, mem_delta_bytes: float) -> None:
        """Attach a memory allocation (+) or release (-) to an already appended task."""
        self._tasks[tid] = self._tasks[tid]._replace(mem_delta_bytes=mem_delta_bytes)

    def stream_ids(self, rank: int, stream: str) -> tuple[int, ...]:
        return tuple(self._streams.get((rank, stream), ()))

    def __len__(self) -> int:
        return len(self._tasks)

    def reorder_tail(self, rank: int, since: int, key) -> None:
        """Re-order, on every stream of ``rank``, the tasks appended since id ``since`` by ``key(id)``
        (a stable sort: tasks of equal key keep their program order). Dependencies are untouched; the
        caller's order must respect them."""
        for (r, _stream), ids in self._streams.items():
            if r != rank or not ids or ids[-1] < since:
                continue
            k = len(ids)
            while k and ids[k - 1] >= since:
                k -= 1
            ids[k:] = sorted(ids[k:], key=key)

    def build(self, ranks: tuple[int, ...], full: bool, meta: dict | None = None) -> TaskGraph:
        streams = {k: tuple(v) for k, v in self._streams.items()}
        return TaskGraph(tuple(self._tasks), streams, ranks, full, dict(meta or {}), tuple(self._shapes))
