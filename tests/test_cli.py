"""The command line contract (DESIGN.md §4.2): --json prints one JSON value; bad input -> one line, exit 2."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SMALL = ROOT / "scenarios" / "gpt3-1.3b-8xa100.toml"


def cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "simulator", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def test_presets_lists_models_gpus_clusters():
    out = cli("presets", "--json")
    assert out.returncode == 0
    data = json.loads(out.stdout)
    assert {"gpt3-175b", "llama3-405b", "mixtral-8x7b"} <= set(data["models"])
    assert {"dgx-a100-40gb", "dgx-a100-80gb", "dgx-h100", "dgx-h200"} <= set(data["clusters"])
    assert data["gpus"]["h100-sxm5-80gb"]["bf16_tflops"] == pytest.approx(989.4)


def test_run_json_prints_exactly_one_value_and_writes_results(tmp_path):
    out = cli("run", SMALL, "--json", "--out", tmp_path / "r")
    assert out.returncode == 0, out.stderr
    metrics = json.loads(out.stdout)
    assert metrics["num_gpus"] == 8 and metrics["iteration_time_s"] > 0
    for name in ("metrics.json", "trace.json", "timeline.png", "bubbles.png", "memory.png", "report.md"):
        assert (tmp_path / "r" / name).stat().st_size > 0, name


@pytest.mark.parametrize("args, fragment", [
    (["run", "nope.toml"], "does not exist"),
    (["run", SMALL, "--set", "parallelism.tp=3"], "parallelism"),
    (["run", SMALL, "--set", "bogus"], "--set 'bogus'"),
    (["run", SMALL, "--set", "training.global_batch_size=-1"], "training.global_batch_size must be positive"),
    (["run", SMALL, "--set", "model.parallel_norms=3", "--set", "model.parallel_attn_mlp=true"],
     "model.parallel_norms must be 1"),
    (["run"], "arguments"),
    (["collective", "--cluster", "dgx-z", "--op", "all_reduce"], "dgx-z"),
])
def test_bad_input_is_one_line_exit_2(args, fragment):
    out = cli(*args)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert fragment in lines[0]


def test_malformed_toml(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\n")
    out = cli("run", bad)
    assert out.returncode == 2 and "malformed TOML" in out.stderr and "Traceback" not in out.stderr


def test_an_internal_failure_is_reported_as_a_bug_with_exit_1(monkeypatch, capsys):
    from simulator import __main__ as cli
    from simulator.tasks import InternalError

    def broken(args):
        raise InternalError("simulation deadlocked: 3 tasks never ran, first 'F0.L0'")
    monkeypatch.setitem(cli.COMMANDS, "presets", broken)
    assert cli.main(["presets"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("internal error (a bug in the simulator") and "deadlocked" in err[0]
    assert issubclass(InternalError, RuntimeError) and not issubclass(InternalError, ValueError)  # never exit 2
