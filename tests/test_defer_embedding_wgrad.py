"""Megatron-Core's defer_embedding_wgrad_compute (parallelism.defer_embedding_wgrad_compute,
wgrad_deferral_limit): the output layer's weight-gradient GEMMs of the step's first micro-batches move
from their backward passes into the pipeline flush, after the last stage's last backward, in
micro-batch order, each freeing the input and output gradient it kept; the head's gradient is reduced
after them; the memory estimates keep the same buffers (stage_units.deferred_head_wgrad, one rule)."""

from __future__ import annotations

import pytest

from simulator.analysis.memory import estimate_memory, schedule_trace
from simulator.explore.estimate import memory_totals
from simulator.pipeline import simulate
from simulator.scenario import scenario_from_dict
from simulator.scenario_checks import ScenarioError
from simulator.strategy.lower import lower
from simulator.strategy.stage_units import deferred_head_wgrad


def scenario(defer: bool = True, limit: int = 0, tp: int = 2, sp: bool = True, **par):
    parallel = {"tp": tp, "pp": 2, "sequence_parallel": sp, "schedule": "1f1b",
                "defer_embedding_wgrad_compute": defer, "wgrad_deferral_limit": limit, **par}
    return scenario_from_dict({"name": "t", "model": {"preset": "gpt3-1.3b"},
                               "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1},
                               "parallelism": parallel,
                               "training": {"global_batch_size": 16, "micro_batch_size": 2}})


def last_stage(graph):
    return max(graph.ranks)


def head_tasks(graph, rank: int) -> list:
    return [t for t in graph.tasks if t.rank == rank and t.kind == "compute" and ".head" in t.name]


@pytest.mark.parametrize("limit, deferred", [(0, 4), (3, 3), (9, 4)])
def test_the_first_micro_batches_defer_their_head_wgrad_to_after_the_last_backward(limit, deferred):
    scn = scenario(limit=limit)
    assert scn.num_microbatches == 4 and deferred_head_wgrad(scn).microbatches == deferred
    g = lower(scn).graph
    r = last_stage(g)
    drain = [t for t in head_tasks(g, r) if t.name.endswith(".head.deferred")]
    assert [t.microbatch for t in drain] == list(range(deferred))  # micro-batch order, the first ones
    last_b = max(t.id for t in g.tasks if t.rank == r and t.kind == "compute" and t.phase == "B")
    assert all(t.id > last_b for t in drain)
    kept = deferred_head_wgrad(scn).kept_bytes
    assert [t.mem_delta_bytes for t in drain] == [-kept] * deferred
    # each deferred GEMM waits for the TP all-gather of its buffered sequence-parallel input
    gathers = {t.id for t in g.tasks if t.rank == r and t.name.endswith(".head.deferred.input_all_gather")}
    assert len(gathers) == deferred and all(set(t.deps) & gathers for t in drain)


def test_deferral_moves_the_head_wgrad_flops_without_changing_them():
    with_defer, without = lower(scenario()).graph, lower(scenario(defer=False)).graph
    r = last_stage(without)

    def flops(g, pred=lambda t: True):
        return sum(w.flops for t in g.tasks if t.rank == r and t.kind == "compute" and pred(t) for w in t.work)

    assert flops(with_defer) == pytest.approx(flops(without), rel=1e-12)
    moved = flops(with_defer, lambda t: t.name.endswith(".head.deferred"))
    b_head = flops(without, lambda t: ".head" in t.name and t.phase == "B")
    assert 0 < moved < b_head  # the weight gradients only, not the input gradients nor the loss


def test_the_heads_gradient_reduction_does_not_wait_for_the_drain_but_the_optimizer_does():
    """Megatron-Core's DDP hook marks the head's weight ready in its last backward (the deferring backward
    returns a dummy gradient), so its reduction is launched before the drain (Megatron-LM issue #1012)."""
    g = lower(scenario(zero_stage=1)).graph
    r = last_stage(g)
    drain = {t.id for t in head_tasks(g, r) if t.name.endswith(".head.deferred")}
    dp = [t for t in g.tasks if t.rank == r and t.kind == "comm" and t.name.startswith("grad_reduce_scatter")]
    assert dp and not any(set(t.deps) & drain for t in dp)
    # finalize_model_grads comes after the drain: the tied embedding's all-reduce waits for it
    tied = [t for t in g.tasks if t.rank == r and t.name == "embedding_grad_all_reduce"]
    assert [t.deps for t in tied] == [(max(drain),)]
    step = [t for t in g.tasks if t.rank == r and t.category == "optimizer"]
    before = {d for t in step for d in t.deps}
    assert max(drain) in before or any(max(drain) in g.tasks[d].deps for d in before)


def test_the_simulated_memory_and_both_estimates_keep_the_buffers():
    for limit in (0, 2):
        scn, base = scenario(limit=limit), scenario(defer=False)
        sim = simulate(scn).memory.per_rank
        est = estimate_memory(scn).per_rank
        r = max(sim)  # the last stage's rank; the estimate numbers stages
        assert sim[r]["activations"] == pytest.approx(est[max(est)]["activations"], rel=1e-9)
        assert sim[r]["activations"] > simulate(base).memory.per_rank[r]["activations"]
        # the search's estimate walks the head's stage unit by unit: the simulated peak exactly
        assert memory_totals(scn)[-1] == pytest.approx(sim[r]["total"], rel=1e-9)
        events = [e for e in schedule_trace(scn).events if e.rank == max(est)]
        assert sum(e.mem_delta_bytes for e in events) == pytest.approx(0.0, abs=1.0)  # the drain frees them


def test_a_peak_in_a_recompute_under_the_kept_buffers():
    """A drawn scenario (benchmarks/invariants.py) whose last stage peaks in a backward's recompute, after
    its head kept its buffers: both estimates hold them from the head's backward on, as the lowering does."""
    raw = {"model": {"preset": "grok-1", "num_layers": 16, "seq_length": 2048},
           "cluster": {"preset": "dgx-h100", "num_nodes": 4},
           "parallelism": {"tp": 8, "pp": 4, "dp": 1, "recompute": "full", "sequence_parallel": True,
                           "schedule": "gpipe", "defer_embedding_wgrad_compute": True},
           "training": {"micro_batch_size": 2, "global_batch_size": 4}}
    scn = scenario_from_dict(raw, default_name="drawn")
    sim = simulate(scn).memory.per_rank
    last = sim[max(sim)]
    assert last["activations"] > simulate(scenario_from_dict(
        dict(raw, parallelism=dict(raw["parallelism"], defer_embedding_wgrad_compute=False)), default_name="d")
    ).memory.per_rank[max(sim)]["activations"]
    assert estimate_memory(scn).per_rank[3]["activations"] == pytest.approx(last["activations"], rel=1e-9)
    assert memory_totals(scn)[3] == pytest.approx(last["total"], rel=1e-9)


def test_kept_bytes_are_the_sequence_parallel_input_and_the_vocab_parallel_output_gradient():
    scn = scenario(tp=2, sp=True)
    m, t = scn.model, scn.training
    tokens = m.seq_length * t.micro_batch_size
    assert deferred_head_wgrad(scn).kept_bytes == 2 * tokens * (m.hidden_size / 2 + -(-m.vocab_size // 2))
    no_sp = scenario(tp=2, sp=False)
    assert deferred_head_wgrad(no_sp).kept_bytes == 2 * tokens * (m.hidden_size + -(-m.vocab_size // 2))
    assert deferred_head_wgrad(scenario(defer=False)).microbatches == 0


@pytest.mark.parametrize("change, message", [
    ({"pp": 1}, "needs pp > 1"),
    ({"wgrad_deferral_limit": -1}, "wgrad_deferral_limit must be >= 0"),
    ({"schedule": "zero-bubble"}, "already splits every weight gradient"),
    ({"zero_stage": 3, "dp": 4}, "is Megatron-Core's"),
])
def test_refused_where_megatron_core_refuses_it_or_where_it_does_not_exist(change, message):
    raw = {"name": "t", "model": {"preset": "gpt3-1.3b"}, "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1},
           "parallelism": {"tp": 2, "pp": 2, "defer_embedding_wgrad_compute": True, **change},
           "training": {"global_batch_size": 16, "micro_batch_size": 2}}
    if change.get("pp") == 1:
        raw["parallelism"]["tp"] = 4
    if "dp" in change:
        raw["cluster"]["num_nodes"] = 2
    with pytest.raises(ScenarioError, match=message):
        scenario_from_dict(raw)


def test_refused_with_multi_token_prediction():
    raw = {"name": "t", "model": {"preset": "gpt3-1.3b", "mtp_layers": 1},
           "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1},
           "parallelism": {"tp": 4, "pp": 2, "defer_embedding_wgrad_compute": True},
           "training": {"global_batch_size": 16, "micro_batch_size": 2}}
    with pytest.raises(ScenarioError, match="mtp_layers = 1"):
        scenario_from_dict(raw)


def test_refused_without_gradient_accumulation_fusion():
    raw = {"name": "t", "model": {"preset": "gpt3-1.3b"}, "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1},
           "parallelism": {"tp": 4, "pp": 2, "defer_embedding_wgrad_compute": True},
           "training": {"global_batch_size": 16, "micro_batch_size": 2, "grad_accumulation_fusion": False}}
    with pytest.raises(ScenarioError, match="grad_accumulation_fusion"):
        scenario_from_dict(raw)


def test_the_readme_figures_of_the_dgx_cloud_rows_that_defer():
    """README: 5.7 GiB of buffers at the 70B recipe's limit of 22, and the rows that defer all moved faster."""
    import re
    from pathlib import Path

    from simulator.explore.validate import evaluate_row, read_rows, row_to_raw

    readme = re.sub(r"\s+", " ", (Path(__file__).resolve().parents[1] / "README.md").read_text())
    rows = [r for r in read_rows([]) if r.get("defer_embedding_wgrad_compute") == "true"]
    assert len(rows) == 24  # DGX Cloud v24.11.1 (10) and the NeMo 2 recipes of v25.05 (14)
    seventy = next(r for r in rows if r["name"] == "dgxc-llama31-70b-fp8-64gpu")
    d = deferred_head_wgrad(scenario_from_dict(row_to_raw(seventy)))
    assert d.microbatches == 22 and f"{d.microbatches * d.kept_bytes / 2**30:.1f} GiB at the DGX Cloud" in readme
    moved = [100 * (evaluate_row(r)["error"] - evaluate_row(dict(r, defer_embedding_wgrad_compute="false"))["error"])
             for r in rows]
    assert max(moved) <= 0 and f"(all faster, by {-max(moved):.1f} to {-min(moved):.1f} points)" in readme


@pytest.mark.parametrize("limit", [0, 2])
@pytest.mark.parametrize("schedule, v", [("1f1b", 1), ("interleaved-1f1b", 2)])
def test_the_searchs_time_bound_stays_below_the_simulation(limit, schedule, v):
    from simulator.explore.estimate import time_lower_bound
    from simulator.pipeline import simulate_metrics

    scn = scenario(limit=limit, schedule=schedule, virtual_stages=v)
    assert time_lower_bound(scn)[0] <= simulate_metrics(scn)["iteration_time_s"]
    undeferred = time_lower_bound(scenario(defer=False, schedule=schedule, virtual_stages=v))[0]
    assert time_lower_bound(scn)[0] <= undeferred + 1e-12  # the wgrads left the chain up to the last B


def test_a_search_keeps_plans_where_the_deferral_cannot_apply():
    """The base scenario's deferral is dropped from plans without a Megatron-Core pipeline (pp 1, ZeRO-2/3,
    split-backward schedules), as recompute_modules is from plans that do not recompute selectively."""
    from simulator.explore.enumerate import Plan, apply_plan

    raw = {"name": "t", "model": {"preset": "gpt3-1.3b"}, "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1},
           "parallelism": {"tp": 2, "pp": 2, "defer_embedding_wgrad_compute": True, "wgrad_deferral_limit": 3},
           "training": {"global_batch_size": 16}}
    kept = apply_plan(raw, Plan(tp=2, pp=2, dp=2, schedule="1f1b"))["parallelism"]
    assert kept["defer_embedding_wgrad_compute"] and kept["wgrad_deferral_limit"] == 3
    for plan in (Plan(tp=8, pp=1, dp=1), Plan(tp=2, pp=2, dp=2, zero_stage=3), Plan(tp=2, pp=2, dp=2, schedule="zero-bubble")):
        par = apply_plan(raw, plan)["parallelism"]
        assert "defer_embedding_wgrad_compute" not in par and "wgrad_deferral_limit" not in par
        scenario_from_dict(apply_plan(raw, plan))  # valid


def test_the_representative_ranks_give_the_full_simulations_step():
    """Fast mode (one rank per stage, sibling traffic charged) against --full, on an oversubscribed fat tree."""
    from simulator.pipeline import simulate_metrics

    raw = {"name": "t", "model": {"preset": "llama3-8b", "num_layers": 8},
           "cluster": {"preset": "dgx-h100", "num_nodes": 4, "topology": "fat-tree", "oversubscription": 2},
           "parallelism": {"tp": 2, "pp": 4, "sequence_parallel": True, "zero_stage": 1,
                           "schedule": "interleaved-1f1b", "virtual_stages": 2,
                           "defer_embedding_wgrad_compute": True, "wgrad_deferral_limit": 3},
           "training": {"global_batch_size": 32}}
    scn = scenario_from_dict(raw)
    fast, full = simulate_metrics(scn), simulate_metrics(scn, full=True)
    assert fast["iteration_time_s"] == pytest.approx(full["iteration_time_s"], rel=0.02)
    assert fast["memory_bytes"]["total"] == pytest.approx(full["memory_bytes"]["total"], rel=1e-9)


# (key, value, exit code): a bool and a non-negative integer are accepted, anything else exits 2
VALUES = [(key, value, 0 if ok else 2) for key, good in (("defer_embedding_wgrad_compute", {"true"}),
                                                        ("wgrad_deferral_limit", {"2"}))
          for value in ('"x"', "1.5", "-1", "2", "true", "[1]") for ok in (value in good,)]


@pytest.mark.parametrize("key, value, expected", VALUES)
def test_bad_values_exit_2_with_one_line(tmp_path, capsys, key, value, expected):
    from simulator.__main__ import main

    path = tmp_path / "s.toml"
    path.write_text('name = "t"\n[model]\npreset = "gpt3-1.3b"\n[cluster]\npreset = "dgx-a100-80gb"\n'
                    f'[parallelism]\ntp = 2\npp = 2\n{key} = {value}\n[training]\nglobal_batch_size = 16\n')
    try:
        rc = main(["run", str(path), "--out", str(tmp_path / "out"), "--json"])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err.strip()
    assert rc == expected
    if rc == 2:
        assert len(err.splitlines()) == 1 and key in err
