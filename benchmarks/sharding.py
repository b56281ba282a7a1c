"""ZeRO-3 / FSDP benchmark: the bundled sharded-data-parallel rows (Narayanan et al. 2021 Table 2's
DeepSpeed ZeRO-3 runs, llm-foundry's FSDP runs) simulated, with what each rank sends per step.

For every row: the all-gathers and reduce-scatters one rank issues per step and the bytes it sends
(from the lowered task graph, ``strategy/zero_impl``), the measured and predicted step times, and the
per-GPU rate the measured time implies if the step were bound by those bytes. Targets (issue 15):
MAPE <= 15 %, every row within +-30 %, the 768- vs 1,536-GPU step ratio within 15 % of 1.0.

    python benchmarks/sharding.py [NAME_SUBSTRING ...]      # default: zero3 and llmfoundry rows
    python benchmarks/sharding.py --counts-only [NAME ...]  # the per-step traffic only (no simulation)
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.explore.validate import DEFAULT_CSVS, read_rows, row_to_raw, summary, validate_rows  # noqa: E402
from simulator.scenario import scenario_from_dict  # noqa: E402
from simulator.strategy.lower import lower  # noqa: E402

DEFAULT_PATTERNS = ("zero3", "llmfoundry")
RING_FACTOR = {"all_gather": 1.0, "reduce_scatter": 1.0, "all_reduce": 2.0}  # x (n-1)/n, nccl-tests


def traffic(row: dict) -> dict:
    """Per rank and step: data-parallel collectives by kind and the bytes the rank sends."""
    scn = scenario_from_dict(row_to_raw(row), default_name=row["name"])
    out = {"all_gather": 0, "reduce_scatter": 0, "all_reduce": 0, "bytes": 0.0}
    for t in lower(scn).graph.tasks:
        c = t.comm
        if c is None or c.axis != "dp" or c.op not in RING_FACTOR:
            continue
        n = len(c.group)
        out[c.op] += 1
        out["bytes"] += c.size_bytes * RING_FACTOR[c.op] * (n - 1) / n
    return out


def main(argv: list[str]) -> int:
    counts_only = "--counts-only" in argv
    patterns = [a for a in argv if not a.startswith("--")] or list(DEFAULT_PATTERNS)
    rows = [r for r in read_rows([DEFAULT_CSVS[2]]) if any(p in r["name"] for p in patterns)]
    results = {} if counts_only else {r["name"]: r for r in validate_rows(rows)}
    print("| run | sharding | all-gathers | reduce-scatters | sent per GPU | measured s | implied GB/s per GPU "
          "| predicted s | error | exposed DP s |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        tr, measured = traffic(row), float(row["iteration_time_s"])
        res = results.get(row["name"], {})
        pred = (f"{res['predicted_s']:.2f} | {100 * res['error']:+.1f}% | {res['breakdown']['comm_dp']:.2f}"
                if res.get("status") == "ok" else " | | ")
        print(f"| {row['name']} | {row['sharding']} | {tr['all_gather']} | {tr['reduce_scatter']} | "
              f"{tr['bytes'] / 1e9:.0f} GB | {measured:.2f} | {tr['bytes'] / measured / 1e9:.1f} | {pred} |")
    if results:
        s = summary(list(results.values()))
        if s["mape"] is not None:
            print(f"\nMAPE {s['mape']:.1%} (target <= 15%), max |error| {s['max_abs_error']:.1%} (target <= 30%) "
                  f"over {s['ok']} rows")
        pair = [results.get(f"narayanan-zero3-175b-{n}") for n in (768, 1536)]
        if all(p and p["status"] == "ok" for p in pair):
            print(f"175B step at 768 / 1,536 GPUs: {pair[0]['predicted_s'] / pair[1]['predicted_s']:.2f} "
                  f"(published 1.00, target within 0.15)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
