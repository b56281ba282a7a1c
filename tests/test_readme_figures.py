"""The README's figures are the code's: each test computes a figure the README quotes and finds it, as
printed, in the README (whitespace folded). A change that moves a figure fails here until the README
says what the code now gives: the accuracy table `validate` prints and the figures its prose quotes
from it, the plan search, DualPipe on DeepSeek-V3, goodput, weak scaling, nccl-tests, collectives,
memory, task counts and bundled scenarios. (Measurement-derived figures of the calibration README are
held by tests/test_h100_measured.py and tests/test_fp8_layer_measured.py.)"""

import csv
import importlib.util
import re
from pathlib import Path

import pytest

from simulator.explore.search import run_search
from simulator.explore.sweep import BaseScenario
from simulator.explore.validate import evaluate_row, markdown_table, read_rows, row_to_raw, validate_rows
from simulator.pipeline import simulate, simulate_metrics
from simulator.scenario import load_scenario, scenario_from_dict

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
    assert all(r["status"] == "ok" for r in results) and len(results) == 120
    shared_names = {n for f in SHARED for n in _names(f)}
    shared = [r["error"] for r in results if r["name"] in shared_names]
    assert len(shared) == 56
    mape, mean, worst = (sum(map(abs, shared)) / len(shared), sum(shared) / len(shared), max(map(abs, shared)))
    in_readme(f"MAPE {_pct(mape)} met; mean {_pct(mean)} and the largest error, {_pct(worst)}",
              f"Over the 56 shared rows: MAPE {_pct(mape)}, mean error {_pct(mean)}, max |error| {_pct(worst)}, "
              "none refused")
    every = [r["error"] for r in results]
    in_readme(f"All 120 rows: MAPE {_pct(sum(map(abs, every)) / 120)}, mean {_pct(sum(every) / 120)} (the 108 "
              "before the held-out NeMo 24.07 table: ")
    before = [r["error"] for r in results if not r["name"].startswith("nemo2407")]
    in_readme(f"table: {_pct(sum(map(abs, before)) / 108)}, {_pct(sum(before) / 108)};")
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
    no_ac = [x for n, x in e.items() if "seq2048" in n
             and n.startswith(("llmfoundry-mpt-1b", "llmfoundry-mpt-3b", "llmfoundry-mpt-7b-h100-"))]
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
    best, second, third = res.ranked[0], res.ranked[1], res.ranked[2]
    c = res.counts
    in_readme(f"{c['enumerated']:,} plans enumerated; {c['invalid']:,} invalid by the scenario rules, "
              f"{c['pruned_memory']:,} pruned because they do not fit",
              f"{c['dominated']:,} dominated, {c['pruned_bound']:,} pruned by a time lower bound, "
              f"{c['simulated']} simulated",
              f"at {100 * best['mfu']:.1f}% MFU", f"then the same plan at v6 ({100 * second['mfu']:.1f}%)",
              f"(tp8 pp4 dp32 b4 v24 ZeRO-1, {100 * third['mfu']:.1f}%")
    assert best["label"] == "tp4 pp8 dp32 b2 interleaved-1f1b v12 z2 none sp"
    assert second["label"] == "tp4 pp8 dp32 b2 interleaved-1f1b v6 z2 none sp"
    assert third["label"] == "tp8 pp4 dp32 b4 interleaved-1f1b v24 z1 none sp"
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


@pytest.mark.parametrize("name", ["nccl_real.csv", "collectives.csv", "memory.csv"])
def test_the_bundled_measurement_files_are_the_shared_ones(name):
    """simulator/data carries copies of ../shared/validation's files so that a clean clone runs the
    benchmarks and these tests; where the shared folder is at hand the copies are byte-identical."""
    shared = ROOT.parent / "shared" / "validation" / name
    if not shared.exists():
        pytest.skip("no ../shared/validation beside this checkout")
    assert (ROOT / "simulator" / "data" / name).read_bytes() == shared.read_bytes()


def test_the_nccl_tests_figures():
    nccl = _bench("nccl_real")
    with nccl.CSV.open(newline="") as f:
        res = nccl.evaluate(list(csv.DictReader(f)))
    assert all(r["expressible"] for r in res)
    large = [r for r in res if r["size_bytes"] >= nccl.LARGE_BYTES]
    small = [r for r in res if r["size_bytes"] < nccl.LARGE_BYTES]
    in_readme(f"{sum(r['within'] for r in large)} of {len(large)} rows >= 64 MB within +-10% and "
              f"{sum(r['within'] for r in small)} of {len(small)} smaller rows within +-25%")

    def errs(hw: str, op: str, lo: float = 0.0, hi: float = 1e12) -> list[float]:
        return [r["error"] for r in res if r["hardware"] == hw and r["op"] == op and lo <= r["size_bytes"] <= hi]

    nebius = errs("nebius-h100-ib.toml", "all_reduce", 8 * 2 ** 20)
    in_readme(f"all-reduce is within {100 * max(map(abs, nebius)):.0f}% from 8 MB to 8 GB")
    in_readme(f"within {100 * abs(errs('nebius-h100-ib.toml', 'all_reduce', hi=65536)[0]):.0f}% at 64 KB",
              f"Nebius 1 MB is {100 * errs('nebius-h100-ib.toml', 'all_reduce', 2 ** 20, 2 ** 20)[0]:.0f}% fast")
    a100 = errs("dgx-a100-80gb", "send_recv")
    in_readme(f"send/recv is within {100 * abs(a100[0]):.1f}% at 128 MB",
              f"send/recv >= 256 MB is {100 * min(a100[1:]):.0f}-{100 * max(a100[1:]):.0f}% fast")
    mega = errs("gcp-a3-mega.toml", "all_reduce", 8 * 2 ** 20)
    mega_small = errs("gcp-a3-mega.toml", "all_reduce", hi=2 ** 20)
    gather = errs("gcp-a3-mega.toml", "all_gather", hi=2 ** 27)
    in_readme(f"all-reduce is within {100 * min(mega):.0f}..{100 * max(mega):+.0f}% from 8 MB to 8 GB",
              f"but {100 * min(mega_small):.0f}-{100 * max(mega_small):.0f}% fast at 64 KB and 1 MB",
              f"its all-gather is {100 * min(gather):.0f}-{100 * max(gather):.0f}% fast from 8 to 128 MB")


def test_the_collectives_figures(capsys):
    collectives = _bench("collectives")
    bad = collectives.accuracy(collectives.CANDIDATES[0])
    out = capsys.readouterr().out
    errors = [float(x) for x in re.findall(r"([+-]\d+\.\d)%", out)]
    a2a = [float(x) for x in re.findall(r"all_to_all +direct +\S+ +\S+ +([+-]\d+\.\d)% +<-- outside", out)]
    assert len(errors) == 9
    in_readme(f"{9 - bad} of 9 rows within ±10% (all_reduce ring/NVLS and intra-node all_to_all within "
              f"{max(abs(e) for e in errors if abs(e) <= 10):.1f}%); the two 4-node all_to_all rows predict "
              f"{sorted(a2a)[0]:+.1f}% and {sorted(a2a)[1]:+.1f}%")


def test_the_memory_figures():
    memory = _bench("memory")
    rows = memory.evaluate(memory.DEFAULT_CSV)
    state = max(abs(r["state_error"]) for r in rows)
    act = max(abs(r["activations_error"]) for r in rows)
    in_readme(f"weights + gradients + optimizer within {100 * state:.2f}% and activations within {100 * act:.1f}% "
              f"on all {len(rows)} rows")


def test_the_weak_scaling_figures(rows):
    weak = _bench("weak_scaling")
    found = weak.pairs(rows)
    jobs = [(row, spread) for pair in found for _, row in pair for spread in (True, False)]
    times = [weak.step_s(j) for j in jobs]
    measured, simulated, alike = [], [], []
    for i, ((_, small), (_, large)) in enumerate(found):
        s_rule, s_alike, l_rule, l_alike = times[4 * i: 4 * i + 4]
        measured.append(float(large["iteration_time_s"]) / float(small["iteration_time_s"]) - 1)
        simulated.append(l_rule / s_rule - 1)
        alike.append(l_alike / s_alike - 1)
    n = len(found)
    above = sum(m > a for m, a in zip(measured, alike))
    in_readme(f"the larger count's step is {100 * sum(measured) / n:.1f}% longer on average measured, "
              f"{100 * sum(simulated) / n:.1f}% simulated with the rule, {100 * sum(alike) / n:.1f}% without it, and "
              f"measured above the rule-less simulation in all {above} pairs")
    assert above == n


def test_the_memory_verdicts_and_torchtitan_peaks(results):
    """Every published run is predicted to fit but three NeMo 24.07 table rows (their optimizer settings are
    not published); torchtitan's logged peaks against the model."""
    refused = sorted(r["name"] for r in results if not r["fits_in_memory"])
    assert refused == ["nemo2407-gpt3-175b-fp8-512gpu", "nemo2407-gpt3-20b-fp8-64gpu", "nemo2407-llama3-8b-fp8-8gpu"]
    in_readme(f"Of the {len(results)} published runs (each of which ran), {len(results) - len(refused)} are predicted")
    peaks = {r["name"]: r["memory_total_bytes"] / r["measured_memory_bytes"] - 1 for r in results
             if "measured_memory_bytes" in r}
    six = [v for n, v in peaks.items() if n in ("tt-llama31-8b-fsdp-8gpu", "tt-llama31-8b-fsdp-128gpu")
           or n.startswith("tt-llama31-8b-fp8-cp")]
    assert len(six) == 6
    in_readme(f"within {100 * min(six):+.1f}% to {100 * max(six):+.1f}% of the six peaks",
              f"({sum(abs(v) <= 0.10 for v in peaks.values())} of {len(peaks)} published peaks within 10%)")
    compiled = [v for n, v in peaks.items() if "compile" in n]
    pp405 = [v for n, v in peaks.items() if n.startswith("tt-llama31-405b")]
    tp70 = sorted(v for n, v in peaks.items() if n.startswith("tt-llama31-70b"))
    in_readme(f"(compiled: {100 * min(compiled):+.0f}% to {100 * max(compiled):+.1f}%",
              f"the pipelined 405B rows {100 * min(pp405):.1f}% to {100 * max(pp405):+.1f}%",
              f"the FSDP x TP 70B rows {100 * tp70[1]:.0f}% and {100 * tp70[0]:.0f}%")


def test_the_h100_kernel_tables_against_the_roofline_model(rows):
    """`calibrate profile`'s H100 tables (short bursts below the power limit) against the roofline model on
    four DGX Cloud BF16 rows, as the README says."""
    diffs, errors = {}, []
    for name in ("dgxc-llama31-8b-bf16-8gpu", "dgxc-llama31-70b-bf16-64gpu", "dgxc-gpt3-175b-bf16-128gpu",
                 "dgxc-nemotron4-15b-bf16-16gpu"):
        row = next(r for r in rows if r["name"] == name)
        times = []
        for cost in ({}, {"cost": {"compute": "calibrated", "tables": str(ROOT / "scenarios/calibration/h100")}}):
            scn = scenario_from_dict(row_to_raw(row) | cost, default_name=name)
            times.append(simulate_metrics(scn)["iteration_time_s"] / float(row["iteration_time_s"]))
        diffs[name] = 100 * (times[1] - times[0])
        errors.append(f"{100 * (times[1] - 1):.1f}%")
        errors.append(f"{100 * (times[0] - 1):.1f}%")
    calibration = re.sub(r"\s+", " ", (ROOT / "scenarios" / "calibration" / "README.md").read_text())
    quoted = (f"(today Llama 3.1 8B {errors[0]} against {errors[1]}, 70B {errors[2]} / {errors[3]}, GPT-3 175B "
              f"{errors[4]} / {errors[5]}; Nemotron-4 15B {errors[6]} / {errors[7]})")
    assert quoted in calibration, quoted
    faster = sorted(-d for n, d in diffs.items() if "nemotron" not in n)
    nemotron = diffs["dgxc-nemotron4-15b-bf16-16gpu"]
    in_readme(f"GPT-3 175B {faster[0]:.0f}-{faster[-1]:.0f} points faster than the roofline model, Nemotron-4 "
              f"15B {abs(nemotron):.1f} points {'slower' if nemotron > 0 else 'faster'}")


def test_te_defaults_cost_a_small_layer_more_than_they_hide():
    """A 2,048-wide Llama layer at TP 4 on one H100 node (tests/test_tp_overlap.py's scenario) against no
    overlap, with TE 1.x's and 2.x's defaults and with NeMo's Llama 3.1 70B table."""
    model = {"num_layers": 4, "hidden_size": 2048, "num_attention_heads": 16, "num_kv_heads": 4,
             "ffn_hidden_size": 5632, "vocab_size": 8192, "seq_length": 2048, "mlp": "swiglu"}

    def step_s(**par) -> float:
        raw = {"model": dict(model), "cluster": {"preset": "dgx-h100", "num_nodes": 1},
               "parallelism": {"tp": 4, "pp": 1, "dp": 2, "sequence_parallel": True, **par},
               "training": {"global_batch_size": 8}}
        return simulate_metrics(scenario_from_dict(raw))["iteration_time_s"]

    plain = step_s(tp_comm_overlap=False)
    change = [step_s(tp_comm_overlap=True, tp_comm_overlap_cfg=c) / plain - 1
              for c in ("te1-default", "te2-default", "userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192")]
    in_readme(f"runs {100 * change[0]:.1f}% slower with TE 1.x's and {100 * change[1]:.1f}% slower with TE 2.x's "
              f"than without overlap, {-100 * change[2]:.1f}% faster with NeMo's tuned Llama 3.1 70B table")


def test_tp_overlap_as_each_recipe_configures_it(rows, results):
    """Every overlapped row against NeMo's Llama 3.1 70B table (which all ran before), and the rows whose
    configure.sh turns the overlap on against running without it."""
    e = dict((r["name"], r["error"]) for r in results)
    by_name = {r["name"]: r for r in rows}
    added = {n for n, r in by_name.items() if "configure.sh" in r.get("settings_from_source", "")
             and "tp_comm_overlap = true" in r.get("settings_from_source", "")}
    assert added == {f"dgxc-nemotron4-340b-{x}" for x in ("bf16-128gpu", "bf16-2048gpu", "fp8-128gpu")} | {
        "dgxc-grok1-314b-bf16-512gpu", "dgxc-grok1-314b-bf16-2048gpu"}
    nemo_70b = "userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192"
    moved = [abs(e[n] - evaluate_row(dict(r, tp_comm_overlap_cfg=nemo_70b))["error"])
             for n, r in by_name.items() if r.get("tp_comm_overlap_cfg") and n not in added]
    in_readme(f"the other rows move by at most {100 * max(moved):.1f} points")

    def off(name: str) -> float:
        return evaluate_row(dict(by_name[name], tp_comm_overlap="false", tp_comm_overlap_cfg=""))["error"]

    for model in ("340b", "grok"):
        names = sorted((n for n in added if model in n),
                       key=lambda n: ("fp8" in n, int(n.split("-")[-1].removesuffix("gpu"))))
        before = "/".join(f"{100 * off(n):+.1f}" for n in names)
        in_readme(f"from {before}% to {'/'.join(f'{100 * e[n]:+.1f}' for n in names)}%")
    launcher = [n for n, r in by_name.items() if "NCCL_NVLS_ENABLE=0 for every job" in r.get("settings_from_source", "")]
    assert len(launcher) == 15 and all(by_name[n]["nvls"] == "false" for n in launcher)
    nvls = max(abs(e[n] - evaluate_row(dict(by_name[n], nvls=""))["error"]) for n in launcher)
    in_readme(f"now run without NVLS (`nvls = false`), which moves them by at most {100 * nvls:.1f} points")


def test_grok1_with_either_attention_kernel(rows, results):
    grok = [r for r in rows if r["name"].startswith("dgxc-grok1")]
    flash = [next(x["error"] for x in results if x["name"] == r["name"]) for r in grok]
    cudnn = [evaluate_row(dict(r, attention="cudnn"))["error"] for r in grok]
    in_readme(f"EP 8) {100 * flash[0]:.0f}% and {100 * flash[1]:.0f}% with FlashAttention-2",
              f"({100 * cudnn[0]:.0f}% and {100 * cudnn[1]:.0f}% with cuDNN's kernel")


def test_the_speed_tables_task_counts():
    """The task counts of the Speed section's cases (benchmarks/speed.py's GPT-3 175B plans, the Llama 3
    405B and DeepSeek-V3 scenario files)."""
    speed = _bench("speed")
    for dp, label in ((8, "1,024 A100 (DP 8)"), (128, "16,384 A100 (DP 128)")):
        scn = scenario_from_dict(dict(speed.gpt3(dp, "1f1b", "full"), name="speed"))
        in_readme(f"| GPT-3 175B, {label} | {len(simulate(scn).graph):,} |")
    llama = load_scenario(ROOT / "scenarios" / "llama3-405b-16384xh100.toml")
    in_readme(f"| Llama 3 405B, 16,384 H100 (scenario file) | {len(simulate(llama).graph):,} |")
    dsv3 = load_scenario(ROOT / "scenarios" / "moe" / "deepseek-v3-1024xh100.toml")
    in_readme(f"{len(simulate(dsv3).graph):,} since the scenario runs the shared-expert overlap")


def test_the_amax_reductions_of_gpt3_fp8(rows):
    """Delayed scaling's amax all-reductions on the DGX Cloud GPT-3 175B FP8 row: how many a rank runs per
    step and the time it waits for them."""
    row = next(r for r in rows if r["name"] == "dgxc-gpt3-175b-fp8-128gpu")
    res = simulate(scenario_from_dict(row_to_raw(row), default_name=row["name"]))
    amax = [e for e in res.trace.events if e.rank == 0 and e.name.endswith("amax_all_reduce")]
    in_readme(f"{len(amax):,} of them, {1e3 * sum(e.end_s - e.start_s for e in amax):.0f} ms of a "
              f"{res.metrics['iteration_time_s']:.0f} s step")


def test_the_torchtitan_prose_figures(results):
    e = {r["name"]: r["error"] for r in results}
    pred = {r["name"]: r["predicted_s"] for r in results}
    meas = {r["name"]: r["measured_s"] for r in results}
    pct = lambda n: f"{100 * e[n]:.1f}%"  # noqa: E731
    in_readme(f"{pct('tt-llama31-8b-fsdp-8gpu')} and {pct('tt-llama31-8b-fsdp-128gpu')} eager, "
              f"{pct('tt-llama31-8b-fsdp-compile-8gpu')} and {pct('tt-llama31-8b-fsdp-compile-128gpu')} compiled, "
              f"{pct('tt-llama31-8b-fsdp-compile-float8-8gpu')} and {pct('tt-llama31-8b-fsdp-compile-float8-128gpu')} "
              "compiled in float8")
    pairs = [("tt-llama31-70b-fp8-2d-256gpu", "tt-llama31-70b-fp8-2d-asynctp-256gpu"),
             ("tt2506-llama31-70b-bf16-2d-256gpu", "tt2506-llama31-70b-bf16-2d-asynctp-256gpu"),
             ("tt2506-llama31-70b-fp8-2d-256gpu", "tt2506-llama31-70b-fp8-2d-asynctp-256gpu")]
    model = [100 * (pred[a] / pred[b] - 1) for a, b in pairs]
    measured = [100 * (meas[a] / meas[b] - 1) for a, b in pairs]
    seventy = [x for n, x in e.items() if "llama31-70b" in n and n.startswith("tt")]
    in_readme(f"70B with FSDP 32 x TP 8: {100 * max(seventy):.1f}% to {100 * min(seventy):.1f}%, where async TP "
              f"gains {min(model):.0f}-{max(model):.0f}% in the model against "
              f"{min(measured):.0f}-{max(measured):.0f}% measured")


def test_the_gb200_prose_figures(results):
    e = {r["name"]: 100 * r["error"] for r in results if r["name"].startswith("dgxc-gb200")}
    bf16 = [v for n, v in e.items() if "bf16" in n]
    l405 = [v for n, v in e.items() if "bf16" in n and "405b" in n]
    nemo = [v for n, v in e.items() if "bf16" in n and "nemotron" in n]
    fp8 = [v for n, v in e.items() if "fp8" in n]
    in_readme(f"BF16 rows {max(bf16):+.1f}..{min(bf16):.1f}% (Llama 3.1 405B {min(l405):+.1f}..{max(l405):+.1f}%, "
              f"Nemotron-4 340B {max(nemo):.1f}..{min(nemo):.1f}%), FP8 rows {max(fp8):.1f}..{min(fp8):.1f}%",
              f"the GB200 rows are within {max(e.values()):+.1f}..{min(e.values()):.1f}%")


def test_more_prose_figures_of_the_accuracy_section(results):
    e = {r["name"]: 100 * r["error"] for r in results}
    pred = {r["name"]: r["predicted_s"] for r in results}
    meas = {r["name"]: r["measured_s"] for r in results}
    cp8b = [e[f"tt-llama31-8b-fp8-cp{c}-seq{s}k-8gpu"] for c, s in ((2, 64), (4, 128), (8, 256))]
    cp405 = [e[f"tt-llama31-405b-fp8-4d-cp{c}-seq{s}k-512gpu"] for c, s in ((2, 64), (4, 128), (8, 256))]
    in_readme("-> " + "/".join(f"{x:+.1f}" for x in cp8b) + "%;", "-> " + "/".join(f"{x:.1f}" for x in cp405) + "%)")
    cp48 = [-x for x in cp8b[1:] + cp405[1:]]
    in_readme(f"What keeps CP 4-8 some {min(cp48):.0f}-{max(cp48):.0f}% fast")
    small = [-e[n] for n in ("gpt-1.7b-h100", "llmfoundry-mpt-1b-h100-512gpu-seq2048",
                              "llmfoundry-mpt-7b-h100-128gpu-seq2048", "llmfoundry-mpt-7b-h100-512gpu-seq2048")]
    in_readme(f"the rows the model predicts {min(small):.0f}-{max(small):.0f}% fast")
    a100 = [abs(e[n]) for n in ("llmfoundry-mpt-70b-a100-80gb-64gpu-seq2048",
                                "llmfoundry-mpt-13b-a100-40gb-128gpu-seq2048")]
    in_readme(f"predicts the A100 run within {a100[0]:.1f}%", f"the two A100 ones within {max(a100):.1f}%")
    h100_a100 = meas["llmfoundry-mpt-70b-a100-80gb-64gpu-seq2048"] / meas["llmfoundry-mpt-70b-h100-64gpu-seq2048"]
    in_readme(f"runs {h100_a100:.2f}x faster on H100 than on A100")
    megatron = [e[n] for n in ("gpt-1.7b-h100", "gpt-16b-h100", "gpt-70b-h100", "gpt-314b-h100")]
    in_readme("Megatron-Core's README rows: " + ", ".join(f"{x:+.1f}%" for x in megatron)
              + f" (MAPE {sum(map(abs, megatron)) / 4:.1f}%")
    h100, gb200 = "dgxc-v2505-nemotron4-340b-bf16-256gpu", "dgxc-gb200-nemotron4-340b-bf16-128gpu"
    in_readme(f"{meas[h100] / meas[gb200]:.2f}x faster on 128 GB200 than on 256 H100 as published ({meas[h100]:.2f} s "
              f"against {meas[gb200]:.2f} s), {pred[h100] / pred[gb200]:.2f}x as simulated ({pred[h100]:.2f} s against "
              f"{pred[gb200]:.2f} s")
    tt2d = [e[n] for n in ("tt2506-llama31-8b-bf16-2d-64gpu", "tt2506-llama31-8b-bf16-2d-asynctp-64gpu",
                           "tt2506-llama31-8b-fp8-2d-64gpu", "tt2506-llama31-8b-fp8-2d-asynctp-64gpu")]
    in_readme(f"{tt2d[0]:+.1f}% and {tt2d[1]:+.1f}% in BF16, {tt2d[2]:.1f}% and {tt2d[3]:.1f}% in float8")
    in_readme(f"DeepSeek-V3 pretraining README: MAPE {abs(e['dgxc-dsv3-671b-bf16-1024gpu']):.1f}%")


def test_the_zero3_and_summary_prose(results):
    e = {r["name"]: 100 * r["error"] for r in results}
    dp = {r["name"]: r["busiest_breakdown"]["comm_dp"] for r in results}
    in_readme("175B: " + ", ".join(f"{dp[f'narayanan-zero3-175b-{n}']:.1f}" for n in (384, 768, 1536)) + " s")
    z530 = [e[f"narayanan-zero3-530b-{n}"] for n in (640, 1120, 2240)]
    in_readme(f"what the 530B rows still miss ({max(z530):.0f} to {min(z530):.0f}%")
    fsdp = [v for n, v in e.items() if n.startswith(("narayanan-zero3", "llmfoundry"))]
    mape, worst = sum(map(abs, fsdp)) / len(fsdp), max(map(abs, fsdp))
    in_readme(f"MAPE <= 15%: {mape:.1f}%, met; every row within +-30%: {worst:.1f}%, met, by {30 - worst:.1f} points")
    second = sorted((abs(v), n) for n, v in e.items() if n in _names("training_runs_2.csv"))[-2]
    in_readme(f"then llm-foundry's MPT-7B at 64K tokens, {e[second[1]]:.1f}%")
    assert second[1] == "llmfoundry-mpt-7b-h100-8gpu-seq65536"


def test_the_held_out_nemo_2407_table(rows, results):
    """The README's figures for the NeMo 24.07 FP8 table: MAPE, mean, worst, the Llama 3 8B pair, the
    four refused memory verdicts and that all of them fit with bf16 gradients."""
    e = {r["name"]: r for r in results}
    nm = [r["error"] for r in results if r["name"].startswith("nemo2407")]
    assert len(nm) == 12
    in_readme(f"MAPE {_pct(sum(map(abs, nm)) / 12)}, mean {100 * sum(nm) / 12:+.1f}%, every row within "
              f"{_pct(max(map(abs, nm)))}, simulated with no change made for them")
    pair = (e["nemo2407-llama3-8b-fp8-8gpu"], e["dgxc-llama31-8b-fp8-8gpu"])
    assert (round(pair[0]["measured_s"], 2), round(pair[1]["measured_s"], 2)) == (10.68, 9.67)
    in_readme(f"({100 * pair[0]['error']:+.1f}% and {100 * pair[1]['error']:+.1f}%: mostly the attention")
    refused = sorted((r["name"], r["memory_total_bytes"] / 2 ** 30) for r in results if not r["fits_in_memory"])
    in_readme(", ".join(f"{n.replace('nemo2407-', '')} {g:.1f} GiB" for n, g in refused))
    bf16 = [evaluate_row(dict(next(x for x in rows if x["name"] == n), grad_dtype="bf16")) for n, _ in refused]
    assert all(r["fits_in_memory"] for r in bf16)
    in_readme(f"{len(refused)} of the 12 are predicted not to fit",
              "(NVIDIA's later recipes set bf16 gradients, with which all of them fit)")



def test_the_two_nemo_versions_of_the_70b_fp8_plan(rows, results):
    """README: the same Llama 3 70B FP8 plan in NeMo 24.07 (FlashAttention-2) and the 24.09 recipe
    (cuDNN attention), measured and simulated, and the 24.09 row with FlashAttention-2's curves."""
    e = {r["name"]: r for r in results}
    a, b = e["nemo2407-llama3-70b-fp8-64gpu"], e["dgxc-llama31-70b-fp8-64gpu"]
    flash = evaluate_row(dict(next(r for r in rows if r["name"] == b["name"]), attention="flash"))
    in_readme(f"{a['measured_s']:.2f} s in 24.07 with FlashAttention-2 ({100 * a['error']:+.1f}%), "
              f"{b['measured_s']:.2f} s in the 24.09 recipe ({100 * b['error']:+.1f}%)",
              f"with FlashAttention-2's curves the model gives {100 * flash['error']:+.1f}%")
