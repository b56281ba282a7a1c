"""lower(): every strategy changes the task graph: which tasks, which collectives of what size on which
group and stream, and which dependencies (the overlap the simulation then measures)."""

import re
from collections import Counter

import pytest

from simulator.defaults import split_layers
from simulator.model.opgraph import build_op_graph
from simulator.scenario import scenario_from_dict
from simulator.strategy.blocks import build_blocks
from simulator.strategy.grad_sync import BUCKET_MIN_PARAMS, DEEPSPEED_REDUCE_BUCKET_PARAMS, bucket_params
from simulator.strategy.lower import chunk_layers, lower

GPT = {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "vocab_size": 1024, "seq_length": 128}
MOE = {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "num_kv_heads": 4, "vocab_size": 1024,
       "seq_length": 128, "mlp": "swiglu", "num_experts": 4, "moe_top_k": 2}
BUS = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0}  # x (n-1)/n, nccl-tests PERFORMANCE.md


def scn(model=GPT, batch=8, mbs=1, training=None, **par):
    n = par.get("tp", 1) * par.get("pp", 1) * par.get("dp", 1) * par.get("cp", 1)
    par.setdefault("dp", 1)
    return scenario_from_dict({"model": dict(model), "parallelism": par,
                               "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1, "gpus_per_node": n},
                               "training": {"global_batch_size": batch, "micro_batch_size": mbs, **(training or {})}})


def comms(graph, op=None, axis=None, phase=None, stream=None):
    return [t for t in graph.tasks if t.comm is not None and (op is None or t.comm.op == op)
            and (axis is None or t.comm.axis == axis) and (phase is None or t.phase == phase)
            and (stream is None or t.stream == stream)]


def bus_bytes(tasks):
    return sum(BUS[t.comm.op] * t.comm.size_bytes for t in tasks)


# ---- layer placement ----------------------------------------------------------------------------
def test_chunk_layers_interleaves_virtual_stages():
    assert chunk_layers((2, 2), 1) == ((0, 1), (2, 3))
    # chunk c of rank r is virtual stage c*p + r: rank 0 holds layers 0-1 and 4-5
    assert chunk_layers((4, 4), 2) == ((0, 1), (2, 3), (4, 5), (6, 7))
    llama3 = split_layers(126, 16)
    layers = chunk_layers(llama3, 1)
    assert [len(c) for c in layers] == list(llama3) and llama3[0] == llama3[-1] == 7
    assert [i for c in layers for i in c] == list(range(126))
    # uneven: the chunks holding the embedding and the head are the short ones (Llama 3 layout)
    assert [len(c) for c in chunk_layers(llama3, 2)] == [3] + [4] * 30 + [3]
    assert [len(c) for c in chunk_layers((5, 7), 3)] == [1, 3, 2, 2, 2, 2]
    with pytest.raises(ValueError, match="virtual_stages = 3"):
        chunk_layers((2, 4), 3)


@pytest.mark.parametrize("par", [
    {"tp": 2, "pp": 2, "dp": 2},
    {"tp": 2, "pp": 2, "dp": 2, "sequence_parallel": True, "recompute": "full", "schedule": "zero-bubble"},
    {"tp": 2, "pp": 2, "cp": 2, "recompute": "selective", "zero_stage": 3, "dp": 2},
    {"pp": 2, "dp": 4, "ep": 2, "zero_stage": 2, "offload_optimizer": True, "schedule": "interleaved-1f1b",
     "virtual_stages": 2},
], ids=["tp-pp-dp", "sp-full-zb", "cp-sel-zero3", "ep-zero2-offload-interleaved"])
def test_graph_is_valid_and_activation_memory_balances(par):
    model = MOE if par.get("ep", 1) > 1 else GPT
    plan = lower(scn(model, batch=8, **par))
    g = plan.graph
    g.validate()
    for r in g.ranks:
        deltas = [t.mem_delta_bytes for t in g.tasks if t.rank == r and t.mem_delta_bytes]
        assert deltas and sum(deltas) == pytest.approx(0.0, abs=1e-6 * max(map(abs, deltas)))
    # activations ride on compute kernels only (communication tasks carry buffers)
    assert {t.category for t in g.tasks if t.mem_delta_bytes} <= {"compute", "recompute"}


# ---- tensor and sequence parallelism ---------------------------------------------------------------
def test_tp_forward_all_reduces_block_and_backward_ones_overlap_the_weight_gradient():
    s = scn(tp=2, batch=2)
    g = lower(s).graph
    size = 1 * 128 * 256 * 2  # b*s*h*bytes
    fwd = [t for t in comms(g, "all_reduce", "tp", "F") if t.layer >= 0]
    assert len(fwd) == 2 * 4 * 2 and {t.comm.size_bytes for t in fwd} == {size}
    assert {t.stream for t in fwd} == {"compute"} and all(len(t.comm.group) == 2 for t in fwd)
    bwd = [t for t in comms(g, "all_reduce", "tp", "B") if t.layer >= 0]
    assert len(bwd) == 2 * 4 * 2 and {t.stream for t in bwd} == {"comm_tp"}
    by_id = {t.id: t for t in g.tasks}
    for ar in bwd:
        dgrad = by_id[ar.deps[0]]
        assert dgrad.name.endswith(".grad") and dgrad.stream == "compute"
        wgrad = by_id[dgrad.id + 2]  # the weight-gradient GEMM runs while the all-reduce is in flight
        assert wgrad.name.endswith(".wgrad") and ar.id not in wgrad.deps
        assert all(w.name.split(".")[-1] in ("qkv", "fc1", "lm_head") for w in wgrad.work)
        after = by_id[dgrad.id + 3]
        assert ar.id in after.deps and wgrad.id in after.deps


def test_sp_replaces_all_reduce_by_reduce_scatter_and_all_gather_of_equal_volume():
    plain = lower(scn(tp=2, batch=2)).graph
    sp = lower(scn(tp=2, batch=2, sequence_parallel=True)).graph
    assert not comms(sp, "all_reduce", "tp")
    size = 128 * 256 * 2
    for phase in ("F", "B"):
        rs, ag = comms(sp, "reduce_scatter", "tp", phase), comms(sp, "all_gather", "tp", phase)
        regather = [t for t in ag if t.name.endswith("input_all_gather")]
        assert {t.comm.size_bytes for t in rs + ag} == {size}
        # every all-reduce became one reduce-scatter and one all-gather: same bus volume
        assert bus_bytes(rs) + bus_bytes([t for t in ag if t not in regather]) == \
            bus_bytes(comms(plain, "all_reduce", "tp", phase))
    # the backward also re-gathers each column-parallel GEMM's saved sequence-sharded input for its
    # weight gradient (qkv, fc1 per layer, lm_head), overlapped with the input-gradient GEMM
    regather = [t for t in comms(sp, "all_gather", "tp", "B") if t.name.endswith("input_all_gather")]
    assert len(regather) == 2 * (2 * 4 + 1) and {t.stream for t in regather} == {"comm_tp"}
    fwd = [t for t in comms(sp, axis="tp", phase="F") if t.layer == 0 and t.microbatch == 0]
    assert [t.comm.op for t in fwd] == ["all_gather", "reduce_scatter", "all_gather", "reduce_scatter"]


def test_pp_sends_a_tp_slice_of_the_activation_each_way():
    g = lower(scn(tp=2, pp=2, batch=4)).graph
    sends = comms(g, "send_recv", "pp")
    assert Counter(t.phase for t in sends) == {"F": 4, "B": 4}
    assert {t.comm.size_bytes for t in sends} == {128 * 256 * 2 / 2}  # scatter/gather, Narayanan §4.1


# ---- context parallelism ---------------------------------------------------------------------------
def test_cp_ring_overlaps_kv_blocks_with_attention_steps():
    g = lower(scn(cp=4, batch=1)).graph
    kv = 2 * (128 // 4) * 256 * 2  # K and V of the local quarter of the sequence
    by_id = {t.id: t for t in g.tasks}
    for phase, size in (("F", kv), ("B", 2 * kv)):
        sends = [t for t in comms(g, "send_recv", "cp", phase) if t.layer == 0]
        assert len(sends) == 3 and {t.comm.size_bytes for t in sends} == {size}
        assert {t.stream for t in sends} == {"comm_cp"}
        steps = [t for t in g.tasks if t.layer == 0 and t.phase == phase and ".core" in t.name]
        assert len(steps) == 4 and not (set(steps[0].deps) & {s.id for s in sends})
        for j in (1, 2, 3):  # step j needs the block of send j-1, and only that one
            assert sends[j - 1].id in steps[j].deps
            assert all(by_id[d].comm is None or d == sends[j - 1].id for d in steps[j].deps)


def test_cp_all_gather_variant_gathers_kv_and_reduce_scatters_its_gradient():
    g = lower(scn(cp=4, batch=1, cp_algorithm="all-gather")).graph
    kv_all = 2 * 128 * 256 * 2
    per_layer = Counter((t.phase, t.comm.op) for t in comms(g, axis="cp") if t.layer == 0)
    assert per_layer == {("F", "all_gather"): 1, ("B", "all_gather"): 1, ("B", "reduce_scatter"): 1}
    assert {t.comm.size_bytes for t in comms(g, axis="cp")} == {kv_all}


def test_cp_joins_the_data_parallel_gradient_reduction():
    g = lower(scn(cp=2, dp=2, batch=2)).graph
    grads = comms(g, "all_reduce", "dp")
    assert grads and {len(t.comm.group) for t in grads} == {4}


# ---- expert parallelism -----------------------------------------------------------------------------
def test_ep_dispatch_and_combine_all_to_all_sized_tokens_topk_hidden():
    s = scn(MOE, dp=4, ep=4, batch=4)
    g = lower(s).graph
    a2a = comms(g, "all_to_all", "ep")
    assert Counter(t.phase for t in a2a) == {"F": 2 * 4, "B": 2 * 4}  # 2 per layer, micro-batch 0 only
    assert {t.comm.size_bytes for t in a2a} == {128 * 2 * 256 * 2}  # tokens * top_k * hidden * bytes
    assert {len(t.comm.group) for t in a2a} == {4} and {t.stream for t in a2a} == {"comm_ep"}
    with_sp = lower(scn(MOE, tp=2, dp=2, ep=2, batch=2, sequence_parallel=True)).graph
    assert {t.comm.size_bytes for t in comms(with_sp, "all_to_all")} == {128 // 2 * 2 * 256 * 2}


def test_expert_gradients_are_reduced_over_the_expert_data_parallel_group():
    s = scn(MOE, dp=4, ep=2, batch=4)
    plan = lower(s)
    grads = comms(plan.graph, "all_reduce", "dp")
    expert = [t for t in grads if ".expert" in t.name]
    dense = [t for t in grads if ".dense" in t.name]
    params = plan.stage_params[0]
    assert {len(t.comm.group) for t in expert} == {2} and {len(t.comm.group) for t in dense} == {4}
    assert sum(t.comm.size_bytes for t in expert) == params["expert"] * 4  # fp32 main grads
    assert sum(t.comm.size_bytes for t in dense) == params["dense"] * 4


# ---- data parallelism and ZeRO ------------------------------------------------------------------
M = 4  # micro-batches per step in the ZeRO tests


def _zero(stage, **kw):
    plan = lower(scn(dp=4, batch=4 * M, zero_stage=stage, **kw))
    return plan.graph, plan.stage_params[0]["dense"]


def test_zero0_all_reduces_every_gradient_once():
    g, p = _zero(0)
    assert {t.comm.op for t in comms(g, axis="dp")} == {"all_reduce"}
    assert sum(t.comm.size_bytes for t in comms(g, axis="dp")) == p * 4


def test_zero1_reduce_scatters_once_and_all_gathers_the_updated_parameters():
    g, p = _zero(1)
    assert sum(t.comm.size_bytes for t in comms(g, "reduce_scatter", "dp")) == p * 4
    assert sum(t.comm.size_bytes for t in comms(g, "all_gather", "dp")) == p * 2
    assert not comms(g, "all_reduce", "dp")


def test_zero2_reduce_scatters_every_micro_batch():
    g, p = _zero(2)  # ZeRO >= 2 keeps gradients in the training dtype (2 bytes)
    rs = comms(g, "reduce_scatter", "dp")
    assert sum(t.comm.size_bytes for t in rs) == M * p * 2
    assert {t.name.split(".")[1] for t in rs} == {f"B{i}" for i in range(M)}  # grad_reduce_scatter.B0.vs0.dense0
    assert sum(t.comm.size_bytes for t in comms(g, "all_gather", "dp")) == p * 2


def test_zero3_gathers_each_unit_before_use_prefetching_one_ahead_and_reduce_scatters_per_micro_batch():
    g, p = _zero(3, sharding="fsdp1")
    ag = comms(g, "all_gather", "dp")
    # FULL_SHARD: every unit forward, every block again in the backward; the root unit (embedding,
    # final norm, head) stays gathered from its forward to its backward (FSDP's root heuristic)
    root = sum(t.comm.size_bytes for t in ag if t.name.startswith("F") and (".embed." in t.name or ".head." in t.name)) / M
    assert root > 0
    assert sum(t.comm.size_bytes for t in ag) == M * (2 * p * 2 - root)
    assert not [t for t in ag if t.name.startswith("B") and (".embed." in t.name or ".head." in t.name)]
    assert sum(t.comm.size_bytes for t in comms(g, "reduce_scatter", "dp")) == M * p * 2
    # FSDP1 issues both kinds on one process group: ProcessGroupNCCL's one NCCL stream (fsdp1)
    assert {t.stream for t in comms(g, "reduce_scatter", "dp")} == {"comm_dp"}
    by_name = {re.sub(r"\.g\d+\.", ".", t.name): t for t in g.tasks}  # F1.L2.g3.param_all_gather
    for i in range(1, 4):
        # layer i's gather is issued when layer i-1 starts: it waits for the compute of layer i-2
        # (whose parameters are then freed), never for layer i-1's; FSDP1 casts the fp32 shard first
        gather = by_name[f"F1.L{i}.param_all_gather"]
        cast = g.tasks[gather.deps[0]]
        assert cast.name.endswith("param_all_gather.shard_cast") and [w.name for w in cast.work] == ["fsdp1_shard_cast"]
        dep = g.tasks[cast.deps[0]]
        assert dep.stream == "compute" and dep.microbatch == 1
        assert dep.name == ("F1.embed" if i == 1 else f"F1.L{i - 2}.mlp")
        first = by_name[f"F1.L{i}.attn"]
        assert g.tasks[first.deps[0]].name == f"F1.L{i}.wait" and gather.id in g.tasks[first.deps[0]].deps


def test_distributed_optimizer_param_gather_overlaps_the_first_forward_or_follows_the_step():
    g, _ = _zero(1)
    ag = comms(g, "all_gather", "dp")
    first_fwd = next(t for t in g.tasks if t.phase == "F" and t.stream == "compute")
    assert all(not t.deps for t in ag) and {t.id for t in ag} <= set(first_fwd.deps)
    g, _ = _zero(1, overlap_param_gather=False)
    step = next(t for t in g.tasks if t.name == "optimizer")
    assert all(t.deps == (step.id,) for t in comms(g, "all_gather", "dp"))


def test_param_gather_runs_bucket_by_bucket_in_forward_order_and_each_layer_waits_for_its_own():
    # 50M parameters per layer: one bucket each (Megatron-core bucket_size = max(40M, 1M x dp));
    # the all-gathers are issued in forward order and the first forward of layer i waits only for
    # the gather of layer i's bucket, so the first layers compute while later buckets still gather
    big = dict(GPT, hidden_size=2048, num_attention_heads=16)
    g = lower(scn(big, dp=2, batch=4, zero_stage=1)).graph
    gathers = {t.id for t in comms(g, "all_gather", "dp")}
    by_name = {t.name: t for t in g.tasks}
    waited = [set(by_name[f"F0.L{i}.wait"].deps) & gathers for i in range(GPT["num_layers"])]
    assert all(len(w) == 1 for w in waited) and len(set.union(*waited)) == GPT["num_layers"]
    order = [w.pop() for w in waited]
    assert order == sorted(order)  # issued in the order the forward needs them
    # later micro-batches find the parameters in place
    assert not any(set(t.deps) & gathers for t in g.tasks if t.microbatch == 1)


def test_grad_buckets_overlap_the_last_backward_only_with_overlap_grad_reduce():
    assert bucket_params(8) == BUCKET_MIN_PARAMS and bucket_params(64, 0) == 64_000_000
    assert bucket_params(8, 2) == DEEPSPEED_REDUCE_BUCKET_PARAMS
    big = dict(GPT, hidden_size=2048, num_attention_heads=16)  # 50M parameters per layer: 1 bucket each
    for overlap in (True, False):
        g = lower(scn(big, dp=2, batch=4, overlap_grad_reduce=overlap)).graph
        last = max(t.id for t in g.tasks if t.stream == "compute" and t.phase in ("B", "W"))
        deps = {t.deps[0] for t in comms(g, "all_reduce", "dp")}
        assert (deps == {last}) is (not overlap) and len(comms(g, "all_reduce", "dp")) >= 4


def test_offload_copies_each_reduced_shard_to_the_host_and_steps_on_the_cpu():
    g, p = _zero(2, offload_optimizer=True)
    rs = comms(g, "reduce_scatter", "dp")
    d2h = [t for t in comms(g, "d2h", "host") if "grads_to_host" in t.name]
    assert len(d2h) == len(rs) and sum(t.comm.size_bytes for t in d2h) == M * p * 2 / 4
    assert {t.stream for t in d2h} == {"offload"} and all(g.tasks[t.deps[0]] in rs for t in d2h)
    adam = [t for t in g.tasks if t.kind == "host"]
    assert len(adam) == 1 and {d for d in adam[0].deps} >= {t.id for t in d2h}
    h2d = next(t for t in g.tasks if t.name == "params_to_gpu")
    assert h2d.deps == (adam[0].id,) and h2d.comm.size_bytes == p / 4 * 2 and h2d.comm.op == "h2d"
    assert not [t for t in g.tasks if t.name == "optimizer"]


# ---- recompute and schedules ------------------------------------------------------------------------
def _layer_fwd_flops(s):
    b = build_blocks(build_op_graph(s.model, 1), 1, False, 1, 1)
    return sum(w.flops for seg in b.segments() for w in seg.fwd), sum(w.flops for w in b.attn_core.fwd)


@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_recompute_reruns_the_layer_or_its_attention_core(mode):
    s = scn(batch=2, recompute=mode)
    g = lower(s).graph
    layer, core = _layer_fwd_flops(s)
    r = [t for t in g.tasks if t.phase == "R"]
    assert {t.category for t in r} <= {"recompute", "comm_tp"}
    expected = {"none": 0.0, "selective": core, "full": layer}[mode] * 4 * 2
    assert sum(t.flops for t in r) == pytest.approx(expected)


def test_zero_bubble_splits_backward_into_b_and_w_without_changing_the_work():
    base = lower(scn(pp=2, batch=4)).graph
    zb = lower(scn(pp=2, batch=4, schedule="zero-bubble")).graph
    assert sum(t.flops for t in zb.tasks) == pytest.approx(sum(t.flops for t in base.tasks))
    w = [t for t in zb.tasks if t.phase == "W" and t.flops]
    # each layer x micro-batch, plus the LM head on the last stage
    assert len([t for t in w if t.layer >= 0]) == 4 * 4 and any(t.name.endswith("head") for t in w)
    assert all(w.kind == "gemm" for t in w for w in t.work if t.layer >= 0)
    blocks = build_blocks(build_op_graph(scn().model, 1), 1, False, 1, 1)
    b_flops = sum(op.flops for seg in blocks.segments() for op in seg.bwd_b)
    w_flops = sum(op.flops for op in blocks.layer_w)
    per_layer = Counter()
    for t in zb.tasks:
        if t.layer >= 0 and t.phase in ("B", "W"):
            per_layer[(t.layer, t.microbatch, t.phase)] += t.flops
    assert len(per_layer) == 2 * 4 * 4
    for (_, _, phase), flops in per_layer.items():
        assert flops == pytest.approx(b_flops if phase == "B" else w_flops)


def test_interleaving_sends_between_all_virtual_stages():
    g = lower(scn(pp=2, batch=4, schedule="interleaved-1f1b", virtual_stages=2)).graph
    sends = comms(g, "send_recv", "pp")
    assert len(sends) == 2 * 3 * 4  # (p*v - 1) boundaries x m micro-batches x (F, B)
    assert {t.chunk for t in g.tasks if t.stream == "compute" and t.phase == "F"} == {0, 1}


def test_the_optimizer_step_reads_the_gradients_for_the_clipping_norm_then_runs_adam():
    from simulator.strategy.grad_sync import ADAM_STATE_RW_BYTES, adam_state_rw_bytes
    s = scenario_from_dict({"model": {"num_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
                                      "vocab_size": 1024, "seq_length": 128},
                            "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1, "gpus_per_node": 2},
                            "parallelism": {"dp": 2, "zero_stage": 1}, "training": {"global_batch_size": 2}})
    plan = lower(s)
    step = next(t for t in plan.graph.tasks if t.category == "optimizer" and t.kind == "compute")
    norm, adam = step.work
    assert (norm.name, adam.name) == ("grad_norm", "adam")
    shard = norm.shape[0]
    assert adam_state_rw_bytes(s.training) == ADAM_STATE_RW_BYTES == 24  # fp32 master, m and v, read and written
    assert norm.bytes == shard * 4 and adam.bytes == shard * (ADAM_STATE_RW_BYTES + 4)  # fp32 main grads


# ---- parallel attention + MLP blocks (GPT-J, GPT-NeoX) ----------------------------------------------
def _layer_tp(model, phase, **par):
    g = lower(scn(model, batch=2, tp=2, **par)).graph
    return [(t.comm.op, t.stream) for t in comms(g, axis="tp", phase=phase) if t.layer == 1 and t.microbatch == 0]


GPTJ = {**GPT, "parallel_attn_mlp": True}  # one shared norm
NEOX = {**GPT, "parallel_attn_mlp": True, "parallel_norms": 2}
AR, AG, RS, BLOCK, ASYNC = "all_reduce", "all_gather", "reduce_scatter", "compute", "comm_tp"


@pytest.mark.parametrize("model, sp, fwd, bwd", [
    # sequential (Shoeybi et al. 2019; Korthikanti et al. 2022 Fig. 5): f and g around each block
    (GPT, False, [(AR, BLOCK)] * 2, [(AR, ASYNC)] * 2),
    (GPT, True, [(AG, BLOCK), (RS, BLOCK)] * 2, [(AG, BLOCK), (AG, ASYNC), (RS, ASYNC)] * 2),
    # shared norm (mesh-transformer-jax layers.py: one f_psum before the norm, one g_psum after both
    # branches): every collective of the layer halves, forward and backward
    (GPTJ, False, [(AR, BLOCK)], [(AR, ASYNC)]),
    (GPTJ, True, [(AG, BLOCK), (RS, BLOCK)], [(AG, BLOCK), (AG, ASYNC), (RS, ASYNC)]),
    # two norms (GPT-NeoX transformer.py with gpt_j_residual: one reduction of both branches; each
    # ColumnParallelLinear keeps its own f, mpu/layers.py): the exit and its conjugate halve, each norm's
    # output still enters the TP region by itself
    (NEOX, False, [(AR, BLOCK)], [(AR, ASYNC)] * 2),
    (NEOX, True, [(AG, BLOCK), (AG, BLOCK), (RS, BLOCK)], [(AG, BLOCK)] + [(AG, ASYNC), (RS, ASYNC)] * 2),
], ids=["seq", "seq-sp", "gptj", "gptj-sp", "neox", "neox-sp"])
def test_parallel_block_tp_collectives_per_layer(model, sp, fwd, bwd):
    assert _layer_tp(model, "F", sequence_parallel=sp) == fwd
    assert sorted(_layer_tp(model, "B", sequence_parallel=sp)) == sorted(bwd)


@pytest.mark.parametrize("sp", [False, True])
def test_shared_norm_backward_overlaps_both_weight_gradients_with_its_one_input_gradient_collective(sp):
    """GPT-J: fc1's input gradient joins QKV's, so the MLP's backward (no collective of its own) ends with
    fc1's input-gradient GEMM and fc1's weight gradient runs with QKV's while their one all-reduce (SP:
    reduce-scatter) is in flight, after the one re-gather of the shared norm's sequence-sharded output."""
    g = lower(scn(GPTJ, batch=2, tp=2, sequence_parallel=sp)).graph
    tasks = [t for t in g.tasks if t.layer == 1 and t.microbatch == 0 and t.phase == "B" and t.rank == 0]
    names = [t.name.split(".", 2)[-1] for t in tasks]
    regather = ["attn.input_all_gather"] if sp else []
    assert names == ["mlp_grad.all_gather"] * sp + ["mlp.grad"] + regather + [
        "attn.grad", f"attn.grad.{RS if sp else AR}", "attn.wgrad", "attn.grad_post"]
    mlp, wgrad = tasks[sp], tasks[-2]
    assert [w.name for w in mlp.work][-1] == "fc1" and [w.name for w in wgrad.work] == ["qkv", "fc1"]
    red = tasks[-3]
    assert red.stream == ASYNC and red.id not in wgrad.deps and red.id in tasks[-1].deps
    seq = lower(scn(GPT, batch=2, tp=2, sequence_parallel=sp)).graph
    flops = lambda graph: sum(w.flops for t in graph.tasks if t.work and t.layer == 1 and t.phase == "B"  # noqa: E731
                              for w in t.work)
    assert flops(g) == flops(seq)  # fc1's B in the MLP's task, its W with QKV's: nothing lost


@pytest.mark.parametrize("model", [GPTJ, NEOX], ids=["gptj", "neox"])
def test_parallel_block_zero_bubble_regathers_each_norm_output_once(model):
    g = lower(scn(model, batch=4, tp=2, pp=2, sequence_parallel=True, schedule="zero-bubble")).graph
    regather = [t for t in comms(g, AG, "tp", "W") if t.layer == 1 and t.microbatch == 0]
    assert len(regather) == model.get("parallel_norms", 1)


@pytest.mark.parametrize("par", [
    {"tp": 2, "pp": 2, "dp": 2, "sequence_parallel": True, "recompute": "full", "schedule": "zero-bubble"},
    {"tp": 2, "pp": 2, "cp": 2, "recompute": "selective", "zero_stage": 3, "dp": 2},
], ids=["sp-full-zb", "cp-sel-zero3"])
@pytest.mark.parametrize("model", [GPTJ, NEOX], ids=["gptj", "neox"])
def test_parallel_block_graph_is_valid_and_activation_memory_balances(model, par):
    g = lower(scn(model, batch=8, **par)).graph
    g.validate()
    for r in g.ranks:
        deltas = [t.mem_delta_bytes for t in g.tasks if t.rank == r and t.mem_delta_bytes]
        assert deltas and sum(deltas) == pytest.approx(0.0, abs=1e-6 * max(map(abs, deltas)))


def test_parallel_block_runs_the_sequential_block_flops():
    """The same GEMMs and attention core: per-layer forward and backward FLOPs of the lowered graph equal
    the sequential block's, recompute included."""
    def flops(model, **par):
        g = lower(scn(model, batch=2, tp=2, sequence_parallel=True, recompute="full", **par)).graph
        return Counter({ph: sum(w.flops for t in g.tasks if t.work and t.layer >= 0 and t.phase == ph for w in t.work)
                        for ph in ("F", "B", "R")})
    assert flops(GPTJ) == flops(NEOX) == flops(GPT)
