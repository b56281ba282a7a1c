"""A power limit below the TDP lowers the clock held under tensor-core load by the cube-root power rule
(cost/clocks), the rule the SM-contention boost already uses; HBM-bound kernels keep their bandwidth;
the Grand Teton H100 (torchtitan's 500 W, 96 GB HBM2e part) is a preset."""

import dataclasses

import pytest

from simulator.cost.clocks import held_clock_MHz, power_limited_boost, sustained_clock_ratio
from simulator.cost.compute import EFFICIENCIES, RooflineCompute
from simulator.hardware.clusters import CLUSTER_PRESETS
from simulator.hardware.gpus import GPU_PRESETS
from simulator.hardware.hwfile import cluster_from_table
from simulator.tasks import OpWork

H100 = GPU_PRESETS["h100-sxm5-80gb"]
HOPPER = EFFICIENCIES["hopper"]
GiB = 2 ** 30


def test_the_held_clock_goes_as_the_cube_root_of_the_power_above_idle():
    """The H100's measured idle draw (75 W) is the part of the limit the SMs' clock cannot use: 500 W of
    a 700 W part leaves (425 / 625)^(1/3) of the clock, 1,385 MHz; with no idle draw known, the plain
    cube root of the power ratio, 1,408."""
    capped = dataclasses.replace(H100, power_limit_W=500.0)
    assert H100.idle_power_W == 75.0 and GPU_PRESETS["h200-sxm-141gb"].idle_power_W == 77.0
    assert held_clock_MHz(capped, HOPPER) == pytest.approx(1575 * (425 / 625) ** (1 / 3))
    assert held_clock_MHz(capped, HOPPER) == pytest.approx(1385, abs=1)
    assert held_clock_MHz(dataclasses.replace(capped, idle_power_W=0.0), HOPPER) == pytest.approx(1408, abs=1)
    # at the TDP, or with no limit set, the measured sustained clock holds unchanged
    for same in (H100, dataclasses.replace(H100, power_limit_W=700.0)):
        assert held_clock_MHz(same, HOPPER) == 1575.0
        assert sustained_clock_ratio(same, HOPPER) == sustained_clock_ratio(H100, HOPPER)
    quoted_MHz = H100.peak("bf16") / (132 * 4096) / 1e6
    assert sustained_clock_ratio(capped, HOPPER) == pytest.approx(1385 / quoted_MHz, abs=1e-3)


def test_a_gpu_with_no_measured_clock_is_capped_from_its_quoted_clock():
    """No sustained clock measured: the datasheet peaks hold at the TDP, and a limit lowers the clock
    they are quoted at by the same rule."""
    b200 = dataclasses.replace(GPU_PRESETS["b200-sxm-180gb"], sustained_clock_MHz=0.0)  # as if not measured
    blackwell = EFFICIENCIES["blackwell"]
    assert sustained_clock_ratio(b200, blackwell) == 1.0
    half = dataclasses.replace(b200, power_limit_W=b200.tdp_W / 2)
    assert sustained_clock_ratio(half, blackwell) == pytest.approx(0.5 ** (1 / 3))


def test_the_sm_contention_boost_starts_from_the_capped_clock():
    """Beside a collective holding half the SMs, the boost is capped by boost / held clock: a lower
    held clock leaves more room up to the boost clock."""
    capped = dataclasses.replace(H100, power_limit_W=500.0)
    held = held_clock_MHz(capped, HOPPER)
    assert power_limited_boost(capped, 132, 66, held) == pytest.approx(2 ** (1 / 3))
    assert power_limited_boost(capped, 132, 12, held) == pytest.approx(1980 / held)
    assert power_limited_boost(H100, 132, 12, 1575.0) == pytest.approx(1980 / 1575)


def test_gemms_slow_by_the_clock_hbm_kernels_do_not():
    capped = dataclasses.replace(H100, power_limit_W=500.0)
    hot, cool = RooflineCompute(H100, "bf16"), RooflineCompute(capped, "bf16")
    shape = (6144, 2816, 8192)  # 4 x 132 tiles: no split tile, no fp32 fixup traffic
    gemm = OpWork("g", "gemm", 2.0 * 6144 * 2816 * 8192, 3 * 8192 * 8192 * 2, shape)
    over = HOPPER.kernel_overhead_s
    assert (cool.op_time_s(gemm) - over) == pytest.approx((hot.op_time_s(gemm) - over) * (625 / 425) ** (1 / 3))
    norm = OpWork("ln", "norm", 0.0, 1e9, (1, 1))
    assert cool.op_time_s(norm) == hot.op_time_s(norm)


@pytest.mark.parametrize("gpu, message", [
    ({"preset": "h100-sxm5-80gb", "power_limit_W": 800}, "cluster.gpu.power_limit_W = 800 exceeds tdp_W = 700"),
    ({"preset": "h100-sxm5-80gb", "tdp_W": 0, "power_limit_W": 500},
     "cluster.gpu.power_limit_W = 500 needs the GPU's tdp_W"),
    ({"preset": "h100-sxm5-80gb", "power_limit_W": -5}, "cluster.gpu.power_limit_W must be a finite number >= 0"),
    ({"preset": "h100-sxm5-80gb", "power_limit_W": 300, "idle_power_W": 300},
     "cluster.gpu.idle_power_W = 300 must be below the power limit (300 W; tdp_W and power_limit_W)"),
    ({"preset": "h100-sxm5-80gb", "tdp_W": 0, "idle_power_W": 60}, "cluster.gpu.idle_power_W = 60 needs the GPU's tdp_W"),
])
def test_a_bad_power_limit_names_the_field(gpu, message):
    with pytest.raises(ValueError) as exc:
        cluster_from_table({"preset": "dgx-h100", "gpu": gpu})
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_grand_teton_is_torchtitans_h100_host():
    gt = CLUSTER_PRESETS["grand-teton-h100"]
    g = gt.gpu
    assert (g.name, g.power_limit_W, g.tdp_W, g.hbm_bandwidth_Bps) == ("h100-sxm5-96gb", 500.0, 700.0, 2.4e12)
    assert g.memory_capacity_bytes == 94 * GiB
    assert g.peak_flops_per_s == H100.peak_flops_per_s
    assert (gt.gpus_per_node, gt.nics_per_node, gt.nic_bandwidth_Bps, gt.fabric) == (8, 8, 50e9, "roce")
    assert RooflineCompute(g, "bf16").clock_ratio < RooflineCompute(H100, "bf16").clock_ratio


def test_torchtitans_8b_row_at_700_w_would_be_seven_to_nine_points_faster():
    """The README's torchtitan bullet: run at the 700 W of the DGX preset instead of the Grand Teton
    hosts' 500 W limit, the Llama 3.1 8B FSDP row is 7-9 points faster (-3.0% -> -11.4%)."""
    from simulator.explore.validate import DEFAULT_CSVS, read_rows, row_to_raw
    from simulator.pipeline import simulate_metrics
    from simulator.scenario import scenario_from_dict

    row = next(r for r in read_rows([DEFAULT_CSVS[4]]) if r["name"] == "tt-llama31-8b-fsdp-8gpu")
    errors = []
    for watts in (500, 700):
        raw = row_to_raw(row)
        raw["cluster"]["gpu"] = {"preset": "h100-sxm5-96gb", "power_limit_W": watts}
        m = simulate_metrics(scenario_from_dict(raw, default_name=row["name"]))
        errors.append(m["iteration_time_s"] / float(row["iteration_time_s"]) - 1)
    assert -0.04 < errors[0] < -0.02
    assert 0.07 <= errors[0] - errors[1] <= 0.09
    assert [round(100 * e, 1) for e in errors] == [-3.0, -11.4]  # as the README quotes them
