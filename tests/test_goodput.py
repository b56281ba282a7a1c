"""Goodput of a whole run (engine/goodput_sim.py, reliability.py): exact timelines without failures,
Daly's closed form with them, the checkpoint-interval optimum where Young/Daly put it, determinism."""

import math
from dataclasses import replace

import numpy as np
import pytest

from simulator.analysis.goodput import checkpoint_bytes, sweep_optimum
from simulator.engine.goodput_sim import BREAKDOWN_KEYS, GoodputConfig, simulate_goodput
from simulator.explore.goodput import build_config, sweep_intervals
from simulator.reliability import (LLAMA3_405B, CauseRate, ReliabilitySpec, cause_rates, daly_interval_s,
                                   expected_goodput, unexpected_rate_per_s, young_interval_s)
from simulator.scenario import load_scenario
from simulator.scenario_checks import ScenarioError

LLAMA3 = "scenarios/llama3-405b-16384xh100.toml"


def crash(rate_per_s, replace_node=False):
    return CauseRate("crash", "gpu", rate_per_s, replace_node)


def _adds_up(run):
    assert sum(run.breakdown_s[k] for k in BREAKDOWN_KEYS) == pytest.approx(run.wall_s, rel=1e-9)


def test_no_failures_goodput_is_the_compute_fraction_exactly():
    cfg = GoodputConfig(step_s=2.0, interval_steps=10, checkpoint_write_s=3.0, checkpoint_read_s=1.0)
    run = simulate_goodput(cfg, 0, horizon_s=100 * (10 * 2.0 + 3.0))
    assert run.goodput == pytest.approx(20.0 / 23.0, rel=1e-12)
    assert run.effective_training_fraction == pytest.approx(20.0 / 23.0, rel=1e-12)
    assert run.steps == 1000 and run.checkpoints == 100 and not run.interruptions
    _adds_up(run)


def test_async_checkpoint_pauses_for_the_snapshot_and_slows_the_steps_it_overlaps():
    # per cycle: snapshot b, then k steps of which the first C s of wall time run at 1/(1+a) speed
    k, t, b, c, a, n = 10, 2.0, 0.5, 6.0, 0.25, 7
    cfg = GoodputConfig(step_s=t, interval_steps=k, checkpoint_write_s=c, checkpoint_read_s=1.0, asynchronous=True,
                        checkpoint_block_s=b, async_step_slowdown=a)
    run = simulate_goodput(cfg, 0, target_steps=n * k)
    assert run.wall_s == pytest.approx(n * k * t + (n - 1) * (b + c * a / (1 + a)), rel=1e-12)
    assert run.breakdown_s["slowdown"] == pytest.approx((n - 1) * c * a / (1 + a), rel=1e-12)
    assert run.breakdown_s["checkpoint"] == pytest.approx((n - 1) * b, rel=1e-12)
    assert run.reached_target and run.steps == n * k
    _adds_up(run)


def test_doubling_the_failure_rate_lowers_goodput_as_the_closed_form_says():
    k, c, r = 40, 10.0, 30.0
    got = {}
    for lam in (1 / 2000, 2 / 2000):
        cfg = GoodputConfig(step_s=1.0, interval_steps=k, checkpoint_write_s=c, checkpoint_read_s=5.0,
                            causes=(crash(lam),), detection_s=20.0, warmup_s=5.0)
        run = simulate_goodput(cfg, 3, horizon_s=2e6)
        _adds_up(run)
        got[lam] = (run.goodput, expected_goodput(k, c, r, lam))
        assert run.goodput == pytest.approx(got[lam][1], abs=0.005)
    (g1, e1), (g2, e2) = got.values()
    assert g2 < g1 and g2 / g1 == pytest.approx(e2 / e1, abs=0.01)


def test_interval_sweep_is_convex_with_its_optimum_where_young_and_daly_put_it():
    # C = 10 s << M = 2000 s and a short restart: the assumptions of Young's first-order formula
    cfg = GoodputConfig(step_s=2.0, interval_steps=100, checkpoint_write_s=10.0, checkpoint_read_s=5.0,
                        causes=(crash(1 / 2000),), detection_s=20.0, warmup_s=5.0)
    rows = sweep_intervals(cfg, 100, seeds=1, horizon_s=1e6)
    x = np.log([r["interval_s"] for r in rows])
    cost = np.array([1.0 / r["goodput"]["mean"] for r in rows])  # wall seconds per useful second
    slopes = np.diff(cost) / np.diff(x)
    assert np.all(np.diff(slopes) > 0), slopes  # convex in log(interval)
    young = young_interval_s(10.0, 2000.0)
    assert sweep_optimum(rows) == pytest.approx(young, rel=0.10)
    assert sweep_optimum(rows) == pytest.approx(daly_interval_s(10.0, 2000.0), rel=0.10)


def test_closed_forms():
    assert young_interval_s(8.0, 1e4) == pytest.approx(400.0)
    assert daly_interval_s(8.0, 1e4) == pytest.approx(400 * (1 + math.sqrt(4e-4) / 3 + 4e-4 / 9) - 8)
    assert daly_interval_s(30.0, 10.0) == 10.0  # C >= 2M: checkpoint every MTBF
    assert expected_goodput(90.0, 10.0, 50.0, 0.0) == pytest.approx(0.9)
    taus = np.linspace(100, 1000, 9001)  # Daly's interval maximises his exact expected goodput
    best = taus[np.argmax([expected_goodput(t, 8.0, 60.0, 1e-4) for t in taus])]
    assert best == pytest.approx(daly_interval_s(8.0, 1e4), rel=0.01)


def test_same_seed_same_run_other_seed_other_run():
    cfg = GoodputConfig(step_s=1.0, interval_steps=20, checkpoint_write_s=4.0, checkpoint_read_s=2.0,
                        causes=(crash(1 / 300, True), CauseRate("sw", "software", 1 / 900, False)),
                        detection_s=10.0, reschedule_s=30.0, warmup_s=3.0, hot_spares=2, spare_repair_s=5000.0,
                        straggler_jitter=0.05, straggler_probability=0.01, straggler_slowdown=0.5)
    a, b, c = (simulate_goodput(cfg, s, horizon_s=2e5) for s in (7, 7, 8))
    assert a == b and a != c
    _adds_up(a)


def test_planned_maintenance_checkpoints_first_and_loses_nothing():
    planned = CauseRate("planned maintenance", "planned", 1 / 500, False, graceful=True)
    cfg = GoodputConfig(step_s=1.0, interval_steps=50, checkpoint_write_s=4.0, checkpoint_read_s=2.0,
                        causes=(planned,), detection_s=600.0, reschedule_s=300.0, warmup_s=3.0)
    run = simulate_goodput(cfg, 1, horizon_s=1e5)
    assert len(run.interruptions) > 100
    assert run.breakdown_s["lost"] == 0.0 and all(i.lost_steps == 0 for i in run.interruptions)
    assert run.breakdown_s["recovery"] <= len(run.interruptions) * (3.0 + 2.0) + 1e-6  # no detection, no rescheduling
    _adds_up(run)


def test_hot_spares_skip_rescheduling():
    cfg = GoodputConfig(step_s=1.0, interval_steps=30, checkpoint_write_s=2.0, checkpoint_read_s=1.0,
                        causes=(crash(1 / 1000, True),), detection_s=60.0, reschedule_s=600.0, warmup_s=10.0)
    without = simulate_goodput(cfg, 2, horizon_s=3e5)
    spared = simulate_goodput(replace(cfg, hot_spares=10_000), 2, horizon_s=3e5)
    assert spared.goodput > without.goodput
    assert spared.breakdown_s["recovery"] <= len(spared.interruptions) * (60.0 + 10.0 + 1.0) + 1e-6
    per_without = without.breakdown_s["recovery"] / len(without.interruptions)
    assert per_without > 3 * spared.breakdown_s["recovery"] / len(spared.interruptions)  # the 600 s rescheduling


def test_stragglers_slow_steps_by_their_mean():
    cfg = GoodputConfig(step_s=1.0, interval_steps=100, checkpoint_write_s=0.0, checkpoint_read_s=0.0,
                        straggler_jitter=0.02, straggler_probability=0.01, straggler_slowdown=0.5)
    run = simulate_goodput(cfg, 0, target_steps=200_000)
    assert run.breakdown_s["slowdown"] / run.breakdown_s["compute"] == pytest.approx(0.01 + 0.01 * 0.5, rel=0.03)
    assert run.goodput == pytest.approx(run.breakdown_s["compute"] / run.wall_s, rel=1e-12)


def test_llama3_rates_scale_with_device_counts():
    scn = load_scenario(LLAMA3)
    rates = cause_rates(scn.reliability, scn.cluster)
    assert unexpected_rate_per_s(rates) * 86400 == pytest.approx(419 / 54)
    assert sum(r.rate_per_s for r in rates) * 86400 == pytest.approx(466 / 54)
    half = load_scenario(LLAMA3, ["cluster.num_nodes=1024", "parallelism.dp=64"])
    assert unexpected_rate_per_s(cause_rates(half.reliability, half.cluster)) * 86400 == pytest.approx(419 / 108)
    fewer_nics = load_scenario(LLAMA3, ["cluster.nics_per_node=4"])
    nic = {r.name: r.rate_per_s for r in cause_rates(fewer_nics.reliability, fewer_nics.cluster)}
    assert nic["NIC"] * 86400 == pytest.approx(7 / 54 / 2)
    assert sum(c.count for c in LLAMA3_405B.causes if not c.graceful) == 419
    doubled = cause_rates(replace(scn.reliability, failure_rate_scale=2.0), scn.cluster)
    assert unexpected_rate_per_s(doubled) == pytest.approx(2 * unexpected_rate_per_s(rates))
    assert cause_rates(ReliabilitySpec(failure_data="none"), scn.cluster) == ()


def test_checkpoint_is_weights_and_optimizer_state():
    scn = load_scenario(LLAMA3)
    assert checkpoint_bytes(scn) == pytest.approx(scn.model.num_params() * (2 + 12))
    cfg, info = build_config(scn, step_s=7.0)
    assert cfg.checkpoint_write_s == pytest.approx(checkpoint_bytes(scn) / 2e12)
    assert info["young_s"] == pytest.approx(young_interval_s(cfg.checkpoint_write_s, 54 * 86400 / 419))
    assert cfg.interval_steps == round(info["young_s"] / 7.0)


@pytest.mark.parametrize("override, fragment", [
    ("reliability.detection_s=-1", "reliability.detection_s must be >= 0"),
    ("reliability.checkpoint_mode='later'", "reliability.checkpoint_mode"),
    ("reliability.failure_data='mars'", "reliability.failure_data 'mars' is unknown"),
    ("reliability.storage_write_GBps=0", "reliability.storage_write_GBps must be positive"),
    ("reliability.straggler_probability=1.5", "reliability.straggler_probability"),
    ("reliability.hot_spares=1.5", "reliability.hot_spares must be int"),
    ("reliability.bogus=1", "[reliability] unknown key(s) ['bogus']"),
])
def test_bad_reliability_values_are_scenario_errors(override, fragment):
    with pytest.raises(ScenarioError, match=None) as e:
        load_scenario(LLAMA3, [override])
    assert fragment in str(e.value)


def test_nothing_fails_nothing_is_saved():
    scn = load_scenario(LLAMA3, ["reliability.failure_data='none'", "reliability.straggler_jitter=0"])
    cfg, info = build_config(scn, step_s=7.0)
    assert cfg.causes == () and math.isinf(info["young_s"])
    run = simulate_goodput(cfg, 0, horizon_s=12_000 * 7.0)  # a whole number of steps: none cut by the horizon
    assert run.goodput == pytest.approx(1.0, rel=1e-12) and run.checkpoints == 0 and run.steps == 12_000
