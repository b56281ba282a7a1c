"""Accuracy benchmark: every bundled published run simulated, the predicted-vs-measured table with the
per-row breakdown, MAPE, largest and signed mean error, overall, per source and over the shared rows
(``training_runs.csv`` + ``training_runs_2.csv``), and the runs the memory model would refuse (every one of
them ran). Targets (H100 fidelity issue, shared rows): MAPE
<= 10 %, every row within +-25 %, signed mean error within +-5 % (no systematic optimism); ZeRO-3/FSDP
issue, over the Narayanan 2021 Table 2 ZeRO-3 rows and the llm-foundry rows: MAPE <= 15 %, every row
within +-30 %.

    python benchmarks/validate.py [CSV ...]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.explore.validate import (DEFAULT_CSVS, markdown_table, read_rows, summary,  # noqa: E402
                                        validate_rows)

TARGET_MAPE = 0.10
TARGET_MAX = 0.25
TARGET_MEAN = 0.05
SHARDED_MAPE, SHARDED_MAX = 0.15, 0.30  # the ZeRO-3/FSDP issue's targets


def _line(label: str, s: dict) -> str:
    if s["mape"] is None:
        return f"{label}: no row simulated ({s['failed']} failed)"
    return (f"{label}: {s['ok']} rows ({s['failed']} failed), MAPE {s['mape']:.1%} (target <= {TARGET_MAPE:.0%}), "
            f"max |error| {s['max_abs_error']:.1%} (target <= {TARGET_MAX:.0%}), mean error {s['mean_error']:+.1%} "
            f"(target within +-{TARGET_MEAN:.0%})")


def memory_line(rows: list[dict]) -> str:
    """Predicted peak memory per GPU against the published peaks of the rows that give one."""
    if not rows:
        return "published peak memory: no row gives one"
    errs = [r["memory_total_bytes"] / r["measured_memory_bytes"] - 1 for r in rows]
    worst = max(zip(errs, rows), key=lambda e: abs(e[0]))
    near = sum(abs(e) <= 0.10 for e in errs)
    return (f"published peak memory ({len(rows)} rows): predicted within {min(errs):+.1%}..{max(errs):+.1%}, "
            f"{near} of {len(rows)} within +-10%, mean |error| {sum(map(abs, errs)) / len(errs):.1%}; "
            f"worst {worst[1]['name']} "
            f"({worst[1]['memory_total_bytes'] / 2**30:.1f} vs {worst[1]['measured_memory_bytes'] / 2**30:.1f} GiB)")


def main(argv: list[str]) -> int:
    t0 = time.perf_counter()
    rows = read_rows(argv)
    results = validate_rows(rows)
    print(markdown_table(results))
    shared_names = {r["name"] for r in read_rows([DEFAULT_CSVS[0], DEFAULT_CSVS[2]])}
    shared = summary([r for r in results if r["name"] in shared_names])
    print()
    print(_line("all rows", summary(results)))
    print(_line("shared rows", shared))
    sharded = summary([r for r in results if r["name"].startswith(("narayanan-zero3-", "llmfoundry-"))])
    if sharded["mape"] is not None:
        print(f"ZeRO-3 and llm-foundry rows: {sharded['ok']}, MAPE {sharded['mape']:.1%} (target <= "
              f"{SHARDED_MAPE:.0%}), max |error| {sharded['max_abs_error']:.1%} (target <= {SHARDED_MAX:.0%})")
    ok_rows = [r for r in results if r["status"] == "ok"]
    refused = [f"{r['name']} ({r['memory_total_bytes'] / 2**30:.1f} GiB)" for r in ok_rows if not r["fits_in_memory"]]
    print(f"memory: {len(ok_rows) - len(refused)} of {len(ok_rows)} published runs (all of which ran) predicted to fit; "
          f"predicted out of memory: {', '.join(refused) or 'none'}")
    print(memory_line([r for r in ok_rows if r.get("measured_memory_bytes")]))
    print(f"{time.perf_counter() - t0:.1f} s")
    ok = shared["mape"] is not None and shared["mape"] <= TARGET_MAPE and shared["max_abs_error"] <= TARGET_MAX \
        and abs(shared["mean_error"]) <= TARGET_MEAN and not shared["failed"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
