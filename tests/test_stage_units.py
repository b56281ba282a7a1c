"""strategy.stage_units is the one rule for what a pipeline rank holds and what its passes allocate:
the lowering, analysis.memory.schedule_trace and the search estimate agree with it exactly, and the
one parameter counter matches Megatron-LM's closed form (GPT-1.3B at TP 8: the row-parallel output
biases replicated, h - h/t = 1,792 parameters per bias more than a split count)."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.analysis.buffers import layer_param_counts
from simulator.analysis.memory import ACTIVATION_PHASES, rank_param_counts, schedule_trace
from simulator.model.opgraph import build_op_graph
from simulator.scenario import scenario_from_dict
from simulator.strategy.lower import lower
from simulator.strategy.stage_units import (ActivationRules, UnitDeltas, activation_rules, stage_layout,
                                            stage_param_counts, unit_params)


def gpt13b(tp: int = 8, pp: int = 2, **par):
    return scenario_from_dict({"name": "t", "model": {"preset": "gpt3-1.3b"},
                               "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 2},
                               "parallelism": {"tp": tp, "pp": pp, **par},
                               "training": {"global_batch_size": 16 * (16 // (tp * pp))}})


def test_gpt_1_3b_tp8_layer_and_stages_match_megatrons_closed_form():
    scn = gpt13b()
    m, t = scn.model, 8
    h, v, layers = m.hidden_size, m.vocab_size, m.num_layers
    assert (h, layers) == (2048, 24)
    # QKV and fc1 (column): weights and biases split; proj and fc2 (row): weights split, biases
    # replicated; two layer norms replicated: 12h²/t + 7h/t + 6h (Shoeybi et al. 2019, sec. 3)
    layer = 12 * h * h // t + 7 * h // t + 6 * h
    assert layer_param_counts(m, t)["dense"] == layer
    assert 2 * (h - h // t) == 2 * 1792  # what splitting the two row-parallel biases would lose
    pos = m.max_position_embeddings * h
    word = -(-v // t) * h  # vocab-parallel, padded to a multiple of tp
    expect = [12 * layer + word + pos, 12 * layer + 2 * h + word]  # last stage: final norm + tied copy
    assert [rank_param_counts(m, scn.parallel, s)["dense"] for s in range(2)] == expect
    plan = lower(scn)
    assert {plan.mesh.stage_of(r): c["dense"] for r, c in plan.stage_params.items()} == dict(enumerate(expect))


PLANS = st.fixed_dictionaries({
    "layers": st.integers(4, 9), "tp": st.sampled_from([1, 2]), "pp": st.sampled_from([1, 2, 4]),
    "schedule": st.sampled_from(["1f1b", "interleaved-1f1b", "zero-bubble", "zb-h2", "zb-v", "dualpipe-v", "gpipe",
                                  "dualpipe"]),
    "recompute": st.sampled_from(["none", "selective", "full"]), "moe": st.booleans(),
    "tied": st.booleans()})


def scenario(d: dict):
    pp, v = d["pp"], 2 if d["schedule"] in ("interleaved-1f1b", "zb-v", "dualpipe-v", "dualpipe") else 1
    if d["layers"] < pp * v // (2 if d["schedule"] == "dualpipe" else 1):  # DualPipe's chunks: whole stages
        return None
    model = {"num_layers": d["layers"], "hidden_size": 128, "num_attention_heads": 4, "vocab_size": 300,
             "seq_length": 64, "mlp": "swiglu", "tie_embeddings": d["tied"]}
    if d["moe"]:
        model.update(num_experts=4, moe_top_k=2, moe_first_dense_layers=1)
    dp = 8 // (d["tp"] * pp)
    return scenario_from_dict({"name": "t", "model": model, "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1},
                               "parallelism": {"tp": d["tp"], "pp": pp, "dp": dp, "ep": 2 if d["moe"] else 1,
                                               "etp": 1 if d["moe"] else 0,
                                               "schedule": d["schedule"], "virtual_stages": v,
                                               "recompute": d["recompute"], "sequence_parallel": d["tp"] > 1},
                               "training": {"global_batch_size": 8 * dp}})


def per_action(events) -> dict:
    """Sum of activation deltas per (chunk, micro-batch, pass), a recompute counted with its B."""
    out: dict = defaultdict(float)
    for e in events:
        if e.phase in ACTIVATION_PHASES and e.mem_delta_bytes:
            out[e.chunk, e.microbatch, "B" if e.phase == "R" else e.phase] += e.mem_delta_bytes
    return {k: x for k, x in out.items() if abs(x) > 1e-6}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(PLANS)
def test_lowering_memory_trace_and_counter_read_one_rule(d):
    scn = scenario(d)
    if scn is None:
        return
    par, plan = scn.parallel, lower(scn)
    layout = stage_layout(par)
    trace = schedule_trace(scn)
    for r in plan.graph.ranks:
        s = plan.mesh.stage_of(r)
        # one parameter counter: the lowering's, the memory report's and the search's
        assert plan.stage_params[r] == rank_param_counts(scn.model, par, s)
        # every action's activation deltas on the lowered tasks are schedule_trace's
        lowered = per_action(plan.graph.tasks[i] for i in range(len(plan.graph.tasks))
                             if plan.graph.tasks[i].rank == r)
        assert lowered and lowered == pytest.approx(per_action(e for e in trace.events if e.rank == s))
    # with one TP rank the stages add up to the model (+ the tied embedding's copy on the head's rank),
    # twice over with DualPipe's two copies (each end rank: one copy's embedding, the other's head)
    if d["tp"] == 1 and not d["moe"]:
        total = sum(sum(rank_param_counts(scn.model, par, s).values()) for s in range(par.pp))
        copy = scn.model.tie_embeddings and not layout.ends_together
        assert total == layout.copies * (scn.model.num_params() + copy * scn.model.vocab_size * scn.model.hidden_size)


def test_v_map_puts_embedding_and_head_on_rank_0():
    d = {"layers": 8, "tp": 1, "pp": 2, "schedule": "zb-v", "recompute": "none", "moe": False, "tied": True}
    scn = scenario(d)
    layout = stage_layout(scn.parallel)
    assert layout.held(0) == (0, 3) and layout.units(0)[0] == "embed" and layout.units(3)[-1] == "head"
    graph = build_op_graph(scn.model, 1, "bf16")
    first, last = (stage_param_counts(graph, scn.parallel, layout, s)["dense"] for s in (0, 1))
    h, v = scn.model.hidden_size, scn.model.vocab_size
    # tied embeddings on one rank: one copy, counted with the embedding
    params = unit_params(graph, scn.parallel, layout)
    assert params.head[0] == scn.model.norm_params() and params.embed[0] == v * h
    assert first - last == v * h + scn.model.norm_params() + sum(params.of(i)[0] for i in (0, 7)) - sum(
        params.of(i)[0] for i in (3, 4))


def test_an_actions_deltas_in_program_order():
    rules = ActivationRules((activation_rules(gpt13b()).layers[0],) * 2, 10.0, 20.0)
    lm = rules.layers[0]
    assert rules.unit("embed", "F") == UnitDeltas(10.0) and rules.unit("head", "B") == UnitDeltas(free_bytes=20.0)
    assert rules.unit("1", "B") == rules.unit(1, "B") == UnitDeltas(max(-lm.at_b, 0.0), lm.transient, max(lm.at_b, 0.0))
    units = ("embed", 0, 1, "head")
    assert [u for u, _, _ in rules.action(units, "F")] == list(units)
    assert [u for u, _, _ in rules.action(units, "B")][0] == "head"
    # every (F, B, W) of a unit returns to zero
    for u in units:
        assert sum(x for p in "FBW" for _, x, _ in rules.action((u,), p)) == pytest.approx(0.0)


def test_recompute_allocation_is_tagged_r():
    scn = gpt13b(recompute="full")
    rules = activation_rules(scn)
    lm = rules.layers[0]
    assert lm.transient > 0
    assert rules.action((0,), "B") == [(0, lm.transient + max(-lm.at_b, 0.0), "R"),
                                       (0, -(lm.transient + max(lm.at_b, 0.0)), "B")]


@pytest.mark.parametrize("sp,overlap,moe,fp8", [(False, False, False, ""), (True, False, False, ""),
                                                (True, True, False, ""), (True, True, True, ""),
                                                (True, True, False, "delayed"), (True, False, True, "current"),
                                                (True, True, False, "current"),
                                                (True, False, False, "mxfp8")])
def test_the_lowerings_blocking_tp_collectives_are_blocking_tps(sp, overlap, moe, fp8):
    """blocking_tp.blocking_tp is the one rule for which TP collectives block a layer's compute stream
    (and with which userbuffers site), blocking_tp.tp_traffic for their bytes: the lowering emits exactly
    those on the compute stream of one layer's forward and backward, with current scaling's amax
    all-reduce before each freshly quantized gather; the estimator sums the same list."""
    from simulator.explore.estimate import EstimateCache
    from simulator.strategy.blocking_tp import blocking_tp, tp_traffic
    model = {"preset": "mixtral-8x7b", "num_layers": 2} if moe else {"preset": "gpt3-1.3b", "num_layers": 2}
    par = {"tp": 4, "pp": 1, "sequence_parallel": sp, "tp_comm_overlap": overlap, **({"ep": 2} if moe else {})}
    training = {"global_batch_size": 2, "micro_batch_size": 1, **({"dtype": "fp8", "fp8_recipe": fp8} if fp8 else {})}
    gpu = "dgx-b200" if fp8 == "mxfp8" else "dgx-h100"
    scn = scenario_from_dict({"name": "t", "model": model, "cluster": {"preset": gpu, "num_nodes": 1},
                              "parallelism": par, "training": training})
    plan = lower(scn)
    rank = plan.graph.ranks[0]
    want = blocking_tp(scn.parallel, EstimateCache().layer_blocks(scn)[1])
    traffic = tp_traffic(scn)
    for phase, colls in (("F", want.forward()), ("B", want.backward())):
        expected: tuple = ()
        for op, overlap_, site in colls:
            amax = traffic.amax_before(site)
            expected += ((("all_reduce", (), amax),) if amax else ()) + ((op, overlap_, traffic.bytes(site)),)
        got = tuple((t.comm.op, t.comm.overlap, t.comm.size_bytes) for t in plan.graph.tasks
                    if t.rank == rank and t.kind == "comm" and t.stream == "compute" and t.comm.axis == "tp"
                    and t.layer == 1 and t.microbatch == 0 and t.phase == phase)
        assert got == expected, phase
