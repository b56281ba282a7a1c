"""FP8 scaling recipes (training.fp8_recipe) as Transformer Engine runs them: each recipe's quantization
kernels and bytes per TE linear in closed form, their order in the backward, the block-scaled GEMMs'
rates, the cached weight copies, and the scenario rules that refuse a recipe by name."""

import pytest

from simulator.analysis.buffers import static_buffers
from simulator.cost.compute import BLOCK_SCALED_GEMM_RATE, EFFICIENCIES, RooflineCompute
from simulator.hardware.gpus import GPU_PRESETS
from simulator.model.fp8 import (AMAX_BYTES, CAST_BYTES, CAST_TRANSPOSE_BYTES, FP8_RECIPES, SCALE_KERNEL_BYTES,
                                 TRANSPOSE_ONLY_BYTES, fp8_transposes, weight_copy_bytes_per_param)
from simulator.model.opgraph import build_op_graph, gemm_flops
from simulator.model.spec import ModelSpec
from simulator.scenario import scenario_from_dict
from simulator.scenario_checks import ScenarioError
from simulator.strategy.sharding import shard_ops, shard_ops_backward
from simulator.tasks import OpWork

H100 = GPU_PRESETS["h100-sxm5-80gb"]
B200 = GPU_PRESETS["b200-sxm-180gb"]
A100 = GPU_PRESETS["a100-sxm4-80gb"]
LLAMA = ModelSpec("llama-small", num_layers=2, hidden_size=1024, num_attention_heads=8, num_kv_heads=2,
                  vocab_size=4096, seq_length=512, ffn_hidden_size=3584, mlp="swiglu")
GEMMS = ("qkv", "attn_out", "fc1", "fc2")
AFTER_NORM = {"qkv": True, "attn_out": False, "fc1": True, "fc2": False}  # ln1 -> qkv, ln2 -> fc1


def layer(recipe):
    return {o.name: o for o in build_op_graph(LLAMA, 1, "fp8", recipe).layer}


def widths(ops):
    """(tokens, input width k, output width n) of each TE linear."""
    return {g: (ops[g].shape[0], ops[g].shape[2], ops[g].shape[1]) for g in GEMMS}


def test_delayed_is_the_default_and_todays_graph():
    assert build_op_graph(LLAMA, 1, "fp8") == build_op_graph(LLAMA, 1, "fp8", "delayed")
    ops = layer("delayed")
    for g, (t, k, n) in widths(ops).items():
        x = TRANSPOSE_ONLY_BYTES if AFTER_NORM[g] else CAST_TRANSPOSE_BYTES
        assert ops[f"{g}.fp8_cast_x"].fwd_bytes == t * k * x
        assert ops[f"{g}.fp8_cast_dy"].bwd_bytes == t * n * CAST_TRANSPOSE_BYTES
        assert ops[g].precision == "fp8"
    assert len(ops) == 11 + 2 * 4


def test_current_scaling_adds_an_amax_pass_and_a_scale_kernel_per_tensor():
    # Float8CurrentScalingQuantizer::quantize_impl: compute_amax (read 2 B), compute_scale_from_amax,
    # cast-transpose (2 + 1 + 1 B); after a norm the norm kernel computes the amax (FUSED_NORM_AMAX_FP8).
    ops = layer("current")
    for g, (t, k, n) in widths(ops).items():
        assert ops[g].precision == "fp8"  # the same per-tensor-scaled GEMM as delayed
        assert ops[f"{g}.fp8_cast_x"].fwd_bytes == t * k * 4
        assert ops[f"{g}.fp8_scale_x"].fwd_bytes == SCALE_KERNEL_BYTES == 8
        if AFTER_NORM[g]:
            assert f"{g}.fp8_amax_x" not in ops
        else:
            assert ops[f"{g}.fp8_amax_x"].fwd_bytes == t * k * AMAX_BYTES == t * k * 2
        assert ops[f"{g}.fp8_amax_dy"].bwd_bytes == t * n * 2
        assert ops[f"{g}.fp8_scale_dy"].bwd_bytes == 8
        assert ops[f"{g}.fp8_cast_dy"].bwd_bytes == t * n * 4
    # per layer: 3 kernels per tensor, less the two amax passes the norms absorb
    assert len(ops) == 11 + 4 * 2 * 3 - 2


@pytest.mark.parametrize("recipe", ["delayed", "current"])
def test_blackwell_makes_no_transposed_copy_for_the_per_tensor_recipes(recipe):
    """FP8 GEMMs run every layout on Blackwell (TE: create_transpose = columnwise_usage &&
    !nvte_is_non_tn_fp8_gemm_supported()): a cast writes one FP8 tensor (2 + 1 B), a norm's FP8 output
    needs no transpose kernel, TE caches one FP8 weight; the block recipes keep both copies."""
    assert fp8_transposes("hopper") and not fp8_transposes("blackwell")
    ops = {o.name: o for o in build_op_graph(LLAMA, 1, "fp8", recipe, fp8_transpose=False).layer}
    for g, (t, k, n) in widths(ops).items():
        if recipe == "delayed" and AFTER_NORM[g]:
            assert f"{g}.fp8_cast_x" not in ops
        else:
            assert ops[f"{g}.fp8_cast_x"].fwd_bytes == t * k * CAST_BYTES == t * k * 3
        assert ops[f"{g}.fp8_cast_dy"].bwd_bytes == t * n * 3
    assert weight_copy_bytes_per_param(recipe, transpose=False) == 1
    assert weight_copy_bytes_per_param("mxfp8", transpose=False) == weight_copy_bytes_per_param("mxfp8")
    scn = scenario_from_dict(raw(recipe, cluster="dgx-b200"))
    assert static_buffers(scn, {"dense": 1_000_000, "expert": 0}, 0)["fp8_weight_cache"] == linear_params(scn)
    assert build_op_graph(LLAMA, 1, "fp8", recipe) == build_op_graph(LLAMA, 1, "fp8", recipe, fp8_transpose=True)


@pytest.mark.parametrize("recipe, per_elem, precision", [
    # one kernel: read BF16 (2 B), write the row-wise and column-wise FP8 copies (1 + 1 B) and their
    # scales: FP32 per 1x128 tile (blockwise), E8M0 byte per 1x32 block (MXFP8)
    ("blockwise", 2 + 2 * (1 + 4 / 128), "fp8-block"),
    ("mxfp8", 2 + 2 * (1 + 1 / 32), "mxfp8"),
])
def test_block_recipes_quantize_both_copies_with_their_scales_in_one_kernel(recipe, per_elem, precision):
    ops = layer(recipe)
    assert per_elem == 4.0625
    for g, (t, k, n) in widths(ops).items():
        assert ops[g].precision == precision
        assert ops[f"{g}.fp8_cast_x"].fwd_bytes == t * k * per_elem  # the norms run unfused: no FP8 output
        assert ops[f"{g}.fp8_cast_dy"].bwd_bytes == t * n * per_elem
    assert len(ops) == 11 + 2 * 4


@pytest.mark.parametrize("recipe", FP8_RECIPES)
def test_recipes_change_kernels_not_the_model(recipe):
    g, bf16 = build_op_graph(LLAMA, 1, "fp8", recipe), build_op_graph(LLAMA, 1, "bf16")
    assert g.num_params() == bf16.num_params() and g.fwd_flops() == bf16.fwd_flops()
    assert g.bwd_flops() == bf16.bwd_flops()
    assert all(o.precision == "" for o in g.head + g.embed)  # the output layer is not a TE module
    with pytest.raises(ValueError):
        build_op_graph(LLAMA, 1, "fp8", "nvfp4")


def test_current_scaling_kernels_run_in_order_in_both_passes():
    ops = build_op_graph(LLAMA, 1, "fp8", "current").layer
    fwd = [w.name for w in shard_ops(ops, 1, False, 1, 1)]
    assert fwd[fwd.index("attn_out") - 3:fwd.index("attn_out") + 1] == [
        "attn_out.fp8_amax_x", "attn_out.fp8_scale_x", "attn_out.fp8_cast_x", "attn_out"]
    assert not any(n.endswith("_dy") for n in fwd)
    bwd = [w.name for w in shard_ops_backward(ops, 1, False, 1, 1, "BW")]
    i = bwd.index("fc2")
    assert bwd[i - 3:i + 1] == ["fc2.fp8_amax_dy", "fc2.fp8_scale_dy", "fc2.fp8_cast_dy", "fc2"]
    assert not any(n.endswith("_x") for n in bwd)


def test_quantize_kernels_cost_their_bytes_and_the_scale_kernel_its_launch():
    rc, eff = RooflineCompute(H100, "fp8"), EFFICIENCIES["hopper"]
    t, k = 4096, 8192
    cast = OpWork("fc2.fp8_cast_x", "elementwise", 0.0, t * k * 4.0625, (t, k))
    assert rc.op_time_s(cast) == pytest.approx(t * k * 4.0625 / (H100.hbm_bandwidth_Bps * eff.memory)
                                               + eff.kernel_overhead_s)
    scale = OpWork("fc2.fp8_scale_x", "elementwise", 0.0, SCALE_KERNEL_BYTES, (t, k))
    assert rc.op_time_s(scale) == pytest.approx(eff.kernel_overhead_s, rel=1e-3)


@pytest.mark.parametrize("gpu, precision", [(H100, "fp8-block"), (B200, "fp8-block"), (B200, "mxfp8")])
@pytest.mark.parametrize("shape", [(8192, 8192, 8192), (4096, 28672, 4096), (4096, 4096, 14336)])
def test_block_scaled_gemm_lies_between_bf16_and_half_of_it(gpu, precision, shape):
    rc = RooflineCompute(gpu, "fp8")
    m, n, k = shape
    bf16 = RooflineCompute(gpu, "bf16").op_time_s(OpWork("g", "gemm", gemm_flops(m, n, k), 0.0, shape))
    tensor = rc.op_time_s(OpWork("g", "gemm", gemm_flops(m, n, k), 0.0, shape, "fp8"))
    block = rc.op_time_s(OpWork("g", "gemm", gemm_flops(m, n, k), 0.0, shape, precision))
    assert bf16 / 2 < tensor < block < bf16
    # the per-tensor kernel's main loop at the block-scaled rate; the launch floor unchanged
    floor = EFFICIENCIES[gpu.architecture].kernel_overhead_s
    rate = BLOCK_SCALED_GEMM_RATE[precision, gpu.architecture]
    # (up to the fp32 fixup of a stream-K kernel's split tiles: memory traffic, not main loop)
    assert block - floor == pytest.approx((tensor - floor) / rate, rel=2e-3)


def test_block_scaled_rates_are_the_published_ratios():
    assert BLOCK_SCALED_GEMM_RATE["fp8-block", "hopper"] == 1.75 / 2.0  # cuBLAS 12.9 blog vs per-tensor 2x
    assert BLOCK_SCALED_GEMM_RATE["mxfp8", "blackwell"] == pytest.approx(0.951, abs=5e-4)  # TE B300 table


def test_block_scaled_gemm_on_a_gpu_without_it_is_an_internal_error():
    shape = (4096, 4096, 4096)
    with pytest.raises(ValueError, match="has no mxfp8 GEMM"):
        RooflineCompute(H100, "fp8").op_time_s(OpWork("g", "gemm", gemm_flops(*shape), 0.0, shape, "mxfp8"))
    with pytest.raises(ValueError, match="no FP8 tensor cores"):
        RooflineCompute(A100, "bf16").op_time_s(OpWork("g", "gemm", gemm_flops(*shape), 0.0, shape, "fp8-block"))


def raw(recipe, dtype="fp8", cluster="dgx-h100"):
    return {"model": {"num_layers": 2, "hidden_size": 1024, "num_attention_heads": 8, "vocab_size": 4096,
                      "seq_length": 512, "mlp": "swiglu"},
            "cluster": {"preset": cluster, "num_nodes": 1},
            "parallelism": {"tp": 1, "dp": 8, "zero_stage": 1},
            "training": {"global_batch_size": 8, "dtype": dtype, "fp8_recipe": recipe}}


@pytest.mark.parametrize("recipe, per_param", [("delayed", 2), ("current", 2),
                                               ("blockwise", 2 * (1 + 4 / (128 * 128))),
                                               ("mxfp8", 2 * (1 + 1 / 32))])
def test_weight_cache_holds_both_quantized_copies_and_their_scales(recipe, per_param):
    cluster = "dgx-b200" if recipe == "mxfp8" else "dgx-h100"
    scn = scenario_from_dict(raw(recipe, cluster=cluster))
    assert weight_copy_bytes_per_param(recipe) == per_param
    assert static_buffers(scn, {"dense": 1_000_000, "expert": 0}, 0)["fp8_weight_cache"] == \
        pytest.approx(linear_params(scn) * per_param)


def linear_params(scn):
    """The TE linear weights of ``raw``'s two bias-free SwiGLU layers, closed form: QKV h x (h + 2 kv hd),
    the projection h x h, fc1 h x 2f and fc2 f x h; the embedding and output layer are not cached."""
    m = scn.model
    h, hd = m.hidden_size, m.hidden_size // m.num_attention_heads
    assert not m.bias
    return m.num_layers * (h * (h + 2 * m.num_kv_heads * hd) + h * h + 3 * h * m.ffn_hidden_size)


def test_recipes_are_refused_by_name_with_the_numbers():
    with pytest.raises(ScenarioError, match="training.fp8_recipe = 'current' needs training.dtype = 'fp8', "
                                            "got 'bf16'"):
        scenario_from_dict(raw("current", dtype="bf16"))
    with pytest.raises(ScenarioError, match="training.fp8_recipe = 'mxfp8' needs a blackwell GPU; "
                                            "cluster.gpu h100-sxm5-80gb is hopper"):
        scenario_from_dict(raw("mxfp8"))
    with pytest.raises(ScenarioError, match="training.fp8_recipe must be one of delayed, current, blockwise, "
                                            "mxfp8, got 'nvfp4'"):
        scenario_from_dict(raw("nvfp4"))
    assert scenario_from_dict(raw("delayed", dtype="bf16")).training.fp8_recipe == "delayed"  # the default
    assert scenario_from_dict(raw("blockwise")).training.fp8_recipe == "blockwise"
    assert scenario_from_dict(raw("blockwise", cluster="dgx-b200")).training.fp8_recipe == "blockwise"


def test_a_bad_recipe_exits_2_from_the_command_line(capsys):
    from simulator.__main__ import main
    assert main(["run", "scenarios/llama31-70b-fp8-64xh100.toml", "--set", "training.fp8_recipe=mxfp8",
                 "--json"]) == 2
    assert "needs a blackwell GPU" in capsys.readouterr().err


def test_an_mxfp8_scenario_runs_on_b200():
    from simulator.pipeline import simulate
    from simulator.scenario import load_scenario
    res = simulate(load_scenario("scenarios/llama3-8b-mxfp8-8xb200.toml"))
    m = res.metrics
    assert res.scenario.training.fp8_recipe == "mxfp8" and res.scenario.cluster.gpu.architecture == "blackwell"
    assert m["iteration_time_s"] > 0 and m["fits_in_memory"]


def test_the_recipe_reaches_the_simulated_step_and_the_search_estimate():
    """End to end: the lowering and the plan search's estimate build the op graph of the scenario's
    recipe, so block-scaled FP8 (extra quantization bytes, 0.875 of the per-tensor rate on Hopper)
    makes an H100 step slower than delayed scaling, and current scaling's amax passes too."""
    from simulator.explore.estimate import EstimateCache
    from simulator.pipeline import simulate
    from simulator.scenario import scenario_from_dict

    def scn(recipe):
        return scenario_from_dict({
            "model": {"num_layers": 2, "hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 32000,
                      "seq_length": 4096},
            "cluster": {"preset": "dgx-h100", "num_nodes": 1, "gpus_per_node": 1},
            "training": {"global_batch_size": 2, "dtype": "fp8", "fp8_recipe": recipe}}, default_name=recipe)

    t = {r: simulate(scn(r)).metrics["iteration_time_s"] for r in ("delayed", "current", "blockwise")}
    assert t["delayed"] < t["current"] < t["blockwise"]
    cache = EstimateCache()
    graphs = {r: cache.graph(scn(r)) for r in ("delayed", "blockwise")}
    assert graphs["delayed"] is not graphs["blockwise"]
    assert {op.precision for op in graphs["blockwise"].layer if op.kind == "gemm"} != \
        {op.precision for op in graphs["delayed"].layer if op.kind == "gemm"}


@pytest.mark.parametrize("recipe,dtype,expect", [("delayed", "fp8", True), ("current", "fp8", False),
                                                 ("delayed", "bf16", False)])
def test_delayed_scaling_all_reduces_a_chunks_amaxes_after_each_pass(recipe, dtype, expect):
    """TE delayed scaling (quantization.py reduce_and_update_fp8_tensors, async_op=False): after each
    model chunk's forward and backward of every micro-batch, one blocking MAX all-reduce on the compute
    stream over the stage's TP x DP x CP ranks, of 4 B x (3 forward | 2 backward) x the chunk's FP8 GEMMs."""
    from simulator.strategy.lower import lower
    raw = {"model": {"preset": "llama3-8b", "num_layers": 4}, "cluster": {"preset": "dgx-h100", "num_nodes": 1},
           "parallelism": {"tp": 2, "pp": 2, "dp": 2, "sequence_parallel": True},
           "training": {"global_batch_size": 8, "micro_batch_size": 1, "dtype": dtype}}
    if dtype == "fp8":
        raw["training"]["fp8_recipe"] = recipe
    plan = lower(scenario_from_dict(raw))
    rank = plan.graph.ranks[0]
    amax = [t for t in plan.graph.tasks if t.rank == rank and t.name.endswith("amax_all_reduce")]
    if not expect:
        assert not amax
        return
    stage = plan.mesh.group("tp_dp_cp", rank)
    assert len(stage) == 4 and all(t.comm.group == stage and t.stream == "compute" for t in amax)
    per_layer = 4  # qkv, proj, fc1 (gate and up in one GEMM), fc2: the FP8 linears of a layer
    sizes = {t.phase: t.comm.size_bytes for t in amax}
    assert len(amax) == 2 * 4  # F and B of 4 micro-batches, one chunk of 2 layers
    assert sizes == {"F": 4.0 * 3 * per_layer * 2, "B": 4.0 * 2 * per_layer * 2}


def _tp_comms(raw_model: dict, training: dict, sp: bool = True, gpu: str = "dgx-h100"):
    """(name tail, op, bytes, stream) of rank 0's TP collectives of layer 1, micro-batch 0, and the
    hidden-state tensor's elements b·s·h."""
    from simulator.strategy.lower import lower
    scn = scenario_from_dict({"model": {"num_layers": 2, **raw_model}, "cluster": {"preset": gpu, "num_nodes": 1},
                              "parallelism": {"tp": 4, "pp": 1, "sequence_parallel": sp,
                                              **({"ep": 2} if "mixtral" in raw_model["preset"] else {})},
                              "training": {"global_batch_size": 2, "micro_batch_size": 1, **training}})
    plan = lower(scn)
    rank = plan.graph.ranks[0]
    out = [(t.name.split(".", 2)[2], t.comm.op, t.comm.size_bytes, t.stream) for t in plan.graph.tasks
           if t.rank == rank and t.kind == "comm" and t.comm.axis == "tp" and t.layer == 1 and t.microbatch == 0]
    return out, scn.model.seq_length * scn.model.hidden_size


@pytest.mark.parametrize("recipe,per_elem", [("delayed", 1.0), ("current", 1.0), ("blockwise", 1 + 4 / 128)])
def test_fp8_sequence_parallel_gathers_move_the_quantized_tensor(recipe, per_elem):
    """TE all-gathers an FP8 linear's quantized input (QKV's and fc1's, forward and again for the weight
    gradients) and a row-parallel linear's quantized output gradient (projection, fc2): 1 B per element
    plus the block recipes' scales; the reduce-scatters carry BF16 outputs (2 B)."""
    comms, elems = _tp_comms({"preset": "llama3-8b"}, {"dtype": "fp8", "fp8_recipe": recipe})
    gathers = {n: b for n, op, b, _ in comms if op == "all_gather"}
    assert set(gathers) == {"attn.all_gather", "mlp.all_gather", "mlp_grad.all_gather", "attn_grad.all_gather",
                            "mlp.input_all_gather", "attn.input_all_gather"}
    assert all(b == pytest.approx(elems * per_elem) for b in gathers.values())
    scatters = [b for _, op, b, _ in comms if op == "reduce_scatter"]
    assert len(scatters) == 4 and all(b == elems * 2 for b in scatters)
    bf16, _ = _tp_comms({"preset": "llama3-8b"}, {"dtype": "bf16"})
    assert all(b == elems * 2 for n, op, b, _ in bf16 if op == "all_gather")


def test_fp8_gathers_outside_te_linears_stay_bf16():
    """An MoE layer's tokens enter its experts through the dispatcher, in BF16, and MLA's down
    projections are gathered in BF16: only the TE linears' own gathers are quantized."""
    comms, elems = _tp_comms({"preset": "mixtral-8x7b"}, {"dtype": "fp8"})
    sizes = {n: b for n, op, b, _ in comms if op == "all_gather"}
    assert sizes["mlp.all_gather"] == sizes["mlp_grad.all_gather"] == elems * 2
    assert sizes["attn.all_gather"] == sizes["attn_grad.all_gather"] == elems
    mla, elems = _tp_comms({"preset": "deepseek-v3", "num_layers": 4, "mtp_layers": 0},
                           {"dtype": "fp8", "fp8_recipe": "blockwise"})
    sizes = {n: b for n, op, b, _ in mla if op == "all_gather"}
    assert sizes["attn.all_gather"] == elems * 2


@pytest.mark.parametrize("recipe,sp,expect", [("current", True, 4), ("delayed", True, 0), ("current", False, 0)])
def test_current_scaling_all_reduces_the_amax_over_tp_before_a_fresh_gather(recipe, sp, expect):
    """Current scaling with SP: a 4-byte MAX all-reduce of the amax over the TP group on the compute
    stream, right before the gathers of a just-quantized tensor (QKV's and fc1's inputs, the projection's
    and fc2's output gradients), not before the weight-gradient gathers of the saved FP8 inputs."""
    comms, _ = _tp_comms({"preset": "llama3-8b"}, {"dtype": "fp8", "fp8_recipe": recipe}, sp=sp)
    names = [n for n, *_ in comms]
    amax = [(n, op, b, s) for n, op, b, s in comms if n.endswith("amax_reduce_tp")]
    assert len(amax) == expect
    assert all(op == "all_reduce" and b == 4.0 and s == "compute" for _, op, b, s in amax)
    for n, *_ in amax:
        assert names[names.index(n) + 1] == n.replace("amax_reduce_tp", "all_gather")


@pytest.mark.parametrize("recipe", FP8_RECIPES)
def test_expert_linears_quantize_their_routed_rows(recipe):
    """TE's GroupedLinear quantizes the token slots the dispatcher hands the experts (fc1's input, fc2's
    input, both output gradients) like a dense linear, over the expert GEMMs' rows, load and grouping."""
    from simulator.model.fp8 import quantize_kernels
    from simulator.model.presets import MODEL_PRESETS
    ops = {o.name: o for o in build_op_graph(MODEL_PRESETS["mixtral-8x7b"], 1, "fp8", recipe).layer}
    for gemm in ("expert_fc1", "expert_fc2"):
        g = ops[gemm]
        rows, n, k = g.shape
        for name, per_elem, fixed in quantize_kernels(recipe, False):
            x, dy = ops[f"{gemm}.{name}_x"], ops[f"{gemm}.{name}_dy"]
            assert x.fwd_bytes == per_elem * rows * k + fixed and x.bwd_bytes == 0
            assert dy.bwd_bytes == per_elem * rows * n + fixed and dy.fwd_bytes == 0
            for kernel in (x, dy):
                assert (kernel.tp_split, kernel.experts, kernel.expert_load, kernel.grouped) == \
                    ("expert", g.experts, g.expert_load, g.grouped)
