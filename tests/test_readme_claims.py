"""README.md's claims that no other test pinned: its examples (the scenario file, the Python snippet,
the printed summary), the default rules it lists, its named constants (clocks, host floor, TP overlap
SMs, goodput defaults), the busiest-rank threshold and the shipped CPU trace's figures. Each test fails
if the README line it names stops being true of the code."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from simulator.scenario import load_scenario, scenario_from_dict

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
SMALL = {"model": {"preset": "gpt3-1.3b"}, "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1},
         "training": {"global_batch_size": 8}}


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, re.S)


def section(title: str) -> str:
    """The README text from the heading `title` to the next heading."""
    start = README.index(title)
    end = README.find("\n#", start + len(title))
    return README[start:end if end > 0 else None]


# ---- "## Scenario files": the example loads, and every key and option its comments name exists ------
def test_the_scenario_file_example_loads_as_written():
    (text,) = blocks("toml")
    scn = scenario_from_dict(tomllib.loads(text), default_name="readme")
    assert scn.name == "gpt3-175b-1024xa100" and scn.num_gpus == 1024
    assert (scn.parallel.tp, scn.parallel.pp, scn.parallel.dp, scn.parallel.virtual_stages) == (8, 16, 8, 2)


def _commented_names(text: str, table: str) -> set[str]:
    """Identifiers the example's comment lines list under [table] ("# a, b, c = ..." or "# key = ...")."""
    body = text.split(f"[{table}]", 1)[1].split("\n[", 1)[0]
    names = set()
    for line in body.splitlines()[1:]:  # [0]: the rest of the header line
        comment = line.split("#", 1)[1] if "#" in line else ""
        if not line.lstrip().startswith("#"):
            continue
        for part in comment.split(","):
            m = re.match(r"\s*([a-z][A-Za-z0-9_]*)\s*(=|$|\()", part)
            if m:
                names.add(m.group(1))
    return names


def test_every_key_the_scenario_comments_name_is_a_key_the_loader_accepts():
    from simulator import scenario as s
    (text,) = blocks("toml")
    known = {"model": s.MODEL_KEYS, "cluster": s._CLUSTER_KEYS, "parallelism": s._PARALLEL_KEYS,
             "training": s._TRAINING_KEYS, "cost": s._COST_KEYS}
    for table, keys in known.items():
        named = _commented_names(text, table)
        assert named - {"or"} <= keys, (table, sorted(named - keys))
    assert len(_commented_names(text, "model")) >= 30  # the comment really was read


@pytest.mark.parametrize("key, options", [
    ("schedule", "strategy.schedules.SCHEDULES"), ("sharding", "strategy.zero_impl.IMPLEMENTATIONS"),
    ("recompute", "scenario.RECOMPUTE_MODES"), ("attention", "cost.compute.ATTENTION_IMPLS"),
    ("fp8_recipe", "model.fp8.FP8_RECIPES"), ("mlp", "model.spec.MLP_KINDS"),
    ("topology", "hardware.clusters.TOPOLOGIES")])
def test_the_options_the_example_lists_are_the_ones_the_code_knows(key, options):
    import importlib
    (text,) = blocks("toml")
    line = next(ln for ln in text.splitlines() if re.search(rf"\b{key} =", ln))
    rest = line.split(f"{key} =", 1)[1]
    token = r'"?([a-z0-9][a-z0-9.-]*)"?'
    listed = (set(re.findall(r'"([a-z0-9.-]+)"', rest)) | set(re.findall(token + r"\s*\|", rest))
              | set(re.findall(r"\|\s*" + token, rest)))
    module, name = options.rsplit(".", 1)
    known = set(getattr(importlib.import_module(f"simulator.{module}"), name))
    assert listed and listed <= known, (key, sorted(listed - known))
    if key == "schedule":  # the schedule comment lists every schedule
        assert listed == known


# ---- "### Default rules for settings a scenario leaves out" ---------------------------------------
def test_settings_left_out_take_the_documented_defaults():
    s = scenario_from_dict(SMALL, default_name="d")
    p, t = s.parallel, s.training
    assert (p.dp, t.micro_batch_size) == (8, 1)  # dp = GPUs / (tp pp cp); Megatron's micro-batch 1
    assert (p.schedule, p.recompute, p.sequence_parallel, p.zero_stage, t.attention) == (
        "1f1b", "none", False, 0, "flash")
    assert (t.grad_dtype, p.sharding) == ("fp32", "megatron-distopt")
    assert (t.kernels, t.optimizer_state_dtype, t.fp8_params, t.cuda_graphs) == ("fused", "fp32", False, False)
    assert (p.recompute_method, p.recompute_num_layers) == ("uniform", 1)
    m = s.model
    assert (m.parallel_norms, m.moe_capacity_factor, m.moe_grouped_gemm, m.moe_shared_expert_overlap,
            m.mtp_layers) == (1, 0.0, True, False, 0)


@pytest.mark.parametrize("zero, grad_dtype, sharding", [
    (0, "fp32", "megatron-distopt"), (1, "fp32", "megatron-distopt"), (2, "bf16", "deepspeed"), (3, "bf16", "fsdp2")])
def test_grad_dtype_and_sharding_follow_the_zero_stage(zero, grad_dtype, sharding):
    s = scenario_from_dict(dict(SMALL, parallelism={"zero_stage": zero}), default_name="z")
    assert (s.training.grad_dtype, s.parallel.sharding) == (grad_dtype, sharding)


def test_a_preset_node_given_fewer_gpus_keeps_one_nic_per_gpu_at_most():
    for gpus in (1, 2, 4):
        s = scenario_from_dict(dict(SMALL, cluster={"preset": "dgx-h100", "num_nodes": 1, "gpus_per_node": gpus}),
                               default_name="n")
        assert s.cluster.nics_per_node == gpus
    full = scenario_from_dict(dict(SMALL, cluster={"preset": "dgx-h100", "num_nodes": 1}), default_name="n")
    assert full.cluster.nics_per_node == 8


# ---- "## Commands" ---------------------------------------------------------------------------------
def test_presets_lists_every_model_gpu_and_cluster_preset(capsys):
    from simulator.__main__ import main
    from simulator.hardware.clusters import CLUSTER_PRESETS
    from simulator.hardware.gpus import GPU_PRESETS
    from simulator.model.presets import MODEL_PRESETS
    assert main(["presets", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["models"]) == set(MODEL_PRESETS)
    assert set(data["gpus"]) == set(GPU_PRESETS) and set(data["clusters"]) == set(CLUSTER_PRESETS)


def test_the_console_script_simulator_is_the_same_program():
    (ep,) = [e for e in metadata.entry_points(group="console_scripts") if e.name == "simulator"]
    from simulator.__main__ import main
    assert ep.load() is main


def test_the_collective_example_of_hardware_as_data_runs(tmp_path, capsys):
    """`python -m simulator collective --hardware my.toml --set cluster.nic_bandwidth_Gbps=200 --nodes 2
    --op all_reduce` (README, *Hardware as data*), on a copy of a shipped hardware file."""
    from simulator.__main__ import main
    hw = tmp_path / "my.toml"
    shutil.copy(ROOT / "simulator" / "data" / "hardware" / "clusters" / "dgx-h100.toml", hw)
    assert "--set cluster.nic_bandwidth_Gbps=200 --nodes 2 --op all_reduce" in " ".join(section("### Hardware as data").split())
    args = ["collective", "--hardware", str(hw), "--nodes", "2", "--op", "all_reduce", "--json"]
    assert main(args) == 0
    fast = json.loads(capsys.readouterr().out)
    assert main(args + ["--set", "cluster.nic_bandwidth_Gbps=200"]) == 0
    slow = json.loads(capsys.readouterr().out)
    assert fast["size_bytes"] == slow["size_bytes"] == 2 ** 30 and slow["busbw_GBps"] < fast["busbw_GBps"]


def test_the_python_example_runs_as_written(monkeypatch):
    (code,) = [b for b in blocks("python") if "load_scenario" in b]
    monkeypatch.chdir(ROOT)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - the README's own snippet
    result = scope["result"]
    assert result.metrics["iteration_time_s"] > 0 and result.metrics["time_breakdown_s"] and result.trace


# ---- "## Two commands": the printed summary is today's --------------------------------------------
def test_the_summary_the_readme_prints_is_what_the_run_prints():
    from simulator.analysis.report import format_summary
    from simulator.pipeline import simulate
    sample = re.search(r"```\n(scenario: gpt3-175b-1024xa100\n.*?)```", README, re.S).group(1).rstrip("\n")
    metrics = simulate(load_scenario(ROOT / "scenarios" / "gpt3-175b-1024xa100.toml")).metrics
    lines = {ln.strip() for ln in format_summary(metrics).splitlines()}
    for ln in sample.splitlines()[:-1]:  # the last: the breakdown, abbreviated to one line
        assert ln.strip() in lines, (ln, sorted(lines))
    shown = re.findall(r"(\w+) ([\d.]+) s", sample.splitlines()[-1])
    assert len(shown) == 5
    for name, value in shown:
        assert f"{metrics['time_breakdown_s'][name]:.3f}" == value, (name, value)


# ---- "What is modelled": named constants ------------------------------------------------------------
def test_fp8_gemms_run_at_transformer_engines_measured_rate_over_bf16():
    """README: "the 5B layer's twelve GEMMs (M = 15,872) on H200 take 1.91x / 1.92x / 1.93x less time in
    FP8 than in BF16 (fprop / dgrad / wgrad), where Transformer Engine's GEMM benchmark measured 1.91x /
    1.90x / 1.90x (pre-quantized per-tensor FP8, H200 NVL)" (TE docs/examples/gemm_profiling)."""
    from simulator.cost.compute import RooflineCompute
    from simulator.hardware.clusters import CLUSTER_PRESETS
    from simulator.tasks import OpWork, gemm_grad_shapes
    gpu = CLUSTER_PRESETS["dgx-h200"].gpu
    bf16, fp8 = RooflineCompute(gpu, "bf16"), RooflineCompute(gpu, "fp8")
    fwd = [(15872, 12288, 4096), (15872, 4096, 4096), (15872, 16384, 4096), (15872, 4096, 16384)]
    shapes = {"fprop": fwd, "dgrad": [gemm_grad_shapes(s)[0] for s in fwd],
              "wgrad": [gemm_grad_shapes(s)[1] for s in fwd]}
    measured = {"fprop": 10.632 / 5.577, "dgrad": 10.747 / 5.661, "wgrad": 10.530 / 5.547}
    for kind, gemms in shapes.items():
        ops = [OpWork("g", "gemm", 2.0 * m * n * k, 0.0, (m, n, k)) for m, n, k in gemms]
        ratio = sum(map(bf16.op_time_s, ops)) / sum(fp8.op_time_s(dataclasses.replace(o, precision="fp8"))
                                                      for o in ops)
        assert round(measured[kind], 2) == {"fprop": 1.91, "dgrad": 1.90, "wgrad": 1.90}[kind]
        assert round(ratio, 2) == {"fprop": 1.91, "dgrad": 1.92, "wgrad": 1.93}[kind]
        assert abs(ratio / measured[kind] - 1) < 0.04


def test_h200_runs_tensor_core_kernels_at_the_h100s_1575_mhz_and_a100_at_its_datasheet_peak():
    from simulator.cost.compute import RooflineCompute
    from simulator.hardware.gpus import GPU_PRESETS
    h200 = GPU_PRESETS["h200-sxm-141gb"]
    assert h200.sustained_clock_MHz == GPU_PRESETS["h100-sxm5-80gb"].sustained_clock_MHz == 1575
    quoted_MHz = h200.peak("bf16") / (132 * 4096) / 1e6  # 132 SMs x 4,096 dense BF16 FLOP per clock
    assert RooflineCompute(h200, "bf16").clock_ratio == pytest.approx(1575 / quoted_MHz)
    for name in ("a100-sxm4-40gb", "a100-sxm4-80gb"):
        assert RooflineCompute(GPU_PRESETS[name], "bf16").clock_ratio == 1.0


def test_an_eager_host_launches_a_kernel_in_7_4_us():
    from simulator.cost.compute import EAGER_KERNEL_HOST_S
    assert EAGER_KERNEL_HOST_S == pytest.approx(7.4e-6)


def test_te_defaults_run_ring_exchange_a_16_sm_pipeline_and_16_sm_bulk_sites():
    from simulator.strategy.ub_config import SITES, load_ub_config
    for name, margin in (("te1-default", False), ("te2-default", True)):
        cfg = load_ub_config(name)
        methods = [cfg.site(s).method for s in SITES]
        assert methods == ["ring_exchange"] * 4 + ["pipeline"] * 2 + ["bulk"] * 4
        assert {(cfg.site(s).num_sm, cfg.site(s).splits, cfg.site(s).sm_margin) for s in SITES[4:6]} == {(16, 4, margin)}
        assert {cfg.site(s).num_sm for s in SITES[6:]} == {16}


# ---- busiest rank: shown when its idle time is shorter by more than 5% of the step ------------------
@pytest.mark.parametrize("gap, shown", [(0.049, False), (0.051, True)])
def test_the_busiest_rank_is_shown_above_5_percent_of_the_step(gap, shown):
    from simulator.analysis.report import format_summary
    base = {"compute": 6.0, "bubble": 4.0}
    metrics = {"iteration_time_s": 10.0, "time_breakdown_s": base, "num_gpus": 8,
               "busiest_rank": {"rank": 3, "time_breakdown_s": {"compute": 6.0 + 10 * gap, "bubble": 4.0 - 10 * gap}}}
    assert ("busiest rank 3" in format_summary(metrics)) is shown


# ---- plan search: the static memory estimate equals the simulated peak, zb-h2 included ---------------
@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_search_estimate_equals_the_simulated_peak_for_zb_h2(recompute):
    from simulator.analysis.memory import estimate_memory
    from simulator.explore.enumerate import Plan, apply_plan
    from simulator.explore.estimate import EstimateCache, estimate
    from simulator.pipeline import simulate
    raw = {"model": {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "vocab_size": 1024,
                     "seq_length": 256}, "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1},
           "training": {"global_batch_size": 16}}
    scn = scenario_from_dict(apply_plan(raw, Plan(2, 2, 2, schedule="zb-h2", recompute=recompute)), default_name="t")
    est = estimate(scn, EstimateCache())
    assert est.total_bytes == pytest.approx(simulate(scn).memory.peak["total"], rel=1e-9)
    assert est.total_bytes == pytest.approx(estimate_memory(scn).peak["total"], rel=1e-9)


# ---- "### Calibrating from your own traces": the shipped CPU trace's figures -------------------------
def test_the_shipped_cpu_trace_compares_at_minus_21_9_and_fits_at_minus_9_4_percent(tmp_path, monkeypatch):
    """README: "On that CPU trace: compare -21.9%, fit then simulate -9.4%" (the CPU scenario, whose
    cost tables are scenarios/calibration/cpu/kernels.csv)."""
    from simulator.calibration.cli import cmd_compare, cmd_fit
    from simulator.pipeline import simulate
    assert "compare -21.9%, fit then simulate -9.4%" in " ".join(README.split())
    monkeypatch.chdir(ROOT)
    trace = ROOT / "scenarios" / "calibration" / "cpu" / "tiny-gpt.trace.json.gz"
    scn_file = ROOT / "scenarios" / "calibration" / "cpu" / "tiny-gpt.toml"
    assert cmd_compare(str(trace), str(scn_file), str(tmp_path / "cmp")) == 0
    c = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert round(100 * c["step_time_error"], 1) == -21.9
    assert cmd_fit([str(trace)], str(scn_file), str(tmp_path / "fit")) == 0
    fitted = simulate(load_scenario(scn_file, ["cost.compute=calibrated", f"cost.tables={tmp_path / 'fit'}"]))
    error = fitted.metrics["iteration_time_s"] / c["measured_step_s"] - 1
    assert round(100 * error, 1) == -9.4
    # scenarios/calibration/README.md: "match coverage 99.8%, measured step 4616 ms, simulated 3606 ms ...
    # simulate 4184 ms ... (kernels busy 4573 ms of it)"
    ms = [round(1e3 * x) for x in (c["measured_step_s"], c["simulated_step_s"], fitted.metrics["iteration_time_s"],
                                   c["measured_busy_s"])]
    assert round(100 * c["coverage"], 1) == 99.8 and ms == [4616, 3606, 4184, 4573]


# ---- goodput: the [reliability] defaults the README lists ------------------------------------------
def test_reliability_defaults_are_the_documented_ones():
    from simulator.reliability import ReliabilitySpec
    documented = {"failure_data": "llama3", "failure_rate_scale": 1.0, "planned_maintenance": True,
                  "checkpoint_interval_steps": 0, "checkpoint_mode": "sync", "storage_write_GBps": 2000,
                  "storage_read_GBps": 2000, "async_step_slowdown": 0, "detection_s": 600, "reschedule_s": 300,
                  "warmup_s": 30, "hot_spares": 0, "spare_repair_h": 0, "straggler_jitter": 0.02,
                  "straggler_probability": 0, "straggler_slowdown": 0}
    assert dataclasses.asdict(ReliabilitySpec()) == documented
    text = section("### Goodput of a whole run")
    for key, value in documented.items():  # each default is also the README's
        shown = {True: "true", False: "false"}.get(value, value) if isinstance(value, bool) else value
        assert re.search(rf"`{key}`[^;]*?= (`[a-z_]+` = )?\"?{re.escape(str(shown))}\b", text), key


# ---- "## Not modelled yet": the 1.7B H100 row's dispatch figures; what search tries by default -------
def test_the_1_7b_h100_rows_kernels_take_2_7x_to_18x_their_dispatch():
    """README: "its tasks' kernels take 2.7x to 18x, median, their dispatch: 0.017 s of dispatch under
    0.36 s of kernels per step" (the least and the median ratio over the first rank's compute tasks)."""
    import statistics

    from simulator.cost.compute import EAGER_KERNEL_HOST_S, RooflineCompute
    from simulator.explore.validate import read_rows, row_to_raw
    from simulator.pipeline import lower
    row = next(r for r in read_rows([]) if r["name"] == "gpt-1.7b-h100")
    scn = scenario_from_dict(row_to_raw(row), default_name="r")
    rc = RooflineCompute(scn.cluster.gpu, scn.training.dtype, scn.training.attention)
    graph = lower(scn).graph
    tasks = [t for t in graph.tasks if t.rank == graph.ranks[0] and t.kind == "compute" and t.work]
    kernels = [sum(rc.op_time_s(o) for o in t.work if o.kind != "host") for t in tasks]
    dispatch = [EAGER_KERNEL_HOST_S * sum(rc.kernel_launches(o) for o in t.work) for t in tasks]
    ratios = [k / d for k, d in zip(kernels, dispatch)]
    assert (round(min(ratios), 1), round(statistics.median(ratios))) == (2.7, 18)
    assert (round(sum(dispatch), 3), round(sum(kernels), 2)) == (0.017, 0.36)


def test_search_does_not_try_the_v_shaped_or_dualpipe_schedules_unless_asked():
    from simulator.explore.enumerate import SearchSpace
    tried = set(SearchSpace().schedules)
    assert not tried & {"zb-v", "dualpipe-v", "dualpipe"} and {"1f1b", "interleaved-1f1b", "zero-bubble"} <= tried


# ---- "**ZeRO-3 at 384 to 2,240 GPUs**": what DeepSpeed's 2021 engine moves per rank and step ----------
@pytest.mark.parametrize("row", ["narayanan-zero3-175b-384", "narayanan-zero3-175b-1536"])
def test_zero3_175b_gathers_1058_times_and_moves_1_3_tb_per_gpu_whatever_the_gpu_count(row):
    from simulator.explore.validate import read_rows, row_to_raw
    from simulator.pipeline import lower
    scn = scenario_from_dict(row_to_raw(next(r for r in read_rows([]) if r["name"] == row)), default_name="r")
    graph = lower(scn).graph
    comms = [t.comm for t in graph.tasks if t.rank == graph.ranks[0] and t.comm is not None]
    names = [t.name for t in graph.tasks
             if t.rank == graph.ranks[0] and t.comm is not None and t.comm.op == "all_gather"]
    assert len(names) == 1059 and names[-1] == "persistent_param_all_gather"  # 1,058 fetches, then the post-step one
    assert round(sum(c.size_bytes for c in comms) / 1e12, 1) == 1.3


def test_zero3_175b_copies_770_persistent_tensors_out_per_rank_after_the_step():
    """README: 770 tensors x 1,536 pairs = 20.6 s per step at 1,536 GPUs, 10.3 s at 768, 5.1 s at 384."""
    from simulator.explore.estimate import EstimateCache
    from simulator.explore.validate import read_rows, row_to_raw
    from simulator.pipeline import lower
    got = {}
    for n in (384, 768, 1536):
        row = next(r for r in read_rows([]) if r["name"] == f"narayanan-zero3-175b-{n}")
        scn = scenario_from_dict(row_to_raw(row), default_name="r")
        tasks = [t for t in lower(scn).graph.tasks if t.name.endswith(".persistent_copy_out")]
        cost = EstimateCache().cost(scn)
        got[n] = round(sum(cost.duration_s(t) for t in tasks), 1)
        views = sum(o.shape[0] for t in tasks for o in t.work if o.name == "ds2021_persistent_views")
        assert views == 3 * 770 * n  # every tensor has a piece on every rank (12,288-49,152 elements)
    assert got == {384: 5.1, 768: 10.3, 1536: 20.6}


def test_deepspeed_gathers_gpt3_175b_persistent_tensors_after_the_step_in_0_42_s_on_256_a100():
    """README (sharding): today's DeepSpeed gathers each of GPT-3 175B's 770 persistent tensors alone
    after the step: 0.42 s on 256 A100 (the tiny collectives run back to back on one stream)."""
    from simulator.explore.estimate import EstimateCache
    from simulator.pipeline import lower
    scn = scenario_from_dict({"model": {"preset": "gpt3-175b"}, "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 32},
                              "parallelism": {"dp": 256, "zero_stage": 3, "sharding": "deepspeed", "recompute": "full"},
                              "training": {"global_batch_size": 256}})
    graph = lower(scn).graph
    tasks = [t for t in graph.tasks if "persistent_param_all_gather" in t.name and t.rank == graph.ranks[0]]
    cost = EstimateCache().cost(scn)
    assert (len(tasks), round(sum(cost.isolated_s(t) for t in tasks), 2)) == (770, 0.42)
