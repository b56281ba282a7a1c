"""MoE simulation speed (issue 17): wall time of one step of DeepSeek-V3 671B on 1,024 H100 (TP2 PP16
EP64 ETP1 DP32, global batch 8192, seq 4096) and Mixtral 8x22B on 256 H100 (NeMo recipe plan: TP2
PP4 VP14 CP2 EP8 DP16, global batch 512), one core each. Targets: <= 10 s and <= 5 s.

Each case runs in a fresh process (its own peak RSS); the lowering (scenario -> task graph) and the
simulation are timed apart, so a slow case shows which part to profile (``--profile`` prints the
top functions of cProfile). ``--lower-only`` times the lowering alone.

    python benchmarks/moe_speed.py [--lower-only] [--profile] [--scale-batch F]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = (("deepseek-v3-1024xh100", 10.0), ("mixtral-8x22b-256xh100", 5.0))
CHILD = r"""
import cProfile, io, json, pstats, resource, sys, time
from simulator.scenario import load_scenario
from simulator.strategy.lower import lower
path, lower_only, profile, scale = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1", float(sys.argv[4])
scn = load_scenario(path)
if scale != 1.0:
    scn = load_scenario(path, [f"training.global_batch_size={int(scn.training.global_batch_size * scale)}"])
prof = cProfile.Profile() if profile else None
t0 = time.perf_counter()
if prof: prof.enable()
plan = lower(scn)
t1 = time.perf_counter()
out = {"lower_s": t1 - t0, "tasks": len(plan.graph.tasks), "microbatches": scn.num_microbatches}
if not lower_only:
    from simulator.pipeline import simulate
    res = simulate(scn)
    t2 = time.perf_counter()
    out.update(simulate_s=t2 - t1, iteration_time_s=res.metrics["iteration_time_s"],
               mfu=res.metrics["mfu"])
if prof:
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(15)
    out["profile"] = s.getvalue()
out["rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps(out))
"""


def run(name: str, lower_only: bool, profile: bool, scale: float) -> dict:
    path = ROOT / "scenarios" / "moe" / f"{name}.toml"
    p = subprocess.run([sys.executable, "-c", CHILD, str(path), str(int(lower_only)), str(int(profile)), str(scale)],
                       cwd=ROOT, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"{name}: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lower-only", action="store_true", help="time the lowering only")
    ap.add_argument("--profile", action="store_true", help="print cProfile's top functions")
    ap.add_argument("--scale-batch", type=float, default=1.0, help="global batch x F (fewer micro-batches)")
    args = ap.parse_args()
    # simulate() lowers again itself: its time is the user's wall time for one step
    print("| scenario | micro-batches | tasks | lower s | simulate() s | target s | iteration s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, target in CASES:
        r = run(name, args.lower_only, args.profile, args.scale_batch)
        sim = f"{r['simulate_s']:.2f}" if "simulate_s" in r else "-"
        it = f"{r['iteration_time_s']:.2f}" if "iteration_time_s" in r else "-"
        print(f"| {name} | {r['microbatches']} | {r['tasks']} | {r['lower_s']:.2f} | {sim} | {target:g} | {it} |",
              flush=True)
        if args.profile:
            print(r["profile"])


if __name__ == "__main__":
    main()
