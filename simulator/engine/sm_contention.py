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

from collections.abc import Callable, Sequence
from operator import itemgetter

import numpy as np

from ..tasks import Task


def stretched_durations(tasks: Sequence[Task], start_s: Sequence[float], end_s: Sequence[float],
                        durations: Sequence[float | None], ctas: Sequence[int],
                        ratio: Callable[[Task, int], float]) -> list[float | None] | None:
    """``durations`` with every compute task stretched by the SMs its rank's collectives held while it
    ran in the first run (``start_s``/``end_s``); ``ctas``: SMs each task's kernel holds (0 for
    compute and host tasks). None when no compute task ran beside such a kernel."""
    held = np.asarray(ctas)
    start, end = np.asarray(start_s), np.asarray(end_s)
    comm = np.flatnonzero((held > 0) & (end > start))
    if not len(comm):
        return None
    rank = np.fromiter(map(itemgetter(3), tasks), int, len(tasks))  # Task.rank
    dur = np.fromiter((d or 0.0 for d in durations), float, len(tasks))
    compute = np.fromiter((k == "compute" for k in map(itemgetter(2), tasks)), bool, len(tasks)) & (dur > 0.0)
    out = list(durations)
    changed = False
    for r in np.unique(rank[comm]):
        ids = np.flatnonzero(compute & (rank == r))
        if not len(ids):
            continue
        mine = comm[rank[comm] == r]
        extra = _extra_s(tasks, ids, start, end, mine, held, ratio)
        grown = np.flatnonzero(extra > 0.0)
        for i, x in zip(ids[grown].tolist(), extra[grown].tolist()):
            out[i] = float(dur[i]) + x
            changed = True
    return out if changed else None


def _extra_s(tasks: Sequence[Task], ids: np.ndarray, start: np.ndarray, end: np.ndarray, comm: np.ndarray,
             held: np.ndarray, ratio: Callable[[Task, int], float]) -> np.ndarray:
    """Seconds each compute task of ``ids`` gains: per level of SMs held (the sum over the rank's
    concurrent collectives), the task's overlap with that level times (ratio - 1)."""
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
        for k in np.flatnonzero(overlap > 0.0).tolist():
            extra[k] += overlap[k] * (ratio(tasks[int(ids[k])], int(sms)) - 1.0)
    return extra
