"""calibration/kineto: real torch.profiler traces import as measured Traces, without torch."""

import gzip
import json
from pathlib import Path

import pytest

from simulator.calibration.kineto import (categorize, load_kineto_trace, parse_annotation, parse_kineto,
                                          run_to_trace)
from simulator.trace import COMPUTE_STREAM, read_chrome_trace, write_chrome_trace

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
SGEMM = SHARED / "a100-multistream-sgemm.json.gz"
DDP = SHARED / "a100x2-ddp-cnn-nccl.rank0.json.gz"
RECSYS = SHARED / "gpu128-recsys-sampled.rank0.json.gz"
TINY = ROOT / "scenarios" / "calibration" / "cpu" / "tiny-gpt.trace.json.gz"
shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/traces not present")


@pytest.mark.parametrize("name, category", [
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "nccl"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "nccl"),
    ("ampere_sgemm_128x64_nn", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1", "gemm"),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>(Params)", "gemm"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>, true>(Flash_fwd_params)",
     "attention"),
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80", "attention"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>(int, ...)", "elementwise"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float)",
     "norm"),
    ("Memcpy HtoD (Pinned -> Device)", "memcpy"),
    ("aten::addmm", "gemm"), ("aten::linear", "gemm"), ("aten::mm", "gemm"),
    ("autograd::engine::evaluate_function: AddmmBackward0", "gemm"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
    ("autograd::engine::evaluate_function: ScaledDotProductFlashAttentionForCpuBackward0", "attention"),
    ("aten::layer_norm", "norm"), ("aten::gelu", "elementwise"),
    ("autograd::engine::evaluate_function: NativeLayerNormBackward0", "norm"),
    ("aten::view", "other"), ("autograd::engine::evaluate_function: ViewBackward0", "other"),
    ("void cub::DeviceScanKernel<cub::AgentScanPolicy<128, 15, int>>(int*)", "other"),
    # AMD: rocBLAS / hipBLASLt (Tensile), MIOpen, RCCL, Composable Kernel attention, ROCm copies
    ("Cijk_Alik_Bljk_BBS_BH_MT128x128x64_MI16x16x16x1_SN_1LDSB0_APM1_ABV0_ACED0_AF0EM1", "gemm"),
    ("Cijk_Ailk_Bljk_SB_MT64x64x16_SN_APM1_AF0EM1_AF1EM1_AMAS3_ASE_ASGT_ASLT", "gemm"),
    ("miopenSp3AsmConv_v21_1_3_gfx9_fp32_f3x2_stride1", "gemm"),
    ("igemm_fwd_gtcx_nhwc_fp16_bx0_ex1_bt256x128x32_wt32x32x8_ws2x1_wr2x2", "gemm"),
    ("MIOpenBatchNormFwdTrainSpatial", "norm"), ("MIOpenLayerNormFwd", "norm"),
    ("ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)", "nccl"),
    ("void ck_tile::kentry<256, 1, ck_tile::FmhaFwdKernel<ck_tile::BlockFmhaPipelineQRKSVSAsync>>", "attention"),
    ("__amd_rocclr_copyBuffer", "memcpy"), ("__amd_rocclr_fillBufferAligned", "memcpy"),
    # NVIDIA families beyond the above
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN", "gemm"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1", "attention"),
    ("void transformer_engine::normalization::rmsnorm_fwd_tuned_kernel<Kernel_traits<...>>", "norm"),
    ("void cuApplyLayerNorm<c10::BFloat16, float, c10::BFloat16>(...)", "norm"),
    ("void multi_tensor_apply_kernel<TensorListMetadata<2>, L2NormFunctor<float, 1, 1>, float*>", "elementwise"),
])
def test_categorize(name, category):
    assert categorize(name) == category


def _synthetic(tmp_path) -> Path:
    """Forward linear launching a GEMM, a backward node launching a GEMM and an NCCL all-reduce
    that overlaps it by 20 us and is exposed for 40 us, inside ProfilerStep#3; times in us."""
    pid, tid = 100, 100
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": pid, "tid": tid, "ts": 1000, "dur": 300},
        {"ph": "X", "cat": "user_annotation", "name": "sim:0:2:fc1", "pid": pid, "tid": tid, "ts": 1000, "dur": 100},
        {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": pid, "tid": tid, "ts": 1000, "dur": 100,
         "args": {"Sequence number": 7}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": tid, "ts": 1010,
         "dur": 5, "args": {"correlation": 1}},
        {"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: AddmmBackward0", "pid": pid,
         "tid": tid, "ts": 1100, "dur": 50, "args": {"Sequence number": 7}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": tid, "ts": 1110,
         "dur": 5, "args": {"correlation": 2}},
        {"ph": "X", "cat": "user_annotation", "name": "nccl:all_reduce", "pid": pid, "tid": tid, "ts": 1140, "dur": 8},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": tid, "ts": 1142,
         "dur": 3, "args": {"correlation": 3}},
        {"ph": "X", "cat": "kernel", "name": "sm80_xmma_gemm_bf16", "pid": 0, "tid": 7, "ts": 1020, "dur": 30,
         "args": {"stream": 7, "correlation": 1, "device": 0}},
        {"ph": "X", "cat": "kernel", "name": "sm80_xmma_gemm_bf16", "pid": 0, "tid": 7, "ts": 1120, "dur": 50,
         "args": {"stream": 7, "correlation": 2, "device": 0}},
        {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_bfloat16", "pid": 0, "tid": 20,
         "ts": 1150, "dur": 60, "args": {"stream": 20, "correlation": 3, "device": 0}},
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 1, "pid": pid, "tid": tid, "ts": 1010},
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 1, "pid": 0, "tid": 7, "ts": 1020, "bp": "e"},
    ]
    doc = {"schemaVersion": 1, "distributedInfo": {"rank": 3, "world_size": 4},
           "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}], "traceEvents": ev}
    p = tmp_path / "t.json.gz"
    with gzip.open(p, "wt") as f:
        json.dump(doc, f)
    return p


def test_synthetic_trace_links_kernels_to_their_cpu_context(tmp_path):
    run = parse_kineto(_synthetic(tmp_path))
    assert not run.cpu_only and run.steps == {3: (0.0, 300e-6)}
    fwd, bwd, ar = run.ops
    assert (fwd.rank, fwd.stream, fwd.phase, fwd.step, fwd.annotation) == (3, "stream 7", "F", 3, "sim:0:2:fc1")
    assert (fwd.start_s, fwd.end_s) == pytest.approx((20e-6, 50e-6))
    # the backward node inherits its forward op's annotation through the sequence number
    assert (bwd.phase, bwd.annotation, bwd.launcher) == ("B", "sim:0:2:fc1",
                                                         "autograd::engine::evaluate_function: AddmmBackward0")
    assert (ar.category, ar.stream, ar.phase, ar.annotation) == ("nccl", "stream 20", "B", "nccl:all_reduce")
    assert run.metadata["device"] == "NVIDIA H100 80GB HBM3" and run.metadata["flow_events"] == 2
    assert run.metadata["counts"]["linked_kernels"] == 3

    trace = run_to_trace(run)
    assert trace.source == "measured"
    lanes = {(e.stream, e.category) for e in trace.events}
    assert (COMPUTE_STREAM, "gemm") in lanes and ("stream 20", "nccl") in lanes
    assert ("cpu thread 100", "cpu_op") in lanes and ("runtime thread 100", "cuda_runtime") in lanes
    k = [e for e in trace.events if e.stream == COMPUTE_STREAM]
    assert [(e.microbatch, e.layer, e.phase) for e in k] == [(0, 2, "F"), (0, 2, "B")]


def test_parse_annotation():
    assert parse_annotation("sim:1:-1:lm_head") == (1, -1, "lm_head")
    assert parse_annotation("## forward ##") is None
    assert parse_annotation("sim:x:1:qkv") is None


def test_bad_files_raise_one_line(tmp_path):
    (tmp_path / "a.json").write_text("{not json")
    (tmp_path / "b.json").write_text(json.dumps({"events": []}))
    (tmp_path / "c.json").write_text(json.dumps({"traceEvents": [{"ph": "M", "name": "process_name"}]}))
    for name, msg in (("a.json", "not a JSON trace"), ("b.json", "no 'traceEvents'"), ("c.json", "no GPU kernels"),
                      ("missing.json", "does not exist")):
        with pytest.raises(ValueError, match=msg) as err:
            load_kineto_trace(tmp_path / name)
        assert "\n" not in str(err.value)


@shared
def test_sgemm_multistream_trace():
    run = parse_kineto(SGEMM)
    kernels = [o for o in run.ops if o.category == "gemm"]
    assert len(kernels) == 3 and {o.stream for o in kernels} == {"stream 20", "stream 24", "stream 28"}
    assert sum(o.category == "memcpy" for o in run.ops) == 3  # memsets
    assert run.metadata["device"].startswith("NVIDIA A100")


@shared
def test_ddp_trace_with_nccl():
    run = parse_kineto(DDP)
    assert run.metadata["counts"] == {"kernels": 2700, "memcpy": 960, "memset": 114, "cpu_ops": 14346,
                                      "cuda_runtime": 8740, "linked_kernels": 3774}
    assert sum(o.category == "nccl" for o in run.ops) == 21
    assert {o.stream for o in run.ops if o.category == "nccl"} == {"stream 40"}
    assert sorted(run.steps) == [4, 5, 6]
    assert {o.phase for o in run.ops} == {"F", "B", "O"}
    assert {o.rank for o in run.ops} == {0}
    trace = run_to_trace(run)
    assert trace.metadata["stream_names"] == {"0/compute": "stream 7"}
    assert trace.metadata["distributed"]["world_size"] == 2


@shared
def test_sampled_recsys_trace():
    run = parse_kineto(RECSYS)
    assert run.metadata["counts"]["kernels"] == 1154
    assert sum(o.category == "nccl" for o in run.ops) == 10
    assert len({o.stream for o in run.ops}) == 5
    assert sorted(run.steps) == [551, 552]


@shared
def test_measured_trace_round_trips_through_our_chrome_format(tmp_path):
    trace = load_kineto_trace(SGEMM)
    back = read_chrome_trace(write_chrome_trace(trace, tmp_path / "m.json"))
    assert back.source == "measured" and len(back.events) == len(trace.events)
    assert [(e.name, e.stream) for e in back.events] == [(e.name, e.stream) for e in trace.events]


def test_committed_tiny_model_trace_maps_every_op():
    """scenarios/calibration/cpu/tiny-gpt.trace.json.gz: written by `calibrate profile --device cpu`."""
    run = parse_kineto(TINY)
    assert run.cpu_only and len(run.steps) == 3
    ops = {(o.phase, parse_annotation(o.annotation)[2]) for o in run.ops if parse_annotation(o.annotation)}
    layer_ops = {"ln1", "qkv", "attn_core", "attn_out", "attn_residual", "ln2", "fc1", "act", "fc2", "mlp_residual"}
    for phase in ("F", "B"):
        assert {op for p, op in ops if p == phase} >= layer_ops | {"embed", "final_norm", "lm_head", "loss"}
    assert ("O", "adam") in ops


def _fake_run(with_annotations: bool):
    """A measured run whose kernels are the simulated ops of tiny-gpt on a timeline twice as slow (each
    kernel and each launch gap between them twice as long)."""
    from simulator.calibration.compare import kind_category, simulated_ops
    from simulator.calibration.kineto import KinetoRun, MeasuredOp
    from simulator.pipeline import simulate
    from simulator.scenario import load_scenario

    result = simulate(load_scenario(ROOT / "scenarios" / "calibration" / "tiny-gpt.toml"))
    _, sim = simulated_ops(result, 0)
    ops = []
    for s in sim:
        note = f"sim:{s.microbatch}:{s.layer}:{s.name}" if with_annotations else ""
        ops.append(MeasuredOp(s.name, kind_category(s.kind), 0, "stream 7", 2 * s.start_s, 2 * s.end_s, s.phase, 0,
                              note))
    end = 2 * result.metrics["iteration_time_s"]
    return KinetoRun(ops, [], [], {0: (0.0, end)}, False, {"source_file": "fake", "device": "fake"}), result


@pytest.mark.parametrize("annotated", [True, False])
def test_compare_maps_kernels_to_ops(annotated):
    from simulator.calibration.compare import compare_run, simulated_ops

    run, result = _fake_run(annotated)
    c = compare_run(run, result)
    assert c["mapping"] == ("annotation" if annotated else "shape-order")
    _, sim = simulated_ops(result, 0)
    busy_span_s = max(s.end_s for s in sim) - min(s.start_s for s in sim)
    assert c["measured_step_s"] == pytest.approx(2 * busy_span_s)
    assert c["step_time_error"] == pytest.approx(result.metrics["iteration_time_s"] / (2 * busy_span_s) - 1)
    assert len(c["per_op"]) == 31 and all(r["error"] == pytest.approx(-0.5) for r in c["per_op"])
    assert {r["category"] for r in c["per_category"]} == {"gemm", "attention", "norm", "elementwise"}
    assert c["coverage"] == pytest.approx(1.0) and not c["coverage_warning"]
