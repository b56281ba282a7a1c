"""Speed benchmark (issue: end-to-end spine): wall time, tasks simulated and peak RSS of one step.

GPT-3 175B on 1024 A100 (TP8 PP16 DP8, global batch 1536, micro-batch 1 -> 192 micro-batches per
pipeline); then the same pipeline with DP 32 and DP 128 (more replicas, same per-pipeline work).
Each case runs in a fresh process so peak RSS is its own. Targets: <= 5 s and < 1 GiB for DP8; wall
time within 1.5x when DP grows from 8 to 128.

    python benchmarks/speed.py [--schedule 1f1b] [--recompute full]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from simulator.scenario import scenario_from_dict
from simulator.pipeline import simulate
raw = json.loads(sys.argv[1])
scn = scenario_from_dict(raw, default_name="bench")
t1 = time.perf_counter()
res = simulate(scn)
t2 = time.perf_counter()
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"wall_s": t2 - t0, "simulate_s": t2 - t1, "tasks": len(res.graph),
                  "iteration_time_s": res.metrics["iteration_time_s"], "mfu": res.metrics["mfu"], "rss_bytes": rss}))
"""


def case(dp: int, schedule: str, recompute: str) -> dict:
    raw = {"model": {"preset": "gpt3-175b"},
           "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 16 * dp},
           "parallelism": {"tp": 8, "pp": 16, "dp": dp, "schedule": schedule, "recompute": recompute},
           "training": {"global_batch_size": 192 * dp, "micro_batch_size": 1}}
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(raw)], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--recompute", default="full")
    args = ap.parse_args()
    print(f"GPT-3 175B, TP8 PP16, {args.schedule}, recompute {args.recompute}, 192 micro-batches per pipeline")
    print(f"{'GPUs':>6} {'DP':>4} {'tasks':>9} {'wall s':>8} {'sim s':>7} {'RSS MiB':>8} {'step s':>8} {'MFU':>6}")
    rows = {}
    for dp in (8, 32, 128):
        r = case(dp, args.schedule, args.recompute)
        rows[dp] = r
        print(f"{128 * dp:>6} {dp:>4} {r['tasks']:>9} {r['wall_s']:>8.2f} {r['simulate_s']:>7.2f} "
              f"{r['rss_bytes'] / 2**20:>8.0f} {r['iteration_time_s']:>8.2f} {r['mfu']:>6.1%}")
    print(f"wall(DP128) / wall(DP8) = {rows[128]['wall_s'] / rows[8]['wall_s']:.2f} (target <= 1.5)")
    print(f"DP8: {rows[8]['wall_s']:.2f} s (target <= 5 s), {rows[8]['rss_bytes'] / 2**30:.2f} GiB RSS (target < 1 GiB)")


if __name__ == "__main__":
    main()
