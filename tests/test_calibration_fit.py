"""calibrate fit and compare on traces: round trips through a simulated run's own Kineto export, any rank,
both Kineto schemas, NVIDIA and AMD names, the committed tiny-model trace and foreign traces (no torch)."""

import json
from pathlib import Path

import pytest

from simulator.calibration.cli import cmd_compare, cmd_fit
from simulator.calibration.compare import compare_run, step_periods
from simulator.calibration.export import kineto_doc, write_kineto
from simulator.calibration.fit import fit_traces
from simulator.calibration.kineto import KinetoRun, MeasuredOp, load_kineto_trace, parse_kineto
from simulator.calibration.profile import scenario_specs
from simulator.cost.calibrated import COMPUTE_KINDS, KERNEL_COLUMNS, KERNEL_TABLE, CalibrationTables, write_table
from simulator.pipeline import simulate
from simulator.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "scenarios" / "calibration" / "tiny-gpt.toml"
TINY_TRACE = ROOT / "scenarios" / "calibration" / "cpu" / "tiny-gpt.trace.json.gz"
SHARED = ROOT.parent / "shared" / "traces"
FIXTURES = ROOT / "tests" / "data" / "traces"
PLAN_3D = ["cluster.gpus_per_node=8", "parallelism.pp=2", "parallelism.tp=2", "parallelism.dp=2"]
# Known efficiencies the synthetic run is built with: fraction of the H100's dense BF16 peak for GEMMs and
# attention, of its HBM bandwidth for every memory-bound kind.
KNOWN = {"gemm": 0.6, "attention": 0.4, "memory": 0.7}


def _known_tables(scn, directory: Path) -> Path:
    """Tables whose every op of ``scn`` runs at exactly the KNOWN efficiencies."""
    gpu, dtype = scn.cluster.gpu, scn.training.dtype
    rows = []
    for s in scenario_specs(scn):
        w = s.work
        if w.kind in COMPUTE_KINDS and w.flops > 0:
            t = w.flops / (gpu.peak(dtype) * KNOWN[w.kind])
        else:
            t = w.bytes / (gpu.hbm_bandwidth_Bps * KNOWN["memory"])
        rows.append((w.kind, w.name, s.pass_, dtype, tuple(w.shape), float(w.flops), float(w.bytes), t, 1))
    write_table(directory / KERNEL_TABLE, KERNEL_COLUMNS, rows, {"device": "known efficiencies"})
    return directory


def _known_run(tmp_path, overrides=()):
    base = load_scenario(TINY, list(overrides))
    tables = _known_tables(base, tmp_path / f"known{len(list(tmp_path.iterdir()))}")
    return simulate(load_scenario(TINY, list(overrides) + ["cost.compute=calibrated", f"cost.tables={tables}"]))


@pytest.mark.parametrize("annotate, schema, vendor", [(False, "current", "nvidia"), (False, "legacy", "amd"),
                                                      (True, "current", "amd")])
def test_fit_recovers_known_efficiencies(tmp_path, annotate, schema, vendor):
    result = _known_run(tmp_path)
    trace = write_kineto(kineto_doc(result, 0, steps=2, annotate=annotate, schema=schema, vendor=vendor),
                         tmp_path / "t.json.gz")
    fit = fit_traces([str(trace)], result.scenario)
    assert fit.coverage == pytest.approx(1.0)
    assert all(c["matched"] == c["kernels"] for c in fit.classes.values())
    for r in fit.rates:
        want = KNOWN[r.kind] if r.kind in COMPUTE_KINDS else KNOWN["memory"]
        assert r.fraction_of_peak == pytest.approx(want, rel=0.01), r
    assert {(r.kind, r.pass_) for r in fit.rates} >= {("gemm", "fwd"), ("gemm", "bwd"), ("attention", "fwd"),
                                                      ("attention", "bwd"), ("norm", "fwd"), ("optimizer", "step")}


def test_fitted_tables_replay_the_run_and_predict_another_plan(tmp_path, capsys):
    result = _known_run(tmp_path)
    trace = write_kineto(kineto_doc(result, 0, steps=2, annotate=False), tmp_path / "t.json.gz")
    out = tmp_path / "fitted"
    assert cmd_fit([str(trace)], str(TINY), str(out)) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("match coverage: 100.0%") and "gemm: 108/108 kernels matched" in printed
    tables = CalibrationTables.load(out)
    assert tables.provenance["command"].startswith("python -m simulator calibrate fit")
    assert json.loads((out / "fit.json").read_text())["coverage"] == pytest.approx(1.0)

    def fitted(overrides=()):
        scn = load_scenario(TINY, list(overrides) + ["cost.compute=calibrated", f"cost.tables={out}"])
        return simulate(scn).metrics["iteration_time_s"]

    assert fitted() == pytest.approx(result.metrics["iteration_time_s"], rel=0.01)
    # another plan: half the micro-batch, twice the micro-batches, shapes the trace never ran
    other = ["training.micro_batch_size=2"]
    truth = _known_run(tmp_path, other).metrics["iteration_time_s"]
    assert fitted(other) == pytest.approx(truth, rel=0.01)


@pytest.mark.parametrize("rank, annotate, schema", [(0, True, "current"), (5, False, "current"),
                                                    (6, True, "legacy"), (3, False, "legacy")])
def test_compare_of_a_runs_own_trace_is_exact_on_any_rank(tmp_path, rank, annotate, schema):
    result = simulate(load_scenario(TINY, PLAN_3D))
    trace = write_kineto(kineto_doc(result, rank, steps=3, annotate=annotate, schema=schema), tmp_path / "t.json")
    c = compare_run(parse_kineto(trace), result)
    stage = rank // 4  # tp 2 x dp 2 ranks per stage
    assert (c["measured_rank"], c["rank"]) == (rank, 4 * stage)
    assert c["coverage"] == pytest.approx(1.0) and not c["coverage_warning"]
    assert c["step_time_error"] == pytest.approx(0.0, abs=1e-9)
    compute = [r for r in c["per_op"] if r["simulated_ops"]]
    assert compute and all(r["error"] == pytest.approx(0.0, abs=1e-9) for r in compute)


def test_overlapping_steps_are_cut_at_the_next_steps_start():
    """Step 1's last kernel (an all-reduce) runs until 1.5 s, into step 2 (which starts at 1.0 s)."""
    ops = [MeasuredOp("gemm", "gemm", 0, "stream 7", 0.0, 0.9, "F", 1),
           MeasuredOp("ncclAllReduce", "nccl", 0, "stream 20", 0.5, 1.5, "B", 1),
           MeasuredOp("gemm", "gemm", 0, "stream 7", 1.0, 1.9, "F", 2),
           MeasuredOp("gemm", "gemm", 0, "stream 7", 2.0, 2.9, "F", 3)]
    run = KinetoRun(ops, [], [], {1: (0.0, 1.0), 2: (1.0, 2.0), 3: (2.0, 3.0)}, False, {}, {3: (2.0, 3.0)})
    steps = {k: [o for o in ops if o.step == k] for k in (1, 2, 3)}
    assert step_periods(run, steps) == {1: (0.0, 1.0), 2: (1.0, 2.0), 3: (2.0, 3.0)}


def test_committed_tiny_trace_compares_and_fits_without_torch(tmp_path, monkeypatch, capsys):
    """scenarios/calibration/cpu/tiny-gpt.trace.json.gz, written by `calibrate profile --device cpu`."""
    run = parse_kineto(TINY_TRACE)
    assert run.metadata["record_shapes"] and run.cpu_only
    monkeypatch.chdir(ROOT)
    assert cmd_compare(str(TINY_TRACE), str(TINY), str(tmp_path / "cmp")) == 0
    assert capsys.readouterr().out.startswith("match coverage: ")
    c = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert c["mapping"] == "annotation" and c["coverage"] > 0.9 and not c["coverage_warning"]
    out = tmp_path / "fit"
    assert cmd_fit([str(TINY_TRACE)], str(TINY), str(out)) == 0
    tables = CalibrationTables.load(out)
    scn = load_scenario(TINY, ["cost.compute=calibrated", f"cost.tables={out}"])
    specs = scenario_specs(scn)
    covered = {(r.kind, r.name, r.pass_) for r in tables.kernels}
    # every op the tiny model runs has a row; grad_norm is the simulator's, the tiny model clips nothing;
    # embed_grad (strategy/embed_grad) is the table's dense gradient, whose zero-fill the trace counts in
    # the embedding's backward and whose main_grad accumulation a plain PyTorch loop does not run
    assert {(s.work.kind, s.work.name, s.pass_) for s in specs} - covered == {("optimizer", "grad_norm", "step"),
                                                                            ("elementwise", "embed_grad", "bwd")}
    assert simulate(scn).metrics["iteration_time_s"] > 0


def _foreign_traces() -> list[Path]:
    found = sorted(FIXTURES.glob("*.json.gz"))
    if SHARED.is_dir():
        found += sorted(SHARED.glob("*.json.gz"))
    return found


@pytest.mark.parametrize("path", _foreign_traces(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_foreign_trace_loads_draws_and_compares_with_low_coverage(tmp_path, path, capsys):
    from simulator.analysis.measured import plot_measured_timeline

    trace = load_kineto_trace(path)
    assert plot_measured_timeline(trace, tmp_path / "t.png").is_file()
    assert cmd_compare(str(path), str(TINY), str(tmp_path / "cmp")) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("match coverage: ") and out[1].startswith("warning: coverage below 50%")
    c = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert c["coverage"] < 0.1 and c["coverage_warning"]
    assert cmd_fit([str(path)], str(TINY), str(tmp_path / "fit")) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: only ") and err.count("\n") == 1


def test_compare_places_a_rank_outside_the_scenario(tmp_path):
    result = simulate(load_scenario(TINY))
    doc = kineto_doc(result, 0, steps=2)
    doc["distributedInfo"]["rank"] = 7
    c = compare_run(parse_kineto(write_kineto(doc, tmp_path / "t.json")), result)
    assert c["measured_rank"] == 7 and c["rank"] == 0 and "outside the scenario's 1 GPUs" in c["placement"]
    assert c["step_time_error"] == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("cov, refused", [(0.499, True), (0.5, False)])
def test_fit_refuses_under_half_of_the_kernel_time_matched(cov, refused, monkeypatch):
    """README: `calibrate fit` refuses under 50% matched (exit 2 from the CLI): the threshold itself, on
    the committed tiny trace with its coverage set either side of it."""
    from simulator.calibration import fit

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(fit, "coverage_fraction", lambda cover: cov)
    scn = load_scenario(TINY)
    if refused:
        with pytest.raises(ValueError, match="fit needs 50%"):
            fit.fit_traces([str(TINY_TRACE)], scn)
    else:
        assert fit.fit_traces([str(TINY_TRACE)], scn).coverage == cov
