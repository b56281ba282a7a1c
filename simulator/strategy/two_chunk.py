"""Schedules on two model chunks per rank, written as token programs (``_VRank``): ZB-V, DualPipeV
and DualPipe, each transcribed from its reference implementation; the overlapped forward-backward
pairs of the DualPipe family are listed beside their action grids. ``schedules`` holds their
definitions (stage map, bubble, pairs) with the other schedules'.
"""

from __future__ import annotations

from collections import deque

from .actions import Action


class _VRank:
    """One rank's program over two chunks, written as tokens: "F0" / "F1" the next forward of
    chunk 0 / 1; "B0" a full backward (B then its W); "I0" an input-gradient backward whose W is
    queued; "W0" the next weight gradient of chunk 0; "W" the oldest queued W (first in first out);
    "F0B1" DualPipe's overlapped pair (``_forward_backward_chunk``): F0 then B1, the forward's
    (stage, micro-batch) recorded in ``pairs``.
    ``stages``: the virtual stage of token chunk 0 and 1 (default the V map's, rank and 2p - 1 - rank);
    ``first_mb``: the micro-batch each token chunk starts counting from (DualPipe's two streams)."""

    def __init__(self, rank: int, p: int, stages: tuple[int, int] | None = None,
                 first_mb: tuple[int, int] = (0, 0)) -> None:
        self.stage = stages or (rank, 2 * p - 1 - rank)
        self.nf, self.nb, self.nw = list(first_mb), list(first_mb), list(first_mb)
        self.queued: deque[tuple[int, int]] = deque()
        self.acts: list[Action] = []
        self.pairs: list[tuple[int, int]] = []

    def run(self, tokens: list[str]) -> None:
        for tok in tokens:
            if len(tok) == 4:
                self.pairs.append((self.stage[int(tok[1])], self.nf[int(tok[1])]))
                self.run([tok[:2], tok[2:]])
                continue
            if tok == "W":
                if self.queued:
                    s, i = self.queued.popleft()
                    self.acts.append(Action(s, "W", i))
                continue
            c = int(tok[1])
            s = self.stage[c]
            if tok[0] == "F":
                self.acts.append(Action(s, "F", self.nf[c]))
                self.nf[c] += 1
            elif tok[0] == "W":
                self.acts.append(Action(s, "W", self.nw[c]))
                self.nw[c] += 1
            else:  # "B" full, "I" split
                self.acts.append(Action(s, "B", self.nb[c]))
                if tok[0] == "B":
                    self.acts.append(Action(s, "W", self.nb[c]))
                else:
                    self.queued.append((s, self.nb[c]))
                self.nb[c] += 1


def zero_bubble_v(p: int, m: int, v: int = 2) -> list[list[Action]]:
    """ZB-V (Qi et al. 2024, sec. 6; "Pipeline Parallelism with Controllable Memory", Qi et al. 2024,
    V-ZB): two chunks per rank on the V stage map, backward split in B and W. Transcribed from
    torch.distributed.pipelining ``ScheduleZBVZeroBubble._calculate_single_rank_operations`` (the
    handcrafted schedule of the authors' repository): 2(p - r) - 1 chunk-0 forwards, r (F1, F0)
    pairs, p - r (F1, B1, W1) triples, then (F0, B0, W0, F1, B1, W1) steps, and the drain with
    each chunk's W deferred. Built for max(m, 2p - 1) micro-batches and the ones >= m dropped, as
    torch does. Peak activation memory is 1F1B's (p micro-batches of a full stage), and with
    T_F = T_B = T_W per chunk every rank runs back to back (zero bubble in the paper's sense).
    """
    count = max(2 * p - 1, m)
    out = []
    for r in range(p):
        prog = _VRank(r, p)
        prog.run(["F0"] * (2 * (p - r) - 1) + ["F1", "F0"] * r + ["F1", "I1", "W1"] * (p - r))
        while prog.nf[1] < prog.nf[0] or prog.nf[0] < count:
            prog.run(["F0"] * (prog.nf[0] < count) + ["I0", "W0", "F1", "I1", "W1"])
        prog.run(["I0", "I1"] * r + ["I0", "W0"] * (p - r))
        prog.run(["W1"] * (prog.nb[1] - prog.nw[1]) + ["W0"] * (prog.nb[0] - prog.nw[0]))
        out.append([a for a in prog.acts if a.microbatch < m])
    return out


def _dualpipe_program(prog: _VRank, h: int, hr: int, m: int) -> None:
    """The steps of ``DualPipeV.step`` / ``DualPipe.step`` (DeepSeek-AI DualPipe repository, steps 1-8:
    nF0, nF0F1, nB1W1F1, nF0B1F1B0, nB1F1B0, nB1B0, nWB0, nW) for ``h`` ranks of the V (DualPipe: half
    the ranks), the rank ``hr`` of it and ``m`` micro-batches per chunk, run on ``prog``."""
    prog.run(["F0"] * 2 * (h - hr - 1) + ["F0", "F1"] * (hr + 1) + ["I1", "W", "F1"] * (h - hr - 1))  # steps 1-3
    # steps 4-5: every forward-backward pair overlapped, but the V's last rank's first ("We don't overlap
    # these two chunks to further reduce bubble size")
    first = ["F0", "B1"] if hr == h - 1 else ["F0B1"]
    prog.run(first + ["F1B0"] + ["F0B1", "F1B0"] * (m - 2 * h + hr) + ["B1", "F1B0"] * (h - hr - 1))
    split = False
    for i in range(hr + 1):  # step 6: from the middle on, the backwards are split
        split = split or (i == (hr + 1) // 2 and hr % 2 == 1)
        prog.run(["I1" if split else "B1"])
        split = split or (i == (hr + 1) // 2 and hr % 2 == 0)
        prog.run(["I0" if split else "B0"])
    prog.run(["W", "I0"] * (h - hr - 1) + ["W"] * (hr + 1))  # steps 7-8


def dualpipe_v(p: int, m: int, v: int = 2) -> list[list[Action]]:
    """DualPipeV (DeepSeek-AI, DualPipe repository ``dualpipev.py``, the "cut-in-half" V-shape form
    of DualPipe, DeepSeek-V3 technical report sec. 3.2.2): two chunks per rank on the V stage map,
    transcribed step for step from ``DualPipeV.step`` (``_dualpipe_program``), needing m >= 2p.

    A forward-backward pair that DualPipe overlaps (``_forward_backward_chunk``: the forward of one
    micro-batch and the full backward of another, each one's all-to-all hidden behind the other's
    compute) is written F then B then W adjacent, and listed by ``dualpipe_v_pairs``: the lowering
    interleaves the pair's compute at its all-to-alls (``strategy/pair_overlap``). A full backward
    (zero-bubble off) is B then W adjacent; a split one (``enable_zb``) queues its W, and each
    ``_weight_chunk`` runs the oldest queued W (``WeightGradStore``, first in first out).
    """
    return [prog.acts for prog in _dualpipe_v_ranks(p, m)]


def _dualpipe_v_ranks(p: int, m: int) -> list[_VRank]:
    out = []
    for r in range(p):
        prog = _VRank(r, p)
        _dualpipe_program(prog, p, r, m)
        out.append(prog)
    return out


def dualpipe_v_pairs(p: int, m: int, v: int = 2) -> frozenset[tuple[int, int]]:
    """(virtual stage, micro-batch) of every forward that opens an overlapped pair in DualPipeV."""
    return _pairs(_dualpipe_v_ranks(p, m))


def dualpipe(p: int, m: int, v: int = 2) -> list[list[Action]]:
    """DualPipe (DeepSeek-V3 technical report sec. 3.2.1, fig. 5; DeepSeek-AI DualPipe repository
    ``dualpipe.py``): bidirectional, on the "dual" stage map (``StageMap``): rank r holds copy A's stage
    r (virtual stage r) and copy B's stage p - 1 - r (virtual stage 2p - 1 - r). Micro-batches
    0 .. m/2 - 1 enter copy A on rank 0, m/2 .. m - 1 enter copy B on rank p - 1 (``DualPipe.step``
    scatters the first rank's inputs into m/2 chunks, the last rank's likewise). Needs an even p and an
    even m >= 2p (its asserts).

    Transcribed from ``DualPipe.step``: half_rank = min(r, p - 1 - r) runs the steps of DualPipeV's rank
    half_rank on p/2 ranks with m/2 micro-batches per chunk (``_dualpipe_program``), its phase 0 being
    the copy that enters on its side (``phase ^= is_in_second_half``): copy A for r < p/2, copy B for the
    second half. The overlapped forward-backward pairs (``_forward_backward_chunk``) are written as
    DualPipeV's, F then B then W, and listed by ``dualpipe_pairs``.
    """
    return [prog.acts for prog in _dualpipe_ranks(p, m)]


def _dualpipe_ranks(p: int, m: int) -> list[_VRank]:
    h, half = p // 2, m // 2
    out = []
    for r in range(p):
        a, b = (r, 0), (2 * p - 1 - r, half)  # copy A's stage r and copy B's stage p - 1 - r, first micro-batch
        first, second = (a, b) if r < h else (b, a)
        prog = _VRank(r, p, (first[0], second[0]), (first[1], second[1]))
        _dualpipe_program(prog, h, min(r, p - 1 - r), half)
        out.append(prog)
    return out


def dualpipe_pairs(p: int, m: int, v: int = 2) -> frozenset[tuple[int, int]]:
    """(virtual stage, micro-batch) of every forward that opens an overlapped pair in DualPipe."""
    return _pairs(_dualpipe_ranks(p, m))


def _pairs(progs: list[_VRank]) -> frozenset[tuple[int, int]]:
    """Every rank's overlapped pairs (``_VRank.pairs``), one set: a (virtual stage, micro-batch) names
    one forward on one rank."""
    return frozenset(pair for prog in progs for pair in prog.pairs)
