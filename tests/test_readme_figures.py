"""The README's figures are the code's: each test computes a figure the README quotes and finds it, as
printed, in the README (whitespace folded). A change that moves a figure fails here until the README
says what the code now gives: the accuracy table `validate` prints, the per-source and summary
figures quoted in the prose, the plan search, DualPipe on DeepSeek-V3, goodput and a bundled
scenario."""

import csv
import importlib.util
import re
from pathlib import Path

import pytest

from simulator.explore.search import run_search
from simulator.explore.sweep import BaseScenario
from simulator.explore.validate import evaluate_row, markdown_table, read_rows, validate_rows
from simulator.pipeline import simulate, simulate_metrics
from simulator.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
FOLDED = re.sub(r"\s+", " ", README)
SHARED = ("training_runs.csv", "training_runs_2.csv")


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def in_readme(*fragments: str) -> None:
    missing = [f for f in fragments if f not in FOLDED]
    assert not missing, f"README does not say {missing}: update it to what the code gives"


@pytest.fixture(scope="module")
def rows():
    return read_rows([])


@pytest.fixture(scope="module")
def results(rows):
    return validate_rows(rows)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _by(results, prefix: str) -> list[float]:
    return [r["error"] for r in results if r["name"].startswith(prefix)]


def test_the_readme_accuracy_table_is_what_validate_prints(results):
    start = README.index("| run | GPUs | plan |")
    end = README.index("What the table says, per source:")
    assert README[start:end].strip() == markdown_table(results).strip()


def test_the_summary_figures(results):
    assert all(r["status"] == "ok" for r in results) and len(results) == 108
    shared_names = {n for f in SHARED for n in _names(f)}
    shared = [r["error"] for r in results if r["name"] in shared_names]
    assert len(shared) == 56
    mape, mean, worst = (sum(map(abs, shared)) / len(shared), sum(shared) / len(shared), max(map(abs, shared)))
    in_readme(f"MAPE {_pct(mape)} met; mean {_pct(mean)} and the largest error, {_pct(worst)}")
    every = [r["error"] for r in results]
    in_readme(f"All 108 rows: MAPE {_pct(sum(map(abs, every)) / 108)}, mean {_pct(sum(every) / 108)}")
    tt = _by(results, "tt")
    in_readme(f"MAPE {_pct(sum(map(abs, tt)) / len(tt))}, mean {_pct(sum(tt) / len(tt))} over {len(tt)} rows")


def _names(csv_name: str) -> list[str]:
    with (ROOT / "simulator" / "data" / csv_name).open(newline="") as f:
        return [row["name"] for row in csv.DictReader(f)]


def test_the_prose_figures_of_the_zero3_and_llm_foundry_rows(results):
    e = dict((r["name"], r["error"]) for r in results)
    z175 = "/".join(f"{100 * e[f'narayanan-zero3-175b-{n}']:.0f}" for n in (384, 768, 1536))
    z530 = "/".join(f"{100 * e[f'narayanan-zero3-530b-{n}']:.0f}" for n in (640, 1120, 2240))
    in_readme(f"today, with the mechanisms added since: {z175}% and {z530}%")
    six = [e[n] for n in e if n.startswith("narayanan-zero3")]
    in_readme(f"to {_pct(sum(map(abs, six)) / 6)} today")
    pred = {r["name"]: r["predicted_s"] for r in results}
    ratio = pred["narayanan-zero3-175b-768"] / pred["narayanan-zero3-175b-1536"]
    ratio530 = pred["narayanan-zero3-530b-1120"] / pred["narayanan-zero3-530b-2240"]
    in_readme(f"from 1.92 to {ratio:.2f} today", f"from 1.63 to {ratio530:.2f}")
    h100 = [x for n, x in e.items() if n.startswith("llmfoundry") and "h100" in n]
    in_readme(f"the H100 rows are at {100 * max(h100):.1f}%..{100 * min(h100):.1f}% and the A100 rows "
              f"{100 * e['llmfoundry-mpt-70b-a100-80gb-64gpu-seq2048']:+.1f}/"
              f"{100 * e['llmfoundry-mpt-13b-a100-40gb-128gpu-seq2048']:+.1f}%")
    long = (e["llmfoundry-mpt-7b-h100-8gpu-seq65536"], e["llmfoundry-mpt-13b-h100-8gpu-seq32768"])
    in_readme(f"the long-sequence rows ({100 * long[0]:.0f}%, {100 * long[1]:.0f}%)")
    no_ac = [x for n, x in e.items() if n.startswith(("llmfoundry-mpt-1b", "llmfoundry-mpt-3b", "llmfoundry-mpt-7b-h100-"))
             and "seq2048" in n]
    in_readme(f"stay {-100 * max(no_ac):.0f}-{-100 * min(no_ac):.0f}% fast at sequence 2048",
              f"The 1.7B H100 row ({100 * e['gpt-1.7b-h100']:.0f}%)")
    assert max(abs(e["k-530b-full"]), abs(e["k-530b-sp-sel"])) < 0.04  # "predicted within 4%"
    assert all(0.19 <= -x <= 0.22 for n, x in e.items() if n.startswith("mtnlg"))  # "19-22% fast"
    t1 = [x for n, x in e.items() if n.startswith("gpt-") and not n.endswith("h100")]
    in_readme(f"Narayanan 2021 MAPE {_pct(sum(map(abs, t1)) / len(t1))} (mean {_pct(sum(t1) / len(t1))}, every row "
              f"within {_pct(max(map(abs, t1)))})")


def test_the_torchtitan_a100_row_with_fused_kernels(rows, results):
    row = next(r for r in rows if r["name"] == "torchtitan-llama3-70b-64xa100-full")
    eager = next(r["error"] for r in results if r["name"] == row["name"])
    fused = evaluate_row(dict(row, kernels="fused"))["error"]
    in_readme(f"without `compile`: {100 * eager:+.1f}%; with fused kernels it would be {100 * fused:+.1f}%")


def test_deepseek_v3_shared_expert_overlap(rows, results):
    row = next(r for r in rows if r["name"] == "dgxc-dsv3-671b-bf16-1024gpu")
    on = next(r for r in results if r["name"] == row["name"])
    off = evaluate_row(dict(row, moe_shared_expert_overlap="false"))
    in_readme(f"({off['predicted_s']:.2f} -> {on['predicted_s']:.2f} s)",
              f"{100 * off['error']:.1f}% without the shared-expert overlap")


def test_dualpipe_on_deepseek_v3():
    dualpipe = _bench("dualpipe")
    path = dualpipe.DEFAULT
    split = dualpipe.v_split(61, 16)
    runs = {}
    for label, extra in (("1f1b", []), ("recipe", ["parallelism.schedule=dualpipe-v", "parallelism.virtual_stages=2"]),
                         ("v", ["parallelism.schedule=dualpipe-v", "parallelism.virtual_stages=2",
                                f"parallelism.layers_per_stage={split}"])):
        runs[label] = simulate(load_scenario(path, extra)).metrics
    ep = {k: m["busiest_rank"]["time_breakdown_s"]["comm_ep"] for k, m in runs.items()}
    gib = {k: m["memory_bytes"]["total"] / 2 ** 30 for k, m in runs.items()}
    in_readme(f"step {runs['1f1b']['iteration_time_s']:.2f} -> {runs['v']['iteration_time_s']:.2f} s and exposed EP "
              f"{ep['1f1b']:.1f} -> {ep['v']:.1f} s",
              f"the step is {runs['recipe']['iteration_time_s']:.1f} s; peak {gib['1f1b']:.1f} -> {gib['v']:.1f} GiB")


def test_the_plan_search_figures(tmp_path):
    search = _bench("search")
    base = BaseScenario(search.RAW, search.RAW["name"], ROOT, "benchmarks/search.py")
    res = run_search(base, tmp_path / "search.csv", top=10, jobs=2)
    best, second = res.ranked[0], res.ranked[1]
    c = res.counts
    in_readme(f"{c['enumerated']:,} plans enumerated; {c['invalid']:,} invalid by the scenario rules, "
              f"{c['pruned_memory']:,} pruned because they do not fit",
              f"{c['dominated']:,} dominated, {c['pruned_bound']:,} pruned by a time lower bound, "
              f"{c['simulated']} simulated",
              f"at {100 * best['mfu']:.1f}% MFU", f"(tp8 pp4 dp32 b4 v24 ZeRO-1, {100 * second['mfu']:.1f}%)")
    assert best["label"] == "tp4 pp8 dp32 b2 interleaved-1f1b v12 z2 none sp"
    assert second["label"] == "tp8 pp4 dp32 b4 interleaved-1f1b v24 z1 none sp"
    slow = {tp: r["iteration_time_s"] / best["iteration_time_s"] - 1 for tp, r in res.per_tp.items()}
    comm = {tp: r["time_comm_tp_s"] for tp, r in res.per_tp.items()}
    in_readme(f"TP 16 is {100 * slow[16]:.0f}% and TP 32 {100 * slow[32]:.0f}% slower than the best plan, with "
              f"{comm[16]:.1f} s and {comm[32]:.1f} s of exposed TP communication against {comm[4]:.1f} s at TP 4",
              f"The best TP 1 plan is `{res.per_tp[1]['label']}`")


def test_goodput_figures(capsys):
    goodput = _bench("goodput")
    rows = {r["name"]: r for r in goodput.llama3(5, 3, None)}
    mean_goodput = re.search(r"goodput (\d+\.\d)% \(min", capsys.readouterr().out).group(1)
    in_readme(f"goodput {mean_goodput}%. Checkpoint-interval sweep")
    young = goodput.young_case(3)
    unexpected = rows["unexpected interruptions per day"]
    effective = rows["effective training time (paper: > 90%)"]
    opt, daly = rows["sweep optimum vs Young sqrt(2CM) (s)"], rows["sweep optimum vs Daly (s)"]
    in_readme(f"{unexpected['simulated']:.2f} unexpected interruptions/day",
              f"effective training time {100 * effective['simulated']:.1f}%",
              f"optimum {opt['simulated']:.0f} s vs Young {opt['reference']:.0f} s ({100 * opt['error']:+.1f}%) / "
              f"Daly {daly['reference']:.0f} s ({100 * daly['error']:+.1f}%)",
              f"{young[0]['simulated']:.0f} s vs {young[0]['reference']:.0f} s ({100 * young[0]['error']:+.1f}%) / "
              f"{young[1]['reference']:.0f} s ({100 * young[1]['error']:+.1f}%)")


def test_the_torchtitan_scenario():
    t = simulate_metrics(load_scenario(ROOT / "scenarios" / "llama31-8b-torchtitan-8xh100.toml"))["iteration_time_s"]
    in_readme(f"`grand-teton-h100`: {t:.2f} s predicted")
