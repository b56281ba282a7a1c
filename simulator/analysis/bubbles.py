"""Pipeline bubbles read off a timeline: idle time of each stage's compute stream, and the schedule's
actions (``1F3``: virtual stage 1, forward, micro-batch 3) as they actually ran.

Pure data, no plotting: ``analysis/metrics`` and ``analysis/plots`` both use it, for simulated and
measured traces alike (DESIGN.md §5: the bubble is measured from the timeline, never from a formula).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..strategy.actions import StageMap
from ..trace import COMPUTE_STREAM, Trace, TraceEvent


@dataclass(frozen=True, slots=True)
class Action:
    """One schedule action on one rank's compute stream: a maximal run of consecutive events that
    share (phase, micro-batch, chunk), spanning the first start to the last end of the run."""

    stage: int
    virtual_stage: int
    phase: str
    microbatch: int
    chunk: int
    start_s: float
    end_s: float

    @property
    def label(self) -> str:
        """PyTorch pipelining's action notation, e.g. ``1F3``; ``O`` alone for the optimizer step."""
        if self.microbatch < 0:
            return self.phase or "?"
        return f"{self.virtual_stage}{self.phase or '?'}{self.microbatch}"


def merge_intervals(intervals) -> list[tuple[float, float]]:
    """Union of (start, end) intervals as sorted, disjoint (start, end) pairs."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def idle_intervals(events, start_s: float, end_s: float) -> list[tuple[float, float]]:
    """The gaps of [start_s, end_s] that no event covers (clipped to the window)."""
    gaps, cursor = [], start_s
    for s, e in merge_intervals((max(ev.start_s, start_s), min(ev.end_s, end_s)) for ev in events
                                if ev.end_s > start_s and ev.start_s < end_s):
        if s > cursor:
            gaps.append((cursor, s))
        cursor = max(cursor, e)
    if cursor < end_s:
        gaps.append((cursor, end_s))
    return gaps


def stage_ranks(trace: Trace) -> dict[int, list[int]]:
    """Pipeline stage -> ranks whose compute stream runs that stage's events.

    A rank belongs to the stage most of its stage-labelled compute events carry; ranks with no
    stage-labelled compute event (pure communication lanes, unlabelled measured runs) are left out.
    """
    votes: dict[int, Counter] = {}
    for e in trace.events:
        if e.stream == COMPUTE_STREAM and e.stage >= 0:
            votes.setdefault(e.rank, Counter())[e.stage] += 1
    stages: dict[int, list[int]] = {}
    for rank in sorted(votes):
        stages.setdefault(votes[rank].most_common(1)[0][0], []).append(rank)
    return dict(sorted(stages.items()))


def compute_events(trace: Trace) -> dict[int, list[TraceEvent]]:
    """Rank -> its compute-stream events in start order."""
    by_rank: dict[int, list[TraceEvent]] = {}
    for e in trace.events:
        if e.stream == COMPUTE_STREAM:
            by_rank.setdefault(e.rank, []).append(e)
    for evs in by_rank.values():
        evs.sort(key=lambda e: (e.start_s, e.end_s))
    return by_rank


def stage_bubble_fractions(trace: Trace) -> dict[int, float]:
    """Per pipeline stage: idle time of its compute stream within [trace.start_s, trace.end_s],
    divided by that duration; averaged over the stage's ranks when several are simulated.

    Idle is every instant no compute-stream event covers, so it includes pipeline fill and drain,
    waits for P2P activations and any communication the compute stream has to wait for.
    """
    t0, t1 = trace.start_s, trace.end_s
    duration = t1 - t0
    by_rank = compute_events(trace)
    fractions = {}
    for stage, ranks in stage_ranks(trace).items():
        if duration <= 0.0:
            fractions[stage] = 0.0
            continue
        idle = [sum(e - s for s, e in idle_intervals(by_rank[r], t0, t1)) for r in ranks]
        fractions[stage] = sum(idle) / len(idle) / duration
    return fractions


def num_pipeline_stages(trace: Trace) -> int:
    """``trace.metadata["num_stages"]`` when given, else one more than the largest stage seen."""
    given = trace.metadata.get("num_stages")
    if given is not None:
        return int(given)
    return 1 + max((e.stage for e in trace.events), default=-1)


def schedule_actions(trace: Trace, rank: int) -> list[Action]:
    """The actions one rank's compute stream ran, in time order (consecutive events of the same
    (phase, micro-batch, chunk) form one action; events with no phase and no micro-batch, such as
    stray kernels of a measured trace, are skipped)."""
    smap = StageMap(str(trace.metadata.get("stage_map", "loop")), max(num_pipeline_stages(trace), 1))
    actions: list[Action] = []
    key = None
    for e in compute_events(trace).get(rank, []):
        if not e.phase and e.microbatch < 0:
            key = None
            continue
        k = (e.stage, e.phase, e.microbatch, e.chunk)
        if k == key:
            last = actions[-1]
            actions[-1] = Action(last.stage, last.virtual_stage, last.phase, last.microbatch,
                                 last.chunk, last.start_s, max(last.end_s, e.end_s))
            continue
        key = k
        # Virtual stage of chunk c on stage s: c*p + s in the loop map of interleaved schedules
        # (Narayanan et al. 2021, section 2.2), the lowering's "stage_map" metadata otherwise.
        virtual = smap.stage(e.stage, e.chunk) if e.chunk >= 0 else e.stage
        actions.append(Action(e.stage, virtual, e.phase, e.microbatch, e.chunk, e.start_s, e.end_s))
    return actions
