"""calibration/profile, tiny_model and cli: kernel specs, the CPU profiling pipeline, and the loop
profile -> tables -> calibrated simulation -> compare, end to end on the CPU (torch needed)."""

import dataclasses
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
    opt = sorted((sp.work.name, sp.work.shape[0]) for sp in specs if sp.work.kind == "optimizer")
    assert opt == sorted((name, 2 ** e) for name in ("adam", "grad_norm") for e in (20, 22, 24, 26, 28))


def test_cpu_runners_time_every_kind():
    torch = pytest.importorskip("torch")
    from simulator.calibration.profile import profile_kernels

    scn = load_scenario(TINY)
    specs = [s for s in scenario_specs(scn) if s.work.kind in ("gemm", "attention", "loss", "optimizer")]
    rows, skipped = profile_kernels(specs[:6], "cpu", "bf16")
    assert len(rows) == 6 and not skipped and all(r.time_s > 0 and r.samples >= 10 for r in rows)
    assert [(r.kind, r.shape, r.flops, r.bytes) for r in rows] == \
        [(s.work.kind, s.work.shape, s.work.flops, s.work.bytes) for s in specs[:6]]


@pytest.mark.parametrize("name, nbytes", [("grad_norm", 4.0), ("grad_norm", 2.0), ("adam", 30.0)])
def test_each_optimizer_op_runs_its_own_kernel(name, nbytes):
    """grad_norm times the gradient clipping's L2 norm over the shard (in the dtype its bytes name), not
    an AdamW step: the committed tables' first runs held Adam's time in their grad_norm rows."""
    torch = pytest.importorskip("torch")
    from simulator.calibration.kernels import make_runner
    from simulator.calibration.profile import KernelSpec

    n = 4096
    runner = make_runner(KernelSpec(OpWork(name, "optimizer", 0.0, n * nbytes, (n,)), "step", None), "cpu", "bf16")
    out = runner()
    if name == "grad_norm":
        assert out.dim() == 0 and out.dtype == torch.float32 and float(out) > 0
    else:
        assert out is None  # the step updates its shard in place


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
    assert cmd_profile("cpu", str(tmp_path), warmup=-1) == 2
    assert "--warmup must be >= 0, got -1" in capsys.readouterr().err and not any(tmp_path.iterdir())


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


@pytest.mark.parametrize("flag, presets, warmup", [([], None, None), (["--no-presets", "--warmup", "80"], False, 80)])
def test_no_presets_and_warmup_flags_reach_the_profiler(monkeypatch, flag, presets, warmup):
    import simulator.calibration.cli as cli
    from simulator.__main__ import main

    seen = {}
    monkeypatch.setattr(cli, "cmd_profile", lambda *a, **k: seen.update(k) or 0)
    assert main(["calibrate", "profile", "--device", "cuda", "--scenario", str(TINY), *flag]) == 0
    assert seen["presets"] is presets and seen["scenario"] == str(TINY) and seen["warmup"] == warmup


def test_eager_ops_compute_what_torchtitans_modules_compute():
    """The calibration model's eager Llama ops (calibration/eager_ops.py): the fp32 RMSNorm equals
    torch's rms_norm, the complex rotary embedding turns each (even, odd) pair by its angle and keeps
    its length, repeat_kv copies every K/V head to its query heads."""
    torch = pytest.importorskip("torch")
    from simulator.calibration.eager_ops import freqs_cis, repeat_kv, rms_norm_class, rotary

    torch.manual_seed(0)
    x = torch.randn(2, 5, 3, 8)
    norm = rms_norm_class()(8, 1e-5)
    assert torch.allclose(norm(x), torch.nn.functional.rms_norm(x, (8,), norm.weight, 1e-5), atol=1e-6)
    cis = freqs_cis(8, 5)
    y = rotary(x, cis)
    pairs, turned = x.reshape(2, 5, 3, 4, 2), y.reshape(2, 5, 3, 4, 2)
    assert torch.allclose(pairs.norm(dim=-1), turned.norm(dim=-1), atol=1e-5)
    angle = torch.atan2(pairs[..., 1], pairs[..., 0]) + cis.angle().view(1, 5, 1, 4)
    assert torch.allclose(torch.atan2(turned[..., 1], turned[..., 0]).cos(), angle.cos(), atol=1e-4)
    kv = repeat_kv(x, 2)
    assert kv.shape == (2, 5, 6, 8) and torch.equal(kv[:, :, 4], x[:, :, 2]) and torch.equal(kv[:, :, 5], x[:, :, 2])


def test_an_eager_llama_scenario_trains_torchtitans_ops_and_maps_every_op(tmp_path):
    """kernels = "eager" on a Llama-style scenario: the calibration model runs torchtitan's separate
    projections, fp32 RMSNorm, complex rotary embedding and repeated K/V (one CPU step), and compare
    still maps nearly all of the measured kernel time to the scenario's ops."""
    torch = pytest.importorskip("torch")
    from simulator.calibration.cli import cmd_compare
    from simulator.calibration.tiny_model import build_model, train_profiled

    text = (ROOT / "scenarios" / "calibration" / "llama31-8b-4layers.toml").read_text()
    small = text.replace('preset = "llama3-8b"\nnum_layers = 4', 'preset = "llama3-8b"\nnum_layers = 2\n'
                         'hidden_size = 64\nnum_attention_heads = 4\nnum_kv_heads = 2\nffn_hidden_size = 128\n'
                         'vocab_size = 256\nseq_length = 32')
    assert small != text
    path = tmp_path / "small.toml"
    path.write_text(small)
    scn = load_scenario(path)
    names = {n for n, _ in build_model(scn.model, "cpu", eager=True).named_modules()}
    assert {"blocks.0.wq", "blocks.0.wk", "blocks.0.wv", "blocks.0.w1", "blocks.0.w3"} <= names
    # a rotary model without a gated MLP is not a Llama layer: the plain ops, and it still runs
    plain = dataclasses.replace(scn.model, mlp="gelu")
    gelu = build_model(plain, "cpu", eager=True)
    assert "blocks.0.qkv" in {n for n, _ in gelu.named_modules()}
    idx = torch.zeros((1, plain.seq_length), dtype=torch.long)
    assert torch.isfinite(gelu(idx, idx))
    trace = train_profiled(scn, "cpu", tmp_path / "t.json.gz", steps=1, warmup=0)
    assert cmd_compare(str(trace), str(path), str(tmp_path / "cmp")) == 0
    c = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert c["coverage"] > 0.9
    assert {r["op"] for r in c["per_op"]} >= {"ln1", "qkv", "rope", "attn_core", "fc1", "act", "fc2"}


def test_the_calibrated_scenario_keeps_the_kernels_attention_and_loss_it_was_profiled_with(tmp_path):
    """profile writes the scenario back with [cost] calibrated; the training choices that decide which
    kernels run (attention backend, eager or fused small ops, the loss) survive the round trip."""
    from simulator.calibration.cli import calibrated_scenario_toml

    scn = load_scenario(ROOT / "scenarios" / "calibration" / "llama31-8b-4layers.toml")
    out = tmp_path / "cal.toml"
    out.write_text(calibrated_scenario_toml(scn, str(tmp_path), "dgx-h100"))
    back = load_scenario(out)
    assert dataclasses.replace(back.model, name=scn.model.name) == scn.model and back.cost.compute == "calibrated"
    for key in ("attention", "kernels", "cross_entropy", "dtype", "micro_batch_size", "global_batch_size"):
        assert getattr(back.training, key) == getattr(scn.training, key), key
