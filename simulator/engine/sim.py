"""The discrete-event engine: runs a TaskGraph on simpy, one process per (rank, stream).

Each stream executes its tasks in program order. Tasks with a static duration (compute, host work,
collectives costed without the network) advance a per-stream clock without a simpy event; the
stream synchronises with simpy time only when it must wait for another stream, or before a
transfer whose time depends on concurrent traffic (``engine/network``). This lazy clock is exact:
static tasks do not interact with other streams except through dependencies, which carry their
end times. Events are created only for tasks that another stream waits on.

The parts, in SimPy's style (state objects plus generator processes): ``Clocks`` (task start and
end times and the events waited on, ``engine/events``), ``Transfers`` (network tasks and their contention),
``Barrier`` (a collective simulated on several ranks), the ``stream`` process for streams with
network or barrier tasks, and the ``static_lanes`` process that runs all static streams of one
rank as a list scheduler. ``simulate_graph`` wires them together.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Generator
from typing import Any
from dataclasses import dataclass
from functools import cached_property, partial
from itertools import compress
from operator import itemgetter
from typing import Protocol

import simpy

from ..cost.plan import CommPlan
from ..tasks import InternalError, Task, TaskGraph
from ..trace import ColumnTrace, Trace
from .events import Clocks, Event, Runner, run
from .network import FlowNetwork

Process = Generator[Event, Any, Any]  # a simpy process body: yields events, returns its result


class TaskCost(Protocol):
    def duration_s(self, task: Task) -> float | None:
        """Static seconds, or None when the task's transfer runs through the network."""

    def comm_plan(self, task: Task) -> CommPlan: ...

    def isolated_s(self, task: Task) -> float:
        """Seconds the task's transfer takes with the network to itself (contention baseline)."""


@dataclass(frozen=True)
class SimResult:
    trace: Trace
    start_s: list[float]
    end_s: list[float]
    makespan_s: float
    network: FlowNetwork
    contention_s: dict  # category -> seconds network transfers took beyond their time alone

    @cached_property
    def link_stats(self) -> dict:
        """LinkId -> (bytes, busy_s) at the end of the step; added up when first asked."""
        return self.network.link_stats()


class Transfers:
    """Tasks whose time depends on concurrent traffic: each runs its CommPlan through the flow
    network from a given start; the time beyond its isolated time is charged to its category."""

    def __init__(self, env: simpy.Environment, cost: TaskCost, capacity_Bps: dict) -> None:
        self.env, self.cost = env, cost
        self.net = FlowNetwork(env, capacity_Bps)
        self.contention: dict[str, float] = {}

    def run(self, t: Task, begin: float) -> Generator[Event, Any, float]:
        """Process body: wait until ``begin``, run the transfer; returns its end time."""
        elapsed = yield from self.net.run(self.cost.comm_plan(t), begin)
        self.charge(t.category, elapsed, self.cost.isolated_s(t))
        return self.env.now

    def charge(self, category: str, elapsed: float, alone_s: float) -> None:
        """Charge the seconds a transfer took beyond its time alone to its category."""
        extra = elapsed - alone_s
        if extra > 1e-12 * max(elapsed, 1.0):
            self.contention[category] = self.contention.get(category, 0.0) + extra


class Barrier:
    """One collective simulated on several ranks (full mode). Participants arrive with their
    stream clocks; the last to arrive runs it from the latest clock, and all leave at its end."""

    __slots__ = ("needed", "arrived", "latest_s", "begin_s", "end_s", "done")

    def __init__(self, env: simpy.Environment, needed: int) -> None:
        self.needed, self.arrived = needed, 0
        self.latest_s = self.begin_s = self.end_s = 0.0
        self.done = env.event()

    def arrive(self, clock: float, dur: float | None,
               run: Callable[[float], Generator[Event, Any, float]]) -> Generator[Event, Any, tuple[float, float]]:
        """Process body for one participant; returns (begin, end). ``dur`` is the static duration,
        or None: then ``run(begin)`` is the transfer's process body, returning its end."""
        self.arrived += 1
        self.latest_s = max(self.latest_s, clock) if self.arrived > 1 else clock
        if self.arrived < self.needed:
            yield self.done
            return self.begin_s, self.end_s
        self.begin_s = self.latest_s
        if dur is None:
            self.end_s = yield from run(self.begin_s)
        else:
            self.end_s = self.begin_s + dur
        self.done.succeed()
        return self.begin_s, self.end_s


def stream(clocks: Clocks, tasks: tuple[Task, ...], durations: list[float | None], ids: tuple[int, ...],
           barriers: dict[int, Barrier], transfers: Transfers, routes: dict, shapes) -> Process:
    """A stream with network or barrier tasks: program order, each task after its dependencies.
    ``routes``: by task shape (``shapes``), the (CommPlan, time alone) of a network transfer
    (``network_routes``)."""
    end, start, env, waiters = clocks.end, clocks.start, clocks.env, clocks.waiters
    net, charge = transfers.net, transfers.charge
    clock = 0.0
    for i in ids:
        t = tasks[i]
        for d in t.deps:
            e = end[d]
            if e is None:
                yield clocks.event(d)
                e = end[d]
                assert e is not None
            if e > clock:
                clock = e
        dur = durations[i]
        barrier = barriers.get(t.sync_key) if barriers and t.sync_key >= 0 else None
        if barrier is not None:
            start[i], clock = yield from barrier.arrive(clock, dur, partial(transfers.run, t))
        elif dur is None:  # Transfers.run inlined: one generator fewer per transfer
            start[i] = clock
            plan, alone_s = routes[shapes[i]]
            elapsed = yield from net.run(plan, clock)
            charge(t.category, elapsed, alone_s)
            clock = env._now
        else:
            start[i] = clock
            clock += dur
        end[i] = clock  # Clocks.finish inlined
        if i in waiters:
            waiters.pop(i).succeed()


def static_lanes(clocks: Clocks, durations: list, rank: int, lanes: list[tuple[int, ...]],
                 static_keys: set[tuple[int, str]], tasks: tuple[Task, ...]) -> Process:
    """All static streams of one rank in one process: a list scheduler that advances every lane
    whose next task's dependencies are known, and waits on simpy only when all are blocked by tasks
    of other processes. Exact, and free of the per-dependency context switches. When every lane
    waits on a task of this same process, they wait on each other: a dependency cycle.
    (``Clocks.finish`` is inlined: this loop runs once per task of the step.)"""
    end, start, waiters, env = clocks.end, clocks.start, clocks.waiters, clocks.env
    pos = [0] * len(lanes)
    clocks_s = [0.0] * len(lanes)
    sizes = [len(ids) for ids in lanes]
    left = sum(sizes)
    while left:
        blocked: list[int] = []
        before = left
        for j, ids in enumerate(lanes):
            k, clock, n = pos[j], clocks_s[j], sizes[j]
            while k < n:
                i = ids[k]
                for d in tasks[i][6]:  # Task.deps
                    e = end[d]
                    if e is None:
                        t = tasks[d]
                        if t[3] != rank or (rank, t[4]) not in static_keys:  # only another process runs it
                            blocked.append(d)
                        break
                    if e > clock:
                        clock = e
                else:
                    start[i] = clock
                    clock += durations[i]
                    end[i] = clock
                    if i in waiters:
                        waiters.pop(i).succeed()
                    k += 1
                    continue
                break
            left -= k - pos[j]
            pos[j], clocks_s[j] = k, clock
        if left and left == before:
            if not blocked:
                raise InternalError(_cycle_message(tasks, end, rank, lanes, pos))
            # every lane waits on another process's task: wake on the first
            yield clocks.event(blocked[0]) if len(blocked) == 1 else clocks.first_of(blocked)


def _cycle_message(tasks: tuple[Task, ...], end: list, rank: int, lanes: list, pos: list[int]) -> str:
    stuck = [tasks[ids[k]] for ids, k in zip(lanes, pos) if k < len(ids)]
    t = stuck[0]
    waits = next(tasks[d].name for d in t.deps if end[d] is None)
    return (f"simulation deadlocked: a dependency cycle among the streams of rank {rank}: "
            f"{t.name!r} ({t.stream}) waits for {waits!r}, which its own rank cannot reach")


def simulate_graph(graph: TaskGraph, cost: TaskCost, capacity_Bps: dict | None = None,
                   rank_labels: dict | None = None, metadata: dict | None = None,
                   by_shape: bool = False, durations: list[float | None] | None = None) -> SimResult:
    """Run ``graph``. ``by_shape``: ``cost`` answers ``duration_s`` from the fields a task shape fixes
    (TaskGraph.shapes: kind, stream, category, work, collective, phase, layer), as the cost models
    do, so it is asked once per shape. ``durations``: every task's static seconds (None: through
    the network), given instead of asking ``cost`` (``task_durations``; a second pass's)."""
    tasks = graph.tasks
    n = len(tasks)
    env = simpy.Environment()
    clocks = Clocks(env, n)
    transfers = Transfers(env, cost, capacity_Bps or {})
    if durations is None:
        durations = task_durations(graph, cost, by_shape)
    sync = list(map(itemgetter(15), tasks))  # Task.sync_key: the copies of a collective on several ranks
    participants = Counter(sync)
    participants.pop(-1, None)
    barriers = {k: Barrier(env, c) for k, c in participants.items() if c > 1}
    synced = set(compress(range(n), map(barriers.__contains__, sync))) if barriers else set()
    static: dict[int, list[tuple[int, ...]]] = {}
    static_keys: set[tuple[int, str]] = set()  # the (rank, stream) lanes run by a static process
    routes = network_routes(graph, cost, durations) if None in durations else {}
    shapes = graph.shapes or range(n)
    for (rank, name), ids in graph.streams.items():
        if None not in map(durations.__getitem__, ids) and (not synced or synced.isdisjoint(ids)):
            static.setdefault(rank, []).append(ids)
            static_keys.add((rank, name))
        else:
            Runner(env, stream(clocks, tasks, durations, ids, barriers, transfers, routes, shapes))
    for rank, lanes in static.items():
        Runner(env, static_lanes(clocks, durations, rank, lanes, static_keys, tasks))
    run(env)
    if None in clocks.end:
        missing = [tasks[i].name for i in range(n) if clocks.end[i] is None]
        raise InternalError(f"simulation deadlocked: {len(missing)} tasks never ran, first {missing[0]!r}")
    end: list[float] = clocks.end  # type: ignore[assignment]
    trace = ColumnTrace(tasks, clocks.start, end, _flops(graph), "simulated", rank_labels, metadata, graph.streams)
    return SimResult(trace, clocks.start, end, max(end) if n else 0.0, transfers.net,
                     transfers.contention)


def task_durations(graph: TaskGraph, cost: TaskCost, by_shape: bool = False) -> list[float | None]:
    """``cost.duration_s`` of every task (once per task shape with ``by_shape``)."""
    return per_shape(graph, cost.duration_s) if by_shape else [cost.duration_s(t) for t in graph.tasks]


def network_routes(graph: TaskGraph, cost: TaskCost, durations: list[float | None]) -> dict:
    """Task shape -> (``cost.comm_plan``, ``cost.isolated_s``) of the shapes whose duration is the
    network's (None): asked once per shape, so that a stream reads its transfers' plans by shape."""
    return {k: (cost.comm_plan(t), cost.isolated_s(t)) for k, t in graph.shape_tasks().items()
            if durations[t.id] is None}


def per_shape(graph: TaskGraph, of: Callable[[Task], Any]) -> list:
    """``of(task)`` for every task, computed once per task shape (TaskGraph.shapes; every task its
    own shape when the graph has none) and spread by C-level maps."""
    per = {k: of(t) for k, t in graph.shape_tasks().items()}
    return list(map(per.__getitem__, graph.shapes or range(len(graph.tasks))))


def _flops(graph: TaskGraph) -> list[float]:
    """FLOPs of every task: its work's, summed once per distinct work tuple (shared between tasks)."""
    sums: dict[int, float] = {}

    def of(task: Task) -> float:
        total = sums.get(id(task.work))
        if total is None:
            total = sums[id(task.work)] = sum(w.flops for w in task.work)
        return total
    return per_shape(graph, of)
