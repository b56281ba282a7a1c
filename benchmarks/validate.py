"""Accuracy benchmark (issue 7): every bundled published run simulated, the predicted-vs-measured
table with the per-row breakdown, the MAPE and the largest error. Targets: MAPE <= 10 %, every row
within +-20 %.

    python benchmarks/validate.py [CSV ...]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.explore.validate import markdown_table, read_rows, summary, validate_rows  # noqa: E402

TARGET_MAPE = 0.10
TARGET_MAX = 0.20


def main(argv: list[str]) -> int:
    t0 = time.perf_counter()
    results = validate_rows(read_rows(argv))
    s = summary(results)
    print(markdown_table(results))
    if s["mape"] is None:
        print("no row simulated")
        return 1
    worst = max((r for r in results if r["status"] == "ok"), key=lambda r: abs(r["error"]))
    print(f"\nrows {s['rows']} ({s['failed']} failed), MAPE {s['mape']:.1%} (target <= {TARGET_MAPE:.0%}), "
          f"max |error| {s['max_abs_error']:.1%} on {worst['name']} (target <= {TARGET_MAX:.0%}), "
          f"{time.perf_counter() - t0:.1f} s")
    return 0 if s["mape"] <= TARGET_MAPE and s["max_abs_error"] <= TARGET_MAX and not s["failed"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
