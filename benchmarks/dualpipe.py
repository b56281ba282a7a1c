"""DualPipe's overlapped forward-backward pairs on DeepSeek-V3 (issue 19): one step of the bundled
NVIDIA recipe scenario (1,024 H100, TP 2 PP 16 EP 64) under 1F1B and under DualPipeV (two chunks per
rank on the V map), with the busiest rank's exposed time per category. DualPipeV interleaves each
overlapped pair at its expert all-to-alls (``strategy/pair_overlap``), so the exposed EP time drops.
The recipe's layer split (3 / 4 x 14 / 2) balances 1F1B's end stages; the V map puts both ends
(embedding, head and the MTP module) on rank 0, so DualPipeV is also run on ``v_split``: rank 0 two
layers short of the others and the last rank one (2 / 4 x 14 / 3 for 61 layers on 16 ranks). The
README quotes the figures this prints.

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
CASES = (("1f1b", 1, False), ("dualpipe-v", 2, False), ("dualpipe-v", 2, True))


def v_split(num_layers: int, pp: int) -> list[int]:
    """Layers per rank for the V map: rank 0 (both model ends) two short of a full rank, the last rank
    one short, the layers left over taken from the middle ranks, one each from the last of them."""
    full = -(-(num_layers + 3) // pp)
    out = [full - 2] + [full] * (pp - 2) + [full - 1]
    for k in range(sum(out) - num_layers):
        out[pp - 2 - k] -= 1
    return out


def main(path: Path) -> None:
    print(f"{path.name}: busiest rank's exposed seconds per category")
    print(f"{'schedule':18s} {'step s':>8s} {'compute':>8s} {'EP':>7s} {'TP':>6s} {'PP':>6s} {'bubble':>7s} "
          f"{'peak GiB':>9s} {'wall s':>7s}")
    base = load_scenario(path)
    split = v_split(base.model.num_layers, base.parallel.pp)
    for schedule, v, rebalanced in CASES:
        overrides = [f"parallelism.schedule={schedule}", f"parallelism.virtual_stages={v}"]
        scn = load_scenario(path, overrides + ([f"parallelism.layers_per_stage={split}"] if rebalanced else []))
        t0 = time.perf_counter()
        m = simulate(scn).metrics
        b = m["busiest_rank"]["time_breakdown_s"]
        label = schedule + (f" {split[0]}/{split[1]}x{len(split) - 2}/{split[-1]}" if rebalanced else "")
        print(f"{label:18s} {m['iteration_time_s']:8.2f} {b['compute'] + b['recompute']:8.2f} {b['comm_ep']:7.2f} "
              f"{b['comm_tp']:6.2f} {b['comm_pp']:6.2f} {b['bubble']:7.2f} "
              f"{m['memory_bytes']['total'] / 2 ** 30:9.1f} {time.perf_counter() - t0:7.1f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
