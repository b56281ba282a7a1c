"""Metrics as closed-form cross-checks: accounting identity, DP-only step, MFU from 6N + attention."""

import pytest

from simulator.analysis.metrics import BREAKDOWN_KEYS, exposed_breakdown
from simulator.cost.collectives import collective_time_s
from simulator.pipeline import simulate
from simulator.scenario import scenario_from_dict
from simulator.trace import Trace, TraceEvent


def gpt(**par):
    raw = {"model": {"num_layers": 4, "hidden_size": 1024, "num_attention_heads": 16, "vocab_size": 4096,
                     "seq_length": 1024},
           "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 2},
           "parallelism": {"tp": 1, "pp": 1, **par},
           "training": {"global_batch_size": 64, "micro_batch_size": 2}}
    return scenario_from_dict(raw, default_name="tiny")


def test_sweep_line_breakdown_exact():
    ev = [TraceEvent("f", "compute", 0, "compute", 0.0, 2.0),
          TraceEvent("ar", "comm_dp", 0, "comm_dp", 1.0, 4.0),
          TraceEvent("pp", "comm_pp", 0, "comm_pp", 3.0, 5.0),
          TraceEvent("o", "optimizer", 0, "compute", 6.0, 7.0)]
    b = exposed_breakdown(Trace(tuple(ev)), 0, 0.0, 8.0)
    # compute 0-2, then comm_pp wins over comm_dp for 3-4 (blocking before overlappable), idle 5-6, 7-8
    assert b["compute"] == 2.0 and b["comm_dp"] == 1.0 and b["comm_pp"] == 2.0
    assert b["optimizer"] == 1.0 and b["bubble"] == 2.0
    assert sum(b.values()) == 8.0


def _reference_sweep(events, t0, t1):
    """The event-by-event sweep exposed_breakdown vectorises: counts per (compute stream, category)
    updated point by point, each interval charged in time order."""
    from simulator.analysis.metrics import _EXPOSED_ORDER
    out = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
    points = sorted([(e.start_s, 1, e.stream == "compute", e.category if e.category in out else "other") for e in events
                     if e.end_s > e.start_s] + [(e.end_s, -1, e.stream == "compute", e.category if e.category in out
                                                 else "other") for e in events if e.end_s > e.start_s],
                    key=lambda p: (p[0], p[1]))
    running = {True: {}, False: {}}
    prev = t0

    def charge(a, b):
        for side in (True, False):
            active = [c for c, n in running[side].items() if n]
            if active:
                out[next((c for c in _EXPOSED_ORDER if c in active), active[0])] += b - a
                return
        out["bubble"] += b - a
    for time, delta, comp, cat in points:
        if time > prev:
            if min(time, t1) > prev:
                charge(prev, min(time, t1))
            prev = time
        running[comp][cat] = running[comp].get(cat, 0) + delta
    if t1 > prev:
        charge(prev, t1)
    return out


def test_the_vectorised_sweep_equals_the_event_by_event_one():
    import random
    rng = random.Random(5)
    cats = list(BREAKDOWN_KEYS) + ["kernel"]
    for _ in range(500):
        ev = [TraceEvent(f"e{i}", rng.choice(cats), 0, rng.choice(["compute", "comm_tp", "comm_dp"]), s,
                         s + rng.choice([0.0, 0.5, 1.0, rng.random(), -0.2]))
              for i, s in enumerate(rng.choice([0.0, 0.5, 1.0, 2.0, rng.random() * 4, -1.0]) for _ in range(rng.randint(0, 20)))]
        t0, t1 = rng.choice([0.0, 0.5, -2.0]), rng.choice([4.0, 1.5, 0.7, 10.0])
        assert exposed_breakdown(Trace(tuple(ev)), 0, t0, t1) == _reference_sweep(ev, t0, t1)


@pytest.mark.parametrize("par", [{}, {"tp": 2, "pp": 2}, {"tp": 4, "pp": 2, "schedule": "interleaved-1f1b"},
                                 {"pp": 4, "schedule": "zero-bubble", "zero_stage": 1}])
def test_breakdown_adds_up_to_the_iteration(par):
    m = simulate(gpt(**par)).metrics
    assert set(m["time_breakdown_s"]) == set(BREAKDOWN_KEYS)
    assert sum(m["time_breakdown_s"].values()) == pytest.approx(m["iteration_time_s"], rel=1e-9)


def test_dp_only_step_is_compute_plus_exposed_all_reduce():
    scn = gpt(overlap_grad_reduce=False)
    res = simulate(scn)
    ev = res.trace.events
    compute = sum(e.duration_s for e in ev if e.stream == "compute")
    reduce = [e for e in ev if e.category == "comm_dp"]
    assert reduce and all(e.start_s >= max(x.end_s for x in ev if x.phase == "B") for e in reduce)
    dp_time = sum(e.duration_s for e in reduce)
    # uncontended: each bucket takes exactly the collective's own time over the 16-GPU group
    task = next(t for t in res.graph.tasks if t.category == "comm_dp")
    assert reduce[0].duration_s == pytest.approx(collective_time_s(task.comm, res.topology), rel=1e-9)
    assert res.metrics["iteration_time_s"] == pytest.approx(compute + dp_time, rel=1e-9)


def test_mfu_from_6N_plus_attention_matches_task_flops():
    scn = gpt()
    m = simulate(scn).metrics
    model, tokens = scn.model, scn.training.global_batch_size * scn.model.seq_length
    gemm_params = model.num_params() - model.seq_length * model.hidden_size  # learned positions: no GEMM
    attention = 12 * model.num_layers * model.seq_length * model.hidden_size * tokens  # 3 x 4·b·s²·h per layer
    assert m["model_flops_per_iteration"] == pytest.approx(6 * gemm_params * tokens + attention, rel=2e-3)
    # no recompute: every executed FLOP is a model FLOP, summed over the simulated tasks
    assert m["hardware_flops_per_iteration"] == pytest.approx(m["model_flops_per_iteration"], rel=1e-9)
    assert m["hfu"] == pytest.approx(m["mfu"], rel=1e-9)


def test_full_recompute_hfu_over_mfu():
    m0 = simulate(gpt()).metrics
    m1 = simulate(gpt(recompute="full")).metrics
    fwd_share = 1 / 3  # recompute re-runs the forward: FLOPs grow by fwd / (fwd + bwd) = 1/3
    assert m1["hfu"] / m1["mfu"] == pytest.approx(1 + fwd_share, rel=2e-2)
    assert m1["iteration_time_s"] > m0["iteration_time_s"]


def test_dp_and_pp_sharing_nics_report_contention():
    # two stages on two nodes: pipeline sends and the overlapped DP gradient buckets use the same NICs
    raw = {"model": {"num_layers": 8, "hidden_size": 2048, "num_attention_heads": 16, "vocab_size": 4096,
                     "seq_length": 2048},
           "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 4},
           "parallelism": {"tp": 2, "pp": 2, "schedule": "interleaved-1f1b", "virtual_stages": 2},
           "training": {"global_batch_size": 64, "micro_batch_size": 1}}
    m = simulate(scenario_from_dict(raw)).metrics
    assert m["network_contention_s"].get("comm_pp", 0.0) + m["network_contention_s"].get("comm_dp", 0.0) > 0
    alone = simulate(gpt()).metrics  # one stage: no pipeline traffic to collide with
    assert alone["network_contention_s"].get("comm_pp", 0.0) == 0.0


def _offload(num_nodes: int):
    raw = {"model": {"num_layers": 8, "hidden_size": 2048, "num_attention_heads": 16, "vocab_size": 4096,
                     "seq_length": 1024},
           "cluster": {"preset": "dgx-a100-80gb", "num_nodes": num_nodes},
           "parallelism": {"tp": 1, "pp": 1, "zero_stage": 1, "offload_optimizer": True},
           "training": {"global_batch_size": 16 * num_nodes, "micro_batch_size": 1}}
    return simulate(scenario_from_dict(raw, default_name="offload"))


def test_offload_copies_cross_pcie_and_contend_with_the_nic_traffic():
    one_node = _offload(1)  # the DP ring stays on NVLink: nothing else crosses PCIe
    copies = [t for t in one_node.graph.tasks if t.comm is not None and t.comm.axis == "host"]
    assert {t.comm.op for t in copies} == {"d2h", "h2d"}
    # alone: two PCIe hops of latency (GPU -> switch -> host) + the bytes at the PCIe rate x 0.8
    pcie = one_node.scenario.cluster.pcie_bandwidth_Bps * 0.8
    ends = {(e.rank, e.name): e.duration_s for e in one_node.trace.events}
    for t in copies:
        assert ends[(t.rank, t.name)] == pytest.approx(2 * 0.5e-6 + t.comm.size_bytes / pcie, rel=1e-9)
    assert one_node.metrics["network_contention_s"].get("offload", 0.0) == 0.0
    # across nodes, gradient buckets leave through the GPU's PCIe link to its NIC while earlier
    # shards go to the host over the same link
    assert _offload(2).metrics["network_contention_s"].get("offload", 0.0) > 0


def test_union_length_of_intervals_counts_overlaps_once():
    from simulator.trace import union_length_s
    assert union_length_s([0.0, 1.0, 5.0, 2.0], [2.0, 3.0, 6.0, 2.5]) == 4.0  # [0,3] and [5,6]
    assert union_length_s([], []) == 0.0
    assert union_length_s([1.0, 1.0], [4.0, 2.0]) == 3.0


def test_the_busiest_rank_is_the_heavy_stage_that_the_last_ending_rank_waits_for():
    """A pipeline whose second stage holds 15 of 24 layers: the rank that ends last is a light stage,
    idle most of the step; the busiest rank (idle the least) is the heavy stage's, its breakdown adds
    up to the step too, and the console summary shows it."""
    from simulator.analysis.report import format_summary
    from simulator.pipeline import simulate
    from simulator.scenario import scenario_from_dict
    r = simulate(scenario_from_dict({
        "model": {"preset": "gpt3-1.3b"}, "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1},
        "parallelism": {"tp": 1, "pp": 4, "dp": 2, "layers_per_stage": [3, 15, 3, 3]},
        "training": {"global_batch_size": 16}}, default_name="imbalanced"))
    m, trace = r.metrics, r.sim.trace
    heavy = r.plan.graph.ranks[1]
    assert m["busiest_rank"]["rank"] == heavy
    assert trace.busy_s(heavy) == max(trace.busy_s(rank) for rank in r.plan.graph.ranks)
    busy = m["busiest_rank"]["time_breakdown_s"]
    assert sum(busy.values()) == pytest.approx(m["iteration_time_s"])
    assert busy["bubble"] < 0.05 * m["iteration_time_s"] < m["time_breakdown_s"]["bubble"]
    assert f"busiest rank {heavy}" in format_summary(m)


def test_a_balanced_plan_shows_one_breakdown():
    from simulator.analysis.report import format_summary
    from simulator.pipeline import simulate
    from simulator.scenario import scenario_from_dict
    r = simulate(scenario_from_dict({
        "model": {"preset": "gpt3-1.3b"}, "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1},
        "parallelism": {"tp": 2, "pp": 1, "dp": 4}, "training": {"global_batch_size": 8}}, default_name="flat"))
    assert r.metrics["busiest_rank"]["rank"] in r.plan.graph.ranks
    assert "busiest rank" not in format_summary(r.metrics)


def test_metrics_json_has_exactly_the_typed_keys_in_their_order():
    """analysis.metrics.Metrics is metrics.json key for key (DESIGN.md §4.3): the typed structure and
    the file cannot drift apart, and the JSON keeps its order."""
    from typing import get_type_hints

    from simulator.analysis.metrics import BusiestRank, Metrics

    m = simulate(gpt(tp=2)).metrics
    assert list(m) == list(get_type_hints(Metrics))
    assert list(m["busiest_rank"]) == list(get_type_hints(BusiestRank))
    assert isinstance(m["num_gpus"], int) and isinstance(m["fits_in_memory"], bool)
    assert all(isinstance(m[k], float) for k in ("iteration_time_s", "mfu", "hfu", "sm_contention_s"))


def test_simulate_metrics_equals_the_full_result_metrics():
    from pathlib import Path

    from simulator import load_scenario, simulate, simulate_metrics
    scn = load_scenario(Path(__file__).resolve().parents[1] / "scenarios" / "gpt3-1.3b-8xa100.toml")
    assert simulate_metrics(scn) == simulate(scn).metrics


def _small_scenario():
    from pathlib import Path

    from simulator import load_scenario
    return load_scenario(Path(__file__).resolve().parents[1] / "scenarios" / "gpt3-1.3b-8xa100.toml")


def test_a_step_leaves_its_objects_in_the_oldest_generation_and_the_collector_on():
    import gc

    from simulator import simulate
    result = simulate(_small_scenario())
    assert gc.isenabled() and gc.get_freeze_count() == 0
    # the step's objects skipped the young generations: no young collection walks them next
    assert len(gc.get_objects(0)) + len(gc.get_objects(1)) < 10_000 < len(gc.get_objects(2))
    assert result.metrics["iteration_time_s"] > 0


def test_dropped_steps_are_still_collected_when_simulating_step_after_step():
    import gc

    from simulator import simulate
    scn = _small_scenario()

    def dropped_step() -> None:
        result = simulate(scn)
        cycle = [result]
        cycle.append(cycle)  # garbage that only the cyclic collector frees

    dropped_step()
    dropped_step()
    baseline = len(gc.get_objects())
    step_objects = len(gc.get_objects(2)) // 2
    for _ in range(6):
        dropped_step()
    # CPython's rule for the oldest generation, applied to the moved objects, freed the dropped steps
    assert len(gc.get_objects()) < baseline + step_objects


def test_objects_someone_else_froze_stay_frozen():
    import gc

    from simulator import simulate
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        simulate(_small_scenario())
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


def test_metrics_only_steps_leave_no_cyclic_garbage_and_need_no_full_collection():
    """``simulate_metrics`` (search, sweep and validate workers) releases the flow network, whose
    reference cycles made every step's objects wait for a full collection; the survivors are then
    counted as they are (tracked objects on the way out less those on the way in), so a worker that
    simulates plan after plan runs no full collection per plan."""
    import gc

    from simulator.pipeline import simulate_metrics
    scn = _small_scenario()
    simulate_metrics(scn)
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        simulate_metrics(scn)
        gc.collect()
        cyclic = len(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert cyclic < 100
    full_runs = gc.get_stats()[2]["collections"]
    for _ in range(5):
        simulate_metrics(scn)
    assert gc.get_stats()[2]["collections"] - full_runs <= 1
