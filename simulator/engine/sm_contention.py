"""Compute slowed by the SMs that communication kernels hold beside it: durations for a second run.

A collective's kernel holds one SM per NCCL channel for as long as it runs (cost/sm_share), and a
compute kernel beside it runs on the SMs left. Which compute overlaps which collective is known only
once the step is timed, so the step is run twice (pipeline._contended_durations): a first, cheap run
(every transfer at its time alone) gives each rank's timeline; each compute task's time is then split
by the number of SMs the rank's collectives held under it, and a task that spent ``o`` seconds
beside collectives holding ``c`` SMs gets ``o * (ratio(c) - 1)`` added (ratio: its time on the SMs
left over its time on the whole GPU); the reported run times the step with those durations. One
correction, not a fixed point (first order in the slowdown, which the tests bound).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from itertools import chain, compress
from math import isfinite

import numpy as np

from ..tasks import Task, TaskGraph

_INF = float("inf")


def static_times(graph: TaskGraph, durations: Sequence[float]) -> tuple[list[float], list[float]] | None:
    """(start, end) of every task when every duration is static: what ``engine/sim.simulate_graph``
    gives for these ``durations`` (the first run, which has no network), without simpy. Each task
    starts at the latest of the end of the task before it on its stream and its dependencies' ends,
    the same max and sum of the same floats as the engine's clocks; the copies of a collective run on
    several simulated ranks (a barrier) start together at the latest of their arrivals. One sweep in
    id order times every task whose inputs come before it (dependencies always do, stream order does
    but on a re-ordered DualPipe stream); an unknown time is +inf there, the tasks with a sync key are
    held at +inf, and what is left is settled stream by stream. None when the engine itself must run: a
    duration that is not finite, barrier copies of unequal durations, or a cycle (the engine reports it)."""
    tasks = graph.tasks
    n = len(tasks)
    prev = [n] * n  # the task before on the stream; n: none (end[n] = 0.0)
    placed = 0
    for ids in graph.streams.values():
        placed += len(ids)
        deque(map(prev.__setitem__, ids[1:], ids[:-1]), 0)
    if placed != n or not isfinite(sum(durations)):
        return None
    start, end = [_INF] * n, [_INF] * n + [0.0]
    synced = _sweep(tasks, prev, durations, start, end)
    barriers = [m for m in synced.values() if len(m) > 1]
    if any(len({durations[i] for i in m}) > 1 for m in barriers):
        return None
    if _INF in end and not _settle(graph.streams.values(), tasks, durations, barriers, start, end):
        return None
    del end[n]
    return start, end


def _sweep(tasks: Sequence[Task], prev: list[int], dur: Sequence[float], start: list[float],
           end: list[float]) -> dict[int, list[int]]:
    """``static_times``'s sweep: every task in id order (most tasks wait for one task); a task with a
    sync key (a barrier copy, or alone) is held at +inf. Returns the held tasks by sync key."""
    synced: dict[int, list[int]] = {}
    i = 0
    for t, p, d_s in zip(tasks, prev, dur):
        s = end[p]
        ds = t[6]  # Task.deps
        if len(ds) == 1:
            e = end[ds[0]]
            if e > s:
                s = e
        else:
            for d in ds:
                e = end[d]
                if e > s:
                    s = e
        start[i] = s
        if t[15] < 0:  # Task.sync_key
            end[i] = s + d_s
        else:
            synced.setdefault(t[15], []).append(i)
        i += 1
    return synced


def _settle(lanes: Iterable[tuple[int, ...]], tasks: Sequence[Task], durations: Sequence[float],
            barriers: list[list[int]], start: list[float], end: list[float]) -> bool:
    """Time the tasks the sweep left at +inf, a suffix of each stream, as the engine's list scheduler
    does: every stream advances while its next task's dependencies are known; a barrier copy waits
    for the others, and all end together once the last has arrived. False on a cycle."""
    todo: list[tuple[int, ...]] = []
    pos: list[int] = []
    for ids in lanes:
        k = len(ids)
        while k and end[ids[k - 1]] == _INF:
            k -= 1
        if k < len(ids):
            todo.append(ids)
            pos.append(k)
    group = {i: m for m in barriers for i in m}
    arrived: set[int] = set()
    while todo:
        progressed = False
        for j, ids in enumerate(todo):
            k = pos[j]
            while k < len(ids):
                i = ids[k]
                if end[i] < _INF:  # a barrier copy the last arrival has settled
                    k += 1
                    continue
                s = end[ids[k - 1]] if k else 0.0
                for d in tasks[i][6]:
                    e = end[d]
                    if e > s:
                        s = e
                if s == _INF:
                    break
                start[i] = s
                members = group.get(i)
                if members is None:
                    end[i] = s + durations[i]
                elif i not in arrived:
                    arrived.add(i)
                    if not arrived.issuperset(members):
                        break
                    begin = max(start[m] for m in members)
                    for m in members:
                        start[m], end[m] = begin, begin + durations[m]
                else:
                    break
                k += 1
            progressed = progressed or k > pos[j]
            pos[j] = k
        if not progressed:
            return False
        keep = [j for j, ids in enumerate(todo) if pos[j] < len(ids)]
        todo, pos = [todo[j] for j in keep], [pos[j] for j in keep]
    return True


def stretched_durations(graph: TaskGraph, start_s: Sequence[float], end_s: Sequence[float],
                        durations: Sequence[float | None], ctas: Sequence[int],
                        ratio: Callable[[Task, int], float], one: dict | None = None) -> list[float | None] | None:
    """``durations`` with every compute task stretched by the SMs its rank's collectives held while it
    ran in the first run (``start_s``/``end_s``); ``ctas``: SMs each task's kernel holds (0 for
    compute and host tasks). ``ratio`` reads the task's work only: it is asked once per task shape
    (``TaskGraph.shapes``) and SM level; ``one``: a task of every shape, when the caller has them.
    None when no compute task ran beside such a kernel."""
    tasks = graph.tasks
    n = len(tasks)
    held = np.fromiter(ctas, np.int64, n)
    start, end = np.fromiter(start_s, float, n), np.fromiter(end_s, float, n)
    comm = np.flatnonzero((held > 0) & (end > start))
    if not len(comm):
        return None
    shape = np.fromiter(graph.shapes or range(n), np.int64, n)
    if one is None:
        one = graph.shape_tasks()
    kinds = np.zeros(max(one) + 1, bool)  # by shape id (a task id)
    kinds[np.fromiter(one, np.int64, len(one))] = [t.kind == "compute" for t in one.values()]
    dur = np.array(durations, dtype=float)  # None (a transfer) is NaN: never > 0, as never compute
    compute = kinds[shape] & (dur > 0.0)
    rank = _ranks(graph)
    out = list(durations)
    changed = False
    for r in np.unique(rank[comm]):
        ids = np.flatnonzero(compute & (rank == r))
        if not len(ids):
            continue
        extra = _extra_s(tasks, shape, ids, start, end, comm[rank[comm] == r], held, ratio)
        grown = np.flatnonzero(extra > 0.0)
        deque(map(out.__setitem__, ids[grown].tolist(), (dur[ids[grown]] + extra[grown]).tolist()), 0)
        changed = changed or len(grown) > 0
    return out if changed else None


def _ranks(graph: TaskGraph) -> np.ndarray:
    """Every task's rank, spread from the streams (rank, stream) -> ids by numpy."""
    lanes = graph.streams
    ids = np.fromiter(chain.from_iterable(lanes.values()), np.int64, len(graph.tasks))
    rank = np.empty(len(graph.tasks), np.int64)
    rank[ids] = np.repeat(np.fromiter((r for r, _ in lanes), np.int64, len(lanes)), [len(v) for v in lanes.values()])
    return rank


def _extra_s(tasks: Sequence[Task], shape: np.ndarray, ids: np.ndarray, start: np.ndarray, end: np.ndarray,
             comm: np.ndarray, held: np.ndarray, ratio: Callable[[Task, int], float]) -> np.ndarray:
    """Seconds each compute task of ``ids`` gains: per level of SMs held (the sum over the rank's
    concurrent collectives), the task's overlap with that level times (ratio - 1), the ratio asked
    for one task of each shape (``shape``: every task's)."""
    times = np.concatenate((start[comm], end[comm]))
    delta = np.concatenate((held[comm], -held[comm]))
    order = np.argsort(times, kind="stable")
    times, level = times[order], np.cumsum(delta[order])
    seg_s = np.diff(times)  # segment k: [times[k], times[k+1]) at level[k]
    s, e = start[ids], end[ids]
    extra = np.zeros(len(ids))
    for sms in np.unique(level[:-1]):
        if sms <= 0:
            continue
        cum = np.concatenate(([0.0], np.cumsum(np.where(level[:-1] == sms, seg_s, 0.0))))
        overlap = np.interp(e, times, cum) - np.interp(s, times, cum)
        hit = np.flatnonzero(overlap > 0.0)
        if not len(hit):
            continue
        _, first, inv = np.unique(shape[ids[hit]], return_index=True, return_inverse=True)
        r = np.array([ratio(tasks[i], int(sms)) for i in ids[hit[first]].tolist()], dtype=float)
        extra[hit] += overlap[hit] * (r[inv] - 1.0)
    return extra
