"""The discrete-event engine: runs a TaskGraph on simpy, one process per (rank, stream).

Each stream executes its tasks in program order. Tasks with a static duration (compute, host work,
collectives costed without the network) advance a per-stream clock without a simpy event; the
stream synchronises with simpy time only when it must wait for another stream, or before a
transfer whose time depends on concurrent traffic (``engine/network``). This lazy clock is exact:
static tasks do not interact with other streams except through dependencies, which carry their
end times. Events are created only for tasks that another stream waits on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import simpy

from ..cost.plan import CommPlan
from ..tasks import InternalError, Task, TaskGraph
from ..trace import Trace, TraceEvent
from .network import FlowNetwork


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
    link_stats: dict  # LinkId -> (bytes, busy_s)
    contention_s: dict  # category -> seconds network transfers took beyond their time alone


def simulate_graph(graph: TaskGraph, cost: TaskCost, capacity_Bps: dict | None = None,
                   rank_labels: dict | None = None, metadata: dict | None = None) -> SimResult:
    tasks = graph.tasks
    n = len(tasks)
    env = simpy.Environment()
    net = FlowNetwork(env, capacity_Bps or {})
    durations = [cost.duration_s(t) for t in tasks]
    start = [0.0] * n
    end: list[float | None] = [None] * n
    waiters: dict[int, simpy.Event] = {}
    # Collectives simulated on several ranks (full mode): participants meet at a barrier.
    participants: dict[int, int] = {}
    for t in tasks:
        if t.sync_key >= 0:
            participants[t.sync_key] = participants.get(t.sync_key, 0) + 1
    barriers: dict[int, list] = {}  # key -> [arrived, max_clock, event, end]

    contention: dict[str, float] = {}

    def slowdown(t: Task, elapsed: float) -> None:
        extra = elapsed - cost.isolated_s(t)
        if extra > 1e-12 * max(elapsed, 1.0):
            contention[t.category] = contention.get(t.category, 0.0) + extra

    def finish(i: int, t_end: float) -> None:
        end[i] = t_end
        ev = waiters.pop(i, None)
        if ev is not None:
            ev.succeed()

    def run_stream(ids: tuple[int, ...]):
        clock = 0.0
        for i in ids:
            t = tasks[i]
            for d in t.deps:
                e = end[d]
                if e is None:
                    ev = waiters.get(d)
                    if ev is None:
                        ev = waiters[d] = env.event()
                    yield ev
                    e = end[d]
                if e > clock:
                    clock = e
            if t.sync_key >= 0 and participants[t.sync_key] > 1:
                clock = yield from barrier(t, i, clock)
                start[i] = barriers[t.sync_key][4]
                finish(i, clock)
                continue
            dur = durations[i]
            start[i] = clock
            if dur is None:
                if clock > env.now:
                    yield env.timeout(clock - env.now)
                elapsed = yield from net.run(cost.comm_plan(t))
                slowdown(t, elapsed)
                clock = env.now
            else:
                clock += dur
            finish(i, clock)

    def barrier(t: Task, i: int, clock: float):
        state = barriers.get(t.sync_key)
        if state is None:
            state = barriers[t.sync_key] = [0, clock, env.event(), 0.0, 0.0]
        state[0] += 1
        state[1] = max(state[1], clock)
        if state[0] < participants[t.sync_key]:
            yield state[2]
            return state[3]
        begin = state[1]
        state[4] = begin
        dur = durations[i]
        if dur is None:
            if begin > env.now:
                yield env.timeout(begin - env.now)
            elapsed = yield from net.run(cost.comm_plan(t))
            slowdown(t, elapsed)
            state[3] = env.now
        else:
            state[3] = begin + dur
        state[2].succeed()
        return state[3]

    def wait_for(d: int):
        ev = waiters.get(d)
        if ev is None:
            ev = waiters[d] = env.event()
        return ev

    def run_static(rank: int, lanes: list[tuple[int, ...]]):
        """Several static streams of one rank in one process: a list scheduler that advances every
        lane whose next task's dependencies are known, and waits on simpy only when all are blocked
        by tasks of other processes. Exact, and free of the per-dependency context switches."""
        pos = [0] * len(lanes)
        clocks = [0.0] * len(lanes)
        left = sum(len(ids) for ids in lanes)
        while left:
            blocked: list[int] = []
            before = left
            for j, ids in enumerate(lanes):
                k, clock = pos[j], clocks[j]
                while k < len(ids):
                    i = ids[k]
                    for d in tasks[i].deps:
                        e = end[d]
                        if e is None:
                            if group_of[d] != rank:  # only another process can resolve it
                                blocked.append(d)
                            break
                        if e > clock:
                            clock = e
                    else:
                        start[i] = clock
                        clock += durations[i]
                        finish(i, clock)
                        k += 1
                        continue
                    break
                left -= k - pos[j]
                pos[j], clocks[j] = k, clock
            if left and left == before:  # every lane waits on another process's task: wake on the first
                yield wait_for(blocked[0]) if len(blocked) == 1 else env.any_of([wait_for(d) for d in blocked])

    def is_static(ids: tuple[int, ...]) -> bool:
        return all(durations[i] is not None and not (tasks[i].sync_key >= 0 and participants[tasks[i].sync_key] > 1)
                   for i in ids)

    static_lanes: dict[int, list[tuple[int, ...]]] = {}
    group_of = [-1] * n  # the rank whose static process runs the task, -1 for a network stream's task
    for (rank, _stream), ids in graph.streams.items():
        if is_static(ids):
            static_lanes.setdefault(rank, []).append(ids)
            for i in ids:
                group_of[i] = rank
        else:
            env.process(run_stream(ids))
    for rank, lanes in static_lanes.items():
        env.process(run_static(rank, lanes))
    env.run()
    missing = [tasks[i].name for i in range(n) if end[i] is None]
    if missing:
        raise InternalError(f"simulation deadlocked: {len(missing)} tasks never ran, first {missing[0]!r}")
    flops: dict[int, float] = {}  # work tuples are shared between tasks: sum each once
    for t in tasks:
        if id(t.work) not in flops:
            flops[id(t.work)] = t.flops
    events = tuple(
        TraceEvent(t.name, t.category, t.rank, t.stream, start[t.id], end[t.id], t.stage, t.microbatch,
                   t.chunk, t.phase, t.layer, flops[id(t.work)], t.mem_delta_bytes)
        for t in tasks)
    makespan = max(end) if n else 0.0  # type: ignore[type-var]
    trace = Trace(events, "simulated", dict(rank_labels or {}), dict(metadata or {}))
    return SimResult(trace, start, end, makespan, net.link_stats(), contention)  # type: ignore[arg-type]
