"""Plan-search benchmark (issues 9 and 20): the full search for GPT-3 175B on 1024 A100 (128 DGX A100
80GB), global batch 1536: wall time, plans enumerated / rejected / pruned / simulated, plans simulated
per second, the top plans and the best plan per TP degree. Targets: <= 5 minutes on 2 cores; the best
plans keep TP inside a node (<= 8), and the output shows why larger TP loses (exposed TP communication).

``--simulate N`` measures throughput instead (issue 20: >= 500 plans fully simulated in <= 5 min on 2
cores): no pruning by the time bound, the N lowest-bound plans that fit are simulated.

    python benchmarks/search.py [--jobs 2] [--top 10] [--out results/bench-search] [--simulate 500]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.explore.search import explain_tp, format_per_tp, format_ranked, run_search  # noqa: E402
from simulator.explore.sweep import BaseScenario  # noqa: E402

TARGET_S = 300.0
RAW = {"name": "gpt3-175b-1024xA100", "model": {"preset": "gpt3-175b"},
       "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 128}, "training": {"global_batch_size": 1536}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--out", default=str(ROOT / "results" / "bench-search"))
    ap.add_argument("--simulate", type=int, default=0, metavar="N",
                    help="throughput mode: simulate the N lowest-bound plans, no bound pruning")
    args = ap.parse_args()
    base = BaseScenario(RAW, RAW["name"], ROOT, "benchmarks/search.py")
    if args.simulate:
        return throughput(base, args)
    res = run_search(base, Path(args.out) / "search.csv", top=args.top, jobs=args.jobs)
    c = res.counts
    print(f"GPT-3 175B, 1024 x A100 80GB, global batch 1536, {args.jobs} worker processes")
    print(f"plans enumerated {c['enumerated']}: invalid {c['invalid']}, do not fit {c['pruned_memory']}, "
          f"dominated {c['dominated']}, pruned by the time bound {c['pruned_bound']}, simulated {c['simulated']}")
    print(f"wall time {res.wall_s:.1f} s (target <= {TARGET_S:.0f} s): estimates {res.estimate_s:.1f} s, "
          f"simulations {res.wall_s - res.estimate_s:.1f} s, {res.plans_per_s:.2f} plans simulated/s")
    print(format_ranked(res.ranked[:args.top]))
    print(format_per_tp(res.per_tp))
    for line in explain_tp(res, 8):
        print(line)
    best_tp = res.ranked[0]["tp"] if res.ranked else None
    ok = res.wall_s <= TARGET_S and best_tp is not None and all(r["tp"] <= 8 for r in res.ranked[:args.top])
    print(f"targets: time {'met' if res.wall_s <= TARGET_S else 'MISSED'}; best plans keep TP <= 8: "
          f"{'yes' if best_tp is not None and all(r['tp'] <= 8 for r in res.ranked[:args.top]) else 'NO'}")
    return 0 if ok else 1


def throughput(base: BaseScenario, args) -> int:
    res = run_search(base, Path(args.out) / "search.csv", top=args.top, jobs=args.jobs, bound=False,
                     per_tp=False, limit=args.simulate)
    c = res.counts
    sim_s = res.wall_s - res.estimate_s
    print(f"GPT-3 175B, 1024 x A100 80GB, global batch 1536, {args.jobs} worker processes, no bound pruning")
    print(f"plans simulated {c['simulated']} ({c['cache_hits']} cache hits, {c['failed']} failed) of "
          f"{c['simulated'] + c['cache_hits'] + c['skipped_limit']} that fit; estimates {res.estimate_s:.1f} s, "
          f"simulations {sim_s:.1f} s: {res.plans_per_s:.2f} plans simulated/s")
    at_rate = res.estimate_s + 500 / max(res.plans_per_s, 1e-9)
    print(f"500 plans at this rate: {at_rate:.0f} s (target <= {TARGET_S:.0f} s): "
          f"{'met' if c['simulated'] >= 500 and res.wall_s <= TARGET_S or at_rate <= TARGET_S else 'MISSED'}")
    print(format_ranked(res.ranked[:args.top]))
    return 0 if at_rate <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
