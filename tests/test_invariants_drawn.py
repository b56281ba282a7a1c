"""Drawn scenarios across every feature at once (``benchmarks/invariants.py``): a scenario the rules
accept simulates, keeps the accounting identity and 0 < MFU <= HFU, and the search's lower bound and
memory estimate agree with its simulation. The benchmark draws hundreds; here 40 from one seed."""

import importlib.util
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "invariants", Path(__file__).resolve().parents[1] / "benchmarks" / "invariants.py")
invariants = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(invariants)


@pytest.mark.parametrize("raw", invariants.accepted_draws(11, 40), ids=lambda r: f"{r['model']['preset']}")
def test_a_drawn_scenario_keeps_every_invariant(raw):
    assert invariants.violations(raw) == []


def test_a_violation_is_reported(monkeypatch):
    """The check itself can fail: a scenario whose simulation raises is a violation, not a pass."""
    raw = invariants.accepted_draws(11, 1)[0]

    def boom(scn):
        raise RuntimeError("boom")

    monkeypatch.setattr(invariants, "simulate_metrics", boom)
    assert invariants.violations(raw) == ["raised RuntimeError: boom"]
