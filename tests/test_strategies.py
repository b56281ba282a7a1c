"""Strategies through the whole pipeline (lower -> simulate -> metrics): bubble fractions against the
closed forms, the schedules as they ran, ZeRO model state, HFU/MFU with recompute, full mode against
the symmetric fast path, and the direction in which each strategy moves the metrics of a plain plan."""

import copy
import dataclasses

import pytest

from simulator.analysis.metrics import critical_rank, exposed_breakdown
from simulator.engine.sim import simulate_graph
from simulator.model.opgraph import build_op_graph
from simulator.pipeline import simulate
from simulator.scenario import scenario_from_dict
from simulator.strategy.blocks import build_blocks
from simulator.strategy.lower import lower
from simulator.strategy.schedules import ideal_bubble_fraction, schedule_actions

GPT = {"num_layers": 8, "hidden_size": 256, "num_attention_heads": 8, "vocab_size": 1024, "seq_length": 128}


def scn(model=GPT, batch=8, cluster=None, training=None, **par):
    n = par.get("tp", 1) * par.get("pp", 1) * par.get("dp", 1) * par.get("cp", 1)
    par.setdefault("dp", 1)
    return scenario_from_dict({"model": dict(model), "parallelism": par,
                               "cluster": cluster or {"preset": "dgx-a100-80gb", "num_nodes": 1, "gpus_per_node": n},
                               "training": {"global_batch_size": batch, **(training or {})}})


class UnitCost:
    """A TaskCost stub: every layer's F, B and W take exactly 1 s (a fused B+W 2 s), recompute 1 s;
    communication, the embedding, the head and the optimizer are free."""

    def __init__(self, s, split: bool):
        b = build_blocks(build_op_graph(s.model, s.training.micro_batch_size), s.parallel.tp,
                         s.parallel.sequence_parallel, s.parallel.cp, s.parallel.ep)
        f = sum(w.flops for seg in b.segments() for w in seg.fwd)
        bw = sum(w.flops for seg in b.segments() for w in seg.bwd)
        self.rate = {"F": f, "R": f, "W": sum(w.flops for w in b.layer_w),
                     "B": sum(w.flops for seg in b.segments() for w in seg.bwd_b) if split else bw / 2}

    def duration_s(self, task):
        if task.kind != "compute" or task.layer < 0:
            return 0.0
        return task.flops / self.rate[task.phase]

    def comm_plan(self, task):
        raise AssertionError("free communication never reaches the network")


def run_free(s):
    plan = lower(s)
    res = simulate_graph(plan.graph, UnitCost(s, plan.graph.meta["schedule"] == "zero-bubble"))
    rank = critical_rank(res.trace)
    return res, exposed_breakdown(res.trace, rank, 0.0, res.makespan_s)


SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("zero-bubble", 1)]


@pytest.mark.parametrize("schedule,v", SCHEDULES)
@pytest.mark.parametrize("m", [4, 8])
def test_simulated_bubble_matches_the_closed_form(schedule, v, m):
    s = scn(pp=4, batch=m, schedule=schedule, virtual_stages=v)
    res, br = run_free(s)
    # (p-1)/(m+p-1); divided by v for interleaving; ZB-H1 with T_F = T_B = T_W: (p-1)/(3m+p-1)
    assert br["bubble"] / res.makespan_s == pytest.approx(ideal_bubble_fraction(schedule, 4, m, v), rel=1e-9)
    per_stage = 8 // 4 * 3 * m  # busy seconds of every stage: layers x (F + B + W) x micro-batches
    assert res.makespan_s == pytest.approx(per_stage + br["bubble"], rel=1e-9)


def test_uneven_layer_split_follows_the_bottleneck_stage():
    # GPipe with stage times f_s = n_s, b_s = 2 n_s: T = sum_s 3 n_s + (m - 1)(max f + max b)
    for m in (4, 8):
        res, _ = run_free(scn(pp=4, batch=m, schedule="gpipe", layers_per_stage=[1, 3, 3, 1]))
        assert res.makespan_s == pytest.approx(3 * 8 + (m - 1) * 9, rel=1e-9)


def test_interleaving_with_uneven_chunks_runs_every_layer_and_shrinks_the_bubble():
    # Llama 3's layout, one layer fewer on the first and last stage; the scenario checks reject
    # virtual stages that do not divide a stage's layers, the lowering itself handles them
    flat = scn(dict(GPT, num_layers=14), pp=4, batch=8, layers_per_stage=[3, 4, 4, 3])
    inter = dataclasses.replace(flat, parallel=dataclasses.replace(flat.parallel, schedule="interleaved-1f1b",
                                                                   virtual_stages=2))
    (ri, bi), (rf, bf) = run_free(inter), run_free(flat)
    for res in (ri, rf):
        busy = sum(e.end_s - e.start_s for e in res.trace.events if e.rank == 0 and e.stream == "compute")
        assert busy == pytest.approx(3 * 3 * 8)  # 3 layers x (F + B + W) x 8 micro-batches on stage 0
    assert bi["bubble"] < bf["bubble"]


@pytest.mark.parametrize("schedule,v", SCHEDULES)
def test_schedule_runs_as_its_grid(schedule, v):
    p, m = 4, 8
    s = scn(pp=p, batch=m, schedule=schedule, virtual_stages=v)
    res, _ = run_free(s)
    grid = schedule_actions(schedule, p, m, v)
    for stage, rank in enumerate(lower(s).mesh.representatives):
        events = sorted((e for e in res.trace.events if e.rank == rank and e.stream == "compute" and e.layer >= 0
                         and e.end_s > e.start_s), key=lambda e: e.start_s)
        for a, b in zip(events, events[1:]):  # one thing at a time on a stage
            assert a.end_s <= b.start_s + 1e-12
        ran = []
        for e in events:
            key = f"{e.chunk * p + stage}{'B' if e.phase == 'R' else e.phase}{e.microbatch}"
            if not ran or ran[-1] != key:
                ran.append(key)
        assert ran == [str(a) for a in grid[stage]]
        for mb in range(m):  # each micro-batch F, then B, then W on every stage
            order = [k[-len(str(mb)) - 1] for k in ran if k.endswith(f"F{mb}") or k.endswith(f"B{mb}")
                     or k.endswith(f"W{mb}")]
            assert order == sorted(order, key="FBW".index)


# ---- through the real cost model -----------------------------------------------------------------
SMALL = {"model": {"preset": "gpt3-1.3b", "num_layers": 8, "seq_length": 1024},
         "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 2},
         "parallelism": {"tp": 2, "pp": 2, "dp": 4},
         "training": {"global_batch_size": 16}}


def small(**par):
    d = copy.deepcopy(SMALL)
    d["parallelism"].update(par)
    for key in ("grad_dtype", "attention"):
        if key in par:
            d["training"][key] = d["parallelism"].pop(key)
    return scenario_from_dict(d)


@pytest.mark.parametrize("par", [{}, {"zero_stage": 3, "sequence_parallel": True}, {"schedule": "zero-bubble"},
                                 {"cp": 2, "dp": 2, "recompute": "full"}],
                         ids=["plain", "zero3-sp", "zero-bubble", "cp-full"])
def test_full_mode_agrees_with_the_symmetric_fast_path(par):
    s = small(**par)
    fast, full = simulate(s), simulate(s, full=True)
    assert len(full.graph.ranks) == 16 and len(fast.graph.ranks) == 2
    assert fast.metrics["iteration_time_s"] == pytest.approx(full.metrics["iteration_time_s"], rel=1e-6)
    assert fast.metrics["memory_bytes"] == pytest.approx(full.metrics["memory_bytes"], rel=1e-9)


def test_hfu_over_mfu_is_one_plus_recompute_over_model_flops():
    s = small(recompute="full")
    m = simulate(s).metrics
    g = build_op_graph(s.model, 1)
    layer_fwd = sum(op.fwd_flops for op in g.layer)
    model = g.fwd_flops() + g.bwd_flops()
    assert m["hfu"] / m["mfu"] == pytest.approx(1 + s.model.num_layers * layer_fwd / model, rel=1e-9)
    plain = simulate(small()).metrics
    assert plain["hfu"] == pytest.approx(plain["mfu"], rel=1e-12)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_model_state_per_rank(stage):
    # Rajbhandari et al. 2020 with 2-byte gradients and Adam (K = 12), N = dp:
    # 16P, 4P + 12P/N, 2P + 14P/N, 16P/N
    s = small(zero_stage=stage, pp=1, dp=8, grad_dtype="bf16")
    res = simulate(s)
    p = res.plan.stage_params[0]["dense"]
    mem = res.metrics["memory_bytes"]
    n = 8
    expected = {0: 16 * p, 1: 4 * p + 12 * p / n, 2: 2 * p + 14 * p / n, 3: 16 * p / n}[stage]
    assert mem["params"] + mem["grads"] + mem["optimizer"] == pytest.approx(expected, rel=1e-12)


def _metrics(**par):
    return simulate(small(**par)).metrics


@pytest.fixture(scope="module")
def plain():
    return _metrics()


def test_direction_of_change_against_the_plain_plan(plain):
    act = plain["memory_bytes"]["activations"]
    # memory: SP and recompute cut activations; ZeRO stages cut the model state step by step
    assert _metrics(sequence_parallel=True)["memory_bytes"]["activations"] < act
    # selective recompute drops the stored attention scores, which flash attention never stores
    unfused = _metrics(attention="unfused")["memory_bytes"]["activations"]
    sel = _metrics(recompute="selective", attention="unfused")["memory_bytes"]["activations"]
    assert _metrics(recompute="selective")["memory_bytes"]["activations"] == act < unfused and sel < unfused
    full = _metrics(recompute="full")
    assert full["memory_bytes"]["activations"] < act
    assert full["hfu"] > full["mfu"] and full["iteration_time_s"] > plain["iteration_time_s"]
    # (without the pipeline: FSDP2 under torch's pipelining keeps ZeRO-1's state, zero_impl.pipelined_fsdp2)
    keys = ("params", "grads", "optimizer")
    state = [sum(_metrics(zero_stage=z, grad_dtype="bf16", pp=1, dp=8)["memory_bytes"][k] for k in keys)
             for z in range(4)]
    assert state == sorted(state, reverse=True) and len(set(state)) == 4
    piped = [sum(_metrics(zero_stage=z, grad_dtype="bf16")["memory_bytes"][k] for k in keys) for z in (1, 3)]
    assert piped[0] == piped[1]
    # pipeline: interleaving and zero-bubble shrink the bubble
    bubble = plain["bubble_fraction"]
    assert _metrics(schedule="interleaved-1f1b", virtual_stages=2)["bubble_fraction"] < bubble
    assert _metrics(schedule="zero-bubble")["bubble_fraction"] < bubble
    assert _metrics(schedule="gpipe")["memory_bytes"]["activations"] > act
    # offload: no optimizer state on the GPU, PCIe traffic appears
    off = _metrics(zero_stage=2, offload_optimizer=True)
    assert off["memory_bytes"]["optimizer"] == 0 and off["time_breakdown_s"]["offload"] > 0
    assert plain["time_breakdown_s"]["comm_ep"] == plain["time_breakdown_s"]["comm_cp"] == 0


def test_cp_and_ep_expose_their_communication():
    cp = _metrics(cp=2, dp=2)
    assert cp["time_breakdown_s"]["comm_cp"] > 0
    moe = dict(SMALL, model={"preset": "mixtral-8x7b", "num_layers": 2, "seq_length": 1024})
    d = copy.deepcopy(moe)
    d["parallelism"] = {"tp": 1, "pp": 1, "dp": 16, "ep": 8}
    m = simulate(scenario_from_dict(d)).metrics
    assert m["time_breakdown_s"]["comm_ep"] > 0


# ---- parallel attention + MLP blocks -------------------------------------------------------------------
PARALLEL_GRID = [(h, tp, sp, mlp) for h in (256, 1024, 4096) for tp in (2, 8) for sp in (False, True)
                 for mlp in ("gelu", "swiglu")] + [(2048, 16, True, "swiglu")]  # TP across two nodes


@pytest.mark.parametrize("h, tp, sp, mlp", PARALLEL_GRID, ids=[f"h{h}-tp{tp}{'-sp' * sp}-{m}" for h, tp, sp, m in
                                                                 PARALLEL_GRID])
def test_parallel_block_is_never_slower_than_the_sequential_one_with_tp(h, tp, sp, mlp):
    """Same GEMMs, fewer TP collectives (strategy/blocking_tp.blocking_tp), one more memory-bound add over
    the unreduced branch outputs: with TP > 1 a parallel block never takes longer on the same plan, and
    exposes less TP communication; with one shared norm (GPT-J) less than with two (GPT-NeoX)."""
    nodes = tp // 8 if tp > 8 else 1
    cluster = {"preset": "dgx-a100-80gb", "num_nodes": nodes}
    model = {**GPT, "num_layers": 2, "hidden_size": h, "num_attention_heads": 16, "seq_length": 512, "mlp": mlp}

    def run(**kw):
        m = simulate(scn({**model, **kw}, batch=8 * nodes // tp, cluster=cluster, tp=tp, dp=8 * nodes // tp,
                         sequence_parallel=sp)).metrics
        return m["iteration_time_s"], m["time_breakdown_s"]["comm_tp"]

    seq, neox, gptj = run(), run(parallel_attn_mlp=True, parallel_norms=2), run(parallel_attn_mlp=True)
    assert gptj[0] <= neox[0] <= seq[0]
    assert gptj[1] <= neox[1] < seq[1]


def test_parallel_block_gains_with_tp_comm_overlap_too():
    """Under TE userbuffers the sequential block hides part of its SP collectives under its GEMMs; the
    parallel block still runs fewer of them and is no slower (GPT-3 6.7B-like shapes on DGX H100)."""
    cluster = {"preset": "dgx-h100", "num_nodes": 1}
    model = {**GPT, "num_layers": 2, "hidden_size": 4096, "num_attention_heads": 32, "seq_length": 2048,
             "mlp": "swiglu"}
    times = [simulate(scn({**model, **kw}, batch=1, cluster=cluster, tp=8, sequence_parallel=True,
                          tp_comm_overlap=True)).metrics["iteration_time_s"]
             for kw in ({}, {"parallel_attn_mlp": True, "parallel_norms": 2}, {"parallel_attn_mlp": True})]
    assert times[2] <= times[1] <= times[0]
