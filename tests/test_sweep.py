"""`simulator sweep`: grid parsing, the cartesian product in grid order with invalid points reported,
identical points simulated once, a CSV that stays valid when the sweep is interrupted."""

import contextlib
import csv
import io
import json

import pytest

import simulator.explore.evaluate as evaluate
from simulator.__main__ import main
from simulator.explore.evaluate import CsvStream, Evaluator
from simulator.explore.sweep import grid_points, parse_grid, read_base, run_sweep, split_values
from simulator.scenario_checks import ScenarioError

TOML = """name = "tiny-sweep"
[model]
num_layers = 4
hidden_size = 256
num_attention_heads = 8
vocab_size = 1024
seq_length = 256
[cluster]
preset = "dgx-a100-80gb"
num_nodes = 1
[parallelism]
pp = 2
[training]
global_batch_size = 16
"""


@pytest.fixture
def scenario(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TOML)
    return path


def test_grid_parsing():
    assert split_values("1,2, 4") == ["1", "2", "4"]
    assert split_values('"1f1b","zero-bubble"') == ['"1f1b"', '"zero-bubble"']
    assert split_values("[1,3],[2,2]") == ["[1,3]", "[2,2]"]
    grid = parse_grid(["parallelism.tp=1,2", "training.micro_batch_size=1,2,4"])
    assert grid == [("parallelism.tp", ["1", "2"]), ("training.micro_batch_size", ["1", "2", "4"])]
    points = grid_points(grid)
    assert len(points) == 6 and points[0] == ["parallelism.tp=1", "training.micro_batch_size=1"]
    assert points[1] == ["parallelism.tp=1", "training.micro_batch_size=2"]  # last key varies fastest
    for bad in (["tp=1,2"], ["parallelism.tp="], ["parallelism.tp=1", "parallelism.tp=2"]):
        with pytest.raises(ScenarioError):
            parse_grid(bad)


def test_sweep_rows_in_grid_order_with_invalid_points(scenario, tmp_path):
    base = read_base(scenario)
    grid = parse_grid(["parallelism.tp=1,2,3", "training.micro_batch_size=1,2"])
    rows = run_sweep(base, grid, tmp_path / "sweep.csv", jobs=1)
    assert [(r["parallelism.tp"], r["training.micro_batch_size"]) for r in rows] == \
        [(t, b) for t in ("1", "2", "3") for b in ("1", "2")]
    assert [r["status"] for r in rows] == ["ok"] * 4 + ["invalid"] * 2
    assert "3*2*1 = 6" in rows[4]["reason"]
    ok = rows[:4]
    assert all(r["tp"] == int(r["parallelism.tp"]) and r["dp"] == 8 // (2 * r["tp"]) for r in ok)
    assert all(r["iteration_time_s"] > 0 and r["tokens_per_s"] == pytest.approx(16 * 256 / r["iteration_time_s"])
               for r in ok)
    written = list(csv.DictReader(open(tmp_path / "sweep.csv")))
    assert sorted(int(r["point"]) for r in written) == list(range(6))


def test_identical_points_are_simulated_once(scenario, tmp_path):
    base = read_base(scenario)
    # virtual_stages = 1 is the default of 1f1b: both points are the same scenario
    grid = parse_grid(["parallelism.virtual_stages=1,1", "parallelism.schedule=\"1f1b\""])
    with Evaluator(1) as ev:
        for i, point in enumerate(grid_points(grid)):
            ev.submit(i, base.build(point))
        results = [ev.next_done() for _ in range(2)]
        assert ev.simulated == 1 and ev.cache_hits == 1
    assert results[0][1] is results[1][1]


def test_interrupted_sweep_leaves_a_valid_csv(scenario, tmp_path, monkeypatch):
    calls = {"n": 0}
    real = evaluate.evaluate_scenario

    def flaky(scn):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(scn)

    monkeypatch.setattr(evaluate, "evaluate_scenario", flaky)
    path = tmp_path / "sweep.csv"
    with pytest.raises(KeyboardInterrupt):
        run_sweep(read_base(scenario), parse_grid(["parallelism.tp=1,2,4", "training.micro_batch_size=1,2"]), path,
                  jobs=1)
    rows = list(csv.DictReader(open(path)))
    assert len(rows) == 2 and all(r["status"] == "ok" and float(r["iteration_time_s"]) > 0 for r in rows)


def test_csv_stream_is_complete_after_every_row(tmp_path):
    path = tmp_path / "x.csv"
    with CsvStream(path, ("a", "b")) as out:
        out.write({"a": 1, "b": "x,y"})
        assert list(csv.DictReader(open(path))) == [{"a": "1", "b": "x,y"}]
        out.write({"a": 0.1})
        assert list(csv.DictReader(open(path)))[1] == {"a": "0.1", "b": ""}


def test_sweep_command_json_and_table(scenario, tmp_path):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["sweep", str(scenario), "--grid", "parallelism.tp=1,2", "--jobs", "2", "--json",
                     "--out", str(tmp_path / "r")])
    assert code == 0
    rows = json.loads(buf.getvalue())
    assert [r["tp"] for r in rows] == [1, 2] and (tmp_path / "r" / "sweep.csv").is_file()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["sweep", str(scenario), "--grid", "parallelism.tp=1,2", "--jobs", "1",
                     "--out", str(tmp_path / "r")]) == 0
    assert "tokens/s" in buf.getvalue() and "2 points, 2 simulated" in buf.getvalue()


def test_bad_grid_is_a_one_line_error(scenario, capsys):
    assert main(["sweep", str(scenario), "--grid", "parallelism.tp"]) == 2
    assert "expected SECTION.KEY=V1,V2" in capsys.readouterr().err
