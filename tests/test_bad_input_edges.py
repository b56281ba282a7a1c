"""Bad input at the edges, found by fuzzing the command line: every case ends with one line on stderr
naming what was wrong and exit code 2, never a traceback, a silent wrong answer or a run that does
not end (malformed Hugging Face configs and profiler traces, paths the system refuses, TOML nested too
deeply, hardware numbers out of range, a sustained clock above the boost clock, empty or repeated
validation columns, unknown calibration-table kinds, a sweep grid with no valid point)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SMALL = ROOT / "scenarios" / "gpt3-1.3b-8xa100.toml"
LLAMA = ROOT / "tests" / "data" / "hf" / "Llama-3.2-1B" / "config.json"
TRACE = ROOT / "scenarios" / "calibration" / "cpu" / "tiny-gpt.trace.json.gz"


def _main(args, capsys) -> tuple[int, list[str]]:
    from simulator.__main__ import main
    code = main([str(a) for a in args])
    return code, capsys.readouterr().err.strip().splitlines()


def _one_line(code: int, err: list[str], fragment: str) -> None:
    assert code == 2 and len(err) == 1 and fragment in err[0], (code, err)


@pytest.mark.parametrize("key, value, fragment", [
    ("architectures", 5, "architectures must be a list of class names, got 5"),
    ("architectures", [["LlamaForCausalLM"]], "architectures must be a list of class names"),
    ("attention_dropout", [0.1], "attention_dropout must be a number in [0, 1], got [0.1]"),
    ("attention_dropout", "abc", "attention_dropout must be a number in [0, 1]"),
    ("layer_types", 5, "layer_types = 5: must be a list of sliding_attention / full_attention"),
])
def test_a_malformed_hf_config_names_its_key(tmp_path, key, value, fragment):
    from simulator.model.hf import load_hf_config
    cfg = json.loads(LLAMA.read_text())
    if key == "architectures":
        cfg.pop("model_type", None)
    cfg[key] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="^config.json") as exc:  # the CLI prints it as one line, exit 2
        load_hf_config(path)
    assert fragment in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("key, value, fragment", [("ts", None, "has ts = null"), ("dur", [1], "has dur = [1]"),
                                                  ("dur", -5, "not a finite duration >= 0")])
def test_a_trace_event_without_a_time_names_it(tmp_path, capsys, key, value, fragment):
    doc = json.loads(gzip.open(TRACE).read())
    next(e for e in doc["traceEvents"] if e.get("ph") == "X")[key] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    _one_line(*_main(["calibrate", "show", path, "--out", tmp_path / "o"], capsys), fragment)


def test_paths_the_system_refuses_and_names_too_long_for_a_folder(tmp_path, capsys):
    _one_line(*_main(["run", tmp_path / ("a" * 300 + ".toml")], capsys), "File name too long")
    _one_line(*_main(["run", SMALL, "--out", tmp_path / ("b" * 300)], capsys), "File name too long")
    long_name = tmp_path / "long.toml"
    long_name.write_text(SMALL.read_text().replace('name = "', f'name = "{"c" * 250}', 1))
    _one_line(*_main(["run", long_name], capsys), "bytes long, at most 200: results go to results/<name>")


def test_toml_nested_too_deeply(tmp_path, capsys):
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    _one_line(*_main(["run", deep], capsys), "nested too deeply")


@pytest.mark.parametrize("setting, fragment", [
    ("cluster.nic_bandwidth_Gbps=1e300", "cluster.nic_bandwidth_Gbps = 1e+300 is out of range (at most 1e+09"),
    ("cluster.nvlink_bandwidth_GBps=1e300", "nvlink_bandwidth_GBps = 1e+300 is out of range"),
    ("cluster.gpu={preset='h100-sxm5-80gb', memory_capacity_GB=1e300}", "memory_capacity_GB = 1e+300 is out of range"),
    ("cluster.gpu={preset='h100-sxm5-80gb', sustained_clock_MHz=5000}",
     "sustained_clock_MHz = 5000 exceeds boost_clock_MHz = 1980"),
])
def test_hardware_numbers_out_of_range(tmp_path, capsys, setting, fragment):
    _one_line(*_main(["run", SMALL, "--set", setting, "--out", tmp_path], capsys), fragment)


def test_validation_csv_without_rows_or_with_a_repeated_column(tmp_path, capsys):
    empty = tmp_path / "empty.csv"
    empty.write_text("name,iteration_time_s\n")
    _one_line(*_main(["validate", empty, "--out", tmp_path / "o"], capsys), "has a header and no rows")
    twice = tmp_path / "twice.csv"
    twice.write_text("name,iteration_time_s,name\nx,1,y\n")
    _one_line(*_main(["validate", twice, "--out", tmp_path / "o"], capsys), "repeats column(s) ['name']")


@pytest.mark.parametrize("table, column, value", [("kernels.csv", "kind", "frob"), ("kernels.csv", "pass", "sideways")])
def test_calibration_tables_refuse_unknown_kinds_and_passes(tmp_path, table, column, value):
    from simulator.cost.calibrated import CalibrationTables
    src = (ROOT / "scenarios" / "calibration" / "cpu" / table).read_text().splitlines()
    header = next(i for i, line in enumerate(src) if not line.startswith("#"))
    cells = src[header + 1].split(",")
    cells[src[header].split(",").index(column)] = value
    src[header + 1] = ",".join(cells)
    (tmp_path / table).write_text("\n".join(src) + "\n")
    with pytest.raises(ValueError, match=rf"{column} = '{value}' is unknown; known: "):
        CalibrationTables.load(tmp_path)


def test_a_sweep_grid_with_no_valid_point_is_bad_input(tmp_path, capsys):
    code, err = _main(["sweep", SMALL, "--grid", "parallelism.tp=a,b", "--out", tmp_path], capsys)
    _one_line(code, err, "none of the 2 points is a valid scenario; the first: parallelism.tp must be int, got 'a'")


@pytest.mark.parametrize("args, fragment", [
    (["collective", "--nodes", 1000000, "--op", "all_reduce"], "8000000 GPUs, more than the 262,144"),
    (["run", SMALL, "--set", "cluster.num_nodes=100000", "--set", "parallelism.dp=200000",
      "--set", "training.global_batch_size=400000"], "800000 GPUs, more than the 262,144 a simulation can hold"),
    (["sweep", SMALL, "--grid", "parallelism.tp=1,2", "--jobs", 100000], "--jobs 100000 exceeds 256 local worker"),
])
def test_runs_too_large_to_end_are_refused_up_front(tmp_path, capsys, args, fragment):
    _one_line(*_main(args + ["--out", tmp_path], capsys), fragment)


def test_collective_names_its_own_flags(capsys, tmp_path):
    _one_line(*_main(["collective", "--op", "all_reduce", "--cluster", "dgx-z"], capsys),
              "--cluster 'dgx-z' is unknown; known: dgx-a100-40gb")
    hw = ROOT / "simulator" / "data" / "hardware" / "clusters" / "dgx-h100.toml"
    code, _ = _main(["collective", "--op", "all_reduce", "--set", f"cluster.hardware='{hw}'", "--json"], capsys)
    assert code == 0  # a hardware file given through --set is not "a preset and a file both given"
