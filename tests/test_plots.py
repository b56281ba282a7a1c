"""Specification of the timeline and pipeline-bubble pictures: they render valid PNGs for pipeline
traces (4-stage 1F1B, 10k events, interleaved), without pyplot, and reject what they cannot draw."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from simulator.analysis.plots import _pick_ranks, event_colour, plot_bubbles, plot_timeline
from simulator.trace import Trace, TraceEvent

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def one_f_one_b_trace(p: int = 4, m: int = 8, tf: float = 1e-3, tb: float = 2e-3,
                      layers: int = 2) -> Trace:
    """1F1B (PipeDream-flush, Narayanan et al. 2021 fig. 4) timed by its dependencies: F(s, i)
    after F(s-1, i), B(s, i) after B(s+1, i) and F(s, i); each action split into layer kernels,
    with a DP gradient bucket after every backward layer and a P2P send after every forward."""
    orders = []
    for s in range(p):
        warm = min(p - 1 - s, m)
        order, f = [("F", i) for i in range(warm)], warm
        for b in range(m):
            if f < m:
                order.append(("F", f))
                f += 1
            order.append(("B", b))
        orders.append(order)
    done: dict[tuple, float] = {}
    clock, pos, events = [0.0] * p, [0] * p, []
    while any(pos[s] < len(orders[s]) for s in range(p)):
        for s in range(p):
            while pos[s] < len(orders[s]):
                phase, i = orders[s][pos[s]]
                deps = [(s - 1, "F", i)] if phase == "F" and s > 0 else []
                deps += [(s + 1, "B", i)] if phase == "B" and s < p - 1 else []
                if any(d not in done for d in deps):
                    break
                start = max([clock[s]] + [done[d] for d in deps])
                dur = tf if phase == "F" else tb
                for layer in range(layers):
                    a, b = start + layer * dur / layers, start + (layer + 1) * dur / layers
                    events.append(TraceEvent(f"{phase}{i}.l{layer}", "compute", s, "compute", a, b,
                                             stage=s, microbatch=i, chunk=0, phase=phase,
                                             layer=layer))
                    if phase == "B":
                        events.append(TraceEvent("dp_bucket", "comm_dp", s, "comm_dp", b,
                                                 b + dur / (2 * layers), stage=s))
                if phase == "F" and s < p - 1:
                    events.append(TraceEvent("send", "comm_pp", s, "comm_pp", start + dur,
                                             start + dur + tf / 10, stage=s, microbatch=i))
                clock[s] = done[(s, phase, i)] = start + dur
                pos[s] += 1
    end = max(clock)
    events += [TraceEvent("adam", "optimizer", s, "compute", end, end + tf / 2, stage=s, phase="O")
               for s in range(p)]
    return Trace(tuple(events), rank_labels={s: f"stage {s}" for s in range(p)},
                 metadata={"num_stages": p})


def assert_png(path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 5000


def test_timeline_and_bubbles_of_a_4_stage_1f1b(tmp_path):
    trace = one_f_one_b_trace()
    out = plot_timeline(trace, tmp_path / "a" / "timeline.png", title="1F1B")
    assert out == tmp_path / "a" / "timeline.png"
    assert_png(out)
    assert_png(plot_bubbles(trace, tmp_path / "bubbles.png"))


def test_10k_events_and_192_microbatches(tmp_path):
    trace = one_f_one_b_trace(p=4, m=192, layers=6)
    assert len(trace.events) > 10_000
    assert_png(plot_timeline(trace, tmp_path / "t.png"))
    assert_png(plot_bubbles(trace, tmp_path / "b.png"))


def test_interleaved_and_zero_bubble_phases_render(tmp_path):
    events = []
    for chunk in range(2):
        for i, phase in enumerate(["F", "B", "W"]):
            t = chunk * 3.0 + i
            events.append(TraceEvent("x", "compute", 0, "compute", t, t + 1.0, stage=0,
                                     microbatch=0, chunk=chunk, phase=phase))
    events.append(TraceEvent("k", "kernel_class_x", 0, "stream 7", 0.0, 2.0))  # measured category
    trace = Trace(tuple(events), metadata={"num_stages": 2})
    assert_png(plot_timeline(trace, tmp_path / "t.png"))
    assert_png(plot_bubbles(trace, tmp_path / "b.png"))


def test_many_ranks_are_sampled_keeping_first_and_last(tmp_path):
    assert _pick_ranks(list(range(100)), 4) == [0, 33, 66, 99]
    assert _pick_ranks([3, 5], 32) == [3, 5]
    trace = Trace(tuple(TraceEvent("op", "compute", r, "compute", 0.0, 1.0 + r) for r in range(40)))
    assert_png(plot_timeline(trace, tmp_path / "t.png", max_ranks=8))


def test_phase_shades_forward_lighter_weight_darker():
    f, b, w = (sum(event_colour("compute", p)) for p in ("F", "B", "W"))
    assert f > b > w
    assert event_colour("no-such-category", "") == event_colour("other", "")


def test_bad_inputs_are_value_errors(tmp_path):
    with pytest.raises(ValueError, match="max_ranks"):
        plot_timeline(one_f_one_b_trace(), tmp_path / "t.png", max_ranks=0)
    no_stage = Trace((TraceEvent("op", "compute", 0, "compute", 0.0, 1.0),))
    with pytest.raises(ValueError, match="stage"):
        plot_bubbles(no_stage, tmp_path / "b.png")


def test_plots_never_touch_pyplot(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        from simulator.analysis.plots import plot_bubbles, plot_timeline
        from simulator.trace import Trace, TraceEvent
        t = Trace((TraceEvent("op", "compute", 0, "compute", 0.0, 1.0, stage=0, phase="F",
                              microbatch=0),))
        plot_timeline(t, {str(tmp_path / 't.png')!r})
        plot_bubbles(t, {str(tmp_path / 'b.png')!r})
        assert "matplotlib.pyplot" not in sys.modules
    """)
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])
