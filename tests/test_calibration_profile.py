"""calibration/profile, tiny_model and cli: kernel specs, the CPU profiling pipeline, and the loop
profile -> tables -> calibrated simulation -> compare, end to end on the CPU (torch needed)."""

import json
from pathlib import Path

import pytest

from simulator.calibration.profile import adam_work, pass_of, preset_specs, scenario_specs
from simulator.model.opgraph import gemm_flops
from simulator.model.presets import MODEL_PRESETS
from simulator.scenario import load_scenario
from simulator.strategy.lower import lower
from simulator.tasks import OpWork

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "scenarios" / "calibration" / "tiny-gpt.toml"


def test_pass_of_reads_the_phase_and_the_flops():
    g = OpWork("fc1", "gemm", gemm_flops(8, 16, 32), 1.0, (8, 16, 32))
    g2 = OpWork("fc1", "gemm", 2 * gemm_flops(8, 16, 32), 1.0, (8, 16, 32))
    assert [pass_of(g, "F"), pass_of(g, "R"), pass_of(g2, "B"), pass_of(g, "B"), pass_of(g, "W")] == \
        ["fwd", "fwd", "bwd", "bwd_input", "bwd_weight"]
    assert pass_of(adam_work(10), "O") == "step"
    assert pass_of(OpWork("ln1", "norm", 0.0, 6.0, (1, 1)), "B") == "bwd"


def test_scenario_specs_are_every_distinct_compute_work():
    scn = load_scenario(TINY)
    works = {w for t in lower(scn).graph.tasks if t.kind == "compute" for w in t.work}
    specs = scenario_specs(scn)
    assert {s.work for s in specs} == works
    assert len(specs) == len({s.key for s in specs})


def test_preset_specs_hold_the_tp_shards_of_the_presets():
    specs = preset_specs((MODEL_PRESETS["gpt3-175b"],), tps=(1, 8))
    shapes = {(s.work.name, s.pass_, s.work.shape) for s in specs}
    h, s = 12288, 2048
    assert ("qkv", "fwd", (s, 3 * h, h)) in shapes and ("qkv", "fwd", (s, 3 * h // 8, h)) in shapes
    assert ("fc2", "bwd", (s, h, 4 * h // 8)) in shapes
    assert ("ln1", "fwd", (s // 8, h)) in shapes  # sequence parallelism shards the norm's tokens
    assert sum(sp.work.kind == "optimizer" for sp in specs) == 5


def test_cpu_runners_time_every_kind():
    torch = pytest.importorskip("torch")
    from simulator.calibration.profile import profile_kernels

    scn = load_scenario(TINY)
    specs = [s for s in scenario_specs(scn) if s.work.kind in ("gemm", "attention", "loss", "optimizer")]
    rows, skipped = profile_kernels(specs[:6], "cpu", "bf16")
    assert len(rows) == 6 and not skipped and all(r.time_s > 0 and r.samples >= 10 for r in rows)
    assert [(r.kind, r.shape, r.flops, r.bytes) for r in rows] == \
        [(s.work.kind, s.work.shape, s.work.flops, s.work.bytes) for s in specs[:6]]


def test_profile_without_cuda_exits_2(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from simulator.calibration.cli import cmd_profile

    assert cmd_profile(None, None) == 2
    err = capsys.readouterr().err
    assert "--device cpu" in err and err.count("\n") == 1


def test_profile_refuses_zero_steps_before_profiling(tmp_path, capsys):
    pytest.importorskip("torch")
    from simulator.calibration.cli import cmd_profile

    assert cmd_profile("cpu", str(tmp_path), steps=0) == 2
    err = capsys.readouterr().err
    assert "--steps must be >= 1, got 0" in err and err.count("\n") == 1
    assert not any(tmp_path.iterdir())  # nothing was profiled or written


def test_profile_compare_loop_on_cpu(tmp_path, capsys):
    pytest.importorskip("torch")
    from simulator.calibration.cli import cmd_compare, cmd_profile, cmd_show
    from simulator.cost.calibrated import CalibrationTables

    out = tmp_path / "cal"
    assert cmd_profile("cpu", str(out), steps=2) == 0
    tables = CalibrationTables.load(out)
    assert tables.provenance["device"].startswith("cpu") and "--device cpu" in tables.provenance["command"]
    trace, scn_file = out / "tiny-gpt.trace.json.gz", out / "tiny-gpt.toml"
    assert load_scenario(scn_file).cost.compute == "calibrated"

    assert cmd_compare(str(trace), str(scn_file), str(tmp_path / "cmp")) == 0
    c = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert c["mapping"] == "annotation" and len(c["steps"]) == 2
    assert c["step_time_error"] == pytest.approx((c["simulated_step_s"] - c["measured_step_s"]) / c["measured_step_s"])
    # every simulated op has measured kernels; the simulated op times are the table's
    # (grad_norm: the simulator's gradient-clipping norm, which the tiny model does not run)
    simulated = [r for r in c["per_op"] if r["simulated_ops"] and r["op"] != "grad_norm"]
    assert len(simulated) == 29 and all(r["measured_s"] > 0 for r in simulated)
    assert c["coverage"] > 0.9 and not c["coverage_warning"]
    assert sum(r["simulated_s"] for r in c["per_op"]) == pytest.approx(c["simulated_step_s"], rel=1e-9)
    for name in ("compare.md", "compare_timeline.png", "measured_trace.json"):
        assert (tmp_path / "cmp" / name).is_file()

    assert cmd_show(str(trace), str(tmp_path / "show")) == 0
    assert (tmp_path / "show" / "timeline.png").is_file()
    assert "rank 0: kernel time" in capsys.readouterr().out


@pytest.mark.gpu
def test_profile_on_cuda(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from simulator.calibration.cli import cmd_compare, cmd_profile

    out = tmp_path / "cal"
    assert cmd_profile("cuda", str(out), steps=2, presets=False) == 0
    assert cmd_compare(str(out / "tiny-gpt.trace.json.gz"), str(out / "tiny-gpt.toml"), str(tmp_path / "c")) == 0
    c = json.loads((tmp_path / "c" / "compare.json").read_text())
    assert c["mapping"] == "annotation" and c["device"] and c["measured_step_s"] > 0
