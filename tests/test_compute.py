"""Compute cost of one kernel: closed forms for memory-bound kernels, FP8 GEMMs as Transformer Engine runs
them, FlashAttention's backward recompute, and the FP8 op graph."""

import dataclasses

import pytest

from simulator.cost.attention_eff import attention_efficiency
from simulator.cost.compute import EFFICIENCIES, FLASH_BWD_RECOMPUTE, RooflineCompute
from simulator.hardware.gpus import GPU_PRESETS
from simulator.model.fp8 import CAST_TRANSPOSE_BYTES, TRANSPOSE_ONLY_BYTES
from simulator.model.opgraph import attention_flops, build_op_graph, gemm_flops
from simulator.model.spec import ModelSpec
from simulator.strategy.blocks import build_blocks, split_work
from simulator.tasks import OpWork

H100 = GPU_PRESETS["h100-sxm5-80gb"]
A100 = GPU_PRESETS["a100-sxm4-80gb"]
LLAMA = ModelSpec("llama-small", num_layers=2, hidden_size=1024, num_attention_heads=8, num_kv_heads=2,
                  vocab_size=4096, seq_length=512, ffn_hidden_size=3584, mlp="swiglu")


@pytest.mark.parametrize("gpu", [A100, H100])
def test_memory_bound_kernel_is_bytes_over_bandwidth_plus_launch_floor(gpu):
    rc = RooflineCompute(gpu, "bf16")
    eff = EFFICIENCIES[gpu.architecture]
    op = OpWork("ln", "norm", 0.0, 3e8, (1, 1))
    assert rc.op_time_s(op) == pytest.approx(3e8 / (gpu.hbm_bandwidth_Bps * eff.memory) + eff.kernel_overhead_s)
    # a tiny kernel costs its launch floor, not zero
    assert rc.op_time_s(OpWork("tiny", "elementwise", 0.0, 8.0, (1, 1))) == pytest.approx(
        eff.kernel_overhead_s, rel=1e-3)


@pytest.mark.parametrize("shape", [(8192, 8192, 8192), (4096, 28672, 4096), (4096, 4096, 14336), (2048, 9216, 12288)])
def test_fp8_gemm_lies_between_bf16_and_half_of_it(shape):
    rc = RooflineCompute(H100, "fp8")
    m, n, k = shape
    bf16 = rc.op_time_s(OpWork("g", "gemm", gemm_flops(m, n, k), 0.0, shape))
    fp8 = rc.op_time_s(OpWork("g", "gemm", gemm_flops(m, n, k), 0.0, shape, "fp8"))
    assert bf16 / 2 < fp8 < bf16
    # its shorter main loop (128-element K slices) loses more to the tile prologue/epilogue at short k
    short = rc.op_time_s(OpWork("g", "gemm", gemm_flops(m, n, 1024), 0.0, (m, n, 1024), "fp8"))
    short_bf16 = rc.op_time_s(OpWork("g", "gemm", gemm_flops(m, n, 1024), 0.0, (m, n, 1024)))
    assert short / short_bf16 > fp8 / bf16


def test_fp8_training_runs_everything_but_the_fp8_gemms_at_bf16_rates():
    fp8, bf16 = RooflineCompute(H100, "fp8"), RooflineCompute(H100, "bf16")
    att = OpWork("a", "attention", attention_flops(1, 8, 4096, 4096, 128), 1e6, (1, 8, 4096, 4096, 128))
    gemm = OpWork("g", "gemm", gemm_flops(4096, 4096, 4096), 0.0, (4096, 4096, 4096))
    assert fp8.op_time_s(att) == bf16.op_time_s(att)
    assert fp8.op_time_s(gemm) == bf16.op_time_s(gemm)  # the LM head, the router: no TE module
    with pytest.raises(ValueError, match="no FP8"):
        RooflineCompute(A100, "bf16").op_time_s(OpWork("g", "gemm", gemm.flops, 0.0, gemm.shape, "fp8"))


def test_flash_backward_executes_two_and_a_half_forwards():
    rc = RooflineCompute(H100, "bf16")
    shape = (1, 16, 8192, 8192, 128)
    f = attention_flops(*shape)
    fwd = rc.op_time_s(OpWork("a", "attention", f, 1e6, shape))
    bwd = rc.op_time_s(OpWork("a", "attention", 2 * f, 2e6, shape, backward=True))  # charged 2x (MFU convention)
    floor = EFFICIENCIES["hopper"].kernel_overhead_s
    # 2.5x the forward's FLOPs, each pass at its own measured efficiency (attention_eff)
    fwd_eff, bwd_eff = (attention_efficiency("hopper", "flash", bwd, True, 128, 8192, 8192) for bwd in (False, True))
    assert 2 * FLASH_BWD_RECOMPUTE == pytest.approx(2.5)
    assert (bwd - floor) / (fwd - floor) == pytest.approx(2 * FLASH_BWD_RECOMPUTE * fwd_eff / bwd_eff)


def test_ring_attention_steps_attend_to_one_kv_block_each():
    steps = split_work((OpWork("core", "attention", 8.0, 4.0, (1, 8, 1024, 4096, 128)),), 4)
    assert steps[0].shape == (1, 8, 1024, 1024, 128) and steps[0].flops == 2.0
    rc = RooflineCompute(H100, "bf16")
    g = build_op_graph(LLAMA, 1)
    bw = build_blocks(g, 1, False, 2, 1).core_steps["BW"][0]
    fw = build_blocks(g, 1, False, 2, 1).core_steps["F"][0]
    floor = EFFICIENCIES["hopper"].kernel_overhead_s
    # a backward ring step is still recognised as a backward (recompute included: 2.5x, not 2x, at each
    # pass's measured efficiency, less the part of this short step that is memory-bound)
    assert bw.shape[2:4] == fw.shape[2:4] == (256, 256)
    ratio = 2.5 * (attention_efficiency("hopper", "flash", False, True, 128, 256, 256)
                   / attention_efficiency("hopper", "flash", True, True, 128, 256, 256))
    assert 0.96 * ratio < (rc.op_time_s(bw) - floor) / (rc.op_time_s(fw) - floor) <= ratio * (1 + 1e-9)


def test_fp8_op_graph_marks_the_te_linears_and_adds_their_casts():
    bf16, fp8 = build_op_graph(LLAMA, 1, "bf16"), build_op_graph(LLAMA, 1, "fp8")
    assert fp8.dtype_bytes == bf16.dtype_bytes == 2  # activations stay BF16
    gemms = {o.name: o.precision for o in fp8.layer if o.kind == "gemm"}
    assert gemms == {"qkv": "fp8", "attn_out": "fp8", "fc1": "fp8", "fc2": "fp8"}
    assert all(o.precision == "" for o in fp8.head + fp8.embed)  # output layer: not a TE module
    assert fp8.num_params() == bf16.num_params() and fp8.fwd_flops() == bf16.fwd_flops()
    names = [o.name for o in fp8.layer]
    for g in gemms:  # the input cast before the GEMM, the gradient cast after it (runs first in backward)
        assert names.index(f"{g}.fp8_cast_x") + 1 == names.index(g) == names.index(f"{g}.fp8_cast_dy") - 1
    ops = {o.name: o for o in fp8.layer}
    t, h, f = 512, 1024, 3584
    assert ops["qkv.fp8_cast_x"].fwd_bytes == t * h * TRANSPOSE_ONLY_BYTES  # the norm wrote FP8 already
    assert ops["fc2.fp8_cast_x"].fwd_bytes == t * f * CAST_TRANSPOSE_BYTES  # SwiGLU output is BF16
    assert ops["fc1.fp8_cast_dy"].bwd_bytes == t * 2 * f * CAST_TRANSPOSE_BYTES
    assert all(ops[f"{g}.fp8_cast_x"].bwd_bytes == 0 == ops[f"{g}.fp8_cast_dy"].fwd_bytes for g in gemms)


def test_fp8_layer_is_faster_than_bf16_but_not_twice():
    def layer_s(dtype):
        rc = RooflineCompute(H100, dtype)
        big = ModelSpec("big", num_layers=2, hidden_size=8192, num_attention_heads=64, num_kv_heads=8,
                        vocab_size=32000, seq_length=4096, ffn_hidden_size=28672, mlp="swiglu")
        blocks = build_blocks(build_op_graph(big, 1, dtype), 1, False, 1, 1)
        return sum(rc.work_time_s(s.fwd) + rc.work_time_s(s.bwd) for s in blocks.segments())
    assert 0.5 < layer_s("fp8") / layer_s("bf16") < 0.8


def test_the_layer_lists_every_kernel_of_a_megatron_core_te_layer():
    # Megatron-Core's TransformerLayer with TE modules (gpt_layer_specs, TE spec): input_layernorm
    # fused into linear_qkv (TELayerNormColumnParallelLinear, a norm kernel then the GEMM), fused RoPE,
    # TEDotProductAttention, linear_proj, bias-dropout-add, pre_mlp_layernorm + linear_fc1, the fused
    # SwiGLU, linear_fc2, bias-dropout-add; FP8 adds the TE casts around each linear.
    bf16 = [o.name for o in build_op_graph(LLAMA, 1, "bf16").layer]
    assert bf16 == ["ln1", "qkv", "rope", "attn_core", "attn_out", "attn_residual", "ln2", "fc1", "act", "fc2",
                    "mlp_residual"]
    fp8 = [o.name for o in build_op_graph(LLAMA, 1, "fp8").layer]
    assert [n for n in fp8 if ".fp8_cast" not in n] == bf16
    assert len(fp8) == len(bf16) + 2 * 4
    g = build_op_graph(LLAMA, 1, "bf16")
    assert [o.name for o in g.embed] == ["embed"] and [o.name for o in g.head] == ["final_norm", "lm_head", "loss"]


def test_attention_kernel_follows_the_software_hopper_runs_cudnn_faster_than_flash_attention_2():
    shape = (1, 16, 8192, 8192, 128)
    op = OpWork("a", "attention", attention_flops(*shape), 1e6, shape)
    floor = EFFICIENCIES["hopper"].kernel_overhead_s
    fa2, cudnn = (RooflineCompute(H100, "bf16", a).op_time_s(op) - floor for a in ("flash", "cudnn"))
    assert fa2 / cudnn == pytest.approx(attention_efficiency("hopper", "cudnn", False, True, 128, 8192, 8192)
                                        / attention_efficiency("hopper", "flash", False, True, 128, 8192, 8192))
    assert cudnn < fa2
    a100 = [RooflineCompute(A100, "bf16", a).op_time_s(op) for a in ("flash", "cudnn")]
    assert a100[0] == a100[1]  # no separate measurement on Ampere


def test_a_windowed_attention_backward_still_pays_the_recompute():
    # sliding windows scale the attention FLOPs down (Gemma 2 style); the pass, not a FLOP ratio to the
    # shape, says it is a backward
    m = ModelSpec("w", num_layers=2, hidden_size=1024, num_attention_heads=8, vocab_size=4096,
                  seq_length=8192, mlp="swiglu", sliding_window=1024)
    core = build_blocks(build_op_graph(m, 1), 1, False, 1, 1).attn_core
    rc = RooflineCompute(H100, "bf16")
    floor = EFFICIENCIES["hopper"].kernel_overhead_s
    (f,), (b,) = core.fwd, core.bwd
    assert not f.backward and b.backward
    # both passes read the curves at the window's mean key loop (attention_eff.kernel_seq_len)
    w = m.window_flops_fraction()
    ratio = 2.5 * (attention_efficiency("hopper", "flash", False, True, 128, 8192, 8192, w)
                   / attention_efficiency("hopper", "flash", True, True, 128, 8192, 8192, w))
    assert (rc.op_time_s(b) - floor) / (rc.op_time_s(f) - floor) == pytest.approx(ratio, rel=0.02)


def test_tensor_core_kernels_run_at_the_sustained_clock_memory_kernels_at_full_bandwidth():
    """H100 SXM holds 1,575 MHz under training load at 700 W; its peaks are quoted at 1,830 MHz
    (132 SMs x 4,096 FLOP/clock): GEMMs and attention take 1830/1575 as long as at the datasheet
    clock, an HBM-bound kernel the same time (the power limit lowers the SM clock only)."""
    h100 = GPU_PRESETS["h100-sxm5-80gb"]
    unthrottled = dataclasses.replace(h100, sustained_clock_MHz=0.0)
    quoted_MHz = h100.peak("bf16") / (132 * 4096) / 1e6
    assert quoted_MHz == pytest.approx(1830, abs=1)
    hot, cold = RooflineCompute(h100, "bf16"), RooflineCompute(unthrottled, "bf16")
    assert hot.clock_ratio == pytest.approx(1575 / quoted_MHz)
    overhead = EFFICIENCIES["hopper"].kernel_overhead_s
    shape = (6144, 2816, 8192)  # 4 x 132 tiles: no split tile, no fp32 fixup traffic
    gemm = OpWork("g", "gemm", gemm_flops(*shape), 3 * 8192 * 8192 * 2, shape)
    assert (hot.op_time_s(gemm) - overhead) == pytest.approx((cold.op_time_s(gemm) - overhead) * quoted_MHz / 1575)
    norm = OpWork("ln", "norm", 0.0, 1e9, (1, 1))
    assert hot.op_time_s(norm) == cold.op_time_s(norm)
    # a GPU with no measured sustained clock, or one above the quoted clock, keeps its datasheet peak
    assert RooflineCompute(GPU_PRESETS["a100-sxm4-80gb"], "bf16").clock_ratio == 1.0
    assert RooflineCompute(dataclasses.replace(h100, sustained_clock_MHz=1980), "bf16").clock_ratio == 1.0


def test_a_task_of_tiny_kernels_takes_what_the_eager_host_needs_to_launch_them():
    """Host-side floor: an eager host launches each kernel at EAGER_KERNEL_HOST_S (PyTorch op
    micro-benchmark), so ten tiny kernels take 10 x 7.4 us, not 10 x the GPU's 2 us; CUDA graphs
    replay them at the GPU's pace; a fused backward GEMM is two launches; host ops add after."""
    from simulator.cost.compute import EAGER_KERNEL_HOST_S, EAGER_OP_HOST_S
    rc = RooflineCompute(H100, "bf16")
    eff = EFFICIENCIES["hopper"]
    tiny = tuple(OpWork(f"t{i}", "elementwise", 0.0, 8.0, (1, 1)) for i in range(10))
    gpu_s = sum(rc.op_time_s(op) for op in tiny)
    assert gpu_s == pytest.approx(10 * eff.kernel_overhead_s, rel=1e-3)
    assert rc.work_time_s(tiny) == pytest.approx(10 * EAGER_KERNEL_HOST_S)
    assert rc.work_time_s(tiny, eager=False) == pytest.approx(gpu_s)
    host = OpWork("sync", "host", 0.0, 0.0, (3,))
    assert rc.work_time_s(tiny + (host,)) == pytest.approx(10 * EAGER_KERNEL_HOST_S + 3 * EAGER_OP_HOST_S)
    bwd = OpWork("fc1_bwd", "gemm", 2 * 2.0 * 64 * 64 * 64, 0.0, (64, 64, 64), backward=True)
    assert rc.kernel_launches(bwd) == 2
    assert rc.work_time_s((bwd,)) == pytest.approx(max(rc.op_time_s(bwd), 2 * EAGER_KERNEL_HOST_S))
    # a big GEMM hides its launch entirely
    big = OpWork("fc1", "gemm", 2.0 * 8192 ** 3, 0.0, (8192, 8192, 8192))
    assert rc.work_time_s((big,)) == rc.work_time_s((big,), eager=False) == rc.op_time_s(big)


def test_cuda_graphs_speed_up_a_host_bound_model_and_leave_a_gpu_bound_one_alone():
    """training.cuda_graphs removes the per-kernel dispatch: a tiny model (host-bound) runs faster with
    it; a 1.3B-class layer on one GPU is GPU-bound, so graphs change little there (< 1%)."""
    from simulator.pipeline import simulate
    from simulator.scenario import scenario_from_dict

    def step(hidden, vocab, seq, graphs):
        return simulate(scenario_from_dict({
            "model": {"num_layers": 4, "hidden_size": hidden, "num_attention_heads": 4,
                      "vocab_size": vocab, "seq_length": seq},
            "cluster": {"preset": "dgx-h100", "num_nodes": 1, "gpus_per_node": 1},
            "training": {"global_batch_size": 4, "cuda_graphs": graphs}}, default_name="g")).metrics[
            "iteration_time_s"]

    tiny_eager, tiny_graphs = step(128, 512, 128, False), step(128, 512, 128, True)
    assert tiny_eager > 1.4 * tiny_graphs
    big_eager, big_graphs = step(2048, 32000, 1024, False), step(2048, 32000, 1024, True)
    assert big_graphs <= big_eager < 1.01 * big_graphs


def test_a_small_output_gemm_splits_k_to_fill_the_gpu():
    """CUTLASS's parallel split-K (efficient_gemm.md, "Parallelized Reductions"), as Ampere runs it: an
    output of 20 tiles on 108 SMs runs its K in s slices on 20·s CTAs, each with a 1/s main loop, and
    reduces the fp32 partials (8·s + 2 bytes per element); the heuristic's pick is the fastest of
    s = 1..21."""
    from simulator.cost.compute import k_efficiency, split_k_candidates, split_k_gemm_s
    rc = RooflineCompute(A100, "bf16")
    assert not rc.eff.stream_k
    m, n, k = 512, 1280, 8192  # 4 x 5 tiles of 128 x 256
    flops = 2.0 * m * n * k
    rate = rc.peak_flops_per_s * rc.eff.gemm_max
    over = rc.eff.tile_overhead_iters
    assert list(split_k_candidates(m, n, k, 108, 32)) == list(range(1, 22))
    times = {s: split_k_gemm_s(flops, rate, m, n, k, s, 108, 32, over, rc.mem_Bps) for s in range(1, 22)}
    best = min(times, key=times.get)
    assert best == 5  # 100 CTAs in one wave
    one_wave = flops / (rate * (20 / 108) * k_efficiency(k, 32, over))
    assert times[1] == pytest.approx(one_wave)
    op = OpWork("g", "gemm", flops, 0.0, (m, n, k))
    assert rc.op_time_s(op) == pytest.approx(times[best] + rc.eff.kernel_overhead_s)
    assert rc.op_time_s(op) < times[1] / 3
    # four waves and more: no split (the data-parallel tiling of before)
    assert list(split_k_candidates(8192, 8192, 8192, 108, 32)) == [1]


def test_hopper_gemms_deal_their_main_loop_evenly_to_the_sms():
    """Stream-K (cuBLAS's persistent Hopper kernels, measured without wave steps): the busiest SM runs
    ceil(tiles · iterations / SMs) main-loop iterations plus the prologue/epilogue of its whole tiles
    and of at most two pieces of the remainder; each extra piece writes and reads an fp32 tile."""
    rc = RooflineCompute(H100, "bf16")
    assert rc.eff.stream_k
    rate, over, tile = rc.peak_flops_per_s * rc.eff.gemm_max, rc.eff.tile_overhead_iters, 128 * 256
    iter_s = 2.0 * tile * 64 * 132 / rate
    floor = rc.eff.kernel_overhead_s

    def time_s(m, n, k):
        return rc.op_time_s(OpWork("g", "gemm", gemm_flops(m, n, k), 0.0, (m, n, k))) - floor

    # 528 tiles = 4 per SM, 192 iterations each: no remainder, no fixup
    assert time_s(6144, 2816, 12288) == pytest.approx((4 * 192 + 4 * over) * iter_s)
    # 36 tiles on 132 SMs: 53 iterations each, two pieces, 96 extra pieces' fp32 partials
    assert time_s(256, 4608, 12288) == pytest.approx((53 + 2 * over) * iter_s + 8.0 * 96 * tile / rc.mem_Bps)
    # no wave steps: from 2.18 to 3 waves' worth of tiles the rate changes by under 5%
    rates = [gemm_flops(m, 4608, 12288) / time_s(m, 4608, 12288) for m in range(2048, 2817, 256)]
    assert max(rates) / min(rates) < 1.05