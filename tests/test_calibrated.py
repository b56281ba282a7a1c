"""cost/calibrated: the table format, exact lookups, log-space interpolation and the committed tables."""

import math
from pathlib import Path

import pytest

from simulator.cost.calibrated import (COLLECTIVE_COLUMNS, COLLECTIVE_TABLE, KERNEL_COLUMNS, KERNEL_TABLE,
                                       CalibrationTables, idw_log, interp_loglog, write_table)
from simulator.model.opgraph import attention_flops, gemm_flops
from simulator.tasks import OpWork

ROOT = Path(__file__).resolve().parents[1]
CPU_TABLES = ROOT / "scenarios" / "calibration" / "cpu"


def _tables(tmp_path, rows, provenance=None, collectives=None) -> CalibrationTables:
    write_table(tmp_path / KERNEL_TABLE, KERNEL_COLUMNS, rows, provenance or {"device": "test"})
    if collectives is not None:
        write_table(tmp_path / COLLECTIVE_TABLE, COLLECTIVE_COLUMNS, collectives, {"device": "test"})
    return CalibrationTables.load(tmp_path)


def _gemm_row(m, n, k, time_s, factor=1, name="fc1"):
    f = factor * gemm_flops(m, n, k)
    return ("gemm", name, "fwd" if factor == 1 else "bwd", "bf16", (m, n, k), f, 1.0, time_s, 10)


def _gemm(m, n, k, factor=1):
    return OpWork("fc1", "gemm", factor * gemm_flops(m, n, k), 1.0, (m, n, k))


def test_provenance_header_round_trips(tmp_path):
    prov = {"device": "NVIDIA H100 80GB HBM3", "driver": "550.54", "torch": "2.13.0", "cuda": "12.4",
            "clocks": "sm 1980 MHz", "date": "2026-01-01", "command": "python -m simulator calibrate profile"}
    t = _tables(tmp_path, [_gemm_row(64, 64, 64, 1e-5)], prov)
    assert {k: t.provenance[k] for k in prov} == prov
    assert len(t.kernels) == 1 and t.kernels[0].shape == (64, 64, 64)


def test_exact_shape_returns_the_measured_time(tmp_path):
    t = _tables(tmp_path, [_gemm_row(1024, 2048, 512, 3e-5), _gemm_row(1024, 2048, 512, 7e-5, factor=2)])
    assert t.lookup_s(_gemm(1024, 2048, 512), "bf16") == pytest.approx(3e-5, rel=1e-12)
    # twice the forward FLOPs is the backward (input + weight gradients): the bwd row
    assert t.lookup_s(_gemm(1024, 2048, 512, 2), "bf16") == pytest.approx(7e-5, rel=1e-12)
    # another dtype or kind is not measured
    assert t.lookup_s(_gemm(1024, 2048, 512), "fp16") is None
    assert t.lookup_s(OpWork("attn_core", "attention", 1.0, 1.0, (1, 2, 3, 4, 5)), "bf16") is None


def test_gemm_rate_is_interpolated_in_log_space(tmp_path):
    # rates R1 at m=1024 and R2 at m=4096; m=2048 is equidistant in log space -> geometric mean rate
    t1, t2 = 1e-4, 2e-4
    t = _tables(tmp_path, [_gemm_row(1024, 1024, 1024, t1), _gemm_row(4096, 1024, 1024, t2)])
    r1, r2 = gemm_flops(1024, 1024, 1024) / t1, gemm_flops(4096, 1024, 1024) / t2
    want = gemm_flops(2048, 1024, 1024) / math.sqrt(r1 * r2)
    assert t.lookup_s(_gemm(2048, 1024, 1024), "bf16") == pytest.approx(want, rel=1e-12)
    # outside the measured range in any dimension: not extrapolated
    assert t.lookup_s(_gemm(8192, 1024, 1024), "bf16") is None
    assert t.lookup_s(_gemm(2048, 2048, 1024), "bf16") is None


def test_a_fraction_of_a_measured_kernel_scales_with_its_flops(tmp_path):
    # ring attention splits one kernel's work over cp steps with the same shape: time / cp
    shape = (1, 8, 1024, 1024, 128)
    f = attention_flops(*shape)
    t = _tables(tmp_path, [("attention", "attn_core", "fwd", "bf16", shape, f, 1.0, 4e-4, 10),
                           ("attention", "attn_core", "bwd", "bf16", shape, 2 * f, 1.0, 1e-3, 10)])
    assert t.lookup_s(OpWork("attn_core", "attention", f / 4, 1.0, shape), "bf16") == pytest.approx(1e-4)
    assert t.lookup_s(OpWork("attn_core", "attention", 2 * f, 1.0, shape), "bf16") == pytest.approx(1e-3)


def test_memory_bound_ops_interpolate_time_over_elements(tmp_path):
    rows = [("norm", "ln1", "fwd", "bf16", (100, 100), 0.0, 4e4, 1e-5, 10),
            ("norm", "ln1", "fwd", "bf16", (1000, 1000), 0.0, 4e6, 1e-4, 10),
            ("norm", "ln1", "bwd", "bf16", (1000, 1000), 0.0, 6e6, 3e-4, 10)]
    t = _tables(tmp_path, rows)

    def norm(tokens, width, per_elem=4.0):
        return OpWork("ln2", "norm", 0.0, per_elem * tokens * width, (tokens, width))

    assert t.lookup_s(norm(1000, 100), "bf16") == pytest.approx(math.sqrt(1e-5 * 1e-4), rel=1e-12)
    assert t.lookup_s(norm(10, 100), "bf16") == pytest.approx(1e-5)  # launch-latency floor
    assert t.lookup_s(norm(10000, 1000), "bf16") == pytest.approx(1e-3)  # bandwidth-bound: linear
    # 6 bytes per element is the backward group
    assert t.lookup_s(norm(1000, 1000, 6.0), "bf16") == pytest.approx(3e-4)
    # 8 bytes per element: nearest group (6 B/elem) scaled by the bytes ratio
    assert t.lookup_s(norm(1000, 1000, 8.0), "bf16") == pytest.approx(3e-4 * 8 / 6)


def test_interpolation_primitives():
    assert interp_loglog(10.0, [1.0, 100.0], [1.0, 100.0]) == pytest.approx(10.0)
    assert interp_loglog(0.5, [1.0, 100.0], [2.0, 3.0]) == 2.0
    import numpy as np
    pts, vals = np.array([[1.0, 1.0], [4.0, 1.0]]), np.array([1.0, 4.0])
    assert idw_log((2.0, 1.0), pts, vals, k=2) == pytest.approx(2.0)
    assert idw_log((4.0, 1.0), pts, vals, k=2) == 4.0


def test_collective_lookup(tmp_path):
    coll = [("all_reduce", 8, 1e6, 1e-4, 1e10, 1.75e10, 20), ("all_reduce", 8, 1e8, 1e-3, 1e11, 1.75e11, 20)]
    t = _tables(tmp_path, [_gemm_row(64, 64, 64, 1e-5)], collectives=coll)
    assert t.collective_time_s("all_reduce", 1e7, 8) == pytest.approx(math.sqrt(1e-7))
    assert t.collective_time_s("all_reduce", 1e9, 8) is None
    assert t.collective_time_s("all_gather", 1e7, 8) is None
    assert "collectives" in t.provenance


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.replace("kind,name", "kind,nom"), "header"),
    (lambda s: s.replace(",10\n", ",ten\n"), "samples"),
    (lambda s: s.replace("64x64x64", "64x64"), "3 dimensions"),
    (lambda s: s.replace("64x64x64", "64xax64"), "shape"),
    (lambda s: s.replace(",1e-05,", ",-1e-05,"), "time_s"),
])
def test_bad_tables_are_rejected_with_file_and_line(tmp_path, edit, message):
    write_table(tmp_path / KERNEL_TABLE, KERNEL_COLUMNS, [_gemm_row(64, 64, 64, 1e-5)], {"device": "x"})
    p = tmp_path / KERNEL_TABLE
    p.write_text(edit(p.read_text()))
    with pytest.raises(ValueError, match=message) as err:
        CalibrationTables.load(tmp_path)
    assert str(p) in str(err.value) and "\n" not in str(err.value)


def test_missing_directory_is_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no kernels.csv"):
        CalibrationTables.load(tmp_path / "nowhere")


def test_committed_cpu_tables_cover_the_tiny_scenario(monkeypatch):
    """scenarios/calibration/cpu was written by `python -m simulator calibrate profile --device cpu`."""
    from simulator.scenario import load_scenario
    from simulator.strategy.lower import lower

    monkeypatch.chdir(ROOT)  # the scenario names its tables relative to the repository root
    t = CalibrationTables.load(CPU_TABLES)
    assert t.provenance["command"].startswith("python -m simulator calibrate profile --device cpu")
    for key in ("device", "driver", "torch", "cuda", "clocks", "date"):
        assert t.provenance[key]
    scn = load_scenario(CPU_TABLES / "tiny-gpt.toml")
    works = {w for task in lower(scn).graph.tasks if task.kind == "compute" for w in task.work}
    assert works and all(t.lookup_s(w, "bf16") is not None for w in works)


def test_calibrated_simulation_sums_the_table_times(monkeypatch):
    """One rank, no communication: the iteration is the sum of the measured op times, exactly."""
    from simulator.pipeline import simulate
    from simulator.scenario import load_scenario

    monkeypatch.chdir(ROOT)
    scn = load_scenario(CPU_TABLES / "tiny-gpt.toml")
    r = simulate(scn)
    t = CalibrationTables.load(CPU_TABLES)
    total = sum(t.lookup_s(w, "bf16") for task in r.graph.tasks if task.kind == "compute" for w in task.work)
    assert r.metrics["iteration_time_s"] == pytest.approx(total, rel=1e-9)
