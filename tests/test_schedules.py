"""Specifications of the pipeline schedules: exact action grids, coverage, per-rank order,
dependency feasibility and the closed-form bubbles, checked with a tiny list scheduler."""

from __future__ import annotations

from fractions import Fraction

import pytest

from simulator.strategy.schedules import (SCHEDULES, Action, format_grid, ideal_bubble_fraction,
                                          max_in_flight, schedule_actions, splits_backward,
                                          virtual_stage)

P, M = 4, 8
CASES = [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("zero-bubble", 1)]


def grid(rows: list[str]) -> list[list[Action]]:
    return [[Action.parse(t) for t in row.split()] for row in rows]


def list_schedule(actions: list[list[Action]], p: int, v: int,
                  dur: dict[str, Fraction]) -> tuple[Fraction, list[Fraction]]:
    """Run every rank's list in program order, each action as soon as its rank is free and its
    inputs exist: F(s, i) after F(s-1, i); B(s, i) after F(s, i) and B(s+1, i); W(s, i) after
    B(s, i). Free communication. Returns (makespan, busy time per rank); raises on deadlock."""
    last = p * v - 1
    end: dict[tuple[int, str, int], Fraction] = {}
    pos, free = [0] * p, [Fraction(0)] * p
    remaining = sum(len(row) for row in actions)
    while remaining:
        progressed = False
        for r in range(p):
            while pos[r] < len(actions[r]):
                a = actions[r][pos[r]]
                if a.phase == "F":
                    deps = [(a.stage - 1, "F", a.microbatch)] if a.stage > 0 else []
                elif a.phase == "B":
                    deps = [(a.stage, "F", a.microbatch)]
                    if a.stage < last:
                        deps.append((a.stage + 1, "B", a.microbatch))
                else:
                    deps = [(a.stage, "B", a.microbatch)]
                if any(d not in end for d in deps):
                    break
                start = max([free[r]] + [end[d] for d in deps])
                free[r] = end[(a.stage, a.phase, a.microbatch)] = start + dur[a.phase]
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = [str(actions[r][pos[r]]) for r in range(p) if pos[r] < len(actions[r])]
            raise RuntimeError(f"deadlock at {stuck}")
    busy = [sum((dur[a.phase] for a in row), Fraction(0)) for row in actions]
    return max(free), busy


def bubble_fractions(name: str, p: int, m: int, v: int, dur: dict[str, Fraction]) -> list[Fraction]:
    makespan, busy = list_schedule(schedule_actions(name, p, m, v), p, v, dur)
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
    for r, row in enumerate(rows):
        assert all(a.rank(P) == r for a in row)
        expected = {(virtual_stage(r, c, P), ph, i)
                    for c in range(v) for ph in phases for i in range(M)}
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
])
def test_invalid_combinations_raise_with_numbers(args, match):
    with pytest.raises(ValueError, match=match):
        schedule_actions(*args)
    with pytest.raises(ValueError, match=match):
        ideal_bubble_fraction(*args)


def test_splits_backward():
    assert [splits_backward(n) for n in SCHEDULES] == [n == "zero-bubble" for n in SCHEDULES]
    assert set(SCHEDULES) == {"gpipe", "1f1b", "interleaved-1f1b", "zero-bubble"}
    with pytest.raises(ValueError, match="zb-v"):
        splits_backward("zb-v")
