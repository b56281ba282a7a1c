"""The units of one GPU SKU differ in speed under power management (Sinha et al. SC22), and a synchronous
job waits for its slowest GPU: cost/clocks.slowest_speed_ratio slows the tensor-core kernels of a job of
N GPUs by the expected largest of N normal draws of the spread, and nothing else."""

import dataclasses
import math
from pathlib import Path
from statistics import NormalDist

import pytest

from simulator.cost.calibrated import KERNEL_COLUMNS, KERNEL_TABLE, CalibrationTables, write_table
from simulator.cost.clocks import expected_max_normal, slowest_speed_ratio
from simulator.cost.compute import EFFICIENCIES, RooflineCompute
from simulator.hardware.gpus import GPU_PRESETS, GPU_SPEED_SPREAD_FRAC
from simulator.hardware.hwfile import cluster_from_table
from simulator.model.opgraph import gemm_flops
from simulator.tasks import OpWork

ROOT = Path(__file__).resolve().parents[1]
H100 = GPU_PRESETS["h100-sxm5-80gb"]


def test_expected_largest_normal_matches_its_closed_forms():
    """E[max] of 2 and 3 standard normals are 1/sqrt(pi) and 3/(2 sqrt(pi)); of 1,000, 3.2414 (the
    tabulated value); one GPU has no slower sibling; the largest grows with the count."""
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-6)
    assert expected_max_normal(3) == pytest.approx(3 / (2 * math.sqrt(math.pi)), rel=1e-6)
    assert expected_max_normal(1000) == pytest.approx(3.2414, abs=1e-3)
    counts = (2, 8, 64, 512, 4096, 16384, 100_000)
    values = [expected_max_normal(n) for n in counts]
    assert values == sorted(values) and values[-1] < 4.5


def test_expected_largest_normal_matches_sampling():
    """The integral against draws: the mean largest of n normals over 4,000 seeded trials, within 1% (the sampling error is 0.1-0.3%)."""
    import numpy as np

    rng = np.random.default_rng(7)
    for n in (16, 256, 2048):
        sampled = rng.standard_normal((4000, n)).max(axis=1).mean()
        assert expected_max_normal(n) == pytest.approx(sampled, rel=0.01)


def test_the_spread_is_the_studys_whisker_range_read_as_a_normal():
    """Sinha et al.'s 8% is the whisker range (Q3 + 1.5 IQR) - (Q1 - 1.5 IQR) = 4 IQR over the median:
    a normal with the derived standard deviation has exactly that range."""
    q = NormalDist(1.0, GPU_SPEED_SPREAD_FRAC)
    iqr = q.inv_cdf(0.75) - q.inv_cdf(0.25)
    assert 4 * iqr == pytest.approx(0.08, rel=1e-3)
    assert all(GPU_PRESETS[name].speed_spread_frac == GPU_SPEED_SPREAD_FRAC for name in GPU_PRESETS)


def test_the_slowest_of_n_gpus_runs_below_the_median_by_the_spread():
    assert slowest_speed_ratio(H100, 1) == 1.0
    assert slowest_speed_ratio(dataclasses.replace(H100, speed_spread_frac=0.0), 4096) == 1.0
    for n in (8, 1024, 16384):
        assert slowest_speed_ratio(H100, n) == pytest.approx(1 - GPU_SPEED_SPREAD_FRAC * expected_max_normal(n))
    # the README's figures: 97.9% of the median at 8 GPUs, 96.2% at 128, 95.2% at 1,024, 94.9% at 2,048,
    # 94.1% at 16,384
    for n, pct in ((8, 97.9), (128, 96.2), (1024, 95.2), (2048, 94.9), (16384, 94.1)):
        assert round(100 * slowest_speed_ratio(H100, n), 1) == pct


def test_tensor_core_kernels_slow_by_the_ratio_hbm_kernels_do_not():
    one, many = RooflineCompute(H100, "bf16"), RooflineCompute(H100, "bf16", num_gpus=2048)
    over = EFFICIENCIES["hopper"].kernel_overhead_s
    gemm = OpWork("g", "gemm", 2.0 * 6144 * 2816 * 8192, 3 * 8192 * 8192 * 2, (6144, 2816, 8192))
    ratio = slowest_speed_ratio(H100, 2048)
    assert many.op_time_s(gemm) - over == pytest.approx((one.op_time_s(gemm) - over) / ratio)
    attention = OpWork("a", "attention", 1e13, 1e8, (1, 32, 8192, 8192, 128))
    assert many.op_time_s(attention) - over == pytest.approx((one.op_time_s(attention) - over) / ratio)
    norm = OpWork("ln", "norm", 0.0, 1e9, (1, 1))
    assert many.op_time_s(norm) == one.op_time_s(norm)


def test_measured_gemms_of_one_gpu_are_slowed_to_the_jobs_slowest(tmp_path):
    """Calibration tables hold one GPU's kernels: a job of many GPUs runs them at its slowest GPU's pace."""
    from simulator.cost.model import CostModel
    from simulator.hardware.topology import build_topology
    from simulator.scenario import scenario_from_dict
    from simulator.tasks import Task

    m, n, k = 8192, 4096, 4096
    row = ("gemm", "fc1", "fwd", "bf16", (m, n, k), gemm_flops(m, n, k), 1.0, 1e-3, 10)
    write_table(tmp_path / KERNEL_TABLE, KERNEL_COLUMNS, [row], {"device": "test"})
    tables = CalibrationTables.load(tmp_path)
    raw = {"name": "s", "model": {"preset": "llama3.1-8b"}, "cluster": {"preset": "dgx-h100", "num_nodes": 16},
           "parallelism": {"dp": 128}, "training": {"global_batch_size": 128, "micro_batch_size": 1}}
    scn = scenario_from_dict(raw)
    cost = CostModel(scn, build_topology(scn.cluster), tables)
    work = (OpWork("fc1", "gemm", gemm_flops(m, n, k), 1.0, (m, n, k)),)
    t = cost.duration_s(Task(0, "t", "compute", 0, "compute", "compute", work=work))
    assert t == pytest.approx(1e-3 / slowest_speed_ratio(H100, 128), rel=1e-12)  # 1 ms: above the host floor


def test_a_job_reports_its_slowest_gpu_and_a_zero_spread_removes_it():
    from simulator.analysis.report import format_summary
    from simulator.pipeline import simulate_metrics
    from simulator.scenario import scenario_from_dict

    def run(gpu: dict) -> dict:
        raw = {"name": "s", "model": {"preset": "llama3.1-8b", "seq_length": 4096},
               "cluster": {"preset": "dgx-h100", "num_nodes": 2, "gpu": gpu},
               "parallelism": {"dp": 16, "zero_stage": 1},
               "training": {"global_batch_size": 16, "micro_batch_size": 1}}
        return simulate_metrics(scenario_from_dict(raw))

    spread, alike = run({"preset": "h100-sxm5-80gb"}), run({"preset": "h100-sxm5-80gb", "speed_spread_frac": 0})
    assert spread["slowest_gpu_speed_ratio"] == pytest.approx(slowest_speed_ratio(H100, 16))
    assert alike["slowest_gpu_speed_ratio"] == 1.0
    assert 1.0 < spread["iteration_time_s"] / alike["iteration_time_s"] < 1 / slowest_speed_ratio(H100, 16) + 1e-9
    assert "slowest GPU" in format_summary(spread) and "slowest GPU" not in format_summary(alike)


@pytest.mark.parametrize("value, message", [
    (0.3, "cluster.gpu.speed_spread_frac = 0.3 is above 0.1"),
    (-0.01, "cluster.gpu.speed_spread_frac must be a finite number >= 0"),
    ("2%", "cluster.gpu.speed_spread_frac must be a number, got '2%'"),
])
def test_a_bad_spread_names_the_field(value, message):
    with pytest.raises(ValueError) as exc:
        cluster_from_table({"preset": "dgx-h100", "gpu": {"preset": "h100-sxm5-80gb", "speed_spread_frac": value}})
    assert message in str(exc.value)
