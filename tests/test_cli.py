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
    assert {"te1-default", "te2-default", "torch-async-tp"} <= set(data["tp_overlap"])
    assert "NeMo" in data["tp_overlap"]["userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192"]["source"]


def test_run_json_prints_exactly_one_value_and_writes_results(tmp_path):
    out = cli("run", SMALL, "--json", "--out", tmp_path / "r")
    assert out.returncode == 0, out.stderr
    metrics = json.loads(out.stdout)
    assert metrics["num_gpus"] == 8 and metrics["iteration_time_s"] > 0
    for name in ("metrics.json", "trace.json", "timeline.png", "bubbles.png", "memory.png", "links.png",
                 "report.md"):
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


def _main_exit(args, capsys):
    from simulator.__main__ import main
    code = main([str(a) for a in args])
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


@pytest.mark.parametrize("args, fragment", [
    (["run", SMALL, "--set", "model.preset=[1]"], "model.preset [1] is unknown"),
    (["run", SMALL, "--set", "model.hf_config=3"], "model.hf_config must be the path"),
    (["run", SMALL, "--set", "model.norm='batchnorm'"], "norm must be one of layernorm, rmsnorm"),
    (["run", SMALL, "--set", "model.position_embedding='alibi'"], "position_embedding must be one of"),
    (["run", SMALL, "--set", "model.num_layers=100000000"], "layer passes"),
    (["collective", "--op", "all_reduce", "--size-bytes", "inf"], "--size-bytes must be a finite number of bytes >= 1"),
    (["collective", "--op", "all_reduce", "--size-bytes", "nan"], "--size-bytes must be a finite number of bytes >= 1"),
])
def test_more_bad_input_is_one_line_exit_2(args, fragment, capsys):
    code, err = _main_exit(args, capsys)
    assert code == 2 and len(err) == 1 and fragment in err[0], err


def test_a_section_given_as_a_value_is_refused_under_set(tmp_path, capsys):
    scn = tmp_path / "s.toml"
    scn.write_text('name = "s"\nmodel = "gpt3-1.3b"\n')
    code, err = _main_exit(["run", scn, "--set", "model.preset=gpt3-1.3b"], capsys)
    assert code == 2 and len(err) == 1 and "[model] must be a table" in err[0], err


@pytest.mark.parametrize("where", ["file", "under-file"])
def test_out_naming_a_file_is_refused_before_any_work(where, tmp_path, capsys):
    f = tmp_path / "a-file"
    f.write_text("")
    out = f if where == "file" else f / "sub"
    code, err = _main_exit(["collective", "--op", "all_reduce", "--sweep", "--out", out], capsys)
    assert code == 2 and len(err) == 1 and "exists and is not a folder" in err[0], err
    assert f.read_text() == ""


def test_validate_rows_with_bad_cells(tmp_path, capsys):
    header = "name,iteration_time_s,num_layers"
    short = tmp_path / "short.csv"
    short.write_text(f"{header}\nx,1.0\n")
    code, err = _main_exit(["validate", short, "--out", tmp_path / "o1"], capsys)
    assert code == 2 and len(err) == 1 and "line 2: 2 cells, the header has 3" in err[0], err
    from simulator.explore.validate import evaluate_row
    row = evaluate_row({"name": "zero", "iteration_time_s": "0"})
    assert row["status"] == "failed" and "iteration_time_s must be a positive number" in row["reason"]


def test_search_with_no_plan_that_fits_is_bad_input(tmp_path, capsys):
    scn = tmp_path / "big.toml"
    scn.write_text('name = "big"\n[model]\npreset = "gpt3-175b"\n[cluster]\npreset = "dgx-a100-40gb"\nnum_nodes = 1\n'
                   '[training]\nglobal_batch_size = 8\n')
    code, err = _main_exit(["search", scn, "--jobs", "1", "--out", tmp_path / "r"], capsys)
    assert code == 2 and err[-1].startswith("error: no plan fits in memory") and "40.0 GiB per GPU" in err[-1], err


def test_goodput_of_a_restart_longer_than_any_float_is_zero():
    from simulator.reliability import expected_goodput
    assert expected_goodput(3600.0, 10.0, 1e12, 1e-6) == 0.0
    assert 0.0 < expected_goodput(3600.0, 10.0, 600.0, 1e-6) < 1.0


@pytest.mark.parametrize("args, fragment", [
    (["run", SMALL, "--set", "cluster.preset={}"], "cluster.preset {} is unknown"),
    (["collective", "--op", "all_reduce", "--set", "cluster.preset=[1]"], "cluster.preset [1] is unknown"),
    (["run", SMALL, "--set", "cluster.nvls=true"], "needs NVLink SHARP"),
    (["run", SMALL, "--set", "parallelism.tp=2\nparallelism.pp=99"], "one TOML value on one line"),
    (["run", SMALL, "--set", "model.mtp_layers=100000000"], "layer passes"),
    (["run", SMALL, "--set", "cost.collective_algorithms={bogus='ring'}"], "unknown op(s) ['bogus']"),
    (["run", SMALL, "--set", "model.sliding_window_pattern=2"], "needs sliding_window > 0"),
    (["run", SMALL, "--set", "model.q_lora_rank=64"], "need kv_lora_rank > 0"),
    (["run", SMALL, "--set", "model.hf_config='x/config.json'"], "both given: name one"),
    (["run", SMALL, "--set", "parallelism.recompute='selective'", "--set", "parallelism.recompute_modules=['moe']"],
     "'moe' needs an MoE model"),
    (["collective", "--op", "all_reduce", "--size-bytes", "0.5"], "--size-bytes must be a finite number of bytes >= 1"),
    (["run", SMALL, "--set", "parallelism.tp=1", "--set", "parallelism.pp=4", "--set", "model.num_layers=4",
      "--set", "parallelism.schedule='interleaved-1f1b'"], "the default rule"),
    (["sweep", SMALL, "--grid", "parallelism.tpp=1,2"], "--grid parallelism.tpp: [parallelism] unknown key"),
    (["sweep", SMALL, "--grid", "foo.tp=1,2"], "--grid foo.tp: unknown top-level key"),
    (["sweep", SMALL, "--grid", "parallelism.tp=1,2", "--set", "parallelism.bogus=1"], "unknown key(s) ['bogus']"),
])
def test_structural_bad_input_is_one_line_exit_2(args, fragment, capsys):
    code, err = _main_exit(args, capsys)
    assert code == 2 and len(err) == 1 and fragment in err[0], err


@pytest.mark.parametrize("content, fragment", [
    (b"\xff\xfe", "is not UTF-8 text"),
    (b'name = ".."\n', "must be a plain folder name"),
    (b'name = "a/b"\n', "must be a plain folder name"),
])
def test_scenario_files_refused_by_content(content, fragment, tmp_path, capsys):
    scn = tmp_path / "s.toml"
    scn.write_bytes(content)
    code, err = _main_exit(["run", scn, "--out", tmp_path / "r"], capsys)
    assert code == 2 and len(err) == 1 and fragment in err[0], err


def test_a_folder_given_as_a_file_says_so(tmp_path, capsys):
    code, err = _main_exit(["run", tmp_path], capsys)
    assert code == 2 and len(err) == 1 and "is a folder, not a file" in err[0], err


def test_a_nan_step_time_fails_its_row_and_the_json_stays_strict():
    from simulator.explore.validate import evaluate_row
    row = evaluate_row({"name": "n", "iteration_time_s": "nan"})
    assert row["status"] == "failed" and row["measured_s"] is None
    json.loads(json.dumps(row), parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))


def test_hf_booleans_must_be_json_booleans():
    from simulator.model.hf import hf_config_to_fields
    cfg = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
           "intermediate_size": 512, "vocab_size": 1000, "tie_word_embeddings": "false"}
    with pytest.raises(ValueError, match="tie_word_embeddings must be true or false"):
        hf_config_to_fields(cfg, "x")


def test_a_misspelled_validation_column_is_refused(tmp_path, capsys):
    csv_path = tmp_path / "rows.csv"
    csv_path.write_text("name,iteration_time_s,sequence_paralel\nx,1.0,true\n")
    code, err = _main_exit(["validate", csv_path, "--out", tmp_path / "o"], capsys)
    assert code == 2 and len(err) == 1 and "unknown column(s) ['sequence_paralel']" in err[0], err


@pytest.mark.parametrize("dtype, peaks, fragment", [
    ("fp8", "{ bf16 = 100, fp8 = 200 }", "is ampere, whatever its peak_tflops.fp8 says"),
])
def test_a_custom_gpu_names_what_the_dtype_needs(dtype, peaks, fragment, tmp_path, capsys):
    scn = tmp_path / "g.toml"
    scn.write_text(SMALL.read_text() + f'\n[cluster.gpu]\nname = "mygpu"\narchitecture = "ampere"\n'
                   f'peak_tflops = {peaks}\nhbm_bandwidth_GBps = 1000\nmemory_capacity_GB = 40\n')
    code, err = _main_exit(["run", scn, "--set", f"training.dtype='{dtype}'", "--out", tmp_path / "r"], capsys)
    assert code == 2 and len(err) == 1 and fragment in err[0], err


def test_a_gpu_without_the_training_dtype_peak_names_both():
    from dataclasses import replace
    from simulator.scenario import load_scenario
    from simulator.scenario_checks import ScenarioError, validate
    scn = load_scenario(SMALL)
    gpu = replace(scn.cluster.gpu, name="mygpu", peak_flops_per_s={"bf16": 1e14})
    bad = replace(scn, cluster=replace(scn.cluster, gpu=gpu), training=replace(scn.training, dtype="fp16"))
    with pytest.raises(ScenarioError, match="training.dtype = 'fp16' needs cluster.gpu.peak_tflops.fp16; gpu mygpu lists bf16"):
        validate(bad)


def test_validate_with_no_row_that_simulates_is_exit_2(tmp_path, capsys):
    csv_path = tmp_path / "rows.csv"
    csv_path.write_text("name,iteration_time_s,tp\nx,1.0,abc\n")
    code, err = _main_exit(["validate", csv_path, "--out", tmp_path / "o"], capsys)
    assert code == 2 and err == ["error: none of the 1 rows could be simulated; the first: row x: tp must be an "
                                 "integer, got 'abc'"], err
