"""Pipeline-parallel schedules as data: each schedule is one ``Schedule`` definition (its action
generator, stage map, backward split, chunk count, micro-batch rules and closed-form bubble) in the
``SCHEDULES`` dict at the end of this module; adding a schedule is a generator plus one entry here.

A generator is a pure function returning, per pipeline rank, the ordered list of compute actions
(forward / backward / weight-gradient x micro-batch x virtual stage) it executes. ``add_p2p``
makes the point-to-point transfers between ranks explicit in those lists. Nothing here knows about
time: lowering turns actions into tasks and the engine measures the bubble off the simulated
timeline; the closed forms (``ideal_bubble_fraction``) are test oracles.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .actions import (PHASES, STAGE_MAPS, Action, P2P, StageMap, add_p2p, format_grid, max_in_flight,
                      virtual_stage)
from .two_chunk import dualpipe, dualpipe_pairs, dualpipe_v, dualpipe_v_pairs, zero_bubble_v

__all__ = ["PHASES", "STAGE_MAPS", "Action", "P2P", "StageMap", "add_p2p", "format_grid", "max_in_flight",
           "virtual_stage", "Schedule", "SCHEDULES", "get", "schedule_actions", "overlapped_pairs", "splits_backward",
           "stage_map",
           "ideal_bubble_fraction"]


def gpipe(p: int, m: int, v: int = 1) -> list[list[Action]]:
    """GPipe (Huang et al. 2019): every rank runs all forwards, then all backwards, both in
    micro-batch order; all m micro-batches' activations are alive at the turn."""
    return [[Action(r, "F", i) for i in range(m)] + [Action(r, "B", i) for i in range(m)]
            for r in range(p)]


def one_f_one_b(p: int, m: int, v: int = 1) -> list[list[Action]]:
    """PipeDream-Flush / Megatron-LM non-interleaved 1F1B (Narayanan et al. 2021, sec. 2.2;
    Megatron-LM ``forward_backward_pipelining_without_interleaving``): rank r runs
    min(p - r - 1, m) warm-up forwards, then alternates one forward and one backward, then drains
    the remaining backwards; at most p - r micro-batches are in flight on rank r."""
    out = []
    for r in range(p):
        warmup = min(p - r - 1, m)
        acts = [Action(r, "F", i) for i in range(warmup)]
        for i in range(m - warmup):
            acts += [Action(r, "F", warmup + i), Action(r, "B", i)]
        acts += [Action(r, "B", i) for i in range(m - warmup, m)]
        out.append(acts)
    return out


def interleaved_1f1b(p: int, m: int, v: int, all_warmup_at_m_p: bool = True) -> list[list[Action]]:
    """Megatron-LM interleaved 1F1B (Narayanan et al. 2021, sec. 2.2.1; Megatron-LM
    ``forward_backward_pipelining_with_interleaving``), transcribed step for step.

    Each rank iterates over m*v (chunk, micro-batch) pairs. Forward iteration k runs chunk
    (k mod p*v) // p on micro-batch (k // (p*v)) * p + k mod p: micro-batches go p at a time
    through chunk 0, then the same p through chunk 1, ... Backward iteration k uses the same
    micro-batch and chunk v-1-((k mod p*v) // p). Warm-up is (p - r - 1) * 2 + (v - 1) * p
    forwards (capped at m*v), or all m*v when m == p (Megatron's special case; not
    ``all_warmup_at_m_p``: ``torch_interleaved_1f1b``); then one forward and one backward alternate;
    then the remaining backwards drain.
    """
    total, group = m * v, p * v
    out = []
    for r in range(p):
        warmup = total if m == p and all_warmup_at_m_p else min((p - r - 1) * 2 + (v - 1) * p, total)

        def act(k: int, phase: str) -> Action:
            c = (k % group) // p
            return Action(virtual_stage(r, c if phase == "F" else v - 1 - c, p), phase,
                          (k // group) * p + k % p)

        acts = [act(k, "F") for k in range(warmup)]
        for k in range(total - warmup):
            acts += [act(warmup + k, "F"), act(k, "B")]
        acts += [act(k, "B") for k in range(total - warmup, total)]
        out.append(acts)
    return out


def torch_interleaved_1f1b(p: int, m: int, v: int) -> list[list[Action]]:
    """torch.distributed.pipelining's ScheduleInterleaved1F1B (torch 2.6, schedules.py
    ``_calculate_single_rank_operations``): Megatron's order (forwards in rounds of p micro-batches
    per chunk, backwards from the last chunk) and warm-up, (v - 1) * p + 2 * (p - 1 - r) forwards
    capped at m*v, without Megatron's all-forwards-first case at m == p."""
    return interleaved_1f1b(p, m, v, all_warmup_at_m_p=False)


def zero_bubble_h1(p: int, m: int, v: int = 1) -> list[list[Action]]:
    """ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", ICLR, sec. 3.1 and fig. 3).

    The 1F1B order with every backward split into B (input gradient, on the critical path) and
    W (weight gradient, needed by nobody downstream). Rank r keeps the 1F1B warm-up
    (min(p - r - 1, m) forwards) and defers each W by r backward steps: W(i) follows B(i + r),
    and the W's still pending after the last B drain at the end. Rank r holds at most
    (p - r - 1) + 1 + r = p micro-batches: 1F1B's peak on rank 0, hence "same memory as 1F1B".
    """
    out = []
    for r in range(p):
        warmup = min(p - r - 1, m)
        acts = [Action(r, "F", i) for i in range(warmup)]
        w_next = 0
        for i in range(m):
            if i + warmup < m:
                acts.append(Action(r, "F", i + warmup))
            acts.append(Action(r, "B", i))
            if i - r >= 0:
                acts.append(Action(r, "W", i - r))
                w_next = i - r + 1
        acts += [Action(r, "W", i) for i in range(w_next, m)]
        out.append(acts)
    return out


def zero_bubble_h2(p: int, m: int, v: int = 1) -> list[list[Action]]:
    """ZB-H2 (Qi et al. 2024, sec. 3.1 and fig. 3 bottom): more warm-up forwards fill the bubble
    before the first B, at up to 2p - 1 micro-batches alive on rank 0 ((2p - 1) M_B).

    The order is that of a unit-time list scheduler with the paper's priorities (sec. 3.2: B on
    the critical path first, then F while rank r holds fewer than 2(p - r) - 1 micro-batches
    whose B has not run and fewer than 2p - 1 whose W has not, the paper's (2p - 1) M_B memory
    limit, then a pending W to fill): with T_F = T_B = T_W every rank's actions then
    run back to back (span 3m, the paper's zero bubble), the W's of later ranks gathering at the
    end so that the last B's reach rank 0 without waiting: the parallelogram the paper closes with
    its optimizer post-validation. With a synchronised optimizer step the ranks' start-up offsets
    remain, and the iteration's idle time is ZB-H1's (p - 1) T_F.
    """
    cap = [2 * (p - r) - 1 for r in range(p)]
    f_end: dict[tuple[int, int], int] = {}
    b_end: dict[tuple[int, int], int] = {}
    nf, nb, nw = [0] * p, [0] * p, [0] * p
    out: list[list[Action]] = [[] for _ in range(p)]
    t = 0
    while any(n < m for n in nw):
        for r in range(p):
            if nb[r] < nf[r] and (r == p - 1 or b_end.get((r + 1, nb[r]), t + 1) <= t):
                act, b_end[(r, nb[r])] = Action(r, "B", nb[r]), t + 1
                nb[r] += 1
            elif (nf[r] < m and nf[r] - nb[r] < cap[r] and nf[r] - nw[r] < 2 * p - 1
                  and (r == 0 or f_end.get((r - 1, nf[r]), t + 1) <= t)):
                act, f_end[(r, nf[r])] = Action(r, "F", nf[r]), t + 1
                nf[r] += 1
            elif nw[r] < nb[r]:
                act = Action(r, "W", nw[r])
                nw[r] += 1
            else:
                continue
            out[r].append(act)
        t += 1
    return out


@dataclass(frozen=True)
class Schedule:
    """Everything the simulator needs to know about one schedule, in its one definition.

    ``chunks``: model chunks per rank, or 0 when the user chooses ``virtual_stages`` (>= 2).
    ``pairs(p, m, v)``: the (virtual stage, micro-batch) of every forward that opens one of DualPipe's
    overlapped forward-backward pairs (that F and the B after it on its rank); None: no pairs.
    ``min_microbatches(p)``: the fewest micro-batches it runs; ``microbatches_multiple_of_p`` is
    Megatron-LM's rule for interleaving. ``bubble(p, m, v)``: idle / iteration time per rank with
    free communication and equal per-chunk work (T_F = T_B = T_W when the backward is split), the
    makespan taken with a synchronised optimizer step (see ``ideal_bubble_fraction``).
    """

    name: str
    build: Callable[[int, int, int], list[list[Action]]]
    bubble: Callable[[int, int, int], float]
    stage_map: str = "loop"
    splits_backward: bool = False
    chunks: int = 1
    pairs: Callable[[int, int, int], frozenset[tuple[int, int]]] | None = None
    min_microbatches: Callable[[int], int] = lambda p: 1
    microbatches_multiple_of_p: bool = False
    even: bool = False  # pp and the micro-batches even (DualPipe's two halves)

    def check(self, p: int, m: int, v: int) -> None:
        """ValueError naming the field and the numbers when (p, m, v) does not fit the schedule."""
        if p < 1:
            raise ValueError(f"pipeline stages must be >= 1, got pp={p}")
        if m < 1:
            raise ValueError(f"number of micro-batches must be >= 1, got {m}")
        if self.chunks == 0 and v < 2:
            raise ValueError(f"parallelism.virtual_stages must be >= 2 for {self.name}, got {v}")
        if self.chunks and v != self.chunks:
            raise ValueError(f"parallelism.virtual_stages must be {self.chunks} for schedule "
                             f"{self.name!r}, got {v}")
        if self.even and (p % 2 or m % 2):
            # DualPipe.step asserts num_ranks % 2 == 0 and num_chunks % 2 == 0 (dualpipe.py)
            raise ValueError(f"{self.name} needs an even pp and an even number of micro-batches (half enter "
                             f"at each end), got pp = {p}, micro-batches = {m}")
        if m < self.min_microbatches(p):
            raise ValueError(f"{self.name} needs at least {self.min_microbatches(p)} micro-batches "
                             f"with pp = {p}, got {m}")
        if self.microbatches_multiple_of_p and m % p:
            # Megatron-LM raises the same error (schedules.py, interleaved schedule).
            raise ValueError(f"{self.name} needs micro-batches divisible by pp: {m} % {p} = {m % p}")


# Schedule name -> definition. A plain dict, as DESIGN.md sec. 6 asks (no registry).
SCHEDULES: dict[str, Schedule] = {s.name: s for s in (
    Schedule("gpipe", gpipe, lambda p, m, v: (p - 1) / (m + p - 1)),
    Schedule("1f1b", one_f_one_b, lambda p, m, v: (p - 1) / (m + p - 1)),
    Schedule("interleaved-1f1b", interleaved_1f1b, lambda p, m, v: (p - 1) / (v * m + p - 1),
             chunks=0, microbatches_multiple_of_p=True),
    Schedule("torch-interleaved-1f1b", torch_interleaved_1f1b, lambda p, m, v: (p - 1) / (v * m + p - 1),
             chunks=0, microbatches_multiple_of_p=True),
    Schedule("zero-bubble", zero_bubble_h1, lambda p, m, v: (p - 1) / (3 * m + p - 1),
             splits_backward=True),
    Schedule("zb-h2", zero_bubble_h2, lambda p, m, v: (p - 1) / (3 * m + p - 1),
             splits_backward=True),
    Schedule("zb-v", zero_bubble_v, lambda p, m, v: (p - 1) / (6 * m + p - 1),
             stage_map="v", splits_backward=True, chunks=2),
    Schedule("dualpipe-v", dualpipe_v, lambda p, m, v: (p - 1) / (6 * m + p - 1),
             stage_map="v", splits_backward=True, chunks=2, pairs=dualpipe_v_pairs,
             min_microbatches=lambda p: 2 * p),
    Schedule("dualpipe", dualpipe, lambda p, m, v: (p / 2 - 1) / (3 * m + p / 2 - 1),
             stage_map="dual", splits_backward=True, chunks=2, pairs=dualpipe_pairs,
             min_microbatches=lambda p: 2 * p, even=True),
)}


def get(name: str) -> Schedule:
    """The definition of ``name``; ValueError listing the known schedules otherwise."""
    if name not in SCHEDULES:
        raise ValueError(f"parallelism.schedule must be one of {sorted(SCHEDULES)}, got {name!r}")
    return SCHEDULES[name]


def schedule_actions(name: str, num_stages: int, num_microbatches: int,
                     virtual_stages: int = 1) -> list[list[Action]]:
    """Per physical pipeline rank (0 .. num_stages-1), the ordered actions it executes."""
    s = get(name)
    s.check(num_stages, num_microbatches, virtual_stages)
    return s.build(num_stages, num_microbatches, virtual_stages)


def overlapped_pairs(name: str, num_stages: int, num_microbatches: int,
                     virtual_stages: int = 1) -> frozenset[tuple[int, int]]:
    """(virtual stage, micro-batch) of every F that the schedule overlaps with the B after it."""
    s = get(name)
    return frozenset() if s.pairs is None else s.pairs(num_stages, num_microbatches, virtual_stages)


def splits_backward(name: str) -> bool:
    """True when the schedule splits the backward into B (input grad) and W (weight grad)."""
    return get(name).splits_backward


def stage_map(name: str, num_stages: int) -> StageMap:
    """The schedule's virtual stage -> rank map for ``num_stages`` ranks."""
    return StageMap(get(name).stage_map, num_stages)


def ideal_bubble_fraction(name: str, p: int, m: int, v: int = 1) -> float:
    """Closed-form bubble fraction: idle time / iteration time on a rank, with free
    communication, equal work per chunk and all ranks ending the step together.

    gpipe, 1f1b: (p - 1) / (m + p - 1) (Narayanan et al. 2021, sec. 2.2: bubble (p - 1)(t_f + t_b)
    against m (t_f + t_b) of work; any t_f : t_b ratio).
    interleaved-1f1b: (p - 1) / (v m + p - 1) (same section: the bubble is divided by v).
    zero-bubble (ZB-H1): (p - 1) / (3 m + p - 1) with T_F = T_B = T_W (Qi et al. 2024, sec. 3.1:
    bubble (p - 1)(T_F + T_B - T_W), a third of 1F1B's); attained for m >= p.
    zb-h2: the same (p - 1) T_F of start-up per rank; inside each rank's own span the bubble is
    (p - 1)(T_F + T_B - 2 T_W) = 0 (Qi et al. sec. 3.1), which only the paper's optimizer
    post-validation turns into iteration time.
    zb-v: (p - 1) / (6 m + p - 1) in per-chunk units: the V's start-up, p - 1 chunk forwards, is
    half a stage each, and every rank then runs back to back (Qi et al. sec. 6).
    dualpipe-v: (p - 1) / (6 m + p - 1), ZB-V's: DeepSeek-V3's table 2 gives (PP/2 - 1)(F&B + B - 3W)
    (PP = 2p stages, B the full backward, i.e. 2 units), p - 1 units when the overlapped pair costs
    one full backward (F&B = 2, the forward hidden); the serial pair the simulator runs attains the
    same p - 1 units at T_F = T_B = T_W, the start-up being the only idle time.
    dualpipe: (p/2 - 1) / (3 m + p/2 - 1) in per-stage units: table 2's (PP/2 - 1)(F&B + B - 3W) with
    PP = p, i.e. p/2 - 1 units of start-up when the pair costs one full backward, against 3m units of
    work per rank (two stages, m/2 micro-batches each); DualPipeV's value on p/2 ranks with m/2
    micro-batches (the "cut-in-half" relation, exact for any T_F, T_B, T_W with the pairs run serially).
    """
    s = get(name)
    s.check(p, m, v)
    return s.bubble(p, m, v)
