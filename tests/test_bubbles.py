"""Specification of the bubble measurement: idle time of each stage's compute stream, and the
schedule's actions read back off a timeline."""

from __future__ import annotations

from fractions import Fraction

import pytest

from simulator.analysis.bubbles import (Action, idle_intervals, merge_intervals, schedule_actions,
                                        stage_bubble_fractions, stage_ranks)
from simulator.trace import Trace, TraceEvent


def ev(rank, start, end, stage, phase="", mb=-1, chunk=-1, stream="compute", name="op"):
    return TraceEvent(name, "compute", rank, stream, float(start), float(end), stage=stage,
                      microbatch=mb, chunk=chunk, phase=phase)


def two_stage_trace() -> Trace:
    """Hand-built 2-stage, 2-micro-batch schedule over [0, 10].

    stage 0 (rank 0): F0 [0,1] F1 [1,2] . B0 [4,6] (+ an overlapping kernel [4.5,5.5]) . B1 [7,10]
    stage 1 (rank 1): . F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7] ...; a P2P send [8,9] on its pp stream
    """
    return Trace((
        ev(0, 0, 1, 0, "F", 0), ev(0, 1, 2, 0, "F", 1), ev(0, 4, 6, 0, "B", 0),
        ev(0, 4.5, 5.5, 0, "B", 0), ev(0, 7, 10, 0, "B", 1),
        ev(1, 1, 2, 1, "F", 0), ev(1, 2, 4, 1, "B", 0), ev(1, 4, 5, 1, "F", 1),
        ev(1, 5, 7, 1, "B", 1), ev(1, 8, 9, 1, stream="comm_pp"),
    ))


def test_two_stage_fractions_are_exact():
    # stage 0 idle: [2,4] + [6,7] = 3 of 10; stage 1 idle: [0,1] + [7,10] = 4 of 10
    # (the send on comm_pp does not make the compute stream busy).
    assert stage_bubble_fractions(two_stage_trace()) == {0: 0.3, 1: 0.4}


def test_several_ranks_of_one_stage_are_averaged():
    trace = Trace((ev(0, 0, 4, 0), ev(8, 0, 2, 0), ev(8, 3, 4, 0)))  # idle 0 and 1 of 4
    assert stage_ranks(trace) == {0: [0, 8]}
    assert stage_bubble_fractions(trace) == {0: 0.125}


def test_no_stage_information_gives_no_fractions():
    assert stage_bubble_fractions(Trace(())) == {}
    assert stage_bubble_fractions(Trace((ev(0, 0, 1, -1),))) == {}


def gpipe_trace(p: int, m: int, tf: float, tb: float) -> Trace:
    """GPipe (Huang et al. 2019): all forwards, then all backwards in reverse stage order.
    F(s, i) starts at (s + i) tf; B(s, i) starts at (m + p - 1) tf + (p - 1 - s + i) tb."""
    t_fwd = (m + p - 1) * tf
    events = []
    for s in range(p):
        for i in range(m):
            events.append(ev(s, (s + i) * tf, (s + i + 1) * tf, s, "F", i))
            b0 = t_fwd + (p - 1 - s + i) * tb
            events.append(ev(s, b0, b0 + tb, s, "B", i))
    return Trace(tuple(events), metadata={"num_stages": p})


@pytest.mark.parametrize("p,m", [(2, 1), (4, 8), (8, 32)])
def test_gpipe_bubble_matches_the_closed_form(p, m):
    # Bubble fraction of GPipe / 1F1B = (p - 1) / (m + p - 1) of the iteration
    # (Narayanan et al. 2021, section 2.2.1: bubble time (p-1)(tf+tb) over m(tf+tb) of work).
    fractions = stage_bubble_fractions(gpipe_trace(p, m, 1.0, 2.0))
    expected = float(Fraction(p - 1, m + p - 1))
    assert fractions == pytest.approx({s: expected for s in range(p)}, rel=1e-12)


def test_merge_and_idle_intervals():
    assert merge_intervals([(3, 4), (0, 1), (0.5, 2), (2, 2.5)]) == [(0, 2.5), (3, 4)]
    events = [ev(0, 1, 2, 0), ev(0, 1.5, 3, 0), ev(0, 5, 12, 0)]
    assert idle_intervals(events, 0.0, 10.0) == [(0.0, 1.0), (3.0, 5.0)]
    assert idle_intervals([], 0.0, 1.0) == [(0.0, 1.0)]


def test_actions_group_consecutive_events_and_label_like_pytorch():
    trace = Trace((
        ev(0, 0, 1, 0, "F", 3, chunk=0), ev(0, 1, 2, 0, "F", 3, chunk=0),   # one action, 2 layers
        ev(0, 2.5, 3, 0, "F", 3, chunk=0),                                  # same action after a gap
        ev(0, 3, 4, 0, "F", 3, chunk=1),                                    # next model chunk
        ev(0, 4, 5, 0, "B", 2, chunk=1), ev(0, 5, 6, 0, "W", 2, chunk=1),
        ev(0, 6, 7, 0, "O"),
        ev(0, 7, 8, 0), ev(1, 0, 1, 1, "F", 0, chunk=1),
    ), metadata={"num_stages": 2})
    acts = schedule_actions(trace, 0)
    assert acts[0] == Action(0, 0, "F", 3, 0, 0.0, 3.0)
    # virtual stage = chunk * num_stages + stage (interleaved 1F1B)
    assert [a.label for a in acts] == ["0F3", "2F3", "2B2", "2W2", "O"]
    assert [a.label for a in schedule_actions(trace, 1)] == ["3F0"]
