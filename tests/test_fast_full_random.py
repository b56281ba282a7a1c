"""Fast mode against the full simulation on drawn plans (``benchmarks/fast_vs_full.py --random``): every
parallelism, CP algorithm, sharding and schedule on 2-16 nodes, fabrics with and without shared links.
Each plan's fast run is within 2% of its full run, or has fallen back to it (one-line notice)."""

import contextlib
import importlib.util
import io
from pathlib import Path

import pytest

from simulator.pipeline import simulate

_SPEC = importlib.util.spec_from_file_location(
    "fast_vs_full", Path(__file__).resolve().parents[1] / "benchmarks" / "fast_vs_full.py")
fast_vs_full = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(fast_vs_full)


@pytest.mark.parametrize("scn", fast_vs_full.random_scenarios(7, 30), ids=lambda s: s.name)
def test_a_drawn_plan_s_fast_run_is_its_full_run_within_two_percent(scn):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        fast = simulate(scn).metrics["iteration_time_s"]
    full = simulate(scn, full=True).metrics["iteration_time_s"]
    assert fast == pytest.approx(full, rel=0.02)
    if "notice: simulating every rank" in err.getvalue():
        assert fast == full
