"""Compute slowed by the SMs that communication kernels hold beside it: a second pass of the engine.

A collective's kernel holds one SM per NCCL channel for as long as it runs (cost/sm_share), and a
compute kernel beside it runs on the SMs left. Which compute overlaps which collective is known only
once the step is timed, so the engine runs twice: the first run gives each rank's timeline; each
compute task's time is then split by the number of SMs the rank's collectives held under it, and a
task that spent ``o`` seconds beside collectives holding ``c`` SMs gets ``o * (ratio(c) - 1)`` added
(ratio: its time on the SMs left over its time on the whole GPU); the second run times the step with
those durations. One correction, not a fixed point: the second run shifts the overlaps a little
(first order in the slowdown, which the tests bound).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..tasks import Task


def stretched_durations(tasks: Sequence[Task], start_s: Sequence[float], end_s: Sequence[float],
                        durations: Sequence[float | None], ctas: Sequence[int],
                        ratio: Callable[[Task, int], float]) -> list[float | None] | None:
    """``durations`` with every compute task stretched by the SMs its rank's collectives held while it
    ran in the first run (``start_s``/``end_s``); ``ctas``: SMs each task's kernel holds (0 for
    compute and host tasks). None when no compute task ran beside such a kernel."""
    comm_by_rank: dict[int, list[int]] = {}
    for i, c in enumerate(ctas):
        if c > 0 and end_s[i] > start_s[i]:
            comm_by_rank.setdefault(tasks[i].rank, []).append(i)
    if not comm_by_rank:
        return None
    out = list(durations)
    changed = False
    compute_by_rank: dict[int, list[int]] = {}
    for i, t in enumerate(tasks):
        if t.kind == "compute" and t.rank in comm_by_rank and (durations[i] or 0.0) > 0.0:
            compute_by_rank.setdefault(t.rank, []).append(i)
    for rank, comm in comm_by_rank.items():
        ids = compute_by_rank.get(rank)
        if not ids:
            continue
        extra = _extra_s(tasks, ids, start_s, end_s, comm, ctas, ratio)
        for i, x in zip(ids, extra):
            if x > 0.0:
                out[i] = (durations[i] or 0.0) + x
                changed = True
    return out if changed else None


def _extra_s(tasks: Sequence[Task], ids: list[int], start_s: Sequence[float], end_s: Sequence[float],
             comm: list[int], ctas: Sequence[int], ratio: Callable[[Task, int], float]) -> list[float]:
    """Seconds each compute task of ``ids`` gains: per level of SMs held (the sum over the rank's
    concurrent collectives), the task's overlap with that level times (ratio - 1)."""
    times = np.array([start_s[i] for i in comm] + [end_s[i] for i in comm])
    held = np.array([ctas[i] for i in comm] + [-ctas[i] for i in comm])
    order = np.argsort(times, kind="stable")
    times, level = times[order], np.cumsum(held[order])
    seg_s = np.diff(times)  # segment k: [times[k], times[k+1]) at level[k]
    s = np.array([start_s[i] for i in ids])
    e = np.array([end_s[i] for i in ids])
    extra = np.zeros(len(ids))
    for sms in np.unique(level[:-1]):
        if sms <= 0:
            continue
        cum = np.concatenate(([0.0], np.cumsum(np.where(level[:-1] == sms, seg_s, 0.0))))
        overlap = np.interp(e, times, cum) - np.interp(s, times, cum)
        for k in np.flatnonzero(overlap > 0.0):
            r = ratio(tasks[ids[k]], int(sms))
            extra[k] += overlap[k] * (r - 1.0)
    return extra.tolist()
