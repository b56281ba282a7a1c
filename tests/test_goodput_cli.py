"""``simulator goodput``: one JSON value with --json, results/<name>/ files, same seed -> same output,
bad values -> one line on stderr, exit 2."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SMALL = ROOT / "scenarios" / "gpt3-1.3b-8xa100.toml"
# 8 GPUs fail rarely at Llama 3's per-device rates; a 3000-fold rate gives about ten a day
BUSY = ("--set", "reliability.failure_rate_scale=3000")


def cli(*args):
    return subprocess.run([sys.executable, "-m", "simulator", "goodput", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_json_report_and_files(tmp_path):
    out = cli(SMALL, "--days", 0.5, "--seeds", 2, *BUSY, "--json", "--out", tmp_path / "g")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    s = data["summary"]
    assert data["num_gpus"] == 8 and data["step_time_s"] > 0 and s["seeds"] == 2
    assert 0 < s["goodput"]["mean"] <= s["effective_training_fraction"]["mean"] <= 1
    assert s["days"]["mean"] == pytest.approx(0.5)
    assert sum(s["breakdown_fraction"].values()) == pytest.approx(1.0)
    assert s["interruptions_per_day"]["mean"] > 1 and s["interruptions_by_component"]
    assert len(data["sweep"]) >= 5
    assert data["sweep_optimum_interval_s"] is None or data["sweep_optimum_interval_s"] > 0
    for name in ("goodput.json", "goodput.md", "goodput_progress.png", "goodput_sweep.png"):
        assert (tmp_path / "g" / name).stat().st_size > 0, name


def test_same_seed_same_output_and_tokens_target(tmp_path):
    args = (SMALL, "--tokens", 2e9, "--seeds", 2, *BUSY, "--step-time-s", 0.5, "--no-sweep", "--json")
    a, b = cli(*args, "--out", tmp_path / "a"), cli(*args, "--out", tmp_path / "b")
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout
    s = json.loads(a.stdout)["summary"]
    assert s["reached_target"] and s["tokens"]["min"] >= 2e9
    assert s["days"]["max"] >= s["days"]["min"] > 0


@pytest.mark.parametrize("args, fragment", [
    (["--days", -1], "--days must be a positive number"),
    (["--seeds", 0], "--seeds must be 1..1000"),
    (["--seeds", 10**8], "--seeds must be 1..1000, got 100000000"),
    (["--days", 1e9], "--days must be at most 3650"),
    (["--step-time-s", 1e-9], "steps of 1e-09 s in 54 days; at most 1e+09"),
    (["--set", "reliability.failure_rate_scale=1e12"], "expected failures in 54 days; at most 1e+06"),
    (["--days", 1, "--tokens", 5], "not allowed with argument"),
    (["--set", "reliability.detection_s=-5"], "reliability.detection_s must be >= 0, got -5"),
    (["--set", "reliability.checkpoint_mode=later"], "reliability.checkpoint_mode must be 'sync' or 'async'"),
    (["--set", "reliability.nope=1"], "[reliability] unknown key(s) ['nope']"),
])
def test_bad_values_exit_2_with_one_line(args, fragment, tmp_path):
    out = cli(SMALL, "--step-time-s", 0.5, "--no-sweep", "--out", tmp_path, *args)
    assert out.returncode == 2
    assert fragment in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
