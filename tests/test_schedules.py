"""Specifications of the pipeline schedules: exact action grids, coverage, per-rank order,
dependency feasibility and the closed-form bubbles, checked with a tiny list scheduler."""

from __future__ import annotations

from fractions import Fraction

import pytest

from simulator.strategy.schedules import (SCHEDULES, P2P, Action, StageMap, add_p2p, format_grid,
                                          ideal_bubble_fraction, max_in_flight, schedule_actions,
                                          splits_backward, stage_map, virtual_stage)

P, M = 4, 8
CASES = [(name, s.chunks or 2) for name, s in SCHEDULES.items()]


def grid(rows: list[str]) -> list[list[Action]]:
    return [[Action.parse(t) for t in row.split()] for row in rows]


def list_schedule(actions: list[list[Action]], p: int, v: int, dur: dict[str, Fraction],
                  spans: list | None = None, smap: StageMap | None = None) -> tuple[Fraction, list[Fraction]]:
    """Run every rank's list in program order, each action as soon as its rank is free and its
    inputs exist: F(s, i) after F(s-1, i); B(s, i) after F(s, i) and B(s+1, i); W(s, i) after
    B(s, i), s-1 and s+1 within s's model copy (``smap``, default one copy). Free communication.
    Returns (makespan, busy time per rank); raises on deadlock. ``spans``, when given, receives
    every rank's (first start, last end)."""
    smap = smap or StageMap("loop", p)
    end: dict[tuple[int, str, int], Fraction] = {}
    pos, free = [0] * p, [Fraction(0)] * p
    first: dict[int, Fraction] = {}
    remaining = sum(len(row) for row in actions)
    while remaining:
        progressed = False
        for r in range(p):
            while pos[r] < len(actions[r]):
                a = actions[r][pos[r]]
                before, after = smap.prev(a.stage), smap.next(a.stage, p * v)
                if a.phase == "F":
                    deps = [(before, "F", a.microbatch)] if before is not None else []
                elif a.phase == "B":
                    deps = [(a.stage, "F", a.microbatch)]
                    if after is not None:
                        deps.append((after, "B", a.microbatch))
                else:
                    deps = [(a.stage, "B", a.microbatch)]
                if any(d not in end for d in deps):
                    break
                start = max([free[r]] + [end[d] for d in deps])
                first.setdefault(r, start)
                free[r] = end[(a.stage, a.phase, a.microbatch)] = start + dur[a.phase]
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = [str(actions[r][pos[r]]) for r in range(p) if pos[r] < len(actions[r])]
            raise RuntimeError(f"deadlock at {stuck}")
    busy = [sum((dur[a.phase] for a in row), Fraction(0)) for row in actions]
    if spans is not None:
        spans += [(first.get(r, Fraction(0)), free[r]) for r in range(p)]
    return max(free), busy


def bubble_fractions(name: str, p: int, m: int, v: int, dur: dict[str, Fraction]) -> list[Fraction]:
    makespan, busy = list_schedule(schedule_actions(name, p, m, v), p, v, dur, smap=stage_map(name, p))
    return [1 - b / makespan for b in busy]


FB = {"F": Fraction(1), "B": Fraction(2)}
FBW = {"F": Fraction(1), "B": Fraction(1), "W": Fraction(1)}


# --- Action ------------------------------------------------------------------------------------

def test_action_prints_and_parses_like_torch_pipelining():
    a = Action(1, "F", 3)
    assert str(a) == "1F3"
    assert Action.parse("1F3") == a
    assert Action.parse("12W10") == Action(12, "W", 10)
    assert (Action(6, "B", 0).rank(4), Action(6, "B", 0).chunk(4)) == (2, 1)
    assert virtual_stage(rank=2, chunk=1, num_stages=4) == 6


@pytest.mark.parametrize("text", ["F3", "1X3", "1F", "aF1", ""])
def test_action_parse_rejects_garbage(text):
    with pytest.raises(ValueError, match="action text"):
        Action.parse(text)


def test_action_rejects_bad_phase_and_negative_indices():
    with pytest.raises(ValueError, match="phase"):
        Action(0, "I", 0)
    with pytest.raises(ValueError, match="microbatch=-1"):
        Action(0, "F", -1)


# --- exact grids (written by hand from the papers' rules) ---------------------------------------

def test_1f1b_grid_p4_m8():
    expected = grid([
        "0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0F6 0B3 0F7 0B4 0B5 0B6 0B7",
        "1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1F5 1B3 1F6 1B4 1F7 1B5 1B6 1B7",
        "2F0 2F1 2B0 2F2 2B1 2F3 2B2 2F4 2B3 2F5 2B4 2F6 2B5 2F7 2B6 2B7",
        "3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5 3F6 3B6 3F7 3B7",
    ])
    assert schedule_actions("1f1b", 4, 8) == expected


def test_1f1b_with_fewer_microbatches_than_stages_is_gpipe_like():
    assert schedule_actions("1f1b", 4, 2)[0] == grid(["0F0 0F1 0B0 0B1"])[0]
    assert schedule_actions("1f1b", 4, 2)[3] == grid(["3F0 3B0 3F1 3B1"])[0]


def test_gpipe_grid_p2_m3():
    assert schedule_actions("gpipe", 2, 3) == grid(["0F0 0F1 0F2 0B0 0B1 0B2",
                                                    "1F0 1F1 1F2 1B0 1B1 1B2"])


def test_interleaved_grid_p2_m4_v2():
    # Megatron: rank 0 warms up (2-0-1)*2 + (2-1)*2 = 4 forwards, rank 1 warms up 2; micro-batches
    # go 2 at a time through chunk 0 (stages 0, 1) then chunk 1 (stages 2, 3); backward visits
    # chunk 1 first.
    assert schedule_actions("interleaved-1f1b", 2, 4, 2) == grid([
        "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3",
        "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3",
    ])


def test_interleaved_all_warmup_when_microbatches_equal_stages():
    # Megatron runs all forwards first when num_microbatches == pp.
    rows = schedule_actions("interleaved-1f1b", 2, 2, 2)
    assert rows[1] == grid(["1F0 1F1 3F0 3F1 3B0 3B1 1B0 1B1"])[0]


def test_torch_interleaved_keeps_its_warmup_when_microbatches_equal_stages():
    """torch.distributed.pipelining's ScheduleInterleaved1F1B: Megatron's order and warm-up, except at
    m == p, where rank r still warms up (v - 1) * p + 2 * (p - 1 - r) forwards."""
    assert schedule_actions("torch-interleaved-1f1b", 2, 2, 2)[1] == grid(["1F0 1F1 3F0 3B0 3F1 3B1 1B0 1B1"])[0]
    assert schedule_actions("torch-interleaved-1f1b", 2, 2, 2)[0] == schedule_actions("interleaved-1f1b", 2, 2, 2)[0]
    for p, m, v in ((2, 4, 2), (4, 8, 2), (4, 12, 3)):
        assert schedule_actions("torch-interleaved-1f1b", p, m, v) == schedule_actions("interleaved-1f1b", p, m, v)
    for dur in (FB, {"F": Fraction(1), "B": Fraction(1)}):
        assert bubble_fractions("torch-interleaved-1f1b", 8, 8, 2, dur) == [Fraction(7, 23)] * 8


def test_zero_bubble_h1_grid_p3_m4():
    # 1F1B warm-up, backward split in B and W, W deferred by `rank` backward steps.
    assert schedule_actions("zero-bubble", 3, 4) == grid([
        "0F0 0F1 0F2 0B0 0W0 0F3 0B1 0W1 0B2 0W2 0B3 0W3",
        "1F0 1F1 1B0 1F2 1B1 1W0 1F3 1B2 1W1 1B3 1W2 1W3",
        "2F0 2B0 2F1 2B1 2F2 2B2 2W0 2F3 2B3 2W1 2W2 2W3",
    ])


def test_format_grid():
    text = format_grid(schedule_actions("1f1b", 2, 2))
    assert text == "rank 0: 0F0 0F1 0B0 0B1\nrank 1: 1F0 1B0 1F1 1B1"
    wide = format_grid([[Action(0, "F", 10), Action(0, "F", 2)]])
    assert wide == "rank 0: 0F10 0F2"


# --- structural properties of every schedule -----------------------------------------------------

@pytest.mark.parametrize("name,v", CASES)
def test_every_stage_microbatch_pair_runs_once_per_phase_on_its_rank(name, v):
    rows = schedule_actions(name, P, M, v)
    assert len(rows) == P
    phases = ("F", "B", "W") if splits_backward(name) else ("F", "B")
    smap = stage_map(name, P)
    for r, row in enumerate(rows):
        assert all(smap.rank(a.stage) == r for a in row)
        share = M // smap.copies  # DualPipe: copy A runs micro-batches 0 .. M/2 - 1, copy B the rest
        first = {vs: (vs // P) * share if smap.copies > 1 else 0 for vs in smap.stages_of(r, v)}
        expected = {(vs, ph, i) for vs in smap.stages_of(r, v) for ph in phases
                    for i in range(first[vs], first[vs] + share)}
        seen = [(a.stage, a.phase, a.microbatch) for a in row]
        assert len(seen) == len(set(seen)) == len(expected)
        assert set(seen) == expected


@pytest.mark.parametrize("name,v", CASES)
def test_forward_precedes_backward_precedes_weight_grad_on_each_rank(name, v):
    for row in schedule_actions(name, P, M, v):
        at = {(a.stage, a.phase, a.microbatch): k for k, a in enumerate(row)}
        for (stage, phase, i), k in at.items():
            if phase == "B":
                assert at[(stage, "F", i)] < k
            if phase == "W":
                assert at[(stage, "B", i)] < k


def test_list_scheduler_detects_deadlock():
    # Rank 0 waits for the backward of micro-batch 1 while rank 1 waits for its forward.
    bad = grid(["0F0 0B1 0F1 0B0", "1F0 1F1 1B1 1B0"])
    with pytest.raises(RuntimeError, match="deadlock"):
        list_schedule(bad, 2, 1, FB)


# --- bubbles off the unit-time timeline ----------------------------------------------------------

@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(1, 3), (2, 1), (4, 2), (4, 8), (3, 7), (8, 16)])
def test_gpipe_and_1f1b_bubble_is_p_minus_1_over_m_plus_p_minus_1(name, p, m):
    expected = Fraction(p - 1, m + p - 1)
    assert bubble_fractions(name, p, m, 1, FB) == [expected] * p
    assert ideal_bubble_fraction(name, p, m) == pytest.approx(float(expected), abs=0.0)


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (4, 4, 2), (2, 6, 3), (4, 12, 3), (8, 16, 2),
                                   (1, 3, 2)])
@pytest.mark.parametrize("dur", [FB, {"F": Fraction(1), "B": Fraction(1)}])
def test_interleaved_bubble_is_p_minus_1_over_vm_plus_p_minus_1(p, m, v, dur):
    # Derived: the idle time is (p - 1)(t_f + t_b) / v per rank for a chunk of 1/v of the layers,
    # so with per-chunk times the fraction is exactly (p - 1) / (v m + p - 1) (Narayanan 2021,
    # sec. 2.2.1), for any t_f : t_b and also in Megatron's all-warm-up case m == p.
    expected = Fraction(p - 1, v * m + p - 1)
    assert bubble_fractions("interleaved-1f1b", p, m, v, dur) == [expected] * p
    assert ideal_bubble_fraction("interleaved-1f1b", p, m, v) == pytest.approx(float(expected),
                                                                               abs=0.0)


@pytest.mark.parametrize("p,m", [(4, 8), (4, 4), (3, 7), (8, 16), (2, 9)])
def test_zero_bubble_h1_bubble_with_equal_f_b_w(p, m):
    expected = Fraction(p - 1, 3 * m + p - 1)
    assert bubble_fractions("zero-bubble", p, m, 1, FBW) == [expected] * p
    assert ideal_bubble_fraction("zero-bubble", p, m) == pytest.approx(float(expected), abs=0.0)


@pytest.mark.parametrize("p,m", [(4, 8), (8, 16)])
def test_zero_bubble_h1_idle_time_is_one_third_of_1f1b(p, m):
    # Same work per micro-batch (F + full backward = 3 units); only the split differs.
    zb_makespan, zb_busy = list_schedule(schedule_actions("zero-bubble", p, m), p, 1, FBW)
    fb_makespan, fb_busy = list_schedule(schedule_actions("1f1b", p, m), p, 1, FB)
    assert zb_busy == fb_busy
    assert (zb_makespan - zb_busy[0]) * 3 == fb_makespan - fb_busy[0] == 3 * (p - 1)


@pytest.mark.parametrize("dur", [{"F": Fraction(2), "B": Fraction(1), "W": Fraction(1)},
                                 {"F": Fraction(1), "B": Fraction(1), "W": Fraction(1, 2)},
                                 {"F": Fraction(1), "B": Fraction(3, 2), "W": Fraction(1)}])
def test_zero_bubble_h1_matches_qi_et_al_bubble_when_w_not_longer_than_f(dur):
    # Qi et al. 2024, sec. 3.1: ZB-H1 bubble = (p - 1)(T_F + T_B - T_W).
    p, m = 4, 8
    makespan, busy = list_schedule(schedule_actions("zero-bubble", p, m), p, 1, dur)
    assert [makespan - b for b in busy] == [(p - 1) * (dur["F"] + dur["B"] - dur["W"])] * p


def test_zero_bubble_with_fewer_microbatches_than_stages_is_no_better_than_formula():
    p, m = 4, 2
    fractions = bubble_fractions("zero-bubble", p, m, 1, FBW)
    assert all(f >= Fraction(p - 1, 3 * m + p - 1) for f in fractions)


def test_ideal_bubble_values():
    assert ideal_bubble_fraction("1f1b", 4, 8) == pytest.approx(3 / 11)
    assert ideal_bubble_fraction("gpipe", 4, 8) == pytest.approx(3 / 11)
    assert ideal_bubble_fraction("interleaved-1f1b", 4, 8, 2) == pytest.approx(3 / 19)
    assert ideal_bubble_fraction("zero-bubble", 4, 8) == pytest.approx(3 / 27)
    assert ideal_bubble_fraction("1f1b", 1, 8) == 0.0


# --- activation memory: in-flight micro-batches --------------------------------------------------

def test_max_in_flight_counts_until_b_or_until_w_when_split():
    assert max_in_flight(grid(["0F0 0F1 0B0 0F2 0B1 0B2"])[0]) == 2
    assert max_in_flight(grid(["0F0 0B0 0F1 0W0 0B1 0W1"])[0]) == 2
    assert max_in_flight(grid(["0F0 0B0 0W0 0F1 0B1 0W1"])[0]) == 1
    assert max_in_flight([]) == 0


@pytest.mark.parametrize("p,m", [(4, 8), (4, 2), (8, 16)])
def test_in_flight_gpipe_1f1b_zero_bubble(p, m):
    assert [max_in_flight(r) for r in schedule_actions("gpipe", p, m)] == [m] * p
    assert [max_in_flight(r) for r in schedule_actions("1f1b", p, m)] == [
        min(p - r, m) for r in range(p)]
    # ZB-H1: every rank holds as many as 1F1B's rank 0, so the peak memory is 1F1B's.
    assert [max_in_flight(r) for r in schedule_actions("zero-bubble", p, m)] == [min(p, m)] * p


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (4, 16, 4), (2, 6, 3), (4, 4, 2)])
def test_in_flight_interleaved_rank0_as_megatron(p, m, v):
    rows = schedule_actions("interleaved-1f1b", p, m, v)
    warmup = m * v if m == p else min(2 * (p - 1) + (v - 1) * p, m * v)
    expected = warmup if warmup == m * v else warmup + 1  # one more forward before the 1st B
    assert max_in_flight(rows[0]) == expected
    assert max(max_in_flight(r) for r in rows) == max_in_flight(rows[0])


# --- input validation ----------------------------------------------------------------------------

@pytest.mark.parametrize("args,match", [
    (("pipedream", 4, 8, 1), "pipedream"),
    (("1f1b", 4, 0, 1), "got 0"),
    (("1f1b", 0, 8, 1), "pp=0"),
    (("interleaved-1f1b", 4, 6, 2), "6 % 4 = 2"),
    (("interleaved-1f1b", 4, 8, 1), "virtual_stages must be >= 2 .* got 1"),
    (("1f1b", 4, 8, 2), "virtual_stages must be 1 .* got 2"),
    (("zero-bubble", 4, 8, 2), "virtual_stages must be 1 .* got 2"),
    (("gpipe", 4, 8, 3), "virtual_stages must be 1 .* got 3"),
    (("zb-v", 4, 8, 1), "virtual_stages must be 2 .* got 1"),
    (("dualpipe-v", 4, 7, 2), "at least 8 micro-batches with pp = 4, got 7"),
])
def test_invalid_combinations_raise_with_numbers(args, match):
    with pytest.raises(ValueError, match=match):
        schedule_actions(*args)
    with pytest.raises(ValueError, match=match):
        ideal_bubble_fraction(*args)


def test_splits_backward():
    assert [n for n in SCHEDULES if splits_backward(n)] == ["zero-bubble", "zb-h2", "zb-v", "dualpipe-v",
                                                                "dualpipe"]
    assert set(SCHEDULES) == {"gpipe", "1f1b", "interleaved-1f1b", "torch-interleaved-1f1b", "zero-bubble",
                              "zb-h2", "zb-v", "dualpipe-v", "dualpipe"}
    with pytest.raises(ValueError, match="zb-v"):
        splits_backward("pipedream")


# --- stage maps, explicit transfers ------------------------------------------------------------

def test_stage_maps_loop_and_v():
    loop, v = StageMap("loop", 4), StageMap("v", 4)
    assert [loop.rank(s) for s in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [v.rank(s) for s in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert v.stages_of(0, 2) == (0, 7) and v.stages_of(3, 2) == (3, 4) and loop.stages_of(1, 3) == (1, 5, 9)
    assert all(m.stage(m.rank(s), m.chunk(s)) == s for m in (loop, v) for s in range(12))
    assert Action(6, "B", 0).rank(4, "v") == 1 and Action(6, "B", 0).chunk(4) == 1
    with pytest.raises(ValueError, match="stage map"):
        StageMap("zigzag", 4)


@pytest.mark.parametrize("name,v", CASES)
def test_every_transfer_has_its_matching_receive_on_the_peer(name, v):
    smap = stage_map(name, P)
    rows = add_p2p(schedule_actions(name, P, M, v), smap)
    sends = {(x.stage, x.phase, x.microbatch, r, x.peer) for r, row in enumerate(rows) for x in row
             if isinstance(x, P2P) and x.kind == "SEND"}
    recvs = {(x.stage, x.phase, x.microbatch, x.peer, r) for r, row in enumerate(rows) for x in row
             if isinstance(x, P2P) and x.kind == "RECV"}
    assert sends == recvs
    # the V's turn stays on a rank; DualPipe's copies do not chain, each runs M / 2 micro-batches
    hops = sum(smap.next(s, P * v) is not None and smap.rank(s) != smap.rank(s + 1) for s in range(P * v))
    assert len(sends) == 2 * M // smap.copies * hops
    for row in rows:  # a RECV right before its consumer, a SEND right after its producer
        for k, x in enumerate(row):
            if isinstance(x, P2P):
                a = row[k + 1] if x.kind == "RECV" else row[k - 1]
                assert (a.phase, a.microbatch) == (x.phase, x.microbatch)
    assert str(P2P("SEND", 1, "F", 3, 2)) == "1SEND_F3"


# --- the zero-bubble family beyond ZB-H1, and DualPipeV ----------------------------------------

def test_dualpipe_v_grid_p2_m4_from_the_steps_of_dualpipev_py():
    # rank 0 holds stages 0 and 3, rank 1 stages 1 and 2. Rank 0: step 1 (2 F0), step 2 (F0 F1),
    # step 3 (B1 split, its W, F1), step 4 (F0 & B1, F1 & B0, full backwards), step 5, step 6
    # (B1 full; B0 split from the middle on), step 7 (W, B0 split), step 8 (W).
    assert schedule_actions("dualpipe-v", 2, 4, 2) == grid([
        "0F0 0F1 0F2 3F0 3B0 3W0 3F1 0F3 3B1 3W1 3F2 0B0 0W0 3B2 3W2 3F3 0B1 0W1 3B3 3W3 0B2 0W2 0B3 0W3",
        "1F0 2F0 1F1 2F1 1F2 2B0 2W0 2F2 1B0 1W0 1F3 2B1 2W1 2F3 1B1 1W1 2B2 2W2 1B2 1W2 2B3 1B3 2W3 1W3",
    ])


def test_zb_v_grid_p2_m3_as_torch_schedule_zbv_zero_bubble():
    assert schedule_actions("zb-v", 2, 3, 2) == grid([
        "0F0 0F1 0F2 3F0 3B0 3W0 3F1 3B1 3W1 0B0 0W0 3F2 3B2 3W2 0B1 0W1 0B2 0W2",
        "1F0 2F0 1F1 2F1 2B0 2W0 1F2 1B0 1W0 2F2 2B1 2W1 1B1 2B2 1B2 1W1 2W2 1W2",
    ])


def test_zb_h2_grid_p3_m6():
    # 2(p - r) - 1 warm-up forwards, B first, W's gathering at the end of later ranks
    assert schedule_actions("zb-h2", 3, 6) == grid([
        "0F0 0F1 0F2 0F3 0F4 0B0 0W0 0B1 0F5 0B2 0W1 0B3 0W2 0B4 0W3 0W4 0B5 0W5",
        "1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1W0 1B3 1F5 1B4 1W1 1W2 1B5 1W3 1W4 1W5",
        "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3 2F4 2B4 2W0 2F5 2B5 2W1 2W2 2W3 2W4 2W5",
    ])


@pytest.mark.parametrize("p,m", [(4, 8), (4, 16), (3, 12), (8, 32), (2, 5)])
@pytest.mark.parametrize("dur", [FBW, {"F": Fraction(2), "B": Fraction(1), "W": Fraction(1)},
                                 {"F": Fraction(1), "B": Fraction(2), "W": Fraction(1)},
                                 {"F": Fraction(1), "B": Fraction(3, 2), "W": Fraction(1, 2)},
                                 {"F": Fraction(1), "B": Fraction(1), "W": Fraction(2)}])
def test_zb_h2_idle_is_the_papers_bubble_floored_at_the_start_up(p, m, dur):
    # Qi et al. 2024 sec. 3.1: ZB-H2's bubble (p - 1)(T_F + T_B - 2 T_W); with every rank ending
    # the step together the start-up (p - 1) T_F of the last rank cannot be hidden, hence the floor.
    makespan, busy = list_schedule(schedule_actions("zb-h2", p, m), p, 1, dur)
    expected = (p - 1) * (dur["F"] + max(Fraction(0), dur["B"] - 2 * dur["W"]))
    assert [makespan - b for b in busy] == [expected] * p
    if dur == FBW:  # the paper's zero bubble: each rank runs back to back, rank r from r to r + 3m
        spans: list = []
        list_schedule(schedule_actions("zb-h2", p, m), p, 1, FBW, spans)
        assert spans == [(r, r + 3 * m) for r in range(p)]
        assert bubble_fractions("zb-h2", p, m, 1, FBW) == [Fraction(p - 1, 3 * m + p - 1)] * p
        assert ideal_bubble_fraction("zb-h2", p, m) == pytest.approx(float(Fraction(p - 1, 3 * m + p - 1)), abs=0)


@pytest.mark.parametrize("p,m", [(4, 8), (4, 16), (3, 12), (8, 32), (2, 3)])
def test_zb_h2_memory_is_2p_minus_1_micro_batches(p, m):
    rows = schedule_actions("zb-h2", p, m)
    assert [max_in_flight(r) for r in rows] == [min(2 * p - 1, m)] * p
    warmups = [next(k for k, a in enumerate(row) if a.phase == "B") for row in rows]
    assert warmups == [min(2 * (p - r) - 1, m) for r in range(p)]


@pytest.mark.parametrize("name", ["zb-v", "dualpipe-v"])
@pytest.mark.parametrize("p,m", [(4, 8), (4, 16), (3, 12), (8, 16), (2, 4)])
def test_v_schedules_idle_only_the_start_up_at_equal_chunk_times(name, p, m):
    # ZB-V (Qi et al. sec. 6): zero bubble at T_F = T_B = T_W but for the start-up of p - 1 chunk
    # forwards; DualPipeV attains the same (DeepSeek-V3 table 2 with the pair's forward hidden).
    expected = Fraction(p - 1, 6 * m + p - 1)
    assert bubble_fractions(name, p, m, 2, FBW) == [expected] * p
    assert ideal_bubble_fraction(name, p, m, 2) == pytest.approx(float(expected), abs=0)


@pytest.mark.parametrize("dur", [FBW, {"F": Fraction(2), "B": Fraction(1), "W": Fraction(1)},
                                 {"F": Fraction(1), "B": Fraction(2), "W": Fraction(1)},
                                 {"F": Fraction(2), "B": Fraction(2), "W": Fraction(1)},
                                 {"F": Fraction(1), "B": Fraction(3, 2), "W": Fraction(1, 2)}])
@pytest.mark.parametrize("p,m", [(4, 16), (3, 12), (5, 20)])
def test_dualpipe_v_within_deepseek_table_bubble_with_the_pair_run_serially(dur, p, m):
    # DeepSeek-V3 table 2: (PP/2 - 1)(F&B + B_full - 3W), PP = 2p; here F&B = F + B_full (no
    # overlap inside the compute stream), B_full = B + W.
    makespan, busy = list_schedule(schedule_actions("dualpipe-v", p, m, 2), p, 2, dur)
    full = dur["B"] + dur["W"]
    bound = (p - 1) * (dur["F"] + full + full - 3 * dur["W"])
    assert all((p - 1) * dur["F"] <= makespan - b <= bound for b in busy)


@pytest.mark.parametrize("p,m", [(4, 8), (4, 16), (3, 12)])
def test_v_schedules_memory_zb_v_as_1f1b_dualpipe_v_pp_plus_one(p, m):
    # a set is one chunk, half a stage: ZB-V holds p stages' worth (1F1B's rank 0, Qi et al.
    # sec. 6); DualPipeV PP + 1 chunks with PP = 2p (DeepSeek-V3 table 2, "Activation").
    assert [max_in_flight(r) for r in schedule_actions("zb-v", p, m, 2)] == [2 * p] * p
    assert [max_in_flight(r) for r in schedule_actions("dualpipe-v", p, m, 2)] == [2 * p + 1] * p


@pytest.mark.parametrize("name", list(SCHEDULES))
@pytest.mark.parametrize("p,m", [(1, 2), (2, 4), (3, 6), (4, 8), (2, 7), (5, 10)])
def test_every_schedule_runs_without_deadlock(name, p, m):
    s = SCHEDULES[name]
    v = s.chunks or 2
    if m < s.min_microbatches(p) or (s.microbatches_multiple_of_p and m % p) or (s.even and (p % 2 or m % 2)):
        return
    rows = schedule_actions(name, p, m, v)
    list_schedule(rows, p, v, FBW, smap=stage_map(name, p))  # raises on deadlock


@pytest.mark.parametrize("name", ["zb-v", "dualpipe-v", "zb-h2", "dualpipe"])
def test_new_schedules_lower_and_simulate_end_to_end(name):
    from simulator.pipeline import simulate
    from simulator.scenario import load_scenario
    scn = load_scenario("scenarios/gpt3-1.3b-8xa100.toml",
                        [f"parallelism.schedule={name}", "parallelism.pp=4", "parallelism.dp=1",
                         "training.global_batch_size=16"])
    res = simulate(scn)
    res.graph.validate()
    smap, p, v = stage_map(name, 4), 4, scn.parallel.virtual_stages
    assert v == (SCHEDULES[name].chunks or 1)
    sends = [t for t in res.graph.tasks if t.category == "comm_pp" and t.comm.op == "send_recv"]
    m = scn.num_microbatches
    hops = sum(smap.next(s, p * v) is not None and smap.rank(s) != smap.rank(s + 1) for s in range(p * v))
    assert len(sends) == 2 * m // smap.copies * hops  # one representative rank per stage sends each hop's transfer
    for t in sends:  # each send goes to the rank holding the neighbouring stage
        a, b = (res.plan.mesh.stage_of(g) for g in t.comm.group)
        assert a != b and abs(a - b) == 1
    assert 0 < res.metrics["iteration_time_s"] < 10
