"""DualPipe's overlapped forward-backward pairs on DeepSeek-V3 (issue 19): one step of the bundled
NVIDIA recipe scenario (1,024 H100, TP 2 PP 16 EP 64) under 1F1B and under DualPipeV (two chunks per
rank on the V map), with the busiest rank's exposed time per category. DualPipeV interleaves each
overlapped pair at its expert all-to-alls (``strategy/pair_overlap``), so the exposed EP time drops.
The README quotes the figures this prints.

    python benchmarks/dualpipe.py [SCENARIO]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.pipeline import simulate  # noqa: E402
from simulator.scenario import load_scenario  # noqa: E402

DEFAULT = ROOT / "scenarios" / "moe" / "deepseek-v3-1024xh100.toml"
CASES = (("1f1b", 1), ("dualpipe-v", 2))


def main(path: Path) -> None:
    print(f"{path.name}: busiest rank's exposed seconds per category")
    print(f"{'schedule':12s} {'step s':>8s} {'compute':>8s} {'EP':>7s} {'TP':>6s} {'PP':>6s} {'bubble':>7s} "
          f"{'peak GiB':>9s} {'wall s':>7s}")
    for schedule, v in CASES:
        scn = load_scenario(path, [f"parallelism.schedule={schedule}", f"parallelism.virtual_stages={v}"])
        t0 = time.perf_counter()
        m = simulate(scn).metrics
        b = m["busiest_rank"]["time_breakdown_s"]
        print(f"{schedule:12s} {m['iteration_time_s']:8.2f} {b['compute'] + b['recompute']:8.2f} {b['comm_ep']:7.2f} "
              f"{b['comm_tp']:6.2f} {b['comm_pp']:6.2f} {b['bubble']:7.2f} "
              f"{m['memory_bytes']['total'] / 2 ** 30:9.1f} {time.perf_counter() - t0:7.1f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
