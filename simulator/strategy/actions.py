"""The vocabulary of pipeline schedules: an ``Action`` (F / B / W of a virtual stage and micro-batch),
a ``P2P`` transfer, and the ``StageMap`` that says which rank holds which virtual stage; plus the
schedule-independent tools over action lists (explicit transfers, printing, in-flight count).

The schedules themselves (which action lists, with which map) are ``schedules``.
"""

from __future__ import annotations

from dataclasses import dataclass

PHASES = ("F", "B", "W")
STAGE_MAPS = ("loop", "v", "dual")


@dataclass(frozen=True, slots=True)
class Action:
    """One unit of pipeline work on one rank.

    ``stage`` is the VIRTUAL stage index (0 .. p*v-1, in model order); which rank holds it is the
    schedule's ``StageMap``. ``phase`` is "F" (forward), "B" (backward; the full backward unless the
    schedule splits it, in which case it is the input-gradient half that PyTorch writes "I") or "W"
    (the deferred weight-gradient half, schedules that split the backward only).
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

    def rank(self, num_stages: int, stage_map: str = "loop") -> int:
        """Physical pipeline rank that holds this virtual stage."""
        return StageMap(stage_map, num_stages).rank(self.stage)

    def chunk(self, num_stages: int) -> int:
        """Model chunk (0 .. virtual_stages-1) of this virtual stage on its rank (either map)."""
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


@dataclass(frozen=True, slots=True)
class P2P:
    """A point-to-point transfer in a rank's action list (PyTorch pipelining's ``1SEND_F3`` /
    ``2RECV_F3``): ``stage`` is the virtual stage whose output (phase "F") or input gradient (phase
    "B") travels, ``peer`` the rank at the other end."""

    kind: str  # "SEND" | "RECV"
    stage: int
    phase: str
    microbatch: int
    peer: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}_{self.phase}{self.microbatch}"


@dataclass(frozen=True, slots=True)
class StageMap:
    """Which rank holds which virtual stage, and which virtual stages chain into one model copy.

    "loop" (Megatron-LM / torch interleaving): chunk c of rank r is virtual stage c*p + r. "v" (ZB-V,
    DualPipeV; torch ``generate_stage_to_rank_mapping`` style "v"): chunks alternate direction, so chunk
    1 of rank r is virtual stage 2p - 1 - r and the model's first and last stages sit on rank 0. Both
    chain all p*v virtual stages into one model. "dual" (DualPipe, DeepSeek-V3 sec. 3.2.1): two model
    copies of p stages each, copy A's stage k is virtual stage k on rank k, copy B's stage k is virtual
    stage p + k on rank p - 1 - k (the ranks of the "v" map, so rank r holds A's stage r as chunk 0 and
    B's stage p - 1 - r as chunk 1); the chains stop at the copy's end: p - 1 does not feed p."""

    kind: str
    p: int

    def __post_init__(self) -> None:
        if self.kind not in STAGE_MAPS:
            raise ValueError(f"stage map must be one of {STAGE_MAPS}, got {self.kind!r}")

    def rank(self, vs: int) -> int:
        c, k = divmod(vs, self.p)
        return self.p - 1 - k if self.kind != "loop" and c % 2 else k

    def chunk(self, vs: int) -> int:
        return vs // self.p

    def stage(self, rank: int, chunk: int) -> int:
        return chunk * self.p + (self.p - 1 - rank if self.kind != "loop" and chunk % 2 else rank)

    def stages_of(self, rank: int, v: int) -> tuple[int, ...]:
        """The virtual stages rank holds, in chunk order."""
        return tuple(self.stage(rank, c) for c in range(v))

    @property
    def copies(self) -> int:
        """Model copies the virtual stages form (2 for "dual": each rank stores both copies' weights)."""
        return 2 if self.kind == "dual" else 1

    def first_of(self, vs: int) -> int:
        """The first virtual stage (the embedding's) of vs's model copy."""
        return vs - vs % self.p if self.kind == "dual" else 0

    def prev(self, vs: int) -> int | None:
        """The virtual stage whose output vs consumes; None at its copy's first stage."""
        return None if vs == self.first_of(vs) else vs - 1

    def next(self, vs: int, nv: int) -> int | None:
        """The virtual stage that consumes vs's output (``nv`` virtual stages in all); None at its
        copy's last stage (the LM head's)."""
        return None if vs == self.first_of(vs) + nv // self.copies - 1 else vs + 1


def virtual_stage(rank: int, chunk: int, num_stages: int) -> int:
    """Virtual stage index of ``chunk`` on ``rank`` in the loop map (Megatron-LM / torch layout)."""
    return StageMap("loop", num_stages).stage(rank, chunk)


def add_p2p(actions: list[list[Action]], smap: StageMap) -> list[list[Action | P2P]]:
    """The action lists with their point-to-point transfers explicit (torch pipelining's
    ``_add_send_recv``): a RECV before an F (B) whose input (output gradient) comes from another
    rank, a SEND after an F (B) whose output (input gradient) another rank consumes. Transfers
    between two stages of one rank (the turn of a V) need none, nor do a copy's ends (``StageMap``)."""
    nv = smap.p * (1 + max((a.stage // smap.p for row in actions for a in row), default=0))
    out: list[list[Action | P2P]] = []
    for r, row in enumerate(actions):
        acts: list[Action | P2P] = []
        for a in row:
            before, after = smap.prev(a.stage), smap.next(a.stage, nv)
            src, dst = (before, after) if a.phase == "F" else (after, before)
            if a.phase != "W" and src is not None and smap.rank(src) != r:
                acts.append(P2P("RECV", src, a.phase, a.microbatch, smap.rank(src)))
            acts.append(a)
            if a.phase != "W" and dst is not None and smap.rank(dst) != r:
                acts.append(P2P("SEND", a.stage, a.phase, a.microbatch, smap.rank(dst)))
        out.append(acts)
    return out


def format_grid(actions) -> str:
    """Printable grid, one row per rank, actions in program order in fixed-width columns."""
    width = max((len(str(a)) for row in actions for a in row), default=1)
    label = len(str(max(len(actions) - 1, 0)))
    return "\n".join(f"rank {r:>{label}}: " + " ".join(f"{str(a):<{width}}" for a in row).rstrip()
                     for r, row in enumerate(actions))


def max_in_flight(actions_of_rank: list[Action]) -> int:
    """Peak number of (virtual stage, micro-batch) activation sets alive on one rank.

    A set is allocated at its F. It is freed at its W when the rank's list contains a W for it
    (split backward: B frees the gradient-only part, but W still reads the stage's inputs and the
    output gradients, so counting until W is the conservative bound of Qi et al. 2024, sec. 3.1);
    otherwise at its B. For schedules with several chunks per rank each set is one chunk, i.e. 1/v
    of a rank's layers: multiply by the per-chunk activation bytes, not the per-stage ones.
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
