"""MoE of today in the lowering: MoE parallel folding (etp), dense first layers and windowed layers lowered
by their own templates, routing imbalance, capacity, grouped vs per-expert GEMMs, the two dispatchers."""

import math
from collections import Counter

import pytest

from simulator.cost.model import CostModel
from simulator.hardware.topology import build_topology
from simulator.model.opgraph import build_op_graph
from simulator.scenario import scenario_from_dict
from simulator.scenario_checks import ScenarioError
from simulator.strategy.activation_memory import layer_activation_bytes
from simulator.strategy.lower import lower

MOE = {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "num_kv_heads": 4, "vocab_size": 1024,
       "seq_length": 256, "mlp": "swiglu", "num_experts": 4, "moe_top_k": 2}


def scn(model=MOE, batch=4, nodes=1, gpus=None, **par):
    n = par.get("tp", 1) * par.get("pp", 1) * par.get("dp", 1) * par.get("cp", 1)
    par.setdefault("dp", 1)
    return scenario_from_dict({"model": dict(model), "parallelism": par,
                               "cluster": {"preset": "dgx-h100", "num_nodes": nodes, "gpus_per_node": gpus or n},
                               "training": {"global_batch_size": batch, "micro_batch_size": 1}})


def tasks(graph, suffix, phase="F", layer=None):
    return [t for t in graph.tasks if t.name.endswith(suffix) and t.phase == phase
            and (layer is None or t.layer == layer)]


def expert_gemms(graph):
    (t,) = [x for x in graph.tasks if x.name == "F0.L1.experts"]
    return [w for w in t.work if w.kind == "gemm"], t


# ---- MoE parallel folding ---------------------------------------------------------------------------
def test_deepseek_v3_plan_is_accepted_with_folding_and_refused_without():
    # dgxc-benchmarking DeepSeek-V3 (1,024 H100): TP2 PP16 EP64 ETP1 DP32
    raw = {"model": {"preset": "deepseek-v3"}, "cluster": {"preset": "dgx-h100", "num_nodes": 128},
           "parallelism": {"tp": 2, "pp": 16, "dp": 32, "ep": 64, "etp": 1, "sequence_parallel": True},
           "training": {"global_batch_size": 8192}}
    s = scenario_from_dict(raw)
    assert s.parallel.expert_dp == 1 and s.parallel.expert_tp == 1
    raw["parallelism"]["etp"] = 0  # etp = tp = 2: EP 64 x ETP 2 = 128 > the 64 ranks of a stage
    with pytest.raises(ScenarioError, match=r"ep\*etp = 64\*2 = 128 does not divide the tp\*cp\*dp = 2\*1\*32 = 64"):
        scenario_from_dict(raw)


def test_folded_expert_group_spans_tp_ranks_and_experts_see_their_own_tokens_only():
    # TP 2 with SP, EP 4 x ETP 1 over the 4 ranks of the stage (TP x DP): each rank dispatches its own
    # s/tp tokens and its experts compute as many slots, over the whole expert width
    s = scn(tp=2, dp=2, ep=4, etp=1, sequence_parallel=True, batch=2)
    g = lower(s).graph
    a2a = [t for t in g.tasks if t.comm is not None and t.comm.op == "all_to_all"]
    assert {t.comm.group for t in a2a} == {(0, 1, 2, 3)}
    assert {t.comm.size_bytes for t in a2a} == {256 // 2 * 2 * 256 * 2}
    (fc1, fc2), _ = expert_gemms(g)
    f = 256 * 4  # moe ffn = 4h
    assert fc1.shape == (256 // 2 * 2, 2 * f, 256) and fc2.shape == (256, 256, f)  # etp 1: unsplit width
    folded = lower(scn(tp=2, dp=2, ep=2, etp=2, sequence_parallel=True, batch=2)).graph
    (fc1_tp, _), _ = expert_gemms(folded)
    assert fc1_tp.shape == (256 * 2, f, 256)  # etp = tp: all the sequence's slots, half the width
    # expert gradients: EDP = tp*dp/(ep*etp) = 1 -> nothing to reduce for the experts
    assert not [t for t in g.tasks if t.comm is not None and ".expert" in t.name]


def test_expert_tp_between_one_and_tp_gathers_the_received_tokens_over_the_expert_tp_group():
    s = scn(tp=4, dp=2, ep=4, etp=2, sequence_parallel=True, batch=2)
    g = lower(s).graph
    ag = [t for t in g.tasks if t.name.endswith("etp_all_gather") and t.phase == "F"]
    rs = [t for t in g.tasks if t.name.endswith("etp_reduce_scatter") and t.phase == "F"]
    received = 256 // 4 * 2 * 256 * 2
    assert len(ag) == len(rs) == 4 and {t.comm.size_bytes for t in ag + rs} == {2 * received}
    assert {t.comm.group for t in ag} == {(0, 1)}


# ---- layers by their own kind ---------------------------------------------------------------------
DS = dict(MOE, num_experts=8, moe_ffn_hidden_size=128, moe_shared_expert_ffn_hidden_size=128,
          moe_first_dense_layers=1, ffn_hidden_size=512)


def test_dense_first_layers_lower_as_dense_layers_with_their_own_parameters_and_memory():
    s = scn(DS, dp=2, ep=2, pp=2, batch=4)
    plan = lower(s)
    g = plan.graph
    assert not tasks(g, "experts", layer=0) and len(tasks(g, "experts", layer=1)) == 2  # 2 micro-batches
    assert not [t for t in g.tasks if t.layer == 0 and t.comm is not None and t.comm.op == "all_to_all"]
    graph = build_op_graph(s.model, 1)
    dense_layer = sum(o.params for o in graph.dense_layer)
    moe_layer = sum(o.params for o in graph.layer)
    experts = sum(o.params for o in graph.layer if o.tp_split == "expert")
    st0, st1 = plan.stage_params[0], plan.stage_params[2]  # layers 0-1 and 2-3
    assert st0["expert"] == experts // 2 and st1["expert"] == 2 * experts // 2
    assert st0["dense"] - st1["dense"] == pytest.approx(dense_layer - moe_layer + experts
                                                        + graph.embed[0].params - sum(o.params for o in graph.head))
    args = (s.model, 1, 1, False, 1, "none", 2, 2, "flash")
    f_alloc = {t.layer: t.mem_delta_bytes for t in g.tasks if t.phase == "F" and t.mem_delta_bytes > 0
               and t.microbatch == 0 and t.layer >= 0}
    assert f_alloc[0] == layer_activation_bytes(*args, dense_mlp=True)
    assert f_alloc[1] == layer_activation_bytes(*args) != f_alloc[0]


def test_windowed_layers_run_their_own_attention_core():
    m = dict(MOE, num_experts=1, moe_top_k=1, sliding_window=32, sliding_window_pattern=2)
    g = lower(scn(m, batch=1)).graph
    core = {t.layer: sum(w.flops for w in t.work if w.kind == "attention") for t in g.tasks
            if t.phase == "F" and t.name.endswith(".attn")}
    s, w = 256, 32
    windowed = (w * (w + 1) / 2 + (s - w) * w) / (s * (s + 1) / 2)
    assert core[1] == core[3] and core[0] == core[2] == pytest.approx(core[1] * windowed)


# ---- routing imbalance, capacity, grouped GEMM, dispatchers -----------------------------------
def _expert_time(model, **par):
    s = scn(model, dp=4, ep=4, batch=4, **par)
    g = lower(s).graph
    gemms, task = expert_gemms(g)
    cost = CostModel(s, build_topology(s.cluster))
    return gemms, sum(cost.roofline.op_time_s(w) for w in gemms)


def test_imbalance_makes_the_slowest_ranks_expert_gemms_that_much_longer():
    # one expert per EP rank: the rank holding the busiest expert computes 1.5x the mean slots
    base, t_base = _expert_time(dict(MOE, seq_length=4096, hidden_size=1024))
    busy, t_busy = _expert_time(dict(MOE, seq_length=4096, hidden_size=1024, moe_load_imbalance=1.5))
    assert [w.flops for w in busy] == pytest.approx([1.5 * w.flops for w in base])
    assert t_busy == pytest.approx(1.5 * t_base, rel=0.01)


def test_imbalance_spreads_over_a_ranks_local_experts_and_grouped_gemm_is_one_kernel():
    # 8 experts on EP 4: 2 per rank. Busiest 1.5x, the other 7 share the rest: 6.5/7 each
    m = dict(MOE, num_experts=8, moe_load_imbalance=1.5)
    (fc1, _), _ = _expert_time(m)
    mean_rows = 256 * 2  # the sequence's routed slots = what a rank receives, balanced
    assert fc1.shape[0] == pytest.approx(mean_rows * (1.5 + 6.5 / 7) / 2, abs=1)
    per_expert, t_seq = _expert_time(dict(m, moe_grouped_gemm=False))
    assert [w.shape[0] for w in per_expert] == [mean_rows // 2 * 1.5, pytest.approx(mean_rows / 2 * 6.5 / 7, abs=1)] * 2
    assert [w.name for w in per_expert] == ["expert_fc1", "expert_fc1", "expert_fc2", "expert_fc2"]
    _, t_grouped = _expert_time(dict(m, moe_load_imbalance=1.0))
    _, t_seq_balanced = _expert_time(dict(m, moe_load_imbalance=1.0, moe_grouped_gemm=False))
    assert t_seq_balanced > t_grouped  # two launches and two tails instead of one


def test_capacity_factor_drops_or_pads_the_slots():
    drop, _ = _expert_time(dict(MOE, moe_capacity_factor=1.25, moe_load_imbalance=1.5))
    pad, _ = _expert_time(dict(MOE, moe_capacity_factor=1.25, moe_pad_to_capacity=True, moe_load_imbalance=1.5))
    mean_rows = 256 * 2
    assert drop[0].shape[0] == mean_rows * 1.25  # the busiest expert is cut at its capacity
    assert pad[0].shape[0] == mean_rows * 1.25  # every expert computes its full capacity
    a2a = lambda m: {t.comm.size_bytes for t in lower(scn(m, dp=4, ep=4, batch=4)).graph.tasks  # noqa: E731
                     if t.comm is not None and t.comm.op == "all_to_all"}
    assert a2a(dict(MOE, moe_capacity_factor=1.25, moe_pad_to_capacity=True)) == {256 * 2 * 1.25 * 256 * 2}
    assert a2a(dict(MOE, moe_capacity_factor=1.25)) == {256 * 2 * 256 * 2}


def test_allgather_dispatcher_gathers_the_tokens_and_reduce_scatters_the_outputs():
    g = lower(scn(dict(MOE, moe_token_dispatcher="allgather"), dp=4, ep=4, batch=4)).graph
    ep = [t for t in g.tasks if t.comm is not None and t.comm.axis == "ep" and t.phase == "F"]
    assert Counter(t.comm.op for t in ep) == {"all_gather": 4, "reduce_scatter": 4}
    assert {t.comm.size_bytes for t in ep} == {256 * 256 * 2 * 4}  # every EP rank's tokens, h wide


def test_router_scores_and_top_k_are_a_kernel_of_their_own():
    g = build_op_graph(scn().model, 1)
    (topk,) = [o for o in g.layer if o.name == "router_topk"]
    assert topk.shape == (256, 4) and topk.fwd_bytes == 2 * 2 * 256 * 4 and topk.tp_split == "sequence"


def test_imbalance_slows_the_step_but_adds_no_hardware_flops():
    # dropless routing: the cluster computes T·k slots whatever their spread; every EP rank is lowered
    # as the busiest (it sets the pace), and HFU counts the mean rank's expert FLOPs, not its own
    from simulator.pipeline import simulate

    def run(imbalance):
        s = scn(dict(MOE, num_experts=8, moe_load_imbalance=imbalance), dp=4, ep=4, batch=4)
        m = simulate(s).metrics
        return m["iteration_time_s"], m["hfu"] * m["iteration_time_s"]

    (t1, hw1), (t15, hw15) = run(1.0), run(1.5)
    assert t15 > t1
    assert hw15 == pytest.approx(hw1, rel=1e-9)


def test_expert_mean_share_closed_form():
    from simulator.strategy.sharding import expert_mean_share
    g = build_op_graph(scn(dict(MOE, num_experts=8, moe_load_imbalance=1.5)).model, 1, "bf16")
    (fc1,) = [op for op in g.layer if op.name == "expert_fc1"]
    # 2 experts per rank on EP 4: the busiest rank computes (1.5 + 6.5/7) / 2 of the mean rank's 512
    # slots (256 tokens x top-2), in whole rows; one expert per rank on EP 8: 1.5x
    assert fc1.shape[0] == 512
    assert expert_mean_share(fc1, 4) == 512 / math.ceil(512 * (1.5 + 6.5 / 7) / 2 - 1e-9)
    assert expert_mean_share(fc1, 8) == pytest.approx(1 / 1.5)
    assert all(expert_mean_share(op, 4) == 1.0 for op in g.layer if op.tp_split != "expert")


# ---- shared experts beside the all-to-alls (moe_shared_expert_overlap) ---------------------------------
SHARED = dict(MOE, num_experts=8, moe_ffn_hidden_size=256, moe_shared_expert_ffn_hidden_size=512,
              seq_length=1024)


def _shared_run(overlap, **par):
    from simulator.pipeline import simulate
    par = {"dp": 4, "ep": 4, **par}
    return simulate(scn(dict(SHARED, moe_shared_expert_overlap=overlap), nodes=4, gpus=1, batch=8, **par))


def test_overlapped_shared_experts_run_between_the_all_to_alls_on_the_compute_stream():
    g = lower(scn(dict(SHARED, moe_shared_expert_overlap=True), dp=4, ep=4, batch=4)).graph
    lane = [g.tasks[i].name for i in g.streams[(0, "compute")] if g.tasks[i].name.startswith("F0.L1.")]
    assert lane[lane.index("F0.L1.mlp"):] == ["F0.L1.mlp", "F0.L1.shared_before", "F0.L1.experts",
                                              "F0.L1.shared_after", "F0.L1.mlp_out"]
    by = {t.name: t for t in g.tasks}
    assert by["F0.L1.shared_before"].deps == (by["F0.L1.mlp"].id,)  # not on the dispatch
    assert by["F0.L1.dispatch"].id in by["F0.L1.experts"].deps
    assert by["F0.L1.combine"].id in by["F0.L1.mlp_out"].deps
    # backward: the shared experts' gradients first, beside the combine's conjugate
    back = [g.tasks[i].name for i in g.streams[(0, "compute")] if g.tasks[i].name.startswith("B0.L1.")]
    assert back.index("B0.L1.shared_out.grad") < back.index("B0.L1.shared_in.grad") < back.index("B0.L1.experts")


@pytest.mark.parametrize("recompute", [{}, {"recompute": "selective", "recompute_modules": ["moe", "shared_experts"]},
                                       {"recompute": "full"}])
def test_overlap_moves_the_shared_experts_without_changing_any_work(recompute):
    on, off = (lower(scn(dict(SHARED, moe_shared_expert_overlap=o), dp=4, ep=4, batch=4, **recompute)).graph
               for o in (True, False))
    flops = lambda g, c: sum(w.flops for t in g.tasks if t.category == c for w in t.work)  # noqa: E731
    for category in ("compute", "recompute"):
        assert flops(on, category) == pytest.approx(flops(off, category), rel=1e-12)
    off_post = [t for t in off.tasks if t.name == "F0.L1.mlp_out"][0]
    assert {w.name for w in off_post.work} >= {"shared_fc1", "shared_fc2"}


def test_overlap_hides_the_shared_experts_behind_exposed_all_to_alls_and_is_never_slower():
    # EP 4 across 4 single-GPU nodes: the all-to-alls cross the network and are exposed
    on, off = _shared_run(True), _shared_run(False)
    t_on, t_off = on.metrics["iteration_time_s"], off.metrics["iteration_time_s"]
    assert t_on < t_off
    shared = sum(e.end_s - e.start_s for e in on.trace.on(0) if ".shared_" in e.name)
    assert t_off - t_on <= shared + 1e-12  # at most what the shared experts took
    assert on.metrics["mfu"] > off.metrics["mfu"]


@pytest.mark.parametrize("model, message", [
    (dict(MOE, moe_shared_expert_overlap=True), "needs shared experts"),
    (dict(SHARED, moe_shared_expert_overlap=True, moe_token_dispatcher="allgather"), "alltoall token dispatcher")])
def test_overlap_without_shared_experts_or_with_the_allgather_dispatcher_is_refused(model, message):
    with pytest.raises(ValueError, match=message):
        scn(model, dp=2, ep=2)
