"""Specification of the console summary and report.md: every metric of DESIGN.md §4.3 appears with
its number and unit, missing keys read "n/a", unknown keys are ignored."""

from __future__ import annotations

from simulator.analysis.report import format_summary, write_report
from simulator.units import GiB


def metrics() -> dict:
    return {
        "scenario": "gpt3-175b-1024xA100", "num_gpus": 1024, "iteration_time_s": 12.5,
        "tokens_per_s": 251658.24, "model_flops_per_iteration": 1.0e18,
        "hardware_flops_per_iteration": 1.3e18, "model_tflops_per_gpu": 140.7,
        "hardware_tflops_per_gpu": 187.9, "mfu": 0.451, "hfu": 0.6025, "bubble_fraction": 0.08,
        "time_breakdown_s": {"compute": 8.0, "recompute": 2.0, "comm_tp": 0.5, "comm_cp": 0.0,
                             "comm_ep": 0.0, "comm_pp": 0.25, "comm_dp": 0.25, "bubble": 1.0,
                             "optimizer": 0.5, "offload": 0.0, "other": 0.0},
        "memory_bytes": {"params": 10 * GiB, "grads": 10 * GiB, "optimizer": 20 * GiB,
                         "activations": 15 * GiB, "buffers": 1 * GiB, "total": 56 * GiB},
        "memory_capacity_bytes": 80 * GiB, "fits_in_memory": True,
        "some_future_key": {"nested": [1, 2]},
    }


def test_summary_lists_every_headline_number():
    text = format_summary(metrics())
    for needle in ("gpt3-175b-1024xA100", "1024", "12.500 s", "251,658", "MFU", "45.1%",
                   "HFU", "60.2%", "140.7", "187.9", "8.0%", "56.00 GiB of 80.00 GiB (70.0%)",
                   "fits"):
        assert needle in text, needle
    lines = text.splitlines()
    assert any(l.split() == ["comm_tp", "500.00", "ms", "4.0%"] for l in lines)
    assert any(l.split() == ["compute", "8.000", "s", "64.0%"] for l in lines)
    assert not any(l.split()[:1] == ["comm_cp"] for l in lines)  # zero rows are left out
    assert "some_future_key" not in text


def test_summary_of_an_almost_empty_dict_says_na():
    text = format_summary({"scenario": "x", "fits_in_memory": False})
    assert "n/a" in text and "DOES NOT FIT" in text


def test_report_has_summary_breakdowns_sections_and_images(tmp_path):
    out = tmp_path / "results" / "run"
    out.mkdir(parents=True)
    (out / "timeline.png").write_bytes(b"png")
    path = write_report(out, metrics(), [str(out / "timeline.png"), "bubbles.png",
                                          str(tmp_path / "elsewhere.png")],
                        sections=[("Link utilization", "| link | util |\n|---|---|\n| nic0 | 80% |"),
                                  ("Warnings", "- activation memory is 27% of capacity")])
    assert path == out / "report.md"
    md = path.read_text()
    assert md.startswith("# Training-iteration report: gpt3-175b-1024xA100\n")
    for row in ("| iteration time | 12.500 s |", "| tokens/s | 251,658 |", "| MFU | 45.1% |",
                "| HFU | 60.2% |", "| model TFLOP/s per GPU | 140.7 |",
                "| hardware TFLOP/s per GPU | 187.9 |", "| pipeline bubble | 8.0% |",
                "| memory peak per GPU | 56.00 GiB of 80.00 GiB (70.0%), fits |",
                # time breakdown: seconds and share of the iteration, in DESIGN.md order
                "| compute | 8.000000 | 64.0% |", "| comm_tp | 0.500000 | 4.0% |",
                "| bubble | 1.000000 | 8.0% |", "| **total** | 12.500000 | 100.0% |",
                # memory breakdown in GiB
                "| optimizer | 20.00 | 35.7% |", "| activations | 15.00 | 26.8% |",
                "| **total** | 56.00 | 100.0% |",
                "## Link utilization", "| nic0 | 80% |", "## Warnings",
                "![timeline](timeline.png)", "![bubbles](bubbles.png)",
                "![elsewhere](../../elsewhere.png)"):
        assert row in md, row
    assert md.index("| compute |") < md.index("| recompute |") < md.index("| comm_tp |")
    assert "some_future_key" not in md


def test_report_without_breakdowns_still_renders(tmp_path):
    md = write_report(tmp_path, {"scenario": "measured"}, []).read_text()
    assert "| iteration time | n/a |" in md
    assert "## Time breakdown" not in md and "## Figures" not in md
