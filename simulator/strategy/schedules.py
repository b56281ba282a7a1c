"""Pipeline-parallel schedules as data: pure functions returning, per pipeline rank, the ordered
list of actions (forward / backward / weight-gradient x micro-batch x virtual stage) it executes.

Nothing here knows about time: lowering turns actions into tasks and the engine measures the
bubble off the simulated timeline; the closed forms in ``ideal_bubble_fraction`` are test oracles.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

PHASES = ("F", "B", "W")


@dataclass(frozen=True, slots=True)
class Action:
    """One unit of pipeline work on one rank.

    ``stage`` is the VIRTUAL stage index ``chunk * p + rank`` (torch.distributed.pipelining and
    Megatron-LM's interleaved layout: virtual stage 0 is chunk 0 of rank 0, virtual stage p is
    chunk 1 of rank 0). ``phase`` is "F" (forward), "B" (backward; the full backward unless the
    schedule splits it, see ``splits_backward``, in which case it is the input-gradient half that
    PyTorch writes "I") or "W" (the deferred weight-gradient half, zero-bubble only).
    """

    stage: int
    phase: str
    microbatch: int

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise ValueError(f"Action.phase must be one of {PHASES}, got {self.phase!r}")
        if self.stage < 0 or self.microbatch < 0:
            raise ValueError(f"Action.stage and Action.microbatch must be >= 0, got stage="
                             f"{self.stage}, microbatch={self.microbatch}")

    def __str__(self) -> str:
        # PyTorch pipelining's _Action format: "1F3" = stage 1, forward, micro-batch 3.
        return f"{self.stage}{self.phase}{self.microbatch}"

    def rank(self, num_stages: int) -> int:
        """Physical pipeline rank that holds this virtual stage."""
        return self.stage % num_stages

    def chunk(self, num_stages: int) -> int:
        """Model chunk (0 .. virtual_stages-1) of this virtual stage on its rank."""
        return self.stage // num_stages

    @staticmethod
    def parse(text: str) -> Action:
        """Inverse of ``str``: ``Action.parse("1F3") == Action(1, "F", 3)``."""
        for i, ch in enumerate(text):
            if ch in PHASES:
                head, tail = text[:i], text[i + 1:]
                if head.isdigit() and tail.isdigit():
                    return Action(int(head), ch, int(tail))
                break
        raise ValueError(f"action text must look like '1F3' (stage, F|B|W, micro-batch), "
                         f"got {text!r}")


def virtual_stage(rank: int, chunk: int, num_stages: int) -> int:
    """Virtual stage index of ``chunk`` on ``rank`` (Megatron-LM / torch layout)."""
    return chunk * num_stages + rank


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


def interleaved_1f1b(p: int, m: int, v: int) -> list[list[Action]]:
    """Megatron-LM interleaved 1F1B (Narayanan et al. 2021, sec. 2.2.1; Megatron-LM
    ``forward_backward_pipelining_with_interleaving``), transcribed step for step.

    Each rank iterates over m*v (chunk, micro-batch) pairs. Forward iteration k runs chunk
    (k mod p*v) // p on micro-batch (k // (p*v)) * p + k mod p: micro-batches go p at a time
    through chunk 0, then the same p through chunk 1, ... Backward iteration k uses the same
    micro-batch and chunk v-1-((k mod p*v) // p). Warm-up is (p - r - 1) * 2 + (v - 1) * p
    forwards (capped at m*v), or all m*v when m == p (Megatron's special case); then one forward
    and one backward alternate; then the remaining backwards drain.
    """
    total = m * v
    group = p * v

    def chunk_of(k: int, forward: bool) -> int:
        c = (k % group) // p
        return c if forward else v - 1 - c

    def mb_of(k: int) -> int:
        return (k // group) * p + k % p

    out = []
    for r in range(p):
        if m == p:
            warmup = total
        else:
            warmup = min((p - r - 1) * 2 + (v - 1) * p, total)

        def fwd(k: int) -> Action:
            return Action(virtual_stage(r, chunk_of(k, True), p), "F", mb_of(k))

        def bwd(k: int) -> Action:
            return Action(virtual_stage(r, chunk_of(k, False), p), "B", mb_of(k))

        acts = [fwd(k) for k in range(warmup)]
        for k in range(total - warmup):
            acts += [fwd(warmup + k), bwd(k)]
        acts += [bwd(k) for k in range(total - warmup, total)]
        out.append(acts)
    return out


def zero_bubble_h1(p: int, m: int, v: int = 1) -> list[list[Action]]:
    """ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", ICLR, sec. 3.1 and fig. 3).

    The 1F1B order with every backward split into B (input gradient, on the critical path) and
    W (weight gradient, needed by nobody downstream). Rank r keeps the 1F1B warm-up
    (min(p - r - 1, m) forwards) and defers each W by r backward steps: W(i) follows B(i + r),
    and the W's still pending after the last B drain at the end. Deferring W on later ranks lets
    their B's run back to back in the cool-down, so the B chain reaches rank 0 without waiting
    and the idle slots fill with W's. A micro-batch's activations stay alive until its W
    (counted conservatively), so rank r holds at most (p - r - 1) + 1 + r = p micro-batches:
    the same peak as 1F1B's rank 0, hence ZB-H1's "same memory as 1F1B".
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


# Schedule name -> generator(p, m, v). A plain dict, as DESIGN.md sec. 6 asks (no registry).
SCHEDULES: dict[str, Callable[[int, int, int], list[list[Action]]]] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved-1f1b": interleaved_1f1b,
    "zero-bubble": zero_bubble_h1,
}


def _check(name: str, num_stages: int, num_microbatches: int, virtual_stages: int) -> None:
    if name not in SCHEDULES:
        raise ValueError(f"parallelism.schedule must be one of {sorted(SCHEDULES)}, got {name!r}")
    if num_stages < 1:
        raise ValueError(f"pipeline stages must be >= 1, got pp={num_stages}")
    if num_microbatches < 1:
        raise ValueError(f"number of micro-batches must be >= 1, got {num_microbatches}")
    if name == "interleaved-1f1b":
        if virtual_stages < 2:
            raise ValueError(f"parallelism.virtual_stages must be >= 2 for interleaved-1f1b, "
                             f"got {virtual_stages}")
        # Megatron-LM raises the same error (schedules.py, interleaved schedule).
        if num_microbatches % num_stages != 0:
            raise ValueError(f"interleaved-1f1b needs micro-batches divisible by pp: "
                             f"{num_microbatches} % {num_stages} = "
                             f"{num_microbatches % num_stages}")
    elif virtual_stages != 1:
        raise ValueError(f"parallelism.virtual_stages must be 1 for schedule {name!r}, "
                         f"got {virtual_stages}")


def schedule_actions(name: str, num_stages: int, num_microbatches: int,
                     virtual_stages: int = 1) -> list[list[Action]]:
    """Per physical pipeline rank (0 .. num_stages-1), the ordered actions it executes."""
    _check(name, num_stages, num_microbatches, virtual_stages)
    return SCHEDULES[name](num_stages, num_microbatches, virtual_stages)


def splits_backward(name: str) -> bool:
    """True when the schedule splits the backward into B (input grad) and W (weight grad)."""
    if name not in SCHEDULES:
        raise ValueError(f"parallelism.schedule must be one of {sorted(SCHEDULES)}, got {name!r}")
    return name == "zero-bubble"


def format_grid(actions: list[list[Action]]) -> str:
    """Printable grid, one row per rank, actions in program order in fixed-width columns."""
    width = max((len(str(a)) for row in actions for a in row), default=1)
    label = len(str(max(len(actions) - 1, 0)))
    return "\n".join(f"rank {r:>{label}}: " + " ".join(f"{str(a):<{width}}" for a in row).rstrip()
                     for r, row in enumerate(actions))


def max_in_flight(actions_of_rank: list[Action]) -> int:
    """Peak number of (virtual stage, micro-batch) activation sets alive on one rank.

    A set is allocated at its F. It is freed at its W when the rank's list contains a W for it
    (zero-bubble: B frees the gradient-only part, but W still reads the stage's inputs and the
    output gradients, so counting until W is the conservative bound of Qi et al. 2024, sec. 3.1);
    otherwise at its B. For interleaved schedules each set is one chunk, i.e. 1/v of a rank's
    layers: multiply by the per-chunk activation bytes, not the per-stage ones.
    """
    has_w = {(a.stage, a.microbatch) for a in actions_of_rank if a.phase == "W"}
    live = peak = 0
    for a in actions_of_rank:
        key = (a.stage, a.microbatch)
        if a.phase == "F":
            live += 1
            peak = max(peak, live)
        elif (a.phase == "W") or (a.phase == "B" and key not in has_w):
            live -= 1
    return peak


def ideal_bubble_fraction(name: str, p: int, m: int, v: int = 1) -> float:
    """Closed-form bubble fraction: idle time / iteration time on a rank, with free
    communication and equal work per stage.

    gpipe, 1f1b: (p - 1) / (m + p - 1) (Narayanan et al. 2021, sec. 2.2: bubble (p - 1)(t_f + t_b)
    against m (t_f + t_b) of work; any t_f : t_b ratio).
    interleaved-1f1b: (p - 1) / (v m + p - 1) (same section: the bubble is divided by v).
    zero-bubble (ZB-H1): (p - 1) / (3 m + p - 1), assuming T_F = T_B = T_W (Qi et al. 2024,
    sec. 3.1: bubble (p - 1)(T_F + T_B - T_W) against m (T_F + T_B + T_W) of work; the bubble
    time is 1/3 of 1F1B's (p - 1)(T_F + T_B + T_W)). ``zero_bubble_h1`` attains it for m >= p
    (and the general (p - 1)(T_F + T_B - T_W) whenever T_W <= T_F); with m < p its bubble is
    larger (with unit times the iteration takes 2p + 2m - 1 slots, not 3m + p - 1).
    """
    _check(name, p, m, v)
    if name in ("gpipe", "1f1b"):
        return (p - 1) / (m + p - 1)
    if name == "interleaved-1f1b":
        return (p - 1) / (v * m + p - 1)
    return (p - 1) / (3 * m + p - 1)
