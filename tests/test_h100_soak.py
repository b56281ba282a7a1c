"""The lent H100 held at load for minutes (benchmarks/gpu_soak.py): the figures
scenarios/calibration/README.md quotes from ``gpu_soak.json``, and that they leave the short tables standing."""

import json
import statistics
from pathlib import Path

MEASURED = Path(__file__).resolve().parents[1] / "scenarios" / "calibration" / "h100"


def _doc(name: str) -> dict:
    return json.loads((MEASURED / name).read_text())


def test_the_thermal_steady_state_slows_the_layer_mix_under_one_percent():
    soak = _doc("gpu_soak.json")["soak"]
    s = soak["summary"]
    assert (round(1e3 * s["first10s_per_layer_s"], 2), round(1e3 * s["last_per_layer_s"], 2)) == (22.48, 22.59)
    assert (s["first10s_sm_MHz"], s["last_sm_MHz"], s["last_window_s"]) == (1470, 1440, 50.0)
    short = _doc("gpu_layer.json")["fwd_bwd_per_layer_s"]
    assert round(100 * (s["last_per_layer_s"] / short - 1), 1) == 0.6
    assert round(100 * (s["last_per_layer_s"] / s["first10s_per_layer_s"] - 1), 1) == 0.5
    late = [r for r in soak["series"] if r["t_s"] >= 60]
    assert (min(r["temp_C"] for r in late), max(r["temp_C"] for r in late)) == (70, 72)
    assert (min(r["hbm_C"] for r in late), max(r["hbm_C"] for r in late)) == (64, 67)
    assert {tuple(r["reasons"]) for r in soak["series"]} == {("sw_power_cap",)}  # no thermal slowdown
    assert statistics.pstdev(r["per_layer_s"] for r in late) / statistics.mean(r["per_layer_s"] for r in late) < 0.005


def test_hot_gemms_sustain_the_rates_of_the_short_tables():
    hot, short = _doc("gpu_soak.json"), _doc("gpu_kernels.json")
    for dtype, quoted, quoted_short in (("bf16", 670, 665), ("fp8", 1271, 1241)):
        rate = hot[f"hot_{dtype}"]["summary"]["steady_tflops"]
        assert (round(rate), round(short[f"sustained_{dtype}"]["summary"]["steady_tflops"])) == (quoted, quoted_short)
        assert rate >= 0.99 * short[f"sustained_{dtype}"]["summary"]["steady_tflops"]
    assert (hot["hot_bf16"]["summary"]["steady_sm_MHz"], hot["hot_fp8"]["summary"]["steady_sm_MHz"]) == (1365, 1320)
