"""Collective accuracy benchmark: predicted vs measured nccl-tests busbw for every published row.

Usage: python benchmarks/collectives.py [collectives.csv]
Each row runs through the engine (``run_collective``: plan -> FlowNetwork) at 8 GiB, nccl-tests'
usual largest size, with the row's algorithm. Then two shape checks: small-message ring latency
grows with the number of steps as NCCL's tuner says, and multi-node all-to-all busbw follows
N/(N-1) x the per-GPU NIC bandwidth (NVIDIA/nccl-tests#130) times the all-to-all efficiency.
"""

from __future__ import annotations

import csv
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from simulator.cost import nccl_tuner  # noqa: E402
from simulator.explore.collective import run_collective  # noqa: E402
from simulator.hardware.clusters import CLUSTER_PRESETS  # noqa: E402
from simulator.hardware.topology import IB_EFFICIENCY  # noqa: E402
from simulator.units import GB, GiB  # noqa: E402

CANDIDATES = (ROOT / "simulator" / "data" / "collectives.csv",
              ROOT.parent / "shared" / "validation" / "collectives.csv")
LARGE_BYTES = 8 * GiB
TOLERANCE = 0.10  # the target: every large-message row within +-10%


def _cluster(system: str, num_gpus: int):
    preset = "dgx-h100" if "H100" in system else "dgx-a100-80gb"
    base = CLUSTER_PRESETS[preset]
    return base.with_nodes(max(1, num_gpus // base.gpus_per_node))


def accuracy(path: Path) -> int:
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    print(f"nccl-tests busbw, predicted vs measured ({path}), {LARGE_BYTES // GiB} GiB messages")
    print(f"{'system':44s} {'op':11s} {'alg':7s} {'measured':>9s} {'predicted':>9s} {'error':>7s}")
    worst, bad = 0.0, 0
    for row in rows:
        cluster = _cluster(row["system"], int(row["num_gpus"]))
        alg = row["algorithm"]
        got = run_collective(cluster, row["collective"], LARGE_BYTES, alg)
        measured = float(row["busbw_GBps"])
        err = got["busbw_GBps"] / measured - 1
        worst = max(worst, abs(err))
        bad += abs(err) > TOLERANCE
        flag = "" if abs(err) <= TOLERANCE else "  <-- outside +-10%"
        print(f"{row['system'][:44]:44s} {row['collective']:11s} {alg:7s} {measured:9.1f} "
              f"{got['busbw_GBps']:9.1f} {err:+7.1%}{flag}")
    print(f"rows: {len(rows)}, within +-10%: {len(rows) - bad}, worst |error|: {worst:.1%}")
    return bad


def latency_shape() -> None:
    """8-byte ring all-reduce inside one node: time = base + 2(n-1) x per-step latency."""
    print("\nsmall-message ring all_reduce (8 B, LL) inside one DGX A100: latency vs steps")
    base = nccl_tuner.base_latency_s("ring", "ll")
    step = nccl_tuner.step_latency_s("ring", "ll", "nvlink")
    for gpus in (2, 4, 8):
        c = replace(CLUSTER_PRESETS["dgx-a100-80gb"], gpus_per_node=gpus, nics_per_node=gpus)
        got = run_collective(c, "all_reduce", 8, "ring/ll")
        expect = base + 2 * (gpus - 1) * step
        print(f"  n={gpus}: {got['time_s'] * 1e6:6.2f} us  (NCCL tuner: {expect * 1e6:6.2f} us, "
              f"{2 * (gpus - 1)} steps)")


def all_to_all_shape() -> None:
    print("\nmulti-node all_to_all busbw vs N/(N-1) x per-GPU NIC bandwidth x a2a efficiency")
    for preset in ("dgx-a100-80gb", "dgx-h100"):
        base = CLUSTER_PRESETS[preset]
        nic = base.nic_bandwidth_Bps * base.nics_per_node / base.gpus_per_node * IB_EFFICIENCY
        for nodes in (2, 4, 8):
            got = run_collective(base.with_nodes(nodes), "all_to_all", GiB)
            n = nodes * base.gpus_per_node
            law = nodes / (nodes - 1) * nic * nccl_tuner.ALL_TO_ALL_EFFICIENCY * (n - 1) / n
            print(f"  {preset:14s} N={nodes}: busbw {got['busbw_GBps']:6.1f} GB/s, "
                  f"law {law / GB:6.1f} GB/s")


def main(argv: list[str]) -> int:
    path = Path(argv[1]) if len(argv) > 1 else next((p for p in CANDIDATES if p.exists()), None)
    if path is None:
        print(f"collectives.csv not found in {', '.join(map(str, CANDIDATES))}", file=sys.stderr)
        return 2
    accuracy(path)
    latency_shape()
    all_to_all_shape()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
