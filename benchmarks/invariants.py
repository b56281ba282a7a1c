"""Drawn scenarios over many features at once, against the invariants every accepted scenario must keep:
it simulates (no exception: a scenario the rules accept is one the simulator runs), its iteration time
is positive and finite, the time breakdown sums to it (the accounting identity), 0 < MFU <= HFU, the
search's time lower bound does not exceed the simulated step, and the static memory estimate equals the
simulated peak (the search prunes with both).

    python benchmarks/invariants.py [--draws 300] [--seed 1]

Draws: model presets (dense, GQA, MoE, MLA, gpt-oss, Llama 4) cut to a few layers per stage, one to
eight nodes of A100, H100, H200, B200 or Grand Teton hosts, TP/CP/PP/DP/EP, ZeRO 0-3 with every
sharding implementation, every pipeline schedule, every CP algorithm, recompute, TP overlap, optimizer
offload, FP8 recipes and parameters, eager kernels, torch's loss, the attention kernels and modules, CUDA graphs,
gradient dtypes and deferred output-layer weight gradients. Draws the scenario rules refuse are drawn
again. Prints one line per violation
and a summary; exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import random
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/, however this script is loaded

from fast_vs_full import draw_features  # noqa: E402
from simulator.explore.estimate import estimate  # noqa: E402
from simulator.pipeline import simulate_metrics  # noqa: E402
from simulator.scenario import scenario_from_dict  # noqa: E402
from simulator.scenario_checks import ScenarioError  # noqa: E402

PRESETS = ("llama3-8b", "llama3-70b", "mixtral-8x7b", "deepseek-v3", "qwen3-235b-a22b", "gpt-oss-120b",
           "nemotron4-15b", "gpt3-13b", "llama4-scout", "grok-1", "gpt3-1.3b")
CLUSTERS = ("dgx-h100", "dgx-a100-80gb", "dgx-b200", "grand-teton-h100", "dgx-h200")
SCHEDULES = ("1f1b", "interleaved-1f1b", "zero-bubble", "gpipe", "zb-v", "dualpipe-v", "zb-h2", "dualpipe")
UB_TABLES = ("te1-default", "torch-async-tp", "userbuffers_fp8_h100_h16384_tp8_cp2_mbs1_seqlen8192",
             "ub_cfg_h100_h12288_tp4_mbs1_seqlen2048", "userbuffers_bf16_b200_h18432_tp8_mbs1_seqlen4096")


def draw(rng: random.Random) -> dict | None:
    """One scenario dict, or None when its degrees do not divide the cluster."""
    nodes = rng.choice([1, 2, 4, 8])
    tp, cp, pp = rng.choice([1, 2, 4, 8]), rng.choice([1, 1, 2, 4]), rng.choice([1, 1, 2, 4])
    if 8 * nodes % (tp * cp * pp):
        return None
    model = {"preset": rng.choice(PRESETS), "num_layers": rng.choice([2, 4, 8]) * pp,
             "seq_length": rng.choice([1024, 2048, 4096, 8192])}
    par: dict = {"tp": tp, "cp": cp, "pp": pp, "dp": 8 * nodes // (tp * cp * pp),
                 "zero_stage": rng.choice([0, 1, 2, 3] if pp == 1 else [0, 1]),
                 "recompute": rng.choice(["none", "full", "selective"])}
    if rng.random() < 0.5:
        par["ep"] = rng.choice([1, 2, 4, 8])
    par["sequence_parallel"] = tp > 1 and rng.random() < 0.8
    draw_features(rng, par, 0.7, SCHEDULES)
    if par.get("tp_comm_overlap") and rng.random() < 0.6:  # a userbuffers table other than TE 2.x's defaults
        par["tp_comm_overlap_cfg"] = rng.choice(UB_TABLES)
    if pp > 1 and rng.random() < 0.3:  # Megatron-Core's deferred head wgrads (refused where they do not exist)
        par["defer_embedding_wgrad_compute"], par["wgrad_deferral_limit"] = True, rng.choice([0, 1, 3])
    if rng.random() < 0.15:
        par["offload_optimizer"] = True
    mb = rng.choice([1, 2, 4])
    tr: dict = {"micro_batch_size": mb, "global_batch_size": par["dp"] * mb * rng.choice([1, 2, 4, 8])}
    if rng.random() < 0.3:
        tr["dtype"], tr["fp8_recipe"] = "fp8", rng.choice(["delayed", "current", "blockwise", "mxfp8"])
        if rng.random() < 0.3:
            tr["fp8_params"] = True
    if rng.random() < 0.2:  # Apex's master copies as NeMo 1 sets them (refused under fp8_params)
        tr["master_weights"] = rng.choice(["remainders", "parameter"])
        if tr["master_weights"] == "parameter":
            tr["optimizer_state_dtype"] = "bf16"
    for key, p, values in (("kernels", 0.2, ["eager"]), ("cross_entropy", 0.2, ["torch"]),
                           ("attention", 0.2, ["flash", "cudnn", "flash-varlen", "unfused"]),
                           ("cuda_graphs", 0.15, [True]), ("grad_dtype", 0.2, ["fp32", "bf16"]),
                           ("attention_module", 0.3, ["sdpa"])):
        if rng.random() < p:
            tr[key] = rng.choice(values)
    return {"model": model, "cluster": {"preset": rng.choice(CLUSTERS), "num_nodes": nodes},
            "parallelism": par, "training": tr}


def violations(raw: dict) -> list[str]:
    """What an accepted scenario breaks (empty: none); a refused one breaks nothing."""
    try:
        scn = scenario_from_dict(raw, default_name="drawn")
    except (ScenarioError, ValueError):
        return []
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            m = simulate_metrics(scn)
        est = estimate(scn)
    except Exception:  # noqa: BLE001 - any exception of an accepted scenario is the finding
        return ["raised " + traceback.format_exc().strip().splitlines()[-1]]
    t, out = m["iteration_time_s"], []
    if not (t > 0 and math.isfinite(t)):
        out.append(f"iteration time {t}")
    if abs(sum(m["time_breakdown_s"].values()) / t - 1) > 1e-6:
        out.append(f"breakdown sums to {sum(m['time_breakdown_s'].values())}, step {t}")
    if not 0 < m["mfu"] <= m["hfu"] + 1e-12:
        out.append(f"mfu {m['mfu']} hfu {m['hfu']}")
    if est.time_lower_bound_s > t * (1 + 1e-6):
        out.append(f"lower bound {est.time_lower_bound_s} above the step {t}")
    if abs(est.total_bytes / m["memory_bytes"]["total"] - 1) > 1e-6:
        out.append(f"memory estimate {est.total_bytes:.6g} against the simulated {m['memory_bytes']['total']:.6g}")
    return out


def accepted_draws(seed: int, n: int) -> list[dict]:
    """The first ``n`` draws from ``seed`` that the scenario rules accept."""
    rng, out = random.Random(seed), []
    while len(out) < n:
        raw = draw(rng)
        if raw is None:
            continue
        try:
            scenario_from_dict(raw, default_name="drawn")
        except (ScenarioError, ValueError):
            continue
        out.append(raw)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    bad = 0
    for raw in accepted_draws(args.seed, args.draws):
        found = violations(raw)
        bad += bool(found)
        for v in found:
            print(f"VIOLATION {v}: {raw}")
    print(f"{args.draws} accepted drawn scenarios (seed {args.seed}): {bad} with a violated invariant")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
