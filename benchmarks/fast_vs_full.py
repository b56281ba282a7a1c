"""Fast (one representative rank per pipeline stage) against full (every rank) simulation, issue 16.

The fast mode simulates one rank per stage but charges the network for the flows of every concurrent
sibling group (``cost/siblings``); these cases span fat-tree and rail-optimized clusters of 8-64
nodes with several leaves, oversubscription 1-4 and TP/PP/DP/CP/EP mixes. Each row prints both
iteration times, their difference and the wall time of each mode. Target: |fast/full - 1| <= 2%.
``--random N`` draws N plans instead (seeded: 2-16 A100/H100 nodes, fat-tree or rail, oversubscription
1-4, 4 or 8 NICs, TP/CP/PP/DP/EP, every CP algorithm, ZeRO and sharding, schedules, recompute, TP
overlap) and prints how many fell back to the full simulation (one-line notice) and the worst gap.

    python benchmarks/fast_vs_full.py [--case NAME ...] [--json]
    python benchmarks/fast_vs_full.py --random 200 [--seed 1]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulator.cost.siblings import shared_binding_links  # noqa: E402
from simulator.hardware.topology import build_topology  # noqa: E402
from simulator.pipeline import simulate  # noqa: E402
from simulator.scenario import scenario_from_dict  # noqa: E402
from simulator.scenario_checks import ScenarioError  # noqa: E402

# A small GPT (4 layers, hidden 1024) keeps the full mode of 512 GPUs to seconds; the gradient and
# activation sizes still put the DP, PP and CP transfers in NCCL's bandwidth-bound range.
SMALL_GPT = {"num_layers": 4, "hidden_size": 1024, "num_attention_heads": 16, "vocab_size": 32000,
             "seq_length": 2048}
SMALL_MOE = dict(SMALL_GPT, num_experts=8, moe_top_k=2)

# name -> (cluster, parallelism, global batch, model); micro-batch 1 everywhere.
CASES = {
    "fat8-tp2pp2dp16": ({"preset": "dgx-a100-80gb", "num_nodes": 8, "topology": "fat-tree"},
                        {"tp": 2, "pp": 2, "dp": 16}, 64, SMALL_GPT),
    "fat8-os4-tp2pp2dp16": ({"preset": "dgx-a100-80gb", "num_nodes": 8, "topology": "fat-tree",
                             "oversubscription": 4}, {"tp": 2, "pp": 2, "dp": 16}, 64, SMALL_GPT),
    "rail40-tp2pp4dp40": ({"preset": "dgx-a100-80gb", "num_nodes": 40}, {"tp": 2, "pp": 4, "dp": 40},
                          160, SMALL_GPT),
    "fat64-h100-dp64": ({"preset": "dgx-h100", "num_nodes": 64, "topology": "fat-tree"},
                        {"tp": 8, "pp": 1, "dp": 64}, 64, SMALL_GPT),
    "rail64-h100-os2-tp4pp2dp64": ({"preset": "dgx-h100", "num_nodes": 64, "oversubscription": 2},
                                   {"tp": 4, "pp": 2, "dp": 64}, 128, SMALL_GPT),
    "fat16-os2-tp2cp2pp2dp16": ({"preset": "dgx-a100-80gb", "num_nodes": 16, "topology": "fat-tree",
                                 "oversubscription": 2}, {"tp": 2, "cp": 2, "pp": 2, "dp": 16}, 32, SMALL_GPT),
    "rail16-os3-moe-tp2ep4pp2dp32": ({"preset": "dgx-h100", "num_nodes": 16, "oversubscription": 3},
                                     {"tp": 2, "ep": 4, "pp": 2, "dp": 32}, 64, SMALL_MOE),
    "fat8-os4-tp2pp2dp16-zero3-sp": ({"preset": "dgx-a100-80gb", "num_nodes": 8, "topology": "fat-tree",
                                      "oversubscription": 4},
                                     {"tp": 2, "pp": 2, "dp": 16, "zero_stage": 3, "sequence_parallel": True},
                                     32, SMALL_GPT),
    "fat8-os4-tp2pp2dp16-interleaved-zero1": ({"preset": "dgx-a100-80gb", "num_nodes": 8, "topology": "fat-tree",
                                               "oversubscription": 4},
                                              {"tp": 2, "pp": 2, "dp": 16, "schedule": "interleaved-1f1b",
                                               "virtual_stages": 2, "zero_stage": 1}, 64, SMALL_GPT),
    "rail24-os3-nic4-tp1pp2dp96": ({"preset": "dgx-a100-80gb", "num_nodes": 24, "nics_per_node": 4,
                                    "oversubscription": 3}, {"tp": 1, "pp": 2, "dp": 96}, 96, SMALL_GPT),
    "fat32-h100-os4-moe-tp2cp2ep8pp2dp32": ({"preset": "dgx-h100", "num_nodes": 32, "topology": "fat-tree",
                                            "oversubscription": 4},
                                           {"tp": 2, "cp": 2, "ep": 8, "pp": 2, "dp": 32}, 64, SMALL_MOE),
    # CP groups across nodes: each ring mixes NVLink and NIC hops (every CP algorithm; 32 heads for a2a)
    "rail2-h100-tp2cp8-ring-8k": ({"preset": "dgx-h100", "num_nodes": 2},
                                  {"tp": 2, "cp": 8, "dp": 1, "sequence_parallel": True}, 8,
                                  dict(SMALL_GPT, seq_length=8192)),
    "rail4-h100-tp4cp8-torch-allgather-8k": ({"preset": "dgx-h100", "num_nodes": 4},
                                             {"tp": 4, "cp": 8, "dp": 1, "sequence_parallel": True,
                                              "cp_algorithm": "torch-allgather"}, 8,
                                             dict(SMALL_GPT, seq_length=8192)),
    "fat4-h100-os2-tp2cp8dp2-a2a-8k": ({"preset": "dgx-h100", "num_nodes": 4, "topology": "fat-tree",
                                        "oversubscription": 2},
                                       {"tp": 2, "cp": 8, "dp": 2, "sequence_parallel": True, "cp_algorithm": "a2a"},
                                       8, dict(SMALL_GPT, seq_length=8192)),
}


TARGET = 0.02  # issue 16: fast mode within 2% of the full simulation, or a fallback to it


def scenario(name: str):
    cluster, par, batch, model = CASES[name]
    return scenario_from_dict({"model": dict(model), "cluster": dict(cluster), "parallelism": dict(par),
                               "training": {"global_batch_size": batch, "micro_batch_size": 1}},
                              default_name=name)


def compare(name: str) -> dict:
    scn = scenario(name)
    shared = shared_binding_links(build_topology(scn.cluster))
    t0 = time.perf_counter()
    fast = simulate(scn).metrics["iteration_time_s"]
    t1 = time.perf_counter()
    full = simulate(scn, full=True).metrics["iteration_time_s"]
    t2 = time.perf_counter()
    return {"case": name, "gpus": scn.num_gpus, "fast_s": fast, "full_s": full, "diff": fast / full - 1,
            "fast_wall_s": t1 - t0, "full_wall_s": t2 - t1, "siblings": shared or "not needed"}


def draw_features(rng: random.Random, par: dict, schedule_p: float, schedules: tuple[str, ...]) -> None:
    """Draw into ``par`` (degrees, ZeRO stage and sequence parallelism set) the CP algorithm, the ZeRO-3
    implementation, TP overlap and, with probability ``schedule_p`` under a pipeline, a schedule of
    ``schedules`` (interleaved with two virtual stages); also used by benchmarks/invariants.py."""
    if par["cp"] > 1:
        par["cp_algorithm"] = rng.choice(["ring", "all-gather", "torch-allgather", "a2a"])
    if par["zero_stage"] == 3 and rng.random() < 0.6:
        par["sharding"] = rng.choice(["fsdp1", "fsdp2", "deepspeed"])
    if par["sequence_parallel"] and rng.random() < 0.4:
        par["tp_comm_overlap"] = True
    if par["pp"] > 1 and rng.random() < schedule_p:
        par["schedule"] = rng.choice(schedules)
        if par["schedule"] == "interleaved-1f1b":
            par["virtual_stages"] = 2


def random_plan(rng: random.Random) -> dict | None:
    """One drawn plan as a scenario dict (None when the draw does not divide the cluster)."""
    nodes = rng.choice([2, 4, 8, 16])
    cluster: dict = {"preset": rng.choice(["dgx-h100", "dgx-a100-80gb"]), "num_nodes": nodes}
    if rng.random() < 0.4:
        cluster["topology"] = "fat-tree"
    if rng.random() < 0.4:
        cluster["oversubscription"] = rng.choice([2, 3, 4])
    if rng.random() < 0.25:
        cluster["nics_per_node"] = 4
    tp, cp, pp = rng.choice([1, 2, 4, 8]), rng.choice([1, 1, 2, 4, 8]), rng.choice([1, 2, 4])
    if nodes * 8 % (tp * cp * pp):
        return None
    dp = nodes * 8 // (tp * cp * pp)
    model = dict(SMALL_GPT, num_layers=4 * pp, num_kv_heads=rng.choice([16, 8]), mlp="swiglu",
                 seq_length=rng.choice([2048, 8192]))
    par: dict = {"tp": tp, "cp": cp, "pp": pp, "dp": dp, "zero_stage": rng.choice([0, 1, 3] if pp == 1 else [0, 1]),
                 "recompute": rng.choice(["none", "full", "selective"])}
    if rng.random() < 0.3:
        model.update(num_experts=8, moe_top_k=2)
        par["ep"] = rng.choice([e for e in (1, 2, 4, 8) if dp * cp * tp % e == 0])
    par["sequence_parallel"] = tp > 1 and ("ep" in par or rng.random() < 0.7)
    draw_features(rng, par, 0.6, ("interleaved-1f1b", "zero-bubble", "gpipe", "zb-v", "dualpipe-v", "zb-h2"))
    mb = rng.choice([1, 2])
    batch = dp * mb * rng.choice([1, 2, 4]) * pp
    return {"model": model, "cluster": cluster, "parallelism": par,
            "training": {"global_batch_size": batch, "micro_batch_size": mb}}


def random_scenarios(seed: int, n: int) -> list:
    """The first ``n`` valid scenarios ``random_plan`` draws from ``seed`` (the scenario rules decide)."""
    rng, out = random.Random(seed), []
    while len(out) < n:
        raw = random_plan(rng)
        try:
            if raw:
                out.append(scenario_from_dict(raw, default_name=f"random{len(out)}"))
        except (ScenarioError, ValueError):
            continue
    return out


def random_scan(n: int, seed: int) -> int:
    rows, fell_back, shared = [], 0, 0
    for scn in random_scenarios(seed, n):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            fast = simulate(scn).metrics["iteration_time_s"]
        full = simulate(scn, full=True).metrics["iteration_time_s"]
        fell_back += "notice: simulating every rank" in err.getvalue()
        shared += bool(shared_binding_links(build_topology(scn.cluster)))
        rows.append((fast / full - 1, scn))
    worst, scn = max(rows, key=lambda r: abs(r[0]))
    p = scn.parallel
    print(f"{n} random plans (seed {seed}), {shared} on fabrics with shared links that can bind: {fell_back} fell "
          f"back to full; {sum(abs(d) > TARGET for d, _ in rows)} beyond 2%; worst |fast/full - 1| = {abs(worst):.2%} "
          f"(tp {p.tp} cp {p.cp} pp {p.pp} dp {p.dp} ep {p.ep} {p.cp_algorithm if p.cp > 1 else ''} "
          f"{p.schedule} on {scn.cluster.num_nodes} nodes, {shared_binding_links(build_topology(scn.cluster))})")
    return 1 if any(abs(d) > TARGET for d, _ in rows) else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", action="append", choices=sorted(CASES))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--random", type=int, default=0, help="draw this many plans instead of the named cases")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if args.random:
        return random_scan(args.random, args.seed)
    rows = [compare(n) for n in (args.case or CASES)]
    if args.json:
        print(json.dumps(rows))
        return 0 if all(abs(r["diff"]) <= TARGET for r in rows) else 1
    print(f"{'case':<40} {'GPUs':>5} {'fast s':>9} {'full s':>9} {'diff':>9} {'fast wall':>9} {'full wall':>9}"
          "  shared links that can bind")
    for r in rows:
        print(f"{r['case']:<40} {r['gpus']:>5} {r['fast_s']:>9.5f} {r['full_s']:>9.5f} {r['diff']:>+9.4%} "
              f"{r['fast_wall_s']:>8.2f}s {r['full_wall_s']:>8.2f}s  {r['siblings']}")
    worst = max(abs(r["diff"]) for r in rows)
    print(f"worst |fast/full - 1| = {worst:.2%} (target <= 2%)")
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
