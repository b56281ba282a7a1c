"""Specification of per-rank memory: ZeRO model-state formulas, parameters per rank, activation peaks
read off schedule-ordered timelines (1F1B holds L layers whatever p, GPipe m micro-batches,
interleaving 1 + (p-1)/(pv)), the return to the baseline, buffers, the OOM verdict and memory.png."""

from __future__ import annotations

from dataclasses import replace

import dataclasses

import pytest

from simulator.analysis.buffers import CUDA_CONTEXT_BYTES, layer_param_counts, static_buffers
from simulator.analysis.memory import (estimate_memory, memory_report, model_state_bytes, rank_param_counts,
                                       schedule_trace, walk_memory, is_buffer_event)
from simulator.analysis.memory_plot import pick_ranks, plot_memory
from simulator.scenario import scenario_from_dict
from simulator.strategy.activation_memory import (head_activation_bytes, layer_activation_bytes,
                                                  layer_activation_split)
from simulator.trace import Trace, TraceEvent

PHI, N = 7_000_000_000, 64


# --- model state (Rajbhandari et al. 2020, Fig. 1; Megatron's 18 B/param) ------------------------

@pytest.mark.parametrize("stage,per_param", [(0, 16), (1, 4 + 12 / N), (2, 2 + 14 / N), (3, 16 / N)])
def test_zero_stages_in_zero_accounting(stage, per_param):
    st = model_state_bytes(PHI, stage, N, 2, 2)
    assert sum(st.values()) == pytest.approx(PHI * per_param)


def test_megatron_fp32_main_grads_18_bytes_and_distributed_optimizer():
    assert sum(model_state_bytes(PHI, 0, N, 2, 4).values()) == pytest.approx(18 * PHI)
    assert sum(model_state_bytes(PHI, 1, N, 2, 4).values()) == pytest.approx(6 * PHI + 12 * PHI / N)


def test_offload_moves_optimizer_to_host_and_sgd_keeps_8_bytes():
    assert model_state_bytes(PHI, 2, N, 2, 2, offload_optimizer=True)["optimizer"] == 0.0
    assert model_state_bytes(PHI, 0, 1, 2, 2, optimizer_bytes_per_param=8)["optimizer"] == 8 * PHI


@pytest.mark.parametrize("args,match", [((PHI, 4, N, 2, 2), "zero_stage"), ((PHI, 1, 0, 2, 2), "dp"),
                                        ((-1, 1, N, 2, 2), "params")])
def test_model_state_rejects_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        model_state_bytes(*args)


# --- scenarios -----------------------------------------------------------------------------------

def make(pp=4, tp=1, m=16, mbs=1, schedule="1f1b", v=None, mlp="swiglu", nodes=1, model_kw=None, **par):
    gpus = 8 * nodes
    dp = gpus // (tp * pp * par.get("cp", 1))
    p = dict(tp=tp, pp=pp, dp=dp, schedule=schedule, **par)
    if v is not None:
        p["virtual_stages"] = v
    model = dict(num_layers=16, hidden_size=1024, num_attention_heads=16, vocab_size=1000, seq_length=512,
                 mlp=mlp, **(model_kw or {}))
    return scenario_from_dict({"name": "t", "model": model,
                               "cluster": {"preset": "dgx-a100-80gb", "num_nodes": nodes},
                               "parallelism": p, "training": {"global_batch_size": m * mbs * dp,
                                                              "micro_batch_size": mbs}})


def layer_bytes(scn) -> float:
    par = scn.parallel
    return layer_activation_bytes(scn.model, scn.training.micro_batch_size, par.tp, par.sequence_parallel,
                                  par.cp, par.recompute, scn.training.dtype_bytes, par.ep, scn.training.attention)


def peaks(scn) -> dict:
    return {r: row["activations"] for r, row in estimate_memory(scn).per_rank.items()}


# --- parameters per rank -------------------------------------------------------------------------

@pytest.mark.parametrize("mlp,pp,extra", [("gelu", 1, 0), ("gelu", 4, 1), ("swiglu", 4, 0)])
def test_stage_params_sum_to_the_model(mlp, pp, extra):
    scn = make(pp=pp, mlp=mlp)
    total = sum(sum(rank_param_counts(scn.model, scn.parallel, s).values()) for s in range(pp))
    # tied embeddings with pp > 1: Megatron keeps a copy of the word embedding on the last stage
    assert total == scn.model.num_params() + extra * scn.model.vocab_size * scn.model.hidden_size


def test_tp_splits_gemms_and_replicates_norms_and_row_biases():
    scn = make(tp=2, pp=1, mlp="gelu")
    h, t = 1024, 2
    assert layer_param_counts(scn.model, t)["dense"] == 12 * h * h // t + 7 * h // t + 6 * h


def test_experts_split_over_ep_router_replicated():
    model = replace(make().model, num_experts=8, moe_top_k=2)
    one, four = layer_param_counts(model, 1, 1), layer_param_counts(model, 1, 4)
    assert four["expert"] * 4 == one["expert"] == 8 * model.expert_params()
    assert four["dense"] == one["dense"] == model.dense_params_per_layer()


# --- activations read off the schedule's timeline --------------------------------------------------

@pytest.mark.parametrize("pp", [2, 4, 8])
def test_1f1b_first_stage_holds_L_layers_whatever_p(pp):
    scn = make(pp=pp)
    assert peaks(scn)[0] == pytest.approx(16 * layer_bytes(scn))


def test_gpipe_holds_all_micro_batches():
    scn = make(pp=4, m=8, schedule="gpipe")
    assert peaks(scn)[0] == pytest.approx(8 * 4 * layer_bytes(scn))


@pytest.mark.parametrize("pp,v,m", [(4, 2, 8), (2, 4, 8), (4, 4, 16)])
def test_interleaved_multiplies_by_1_plus_p_minus_1_over_pv(pp, v, m):
    scn = make(pp=pp, v=v, m=m, schedule="interleaved-1f1b")
    assert peaks(scn)[0] == pytest.approx(16 * layer_bytes(scn) * (1 + (pp - 1) / (pp * v)))


def test_zero_bubble_defers_w_and_keeps_its_inputs():
    scn = make(pp=4, m=8, schedule="zero-bubble", mlp="gelu")
    n, layer = 4, layer_bytes(scn)
    _, at_w = layer_activation_split(scn.model, 1, 1, False, 1, "none")
    head = head_activation_bytes(scn.model, 1, 1, False, 1)
    got = peaks(scn)
    emb = 512 * 1024  # the embedding's dropout mask
    assert got[0] == pytest.approx(4 * (n * layer + emb))  # rank 0 runs each W right after its B
    assert got[3] == pytest.approx(n * layer + head + 3 * n * at_w)  # W(i) after B(i + 3)


def test_recompute_workspace_is_one_layer_on_top_of_the_stored_activations():
    scn = make(pp=4, recompute="selective", mlp="gelu")
    # unfused attention (Korthikanti's setting): the s x s core is what selective recompute re-creates
    scn = dataclasses.replace(scn, training=dataclasses.replace(scn.training, attention="unfused"))
    core = layer_activation_bytes(scn.model, 1, 1, False, 1, "none") - layer_bytes(scn)
    stored = 16 * layer_bytes(scn) + 4 * 512 * 1024  # + the embedding's dropout masks in flight
    assert core == pytest.approx(5 * 16 * 512 * 512)  # 5as^2b: the attention core
    assert peaks(scn)[0] == pytest.approx(stored + core)
    no_ws = schedule_trace(scn, [0], recompute_workspace=False)
    assert max(a for _, a, _ in walk_memory(list(no_ws.events))) == pytest.approx(stored)


def test_schedule_trace_matches_the_lowering():
    from simulator.strategy.lower import lower

    for scn in (make(pp=4, v=2, m=8, schedule="interleaved-1f1b", mlp="gelu"),
                make(pp=4, m=8, schedule="zero-bubble", recompute="full"),
                make(pp=2, m=4, tp=2, sequence_parallel=True, recompute="selective", mlp="gelu")):
        plan = lower(scn)
        for r in plan.graph.ranks:
            ids = plan.graph.streams[(r, "compute")]
            events = [TraceEvent(t.name, t.category, r, "compute", float(k), k + 1.0, phase=t.phase,
                                 mem_delta_bytes=t.mem_delta_bytes)
                      for k, t in enumerate(plan.graph.tasks[i] for i in ids)]
            stage = plan.mesh.stage_of(r)
            ref = walk_memory(list(schedule_trace(scn, [stage]).events))
            assert max(a for _, a, _ in walk_memory(events)) == pytest.approx(max(a for _, a, _ in ref))


# --- timeline semantics ----------------------------------------------------------------------------

def ev(name, start, end, delta, phase="F", rank=0):
    return TraceEvent(name, "compute", rank, "compute", start, end, phase=phase, mem_delta_bytes=delta)


def test_frees_apply_at_end_allocations_at_start_frees_first_on_ties():
    pts = walk_memory([ev("F0", 0, 1, 10), ev("F1", 1, 2, 10), ev("B0", 2, 3, -10, "B"),
                       ev("B1", 3, 4, -10, "B")])
    assert [(t, a) for t, a, _ in pts] == [(0, 10), (1, 20), (3, 10), (4, 0)]
    tie = walk_memory([ev("F0", 0, 1, 10), ev("B0", 0, 1, -10, "B"), ev("F1", 1, 2, 10)])
    assert max(a for _, a, _ in tie) == 10


def test_walk_memory_sums_change_by_change_in_time_order():
    # the columns' cumulative sums equal the change-by-change loop, float for float, ties included
    import random
    rng = random.Random(3)
    for _ in range(500):
        events = [ev(f"e{i}", s, s + rng.choice([0.0, 0.5, rng.random()]), rng.choice([0.0, 1e9 * rng.random(), -3e8, 0.1, -0.1]),
                     rng.choice(["F", "B", "", "O"]))
                  for i, s in enumerate(rng.choice([0.0, 0.5, 1.0, rng.random() * 3]) for _ in range(rng.randint(0, 20)))]
        changes = sorted(((e.start_s if e.mem_delta_bytes > 0 else e.end_s, e.mem_delta_bytes > 0, e.mem_delta_bytes,
                           is_buffer_event(e)) for e in events if e.mem_delta_bytes), key=lambda c: (c[0], c[1]))
        act = buf = 0.0
        points = [(0.0, 0.0, 0.0)]
        for t, _, delta, is_buf in changes:
            act, buf = (act, buf + delta) if is_buf else (act + delta, buf)
            points[-1:] = [(t, act, buf)] if points[-1][0] == t else [points[-1], (t, act, buf)]
        assert walk_memory(events) == points


def test_memory_returns_to_the_model_state_baseline():
    scn = make(pp=4)
    rep = estimate_memory(scn)
    for r in rep.per_rank:
        static = sum(rep.buffer_detail[r].values())
        assert rep.timeline[r][-1][1] == pytest.approx(static)
        assert rep.activation_timeline[r][-1][1] == pytest.approx(0.0, abs=1e-3)
        row = rep.per_rank[r]
        assert row["total"] == pytest.approx(sum(row[k] for k in ("params", "grads", "optimizer",
                                                                  "activations", "buffers")))
    assert rep.peak == rep.per_rank[rep.worst_rank]
    assert rep.worst_rank == 0  # 1F1B: the first stage holds the most micro-batches


def test_unbalanced_deltas_are_rejected():
    scn = make(pp=1)
    trace = Trace((ev("F0", 0, 1, 10.0), ev("B0", 1, 2, -4.0, "B")))
    from simulator.tasks import InternalError
    with pytest.raises(InternalError, match="rank 0 ends the step"):  # a lowering bug, not bad input
        memory_report(scn, {0: {"dense": 1, "expert": 0}}, trace)


def test_model_state_uses_dp_cp_for_dense_and_expert_dp_for_experts():
    scn = make(pp=1, zero_stage=1, nodes=2, ep=4, model_kw={"num_experts": 8, "moe_top_k": 2})
    rep = memory_report(scn, {0: {"dense": 1600, "expert": 800}}, Trace(()))
    assert rep.per_rank[0]["optimizer"] == pytest.approx(12 * 1600 / 16 + 12 * 800 / 4)
    assert rep.per_rank[0]["grads"] == pytest.approx(4 * 2400)  # fp32 main grads below ZeRO-2


def test_buffers_from_the_trace_replace_the_static_zero3_allowance():
    scn = make(pp=1, zero_stage=3)
    counts = {"dense": 10_000_000, "expert": 0}
    assert "zero3_gathered" in static_buffers(scn, counts, 0)
    trace = Trace((ev("gather", 0, 1, 300.0, phase=""), ev("F0", 1, 2, 50.0),
                   ev("release", 2, 3, -300.0, phase=""), ev("B0", 3, 4, -50.0, "B")))
    rep = memory_report(scn, {0: counts}, trace)
    assert "zero3_gathered" not in rep.buffer_detail[0]
    assert rep.per_rank[0]["activations"] == 50.0
    assert rep.buffer_detail[0]["trace_buffers"] == 300.0
    assert rep.buffer_detail[0]["cuda_context"] == CUDA_CONTEXT_BYTES


def test_deepspeed_holds_its_reduce_bucket_fsdp_one_unit_of_gradients():
    """DeepSpeed ZeRO-2/3 reduce through a reduce_bucket_size bucket (5e8 elements); FSDP has none: it
    reduce-scatters one unit's (a layer's) gradients from their copy in the reduce dtype; at ZeRO-3 that
    copy is part of the gathered allowance; under torch's pipelining it comes after the last backward."""
    counts = {"dense": 10**9, "expert": 0}
    layer = layer_param_counts(make(pp=1).model, 1)["dense"]
    ds = static_buffers(make(pp=1, zero_stage=2, sharding="deepspeed"), counts, 0)
    assert ds["dp_bucket"] == 5e8 * 2 and "fsdp_reduce_input" not in ds  # bf16 gradients at ZeRO-2
    fsdp2 = make(pp=1, zero_stage=2, sharding="fsdp2")
    z2 = static_buffers(fsdp2, counts, 0)
    assert "dp_bucket" not in z2 and z2["fsdp_reduce_input"] == layer * fsdp2.training.grad_dtype_bytes
    z3 = make(pp=1, zero_stage=3, sharding="fsdp1")
    assert static_buffers(z3, counts, 0)["zero3_gathered"] == layer * (2 * 2 + z3.training.grad_dtype_bytes)
    piped = static_buffers(make(pp=2, zero_stage=2, sharding="fsdp2"), counts, 0)
    assert not {"dp_bucket", "fsdp_reduce_input", "zero3_gathered"} & set(piped)


def test_oom_verdict_flips_when_the_micro_batch_doubles_at_the_edge():
    small, big = make(pp=4, mbs=1, m=16), make(pp=4, mbs=2, m=8)
    lo, hi = estimate_memory(small).peak["total"], estimate_memory(big).peak["total"]
    assert hi > lo
    gpu = replace(small.cluster.gpu, memory_capacity_bytes=(lo + hi) / 2)
    at_edge = [replace(s, cluster=replace(s.cluster, gpu=gpu)) for s in (small, big)]
    assert [estimate_memory(s).fits for s in at_edge] == [True, False]


# --- memory.png ------------------------------------------------------------------------------------

def test_pick_ranks_keeps_ends_and_at_most_16():
    picked = pick_ranks(list(range(35)))
    assert len(picked) == 16 and picked[0] == 0 and picked[-1] == 34
    assert pick_ranks([3, 5]) == [3, 5]


def test_plot_memory_writes_a_png(tmp_path):
    scn = make(pp=8, mlp="gelu")
    out = plot_memory(estimate_memory(scn), scn, tmp_path)
    assert out == tmp_path / "memory.png"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fp8_training_keeps_bf16_weights_plus_the_te_fp8_weight_cache():
    from simulator.analysis.buffers import FP8_WEIGHT_COPY_BYTES
    from simulator.scenario import scenario_from_dict

    def scn(dtype):
        return scenario_from_dict({"model": {"num_layers": 2, "hidden_size": 1024, "num_attention_heads": 8,
                                             "vocab_size": 4096, "seq_length": 512, "mlp": "swiglu"},
                                   "cluster": {"preset": "dgx-h100", "num_nodes": 1},
                                   "parallelism": {"tp": 1, "dp": 8, "zero_stage": 1},
                                   "training": {"global_batch_size": 8, "dtype": dtype}})
    counts = {"dense": 1_000_000, "expert": 0}
    fp8, bf16 = static_buffers(scn("fp8"), counts, 0), static_buffers(scn("bf16"), counts, 0)
    m, h = scn("fp8").model, 1024
    layer = h * (h + 2 * m.num_kv_heads * (h // 8)) + h * h + 3 * h * m.ffn_hidden_size  # bias-free SwiGLU
    assert fp8["fp8_weight_cache"] == 2 * layer * FP8_WEIGHT_COPY_BYTES and "fp8_weight_cache" not in bf16
    assert scn("fp8").training.dtype_bytes == 2  # activations and weights stay BF16


def test_the_fp8_weight_cache_holds_the_te_linear_layers_of_the_rank_stage_not_its_embedding_or_head():
    """TE caches the quantized weights of its own linear modules: a stage's layers' QKV, projection and
    MLP GEMMs (an MoE layer's local experts), not the vocab-parallel embedding or the output layer that the
    first and last stage also hold, nor the norms and router."""
    from simulator.scenario import scenario_from_dict

    def scn(ep):
        return scenario_from_dict({
            "model": {"num_layers": 4, "hidden_size": 1024, "num_attention_heads": 8, "vocab_size": 32000,
                      "seq_length": 512, "mlp": "swiglu", "ffn_hidden_size": 2048, "num_experts": 8,
                      "moe_top_k": 2},
            "cluster": {"preset": "dgx-h100", "num_nodes": 1},
            "parallelism": {"tp": 1, "pp": 2, "dp": 4, "ep": ep, "zero_stage": 1},
            "training": {"global_batch_size": 16, "dtype": "fp8"}})

    h, f = 1024, 2048
    attention, expert = 4 * h * h, 3 * h * f  # QKV (8 K/V heads) + projection; one bias-free SwiGLU expert
    for ep in (2, 4):
        s = scn(ep)
        for stage in (0, 1):
            counts = rank_param_counts(s.model, s.parallel, stage)
            cache = static_buffers(s, counts, stage)["fp8_weight_cache"]
            assert cache == 2 * (attention + 8 // ep * expert) * 2  # two layers, FP8 weight + transpose
            assert (counts["dense"] + counts["expert"]) * 2 - cache >= 32000 * h * 2  # embedding or head
