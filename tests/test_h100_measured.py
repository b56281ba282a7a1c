"""The compute cost model against the kernels measured on an H100 SXM (scenarios/calibration/h100/,
made by benchmarks/gpu_kernels.py and benchmarks/gpu_layer.py on a lent GPU): FP8 split accumulation,
whole layers, and the GEMM shapes of today's layers; and the sustained rate and a layer on an H200
(scenarios/calibration/h200/)."""

import csv
import dataclasses
import json
from pathlib import Path

import pytest

from simulator.cost.compute import FP8_SPLIT_ACCUMULATOR_RATE, RooflineCompute
from simulator.hardware.gpus import GPU_PRESETS
from simulator.model.opgraph import build_op_graph, gemm_flops
from simulator.model.presets import MODEL_PRESETS
from simulator.model.spec import ModelSpec
from simulator.strategy.sharding import shard_ops, shard_ops_backward
from simulator.tasks import OpWork

H100 = GPU_PRESETS["h100-sxm5-80gb"]
H200 = GPU_PRESETS["h200-sxm-141gb"]
B200 = GPU_PRESETS["b200-sxm-180gb"]
MEASURED = Path(__file__).resolve().parents[1] / "scenarios" / "calibration" / "h100"


def _gemm(shape, precision="", backward=False):
    m, n, k = shape
    return OpWork("g", "gemm", gemm_flops(m, n, k), 0.0, shape, precision, backward)


def test_fp8_dgrad_and_wgrad_run_split_accumulators_on_hopper_only():
    shape = (6144, 2816, 8192)  # 4 x 132 tiles: no fp32 fixup traffic, which no accumulator changes
    h100 = RooflineCompute(H100, "fp8")
    fprop, grad = (h100.op_time_s(_gemm(shape, "fp8", b)) for b in (False, True))
    over = h100.eff.kernel_overhead_s
    assert (grad - over) == pytest.approx((fprop - over) / FP8_SPLIT_ACCUMULATOR_RATE["hopper"], rel=1e-9)
    # BF16 GEMMs have one accumulator: forward and backward GEMMs of one shape take the same time
    assert h100.op_time_s(_gemm(shape, "", True)) == h100.op_time_s(_gemm(shape))
    b200 = RooflineCompute(B200, "fp8")
    assert b200.op_time_s(_gemm(shape, "fp8", True)) == b200.op_time_s(_gemm(shape, "fp8"))
    # still faster than the BF16 GEMM, never faster than half of it
    bf16 = h100.op_time_s(_gemm(shape))
    assert bf16 / 2 < grad < bf16


def test_fused_fp8_backward_gemm_prices_both_gradients_with_split_accumulators():
    rc = RooflineCompute(H100, "fp8")
    m, n, k = 4096, 14336, 4096
    fused = OpWork("fc1", "gemm", 2 * gemm_flops(m, n, k), 0.0, (m, n, k), "fp8", True)
    dgrad = rc.op_time_s(_gemm((m, k, n), "fp8", True))
    wgrad = rc.op_time_s(_gemm((k, n, m), "fp8", True))
    assert rc.op_time_s(fused) == pytest.approx(dgrad + wgrad, rel=1e-9)


def _layer_s(model, seq: int, tp: int, attention: str, micro_batch: int = 1, gpu=H100) -> tuple[float, float]:
    """Forward and forward + backward seconds of one layer's TP-rank shard, BF16."""
    m = dataclasses.replace(model, seq_length=seq)
    rc = RooflineCompute(gpu, "bf16", attention)
    g = build_op_graph(m, micro_batch, "bf16", attention=attention)
    fwd = sum(rc.op_time_s(w) for w in shard_ops(g.layer, tp, False, 1, 1))
    bwd = sum(rc.op_time_s(w) for w in shard_ops_backward(g.layer, tp, False, 1, 1, "BW", 4.0))
    return fwd, fwd + bwd


def _measured_model(spec: dict) -> ModelSpec:
    """The layer gpu_layer.py ran (its ``model`` entry) as a ModelSpec."""
    return ModelSpec(spec["name"], 1, spec["hidden"], spec["heads"], spec.get("vocab", 32000), spec["seq"],
                     num_kv_heads=spec["kv_heads"], ffn_hidden_size=spec["ffn"], mlp=spec["mlp"],
                     norm=spec["norm"], bias=spec["bias"])


@pytest.mark.parametrize("measured, modelled_ms", [
    ("gpu_layer.json", 22.21), ("gpu_layer_gpt3-175b-tp4.json", 9.86), ("gpu_layer_gpt-1.7b.json", 2.92),
    ("gpu_layer_mpt-1b.json", 15.02), ("gpu_layer_mpt-7b.json", 26.05), ("../h200/gpu_layer.json", 21.71)])
def test_a_layer_costs_what_it_measured_on_an_h100(measured, modelled_ms):
    """Four layers forward and backward back to back at the power limit (benchmarks/gpu_layer.py):
    a Llama 3.1 8B layer at sequence 8192, a GPT-3 175B layer's TP 4 shard at 2048 (its TP
    collectives not run), the Megatron-LM README's 1.7B GPT layer at 4096, MPT 1B and 7B layers at
    llm-foundry's micro-batches 12 and 6. The sums agree within 3.5%; the parts do not (README: GEMMs in
    the mix run faster than back to back, torch's elementwise kernels slower than the HBM rate). The
    forward pass alone, timed briefly before the sustained run, ran above the power-limited clock the
    model prices GEMMs at (1,530-1,845 MHz): within 12%."""
    doc = json.loads((MEASURED / measured).read_text())
    spec, gpu = doc["model"], H200 if doc["provenance"]["device"] == "NVIDIA H200" else H100
    fwd, both = _layer_s(_measured_model(spec), spec["seq"], spec["tp"], "cudnn", spec.get("mb", 1), gpu)
    assert both == pytest.approx(doc["fwd_bwd_per_layer_s"], rel=0.035)
    assert round(1e3 * both, 2) == modelled_ms  # as scenarios/calibration/README.md quotes it
    assert fwd == pytest.approx(doc["forward_per_layer_s"], rel=0.12)


def _measured_gemms(name: str, section: str):
    with open(MEASURED / name) as f:
        return [r for r in csv.DictReader(f) if r["section"] == section]


def test_measured_split_accumulation_rate_is_the_constant():
    rows = _measured_gemms("gpu_fp8_accum.csv", "fp8_accum")
    times: dict = {}
    for r in rows:
        base, acc = r["name"].rsplit(".", 1)
        times.setdefault((base, r["pass"]), {})[acc] = float(r["time_s"])
    ratios = [t["fast"] / t["split"] for t in times.values()]
    assert len(ratios) == 39
    assert sum(ratios) / len(ratios) == pytest.approx(FP8_SPLIT_ACCUMULATOR_RATE["hopper"], abs=5e-4)
    assert (round(min(ratios), 2), round(max(ratios), 2)) == (0.84, 1.00)  # "0.936 (0.84..1.00)"


def test_the_gemm_model_reproduces_every_measured_h100_gemm():
    """256 GEMMs of at least 50 us measured back to back at the power limit (square, k sweep, m sweeps
    across wave boundaries, the layer GEMMs in three layouts, BF16 and FP8): MAPE 3.0%, -11.6%..+13.5%.
    Shorter ones are launch-bound in the measurement and left out."""
    rc = RooflineCompute(H100, "fp8")
    errors = []
    for name, section in (("gpu_kernels.csv", "gemm"), ("gpu_waves.csv", "waves"), ("gpu_fp8_accum.csv", "fp8_accum")):
        for r in _measured_gemms(name, section):
            t = float(r["time_s"])
            if t < 50e-6 or r["name"].endswith(".split"):
                continue
            split = r["dtype"] == "fp8" and r["pass"] != "fwd" and not r["name"].endswith(".fast")
            op = _gemm((int(r["m"]), int(r["n"]), int(r["k"])), "fp8" if r["dtype"] == "fp8" else "", split)
            errors.append((rc.op_time_s(op) - rc.eff.kernel_overhead_s) / t - 1)
    assert len(errors) == 256
    # as the READMEs quote it: MAPE 3.0%, -11.6%..+13.5%
    assert round(100 * sum(abs(e) for e in errors) / len(errors), 1) == 3.0
    assert (round(100 * min(errors), 1), round(100 * max(errors), 1)) == (-11.6, 13.5)


def test_large_gemms_beside_held_sms_lose_what_was_measured():
    """A GEMM beside CTAs that hold SMs (as NCCL's do) runs its tiles in waves on the SMs left, at the
    clock the power limit allows fewer busy SMs. Against the measured H100 (gpu_contention.csv): the
    two large GEMMs within +10% at 8 to 66 SMs held; the one- and two-wave GEMMs, whose persistent
    kernels lose more (up to 2.5x), are a known shortfall and only bounded here."""
    from simulator.cost.sm_share import with_sms_taken
    rc = RooflineCompute(H100, "bf16")
    with open(MEASURED / "gpu_contention.csv") as f:
        rows = [r for r in csv.DictReader(f) if int(r["hog_ctas"])]
    assert len(rows) == 20
    for r in rows:
        op = _gemm((int(r["m"]), int(r["n"]), int(r["k"])))
        over = rc.eff.kernel_overhead_s
        ratio = (with_sms_taken(rc, int(r["hog_ctas"])).op_time_s(op) - over) / (rc.op_time_s(op) - over)
        error = ratio / float(r["ratio"]) - 1
        m, held = int(r["m"]), int(r["hog_ctas"])
        if m == 8192:
            assert -0.01 < error < 0.10, (r, ratio)
        elif held == 66:  # README: measured 2.3-2.5x, the model 1.6-1.8x
            assert 2.3 <= round(float(r["ratio"]), 1) <= 2.5 and 1.6 <= round(ratio, 1) <= 1.8, (r, ratio)
        else:  # README: the 1,536-row GEMM 8-11% more than measured, the 2,048-row one 20-24% less
            assert (8 <= round(100 * error) <= 11) if m == 1536 else (-24 <= round(100 * error) <= -20), (r, error)


def test_large_gemms_beside_copying_ctas_lose_what_was_measured():
    """The same GEMMs beside CTAs that copy memory as they hold their SMs (``gpu_contention.py --hog
    copy``, 290-1,070 GB/s at 8-33 CTAs: an NCCL channel's traffic), whose HBM traffic and power take
    back most of the clock that idle held SMs give: the two large GEMMs within 5% of the model at
    NCCL's channel counts (8-33 CTAs); at 66 copying CTAs (1.9 TB/s) they lose 8-18% more than modelled."""
    from simulator.cost.sm_share import with_sms_taken
    rc = RooflineCompute(H100, "bf16")
    with open(MEASURED / "gpu_contention_copy.csv") as f:
        rows = [r for r in csv.DictReader(f) if int(r["m"]) == 8192 and 0 < int(r["hog_ctas"])]
    assert len(rows) == 10 and all(280e0 < float(r["hog_GBps"]) < 1100 for r in rows if int(r["hog_ctas"]) <= 33)
    errors: dict = {}
    for r in rows:
        op = _gemm((int(r["m"]), int(r["n"]), int(r["k"])))
        over = rc.eff.kernel_overhead_s
        ratio = (with_sms_taken(rc, int(r["hog_ctas"])).op_time_s(op) - over) / (rc.op_time_s(op) - over)
        errors.setdefault(int(r["hog_ctas"]) == 66, []).append(ratio / float(r["ratio"]) - 1)
    # scenarios/calibration/README.md: within -4.3%..+4.6% at 8-33 CTAs; at 66 under-charged by 8-18%
    assert (round(100 * min(errors[False]), 1), round(100 * max(errors[False]), 1)) == (-4.3, 4.6)
    assert sorted(round(-100 * e) for e in errors[True]) == [8, 18]


def test_queued_timing_took_the_launch_out_of_the_small_kernels_only():
    """scenarios/calibration/README.md: the committed tables (queued timing) against the first run's
    (an event pair around each call, kept as kernels_first_run.csv): kernels under 30 us came out at
    0.43x their first times (median), kernels over 1 ms at 0.98x."""
    import statistics

    from simulator.cost.calibrated import KERNEL_COLUMNS, read_table

    def times(name):
        prov, rows = read_table(MEASURED / name, KERNEL_COLUMNS)
        return prov, {(r["kind"], r["name"], r["pass"], r["shape"]): float(r["time_s"]) for _, r in rows}

    first_prov, first = times("kernels_first_run.csv")
    queued_prov, queued = times("kernels.csv")
    assert "per call" in first_prov["timing"] and "queued" in queued_prov["timing"]
    both = first.keys() & queued.keys()
    small = [queued[k] / first[k] for k in both if first[k] < 30e-6]
    large = [queued[k] / first[k] for k in both if first[k] > 1e-3]
    assert (round(statistics.median(small), 2), round(statistics.median(large), 2)) == (0.43, 0.98)


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_an_h200_sustains_the_h100s_tensor_rate(dtype):
    """Back-to-back 8192^3 GEMMs at the 700 W limit settle at the same rate on the lent H200 as on the
    lent H100 (664 / 665 TFLOP/s BF16, 1,241 / 1,241 FP8): the same die under the same power limit, so
    the two presets price them alike: BF16 2% and FP8 5% faster than both measurements (the FP8 rate is
    the fit over the layer shapes, which the 8192^3 product sustains a little under)."""
    sustained = {}
    for gpu, folder in ((H100, "h100"), (H200, "h200")):
        doc = json.loads((MEASURED.parent / folder / "gpu_kernels.json").read_text())
        sustained[gpu.name] = doc[f"sustained_{dtype}"]["summary"]["steady_tflops"] * 1e12
    assert sustained[H200.name] == pytest.approx(sustained[H100.name], rel=0.01)
    op = _gemm((8192, 8192, 8192), "fp8" if dtype == "fp8" else "")
    for gpu in (H100, H200):
        rc = RooflineCompute(gpu, "fp8")
        rate = op.flops / (rc.op_time_s(op) - rc.eff.kernel_overhead_s)
        assert rate / sustained[gpu.name] - 1 == pytest.approx(0.02 if dtype == "bf16" else 0.05, abs=0.01)


@pytest.mark.parametrize("gpu, trace", [("h100", "llama31-8b-4layers-sustained.trace.json.gz"),
                                        ("h200", "llama31-8b-4layers.trace.json.gz")])
def test_a_whole_llama_step_on_one_gpu_costs_what_it_measured(tmp_path, gpu, trace):
    """Four Llama 3.1 8B layers with the 128K head at seq 8192, two micro-batches and AdamW, trained on
    the lent H100 and H200 with torchtitan's eager small ops after 80 unrecorded steps at the 700 W
    limit (<gpu>/llama31-8b-4layers/, `calibrate profile --warmup 80`): the simulated step (the scenario
    on dgx-h100 or dgx-h200) is within 1% of the measured one (-0.4%, -0.6%). Its parts are not: GEMMs run 5-15%
    faster in the step's kernel mix than the model's back-to-back rate, the eager RMSNorm and rotary
    kernels slower than their HBM rule."""
    from simulator.calibration.cli import cmd_compare

    folder = MEASURED.parent / gpu / "llama31-8b-4layers"
    scenario = tmp_path / "scn.toml"
    scenario.write_text((MEASURED.parent / "llama31-8b-4layers.toml").read_text().replace(
        'preset = "dgx-h100"', f'preset = "dgx-{gpu}"'))
    assert cmd_compare(str(folder / trace), str(scenario), str(tmp_path)) == 0
    c = json.loads((tmp_path / "compare.json").read_text())
    assert c["coverage"] > 0.98 and round(100 * c["step_time_error"], 1) == {"h100": -0.4, "h200": -0.6}[gpu]
    cat = {r["category"]: r for r in c["per_category"]}
    assert 0.05 < cat["gemm"]["simulated_s"] / cat["gemm"]["measured_s"] - 1 < 0.15
    ops = {(r["phase"], r["op"]): r["error"] for r in c["per_op"]}
    assert all(ops[(p, op)] < -0.10 for p in "FB" for op in ("ln1", "ln2", "rope"))
    if gpu == "h200":  # scenarios/calibration/README.md: GEMMs +12%, the eager norms and rotary 25-32% under
        assert round(100 * (cat["gemm"]["simulated_s"] / cat["gemm"]["measured_s"] - 1)) == 12
        under = [-ops[(p, op)] for p in "FB" for op in ("ln1", "ln2", "rope", "final_norm")]
        assert (round(100 * min(under)), round(100 * max(under))) == (25, 32)
    if gpu == "h100":  # scenarios/calibration/README.md's table of this step, measured / simulated ms
        def ms(names):
            rows = [r for r in c["per_op"] if r["op"] in names]
            return (round(1e3 * sum(r["measured_s"] for r in rows), 1),
                    round(1e3 * sum(r["simulated_s"] for r in rows), 1))
        assert [ms(n) for n in ({"ln1", "ln2", "final_norm"}, {"rope"}, {"act"}, {"loss"})] == \
            [(33.3, 26.2), (5.7, 4.9), (8.6, 9.3), (36.3, 35.5)]
        assert [(round(1e3 * cat[k]["measured_s"], 1), round(1e3 * cat[k]["simulated_s"], 1))
                for k in ("gemm", "attention")] == [(186.3, 202.7), (32.3, 37.7)]
    if gpu == "h100":  # scenarios/calibration/README.md: with FlashAttention-2's curve, 6.0% slow
        scenario.write_text(scenario.read_text().replace('attention = "cudnn"', 'attention = "flash"'))
        assert cmd_compare(str(folder / trace), str(scenario), str(tmp_path / "flash")) == 0
        flash = json.loads((tmp_path / "flash" / "compare.json").read_text())
        assert round(100 * flash["step_time_error"], 1) == 6.0


def test_tables_fitted_from_the_h100_step_trace_replay_the_step(tmp_path):
    """The calibration loop on real GPU data: `calibrate fit` on the committed H100 step trace, then
    the scenario simulated over those tables (`cost.compute = "calibrated"`), comes within 2% of the
    measured step (345.99 against 347.38 ms)."""
    from simulator.calibration.cli import cmd_fit
    from simulator.pipeline import simulate_metrics
    from simulator.scenario import load_scenario

    trace = MEASURED / "llama31-8b-4layers" / "llama31-8b-4layers-sustained.trace.json.gz"
    scenario = MEASURED.parent / "llama31-8b-4layers.toml"
    assert cmd_fit([str(trace)], str(scenario), str(tmp_path)) == 0
    scn = load_scenario(scenario)
    calibrated = dataclasses.replace(scn, cost=dataclasses.replace(scn.cost, compute="calibrated",
                                                                   tables=str(tmp_path)))
    step_s = simulate_metrics(calibrated)["iteration_time_s"]
    assert round(step_s / 0.34738 - 1, 3) == -0.002
    # scenarios/calibration/README.md: with torch's own loss rule the loss "runs at 76% forward and 90%
    # backward" of the HBM peak in the fitted rates
    with (tmp_path / "efficiencies.csv").open() as f:
        rates = {(r["kind"], r["pass"]): float(r["fraction_of_peak"])
                 for r in csv.DictReader(line for line in f if not line.startswith("#"))}
    assert (round(100 * rates["loss", "fwd"]), round(100 * rates["loss", "bwd"])) == (76, 90)


@pytest.mark.parametrize("hog", ["spin", "copy"])
def test_memory_bound_kernels_beside_held_sms(hog):
    """cost/sm_share's rule: memory-bound kernels keep their time beside a collective's CTAs (HBM, not
    SMs, bounds them). Measured (gpu_contention.py --victim memory; a BF16 add, LayerNorm and a copy
    over 8192 x 8192 / 512 MiB): beside 8-66 spinning CTAs they keep it within 1.5%. Beside CTAs that
    copy memory as NCCL's do they lose 2-9% at 8-33 CTAs (LayerNorm 4-19%) and 16-41% at 66: the HBM
    share, which the model does not charge (README, "Not modelled yet")."""
    rows = list(csv.DictReader((MEASURED / f"gpu_contention_memory_{hog}.csv").open()))
    assert len(rows) == 18 and {int(r["hog_ctas"]) for r in rows} == {0, 8, 16, 24, 33, 66}
    ratios = [float(r["ratio"]) for r in rows]
    if hog == "spin":
        assert max(ratios) < 1.015
    else:
        small = [float(r["ratio"]) for r in rows if 8 <= int(r["hog_ctas"]) <= 33]
        assert 1.015 < min(small) and max(small) < 1.20
        assert max(ratios) > 1.4


def _attention_errors(name: str, kernel: str) -> list[float]:
    """Model over measured time of each causal attention row (32 heads of 128, bf16) of ``name``."""
    att = {"flash_attention": "flash", "cudnn_attention": "cudnn"}[kernel]
    out = []
    for r in csv.DictReader((MEASURED / name).open()):
        if r["section"] != "attention" or r["name"] != kernel:
            continue
        b, heads, s = int(r["m"]), int(r["n"]), int(r["k"])
        spec = ModelSpec("attn", 1, heads * 128, heads, 32000, s, mlp="swiglu", dropout=False)
        layer = build_op_graph(spec, b, "bf16", attention=att).layer
        rc = RooflineCompute(H100, "bf16", att)
        ops = (shard_ops(layer, 1, False, 1, 1) if r["pass"] == "fwd"
               else shard_ops_backward(layer, 1, False, 1, 1, "BW"))
        out.append(sum(rc.op_time_s(w) for w in ops if w.kind == "attention") / float(r["time_s"]) - 1)
    return out


@pytest.mark.parametrize("name, kernel, lo, hi", [
    ("gpu_kernels.csv", "flash_attention", 3, 19), ("gpu_kernels.csv", "cudnn_attention", 16, 33),
    ("gpu_attention_long.csv", "flash_attention", 15, 28), ("gpu_attention_long.csv", "cudnn_attention", 25, 33)])
def test_the_model_prices_attention_slower_than_it_ran_alone(name, kernel, lo, hi):
    """README and scenarios/calibration/README.md: the model's attention (the published curves at the
    GEMMs' sustained clock) is 3-19% (torch's FlashAttention-2) and 16-33% (cuDNN 9.19) longer than those
    kernels ran alone on the lent H100 at 1K-16K tokens, 15-28% and 25-33% at 8K-64K (not adopted:
    scenarios/calibration/README.md)."""
    errors = _attention_errors(name, kernel)
    assert len(errors) == 10 if name == "gpu_kernels.csv" else len(errors) == 8
    assert (round(100 * min(errors)), round(100 * max(errors))) == (lo, hi)


@pytest.mark.parametrize("measured, torch_pct, fused_pct", [
    ("gpu_layer_gpt-1.7b.json", 9, 18), ("gpu_layer_mpt-1b.json", 9, 18), ("gpu_layer_mpt-7b.json", 10, 16)])
def test_lm_heads_with_a_loss_cost_more_than_they_ran(measured, torch_pct, fused_pct):
    """scenarios/calibration/README.md: the LM head GEMM with an fp32 cross-entropy, forward and backward
    (gpu_layer.py's head_and_loss, torch's F.cross_entropy), is modelled 9-10% slower than measured with
    torch's loss rule and 16-18% with Megatron's fused-loss rule: the mix-clock effect."""
    doc = json.loads((MEASURED / measured).read_text())
    spec = dataclasses.replace(_measured_model(doc["model"]), vocab_size=doc["model"]["vocab"])
    rc = RooflineCompute(H100, "bf16", "flash")
    for rule, pct in (("torch", torch_pct), ("fused", fused_pct)):
        head = tuple(o for o in build_op_graph(spec, doc["model"].get("mb", 1), "bf16", attention="flash",
                                               cross_entropy=rule).head if o.name != "final_norm")
        works = shard_ops(head, 1, False, 1, 1) + shard_ops_backward(head, 1, False, 1, 1, "BW")
        t = sum(rc.op_time_s(w) for w in works)
        assert round(100 * (t / doc["head_and_loss"]["fwd_bwd_s"] - 1)) == pct


def test_the_tiny_model_on_an_h100_is_host_bound(tmp_path, monkeypatch):
    """scenarios/calibration/README.md: the tiny model's traced H100 step is 10.8 ms, its kernels busy
    0.74 ms; compare matches 95.6% of the kernel time and the simulation from these tables gives
    0.95 ms: -91%, the profiled host, not the kernels."""
    from simulator.calibration.cli import cmd_compare

    monkeypatch.chdir(MEASURED.parents[2])  # the scenario's tables path is relative to the repository root
    assert cmd_compare(str(MEASURED / "tiny-gpt.trace.json.gz"), str(MEASURED / "tiny-gpt.toml"), str(tmp_path)) == 0
    c = json.loads((tmp_path / "compare.json").read_text())
    assert (round(1e3 * c["measured_step_s"], 1), round(1e3 * c["measured_busy_s"], 2)) == (10.8, 0.74)
    assert (round(100 * c["coverage"], 1), round(1e3 * c["simulated_step_s"], 2)) == (95.6, 0.95)
    assert round(100 * c["step_time_error"]) == -91


def test_re_timed_grad_norm_rows():
    """scenarios/calibration/README.md: the re-timed gradient norm of the 4-layer step is 2.49 ms on the
    H100 (3.1 TB/s), 1.72 ms on the H200, where the Adam rows scaled by bytes gave 4.2 ms; the H100
    preset rows run 7.5 us at 2^20 parameters to 0.35 ms at 2^28; the profiled tables simulate the step
    at 314 ms, 10% under the sustained measurement (347.4 ms)."""
    from simulator.cost.calibrated import CalibrationTables
    from simulator.pipeline import simulate_metrics
    from simulator.scenario import load_scenario
    from simulator.tasks import OpWork

    n = 1923125248
    work = OpWork("grad_norm", "optimizer", 0.0, 4.0 * n, (n,))
    h100 = CalibrationTables.load(MEASURED / "llama31-8b-4layers")
    h200 = CalibrationTables.load(MEASURED.parent / "h200" / "llama31-8b-4layers")
    adam_only = CalibrationTables(tuple(r for r in h100.kernels if r.name != "grad_norm"))
    assert [round(1e3 * t.lookup_s(work, "bf16"), 2) for t in (h100, h200)] == [2.49, 1.72]
    assert round(4.0 * n / h100.lookup_s(work, "bf16") / 1e12, 1) == 3.1
    assert round(1e3 * adam_only.lookup_s(work, "bf16"), 1) == 4.2
    presets = sorted((r.shape[0], r.time_s) for r in CalibrationTables.load(MEASURED).kernels
                     if r.name == "grad_norm" and r.shape[0] >= 2 ** 20)
    assert [p[0] for p in presets] == [2 ** e for e in (20, 22, 24, 26, 28)]
    assert (round(1e6 * presets[0][1], 1), round(1e3 * presets[-1][1], 2)) == (7.5, 0.35)
    scn = load_scenario(MEASURED.parent / "llama31-8b-4layers.toml")
    step_s = simulate_metrics(dataclasses.replace(scn, cost=dataclasses.replace(
        scn.cost, compute="calibrated", tables=str(MEASURED / "llama31-8b-4layers"))))["iteration_time_s"]
    assert (round(1e3 * step_s), round(100 * (step_s / 0.34738 - 1))) == (314, -10)

