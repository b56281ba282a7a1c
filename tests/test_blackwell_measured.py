"""Blackwell's compute constants against the kernels measured by others: cuBLAS BF16 GEMMs on an HGX B200
(pytorch/ao PR #2427) at its boost clock, the clock a B200 holds under load (flashinfer PR #2899) and
cuDNN's fused attention on a GB200 (cudnn-frontend, tested in
test_attention_eff.py); the published GB200 training runs that hold them to account are expressible as
published (validate simulates them)."""

from dataclasses import replace

import pytest

from simulator.cost.compute import EFFICIENCIES, RooflineCompute
from simulator.explore.validate import DEFAULT_CSVS, read_rows, row_to_raw
from simulator.hardware.gpus import GPU_PRESETS
from simulator.model.opgraph import gemm_flops
from simulator.pipeline import simulate_metrics
from simulator.scenario import scenario_from_dict
from simulator.tasks import OpWork, gemm_grad_shapes

B200 = GPU_PRESETS["b200-sxm-180gb"]
GB200 = GPU_PRESETS["gb200"]
# pytorch/ao PR #2427 (benchmarks/float8/bench_matmul.py on "NVIDIA B200"): torch.bfloat16 time_sec per square GEMM
B200_BF16_SQUARE_S = {3072: 3.84e-05, 4096: 9.74e-05, 6144: 3.19e-04, 8192: 7.74e-04}


def _square(n: int) -> OpWork:
    return OpWork("g", "gemm", gemm_flops(n, n, n), 0.0, (n, n, n))


@pytest.mark.parametrize("n", sorted(B200_BF16_SQUARE_S))
def test_b200_bf16_gemms_take_what_they_measured_at_the_boost_clock(n):
    """The PR's GEMMs ran at the 1,965 MHz boost clock (six calls, under the ~5 ms a B200 runs before its
    clock drops): the model at the clock the datasheet peak is quoted at, sped up to 1,965 MHz."""
    quoted_MHz = B200.peak("bf16") / (148 * 8192) / 1e6
    burst = RooflineCompute(replace(B200, sustained_clock_MHz=0.0), "bf16")
    assert burst.clock_ratio == 1.0 and B200.boost_clock_MHz == 1965
    model_s = (burst.op_time_s(_square(n)) - burst.eff.kernel_overhead_s) * quoted_MHz / B200.boost_clock_MHz
    # the fit's three points (>= 50 us, as the H100 fit) within 3%; the 38 us one within 10%
    assert model_s / B200_BF16_SQUARE_S[n] - 1 == pytest.approx(0.0, abs=0.03 if n >= 4096 else 0.10)


def test_a_training_step_holds_the_sustained_clock():
    """Under training load a B200 holds 1,580 MHz (measured by others), a GB200 1,580 x 1.2^(1/3) MHz
    (derived: the power rule at its 1,200 W): GEMMs take the quoted clock's time over the ratio."""
    op = _square(8192)
    for gpu, held_MHz in ((B200, 1580.0), (GB200, 1580.0 * 1.2 ** (1 / 3))):
        quoted_MHz = gpu.peak("bf16") / (148 * 8192) / 1e6
        rc, at_quoted = RooflineCompute(gpu, "bf16"), RooflineCompute(replace(gpu, sustained_clock_MHz=0.0), "bf16")
        assert rc.clock_ratio == pytest.approx(held_MHz / quoted_MHz, rel=1e-4)
        dt = (rc.op_time_s(op) - rc.eff.kernel_overhead_s) / (at_quoted.op_time_s(op) - rc.eff.kernel_overhead_s)
        assert dt == pytest.approx(1 / rc.clock_ratio, rel=1e-3)  # less the stream-K fix-up's HBM time


def test_a_gb200_gemm_runs_at_the_b200s_rate_per_clock():
    b200, gb200 = RooflineCompute(B200, "bf16"), RooflineCompute(GB200, "bf16")
    op = _square(8192)
    b_s, g_s = (rc.op_time_s(op) - rc.eff.kernel_overhead_s for rc in (b200, gb200))
    assert b_s / g_s == pytest.approx(GB200.sustained_clock_MHz / B200.sustained_clock_MHz, rel=1e-3)
    # FP8 keeps Hopper's measured FP8/BF16 ratio of gemm_max
    bw, hop = EFFICIENCIES["blackwell"], EFFICIENCIES["hopper"]
    assert bw.fp8_gemm_max / bw.gemm_max == pytest.approx(hop.fp8_gemm_max / hop.gemm_max)
    assert bw.gemm_max < hop.gemm_max


# FP8/BF16 time ratios measured by others on Blackwell (cost/compute's gemm_max notes): XLA's sm_100 GEMM
# cost table, 4096^3 (1,417 and 2,765 TFLOP/s); Transformer Engine's GEMM profiling tutorial on a B300,
# a 5B layer's 12 GEMMs at m = 15,872 (hidden 4,096, intermediate 16,384), pre-quantized (13.102 and
# 6.812 ms).
XLA_SM100_4096_RATIO = 1417 / 2765
TE_B300_LAYER_RATIO = 6.812 / 13.102


def test_b200_fp8_gemms_take_the_fp8_over_bf16_time_measured_on_blackwell():
    rc = RooflineCompute(B200, "fp8")
    square = _square(4096)
    fp8 = replace(square, precision="fp8")
    assert rc.op_time_s(fp8) / rc.op_time_s(square) == pytest.approx(XLA_SM100_4096_RATIO, rel=0.08)
    floor = rc.eff.kernel_overhead_s  # the README quotes the kernels' times, without the launch floor
    assert round((rc.op_time_s(fp8) - floor) / (rc.op_time_s(square) - floor), 2) == 0.54
    h, f, m = 4096, 16384, 15872
    fprop = [(m, 3 * h, h), (m, h, h), (m, f, h), (m, h, f)]  # qkv, proj, fc1, fc2
    shapes = fprop + [g for s in fprop for g in gemm_grad_shapes(s)]  # + dgrad, wgrad: 12 GEMMs
    bf16_s = sum(rc.op_time_s(OpWork("g", "gemm", gemm_flops(*s), 0.0, s)) for s in shapes)
    fp8_s = sum(rc.op_time_s(OpWork("g", "gemm", gemm_flops(*s), 0.0, s, precision="fp8")) for s in shapes)
    assert fp8_s / bf16_s == pytest.approx(TE_B300_LAYER_RATIO, rel=0.05)
    assert round(fp8_s / bf16_s, 2) == 0.52  # as the README quotes it


def test_the_published_gb200_runs_are_expressible_as_published():
    rows = [r for r in read_rows([DEFAULT_CSVS[3]]) if r["gpu"] == "gb200-nvl72"]
    assert len(rows) == 12
    for r in rows:
        scn = scenario_from_dict(row_to_raw(r), default_name=r["name"])
        assert scn.cluster.gpu.name == "gb200" and scn.num_gpus == int(r["num_nodes"]) * 64
        assert scn.training.cuda_graphs == (r["cuda_graphs"] == "true")


def test_gb200_over_h100_at_equal_work_is_the_readmes_figure():
    """The Nemotron-4 340B BF16 recipe at 0.25 sequences per GPU: 256 H100 (4.61 s published) over 128
    GB200 (2.19 s): 2.10x measured; the README quotes the simulated ratio."""
    rows = {r["name"]: r for r in read_rows([DEFAULT_CSVS[3]])}
    t = {}
    for name in ("dgxc-v2505-nemotron4-340b-bf16-256gpu", "dgxc-gb200-nemotron4-340b-bf16-128gpu"):
        t[name] = simulate_metrics(scenario_from_dict(row_to_raw(rows[name]), default_name=name))["iteration_time_s"]
    h100, gb200 = t.values()
    assert (round(h100, 2), round(gb200, 2)) == (4.26, 2.11)
    assert h100 / gb200 == pytest.approx(2.01, abs=0.005)
