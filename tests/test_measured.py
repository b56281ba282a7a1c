"""analysis/measured: busy/idle per stream, kernel time by category, exposed communication, timelines."""

from pathlib import Path

import pytest

from simulator.analysis.bubbles import merge_intervals
from simulator.analysis.measured import (exposed_communication, kernel_time_by_category,
                                         plot_measured_timeline, plot_side_by_side, stream_utilization,
                                         summary_markdown)
from simulator.trace import Trace, TraceEvent

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
US = 1e-6


def _ev(name, cat, stream, a_us, b_us, rank=0):
    return TraceEvent(name, cat, rank, stream, a_us * US, b_us * US)


def _trace() -> Trace:
    """Rank 0: GEMMs [0,30] and [40,100] on compute, NCCL [80,130] on stream 20 (exposed 30 us), a CPU op
    that must not count as a kernel; rank 1: one elementwise kernel [10, 20]."""
    return Trace((
        _ev("gemm", "gemm", "compute", 0, 30), _ev("gemm", "gemm", "compute", 40, 100),
        _ev("ncclAllReduce", "nccl", "stream 20", 80, 130), _ev("aten::mm", "cpu_op", "cpu thread 1", 0, 120),
        _ev("add", "elementwise", "compute", 10, 20, rank=1)), source="measured")


def test_merged_intervals():
    assert merge_intervals([(3, 4), (0, 1), (0.5, 2), (2, 2.5)]) == [(0, 2.5), (3, 4)]


def test_stream_utilization_is_busy_union_over_the_window():
    rows = {(r["rank"], r["stream"]): r for r in stream_utilization(_trace())}
    c = rows[(0, "compute")]
    assert c["busy_s"] == pytest.approx(90 * US) and c["idle_s"] == pytest.approx(40 * US)
    assert c["busy_fraction"] == pytest.approx(90 / 130) and c["events"] == 2
    assert rows[(0, "stream 20")]["busy_s"] == pytest.approx(50 * US)
    # a window clips the events
    w = {(r["rank"], r["stream"]): r for r in stream_utilization(_trace(), 20 * US, 60 * US)}
    assert w[(0, "compute")]["busy_s"] == pytest.approx(30 * US)
    assert w[(0, "compute")]["idle_s"] == pytest.approx(10 * US)


def test_kernel_time_by_category_leaves_out_host_lanes():
    by = kernel_time_by_category(_trace())
    assert by[0]["gemm"] == pytest.approx(90 * US) and by[0]["nccl"] == pytest.approx(50 * US)
    assert by[0]["elementwise"] == 0.0 and "cpu_op" not in by[0]
    assert by[1]["elementwise"] == pytest.approx(10 * US)


def test_exposed_communication():
    x = exposed_communication(_trace())[0]
    assert x["comm_s"] == pytest.approx(50 * US)
    assert x["overlapped_s"] == pytest.approx(20 * US)
    assert x["exposed_s"] == pytest.approx(30 * US)
    assert exposed_communication(_trace())[1]["comm_s"] == 0.0


def test_summary_markdown_has_a_row_per_lane():
    t = _trace()
    md = summary_markdown(stream_utilization(t), kernel_time_by_category(t), exposed_communication(t))
    assert "| 0 | compute | 2 | 0.090 | 0.040 | 69.2% |" in md
    assert "| 0 | 0.050 | 0.020 | 0.030 |" in md


def _is_png(p: Path) -> bool:
    return p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_timelines_are_written(tmp_path):
    t = _trace()
    assert _is_png(plot_measured_timeline(t, tmp_path / "m.png", title="m"))
    assert _is_png(plot_side_by_side(t, t, tmp_path / "s.png", title="s", measured_window=(0.0, 100 * US)))


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/traces not present")
@pytest.mark.parametrize("name", ["a100-multistream-sgemm.json.gz", "a100x2-ddp-cnn-nccl.rank0.json.gz",
                                  "gpu128-recsys-sampled.rank0.json.gz"])
def test_every_shared_trace_loads_and_draws(tmp_path, name):
    from simulator.calibration.kineto import load_kineto_trace

    t = load_kineto_trace(SHARED / name)
    assert _is_png(plot_measured_timeline(t, tmp_path / "t.png", title=name))
    by = kernel_time_by_category(t)[0]
    assert by["gemm"] > 0
    x = exposed_communication(t)[0]
    assert 0.0 <= x["exposed_s"] <= x["comm_s"]
    assert (x["comm_s"] > 0) == ("nccl" in name or "gpu128" in name)
