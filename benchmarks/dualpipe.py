"""DualPipe's overlapped forward-backward pairs on DeepSeek-V3 (issue 19): one step of the bundled
NVIDIA recipe scenario (1,024 H100, TP 2 PP 16 EP 64) under 1F1B and under DualPipeV (two chunks per
rank on the V map), with the busiest rank's exposed time per category. DualPipeV interleaves each
overlapped pair at its expert all-to-alls (``strategy/pair_overlap``), so the exposed EP time drops.
The recipe's layer split (3 / 4 x 14 / 2) balances 1F1B's end stages; the V map puts both ends
(embedding, head and the MTP module) on rank 0, so DualPipeV is also run with rank 0 two layers short
and the last rank one (2 / 4 x 14 / 3). The README quotes the figures this prints.

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
V_SPLIT = "[" + ", ".join(["2"] + ["4"] * 14 + ["3"]) + "]"
CASES = (("1f1b", 1, ""), ("dualpipe-v", 2, ""), ("dualpipe-v", 2, V_SPLIT))


def main(path: Path) -> None:
    print(f"{path.name}: busiest rank's exposed seconds per category")
    print(f"{'schedule':18s} {'step s':>8s} {'compute':>8s} {'EP':>7s} {'TP':>6s} {'PP':>6s} {'bubble':>7s} "
          f"{'peak GiB':>9s} {'wall s':>7s}")
    for schedule, v, split in CASES:
        overrides = [f"parallelism.schedule={schedule}", f"parallelism.virtual_stages={v}"]
        scn = load_scenario(path, overrides + ([f"parallelism.layers_per_stage={split}"] if split else []))
        t0 = time.perf_counter()
        m = simulate(scn).metrics
        b = m["busiest_rank"]["time_breakdown_s"]
        label = schedule + (" 2/4x14/3" if split else "")
        print(f"{label:18s} {m['iteration_time_s']:8.2f} {b['compute'] + b['recompute']:8.2f} {b['comm_ep']:7.2f} "
              f"{b['comm_tp']:6.2f} {b['comm_pp']:6.2f} {b['bubble']:7.2f} "
              f"{m['memory_bytes']['total'] / 2 ** 30:9.1f} {time.perf_counter() - t0:7.1f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
