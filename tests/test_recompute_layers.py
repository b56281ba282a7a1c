"""Full recompute of some layers only (parallelism.recompute_method / recompute_num_layers, Megatron-LM's
--recompute-method / --recompute-num-layers): "block" re-runs the first N layers of every model chunk
and keeps the others' activations. The rule picks the layers Megatron-Core's TransformerBlock does; the
lowering emits exactly their recompute tasks; the memory, the step time and the search's estimate follow
it; "uniform" with one layer per checkpoint is today's full recompute; "interval" is torchtitan's selective
layer AC (every N-th block a rank builds); "uniform" with N > 1 checkpoints groups of N layers
(Megatron-Core's uniform method): only a group's input stays, its backward re-materialises the group;
bad settings are refused."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from pathlib import Path

import pytest

from simulator.explore.enumerate import Plan, SearchSpace, apply_plan, plan_of
from simulator.explore.estimate import EstimateCache, estimate
from simulator.explore.search import _estimate_group
from simulator.explore.sweep import BaseScenario
from simulator.pipeline import simulate
from simulator.scenario import ParallelSpec, scenario_from_dict
from simulator.scenario_checks import ScenarioError
from simulator.strategy.recompute import layer_recompute, recompute_groups, recomputed_layers
from simulator.strategy.stage_units import activation_rules, layer_memory, scenario_layout
from simulator.strategy.zero_impl import chunk_fetches

CHUNKS = ((0, 1, 2), (3, 4, 5), (6, 7, 8, 9))  # three model chunks, the last with an MTP layer (9)


def _par(**kw) -> ParallelSpec:
    return dataclasses.replace(ParallelSpec(), **kw)


def test_block_picks_the_first_layers_of_every_chunk_and_uniform_all():
    block2 = _par(recompute="full", recompute_method="block", recompute_num_layers=2)
    # the MTP layer (index >= num_layers 9) recomputes under full recompute whatever the method
    assert recomputed_layers(block2, CHUNKS, 9) == {0, 1, 3, 4, 6, 7, 9}
    assert recomputed_layers(_par(recompute="full"), CHUNKS, 9) == set(range(10))
    assert recomputed_layers(dataclasses.replace(block2, recompute_num_layers=5), CHUNKS, 9) == set(range(10))
    assert recomputed_layers(_par(recompute="selective"), CHUNKS, 9) == frozenset()
    done = recomputed_layers(block2, CHUNKS, 9)
    assert [layer_recompute(block2, done, i) for i in (0, 2, 5, 7, 8)] == ["full", "none", "none", "full", "none"]
    assert layer_recompute(_par(recompute="selective"), frozenset(), 3) == "selective"


def _raw(recompute: str = "full", method: str = "uniform", n: int = 1, v: int = 1, **extra) -> dict:
    # GPT-3 2.7B: 32 layers, 8 per pipeline stage (4 per chunk with v = 2)
    par = {"tp": 2, "pp": 4, "dp": 1, "recompute": recompute, "virtual_stages": v,
           "schedule": "interleaved-1f1b" if v > 1 else "1f1b", **extra}
    if (method, n) != ("uniform", 1):
        par.update(recompute_method=method, recompute_num_layers=n)
    return {"model": {"preset": "gpt3-2.7b"}, "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1},
            "parallelism": par, "training": {"global_batch_size": 16, "micro_batch_size": 1}}


def _scn(**kw):
    return scenario_from_dict(_raw(**kw), default_name="partial")


@pytest.mark.parametrize("n, v", [(1, 1), (3, 1), (2, 2)])
def test_the_lowering_recomputes_exactly_the_chosen_layers(n, v):
    scn = _scn(method="block", n=n, v=v)
    res = simulate(scn)
    chunks = scenario_layout(scn).chunks
    chosen = recomputed_layers(scn.parallel, chunks, scn.model.num_layers)
    ranks = sorted({t.rank for t in res.graph.tasks})
    assert len(ranks) == 4  # a representative rank per pipeline stage
    for rank in ranks:
        stage_layers = {i for vs in scenario_layout(scn).held(res.plan.mesh.stage_of(rank)) for i in chunks[vs]}
        recomputed = {t.layer for t in res.graph.tasks if t.rank == rank and t.category == "recompute"}
        assert recomputed == chosen & stage_layers
        assert len(recomputed) == n * v  # the first n layers of each of the rank's v chunks


def test_block_covering_a_chunk_is_uniform_and_fewer_layers_interpolate():
    full, none = simulate(_scn()).metrics, simulate(_scn(recompute="none")).metrics
    assert simulate(_scn(method="block", n=8)).metrics == full  # 8 layers per stage: all of them
    times, mems, hfus = [], [], []
    for n in (1, 4, 7):
        m = simulate(_scn(method="block", n=n)).metrics
        times.append(m["iteration_time_s"])
        mems.append(m["memory_bytes"]["total"])
        hfus.append(m["hfu"])
        assert m["mfu"] == pytest.approx(full["mfu"] * full["iteration_time_s"] / m["iteration_time_s"], rel=1e-12)
    assert none["iteration_time_s"] < times[0] < times[1] < times[2] < full["iteration_time_s"]
    assert none["memory_bytes"]["total"] > mems[0] > mems[1] > mems[2] > full["memory_bytes"]["total"]
    assert none["hfu"] < hfus[0] and hfus[-1] < full["hfu"]


def test_each_layer_stores_what_its_own_recompute_mode_stores():
    scn = _scn(method="block", n=3)
    rules = activation_rules(scn)
    none, full = (layer_memory(scn, False, recompute=mode) for mode in ("none", "full"))
    for i in range(scn.model.num_layers):
        want = full if i % 8 < 3 else none  # 8 layers per stage, one chunk each
        assert rules.layers[i] == want
        assert rules.unit(i, "F").alloc_bytes == want.stored
    assert full.stored < none.stored and full.transient == none.stored - full.stored and none.transient == 0


@pytest.mark.parametrize("v", [1, 2])
def test_the_search_estimate_follows_the_same_rule(v):
    scn = _scn(method="block", n=2, v=v)
    est, m = estimate(scn), simulate(scn).metrics
    assert est.total_bytes == pytest.approx(m["memory_bytes"]["total"], rel=1e-9)
    assert est.time_lower_bound_s <= m["iteration_time_s"]
    assert estimate(_scn(recompute="none", v=v)).time_lower_bound_s < est.time_lower_bound_s \
        < estimate(_scn(v=v)).time_lower_bound_s


def test_deepspeed_gathers_again_only_the_recomputed_layers():
    units = ["embed", "0", "1", "2", "head"]
    subs = [[4e7, 4e7]] * 3
    dense = [1e7, 8e7, 8e7, 8e7, 1e7]
    b = {k: len(chunk_fetches("deepspeed", 3, frozenset(k), units, dense, subs)["B"]) for k in [(), (0,), (0, 1, 2)]}
    assert b[()] < b[(0,)] < b[(0, 1, 2)]


def test_a_plan_carries_its_recompute_layers_to_and_from_its_scenario():
    raw = _raw(method="block", n=2)
    assert plan_of(scenario_from_dict(raw, default_name="p")).recompute_num_layers == 2
    plan = Plan(tp=2, pp=4, dp=1, recompute="none")
    par = apply_plan(raw, plan)["parallelism"]
    assert "recompute_method" not in par and "recompute_num_layers" not in par
    scenario_from_dict(apply_plan(raw, plan), default_name="p")  # accepted
    assert "recompute_method" not in apply_plan(raw, dataclasses.replace(plan, recompute="full"))["parallelism"]
    block3 = dataclasses.replace(plan, recompute="full", recompute_num_layers=3)
    par = apply_plan(raw, block3)["parallelism"]
    assert (par["recompute_method"], par["recompute_num_layers"]) == ("block", 3)
    assert plan_of(scenario_from_dict(apply_plan(raw, block3), default_name="p")) == block3
    assert block3.label() == "tp2 pp4 dp1 b1 1f1b z0 block3"


@pytest.mark.parametrize("method, n", [("interval", 2), ("uniform", 4)])
def test_a_plan_keeps_the_other_methods(method, n):
    """A sweep's rows carry the plan of each scenario (plan_of): the interval and grouped-uniform plans
    keep their method and N, and apply_plan writes them back."""
    scn = _scn(method=method, n=n)
    plan = plan_of(scn)
    assert (plan.recompute_method, plan.recompute_num_layers) == (method, n)
    assert plan.label().endswith(f"z0 {method}{n}")
    par = apply_plan(_raw(), plan)["parallelism"]
    assert (par["recompute_method"], par["recompute_num_layers"]) == (method, n)
    assert plan_of(scenario_from_dict(apply_plan(_raw(), plan), default_name="p")) == plan


@pytest.mark.parametrize("par, match", [
    ({"recompute_method": "blocks"}, r"recompute_method must be 'uniform', 'block' or 'interval', got 'blocks'"),
    ({"recompute_method": "block", "recompute_num_layers": 0}, r"recompute_num_layers must be >= 1, got 0"),
    ({"recompute": "selective", "recompute_method": "block", "recompute_num_layers": 2},
     r"recompute_method = 'block' with recompute_num_layers = 2 needs recompute = 'full', got 'selective'"),
    ({"recompute_num_layers": 2, "schedule": "zero-bubble"},
     r"recompute_num_layers = 2 with recompute_method = 'uniform' .* not modelled with schedule 'zero-bubble'"),
])
def test_bad_settings_are_refused_by_name(par, match):
    raw = _raw()
    raw["parallelism"].update(par)
    with pytest.raises(ScenarioError, match=match):
        scenario_from_dict(raw, default_name="bad")


def test_the_search_keeps_the_fewest_recomputed_layers_that_fit():
    """GPT-3 6.7B on 8 A100 40GB, PP 8, micro-batch 4: neither no recompute nor selective fits (57 GiB
    estimated), full recompute does (22 GiB); recomputing the first 2 of each stage's 4 layers fits
    (39 GiB) and 1 does not (48 GiB), so the search's candidate is block2, faster than full."""
    raw = {"model": {"preset": "gpt3-6.7b"}, "cluster": {"preset": "dgx-a100-40gb", "num_nodes": 1},
           "training": {"global_batch_size": 64}}
    base, cache = BaseScenario(raw, "t", Path("."), "t"), EstimateCache()
    plans = [Plan(tp=1, pp=8, dp=1, micro_batch_size=4, recompute=rc) for rc in ("none", "selective", "full")]
    delta, cands, _ = _estimate_group(base, SearchSpace(), plans, cache)
    assert [c.plan.label() for c in cands] == ["tp1 pp8 dp1 b4 1f1b z0 block2"]
    assert delta == {"invalid": 0, "pruned_memory": 2, "dominated": 1}
    fits = {n: estimate(base.with_plan(replace(plans[2], recompute_num_layers=n)), cache).fits for n in (1, 2)}
    assert fits == {1: False, 2: True}
    _, both, _ = _estimate_group(base, SearchSpace(prune_dominated=False), plans, cache)
    assert [c.plan.recompute_num_layers for c in both] == [2, 0]
    assert both[0].bound_s < both[1].bound_s
    _, off, _ = _estimate_group(base, SearchSpace(partial_recompute=False), plans, cache)
    assert [c.plan.label() for c in off] == ["tp1 pp8 dp1 b4 1f1b z0 full"]


def test_interval_counts_every_nth_block_a_rank_builds():
    """torchtitan's _apply_layer_sac: a process-wide counter over the transformer blocks a rank wraps, in
    the order of its model parts, checkpointing those whose count is a multiple of N."""
    every2 = _par(recompute="full", recompute_method="interval", recompute_num_layers=2)
    one_rank = ((0, 1, 2),)  # every chunk on one rank: counts 1..9 run on through the chunks
    assert recomputed_layers(every2, CHUNKS, 9, one_rank) == {1, 3, 5, 7, 9}
    per_rank = ((0,), (1,), (2,))  # one chunk per rank: each rank counts from 1
    assert recomputed_layers(every2, CHUNKS, 9, per_rank) == {1, 4, 7, 9}
    assert recomputed_layers(dataclasses.replace(every2, recompute_num_layers=1), CHUNKS, 9, per_rank) == \
        set(range(10))


@pytest.mark.parametrize("n, v", [(2, 1), (3, 2)])
def test_the_lowering_recomputes_every_nth_layer_of_a_rank(n, v):
    """The lowering, the memory rules and the estimate follow the interval rule: each rank recomputes its
    n-th, 2n-th... layer in chunk order, and the step's time and peak fall between none and full."""
    scn = _scn(method="interval", n=n, v=v)
    layout = scenario_layout(scn)
    res = simulate(scn)
    for rank in sorted({t.rank for t in res.graph.tasks}):
        mine = [i for vs in layout.held(res.plan.mesh.stage_of(rank)) for i in layout.chunks[vs]]
        recomputed = {t.layer for t in res.graph.tasks if t.rank == rank and t.category == "recompute"}
        assert recomputed == set(mine[n - 1::n])
    none, full = simulate(_scn(recompute="none", v=v)), simulate(_scn(v=v))
    t = res.metrics["iteration_time_s"]
    assert none.metrics["iteration_time_s"] < t < full.metrics["iteration_time_s"]
    peak = res.metrics["memory_bytes"]["activations"]
    assert full.metrics["memory_bytes"]["activations"] < peak < none.metrics["memory_bytes"]["activations"]
    assert estimate(scn).total_bytes == pytest.approx(res.metrics["memory_bytes"]["total"], rel=1e-9)


def test_uniform_groups_n_layers_of_every_chunk():
    uniform = lambda n: _par(recompute="full", recompute_num_layers=n)  # noqa: E731
    assert recompute_groups(uniform(2), CHUNKS, 9) == ((0, 1), (3, 4), (6, 7))  # 2 and 5 alone; MTP 9 its own
    assert recompute_groups(uniform(3), CHUNKS, 9) == ((0, 1, 2), (3, 4, 5), (6, 7, 8))
    assert recompute_groups(uniform(1), CHUNKS, 9) == ()
    assert recompute_groups(_par(recompute="full", recompute_method="block", recompute_num_layers=2), CHUNKS, 9) == ()


def _group_scn(n: int, vocab: int = 51200):
    par = {"tp": 1, "pp": 1, "dp": 8, "recompute": "full"}
    if n > 1:
        par.update(recompute_method="uniform", recompute_num_layers=n)
    return scenario_from_dict({"model": {"preset": "gpt3-2.7b", "num_layers": 8, "vocab_size": vocab},
                               "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1}, "parallelism": par,
                               "training": {"global_batch_size": 8, "micro_batch_size": 1}}, default_name="g")


def test_a_uniform_group_keeps_its_input_and_rematerialises_the_group_at_its_first_backward():
    """Per group of N: F stores the first layer's input only; the group's last layer (its first backward)
    allocates what the group re-materialises, (N - 1) whole layers and the first one's remainder; every
    layer's backward frees its own; the step's work is the same as one layer per checkpoint."""
    scn = _group_scn(4)
    rules = activation_rules(scn)
    c, whole = (layer_memory(scn, False, recompute=mode).stored for mode in ("full", "none"))
    assert [rules.unit(i, "F").alloc_bytes for i in range(8)] == [c, 0, 0, 0] * 2
    for first, top in ((0, 3), (4, 7)):
        assert rules.unit(top, "B").recompute_bytes == pytest.approx(4 * whole - c)
        assert all(rules.unit(i, "B").recompute_bytes == 0 for i in range(first, top))
        assert [sum(-d for d, _ in rules.unit(i, "B").events() if d < 0) for i in range(first, top + 1)] == \
            pytest.approx([whole] * 4)
    assert simulate(scn).metrics["iteration_time_s"] == simulate(_group_scn(1)).metrics["iteration_time_s"]


@pytest.mark.parametrize("n", [2, 4, 8])
def test_the_uniform_groups_peak_in_closed_form(n):
    """One micro-batch in flight, a head too small to set the peak: the activation peak moves from
    L inputs + one layer's re-materialised remainder to L/N inputs + the group's, i.e. by
    (L/N - L) c + (N - 1) x a whole layer; the estimate equals the simulation."""
    one, grouped = simulate(_group_scn(1, 1024)), simulate(_group_scn(n, 1024))
    c, whole = (layer_memory(grouped.scenario, False, recompute=mode).stored for mode in ("full", "none"))
    moved = grouped.metrics["memory_bytes"]["activations"] - one.metrics["memory_bytes"]["activations"]
    assert moved == pytest.approx((8 / n - 8) * c + (n - 1) * whole)
    assert estimate(grouped.scenario).total_bytes == pytest.approx(grouped.metrics["memory_bytes"]["total"], rel=1e-9)
