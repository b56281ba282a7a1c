"""Weak-scaling pairs of the bundled published runs: one recipe (the same row name but for its GPU count,
the same global batch per GPU) measured at two GPU counts, the smallest and the largest. For each pair
it prints the measured step
ratio (larger count over smaller) and the simulated one, with the slowest-GPU rule
(``cost/clocks.slowest_speed_ratio``) and without it (``speed_spread_frac = 0``): how much of the
measured slowdown at scale the rule and the rest of the model account for.

    python benchmarks/weak_scaling.py [CSV ...]
"""

from __future__ import annotations

import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.explore.validate import read_rows, row_to_raw  # noqa: E402
from simulator.pipeline import simulate_metrics  # noqa: E402
from simulator.scenario import scenario_from_dict  # noqa: E402


def pairs(rows: list[dict]) -> list[tuple[tuple[int, dict], tuple[int, dict]]]:
    """((GPUs, row) smallest, (GPUs, row) largest) of each recipe published at more than one GPU count
    with the same work per GPU (global batch over GPUs)."""
    groups: dict[tuple[str, float], list[tuple[int, dict]]] = {}
    for row in rows:
        scn = scenario_from_dict(row_to_raw(row), default_name=row["name"])
        key = (re.sub(r"\d+gpu", "", row["name"]), scn.training.global_batch_size / scn.num_gpus)
        groups.setdefault(key, []).append((scn.num_gpus, row))
    out = []
    for members in groups.values():
        members.sort(key=lambda m: m[0])
        if len(members) > 1 and members[0][0] < members[-1][0]:
            out.append((members[0], members[-1]))
    return out


def step_s(job: tuple[dict, bool]) -> float:
    """One row's simulated step, with the GPUs' speed spread or with every unit alike."""
    row, spread = job
    scn = scenario_from_dict(row_to_raw(row), default_name=row["name"])
    if not spread:
        scn = replace(scn, cluster=replace(scn.cluster, gpu=replace(scn.cluster.gpu, speed_spread_frac=0.0)))
    return simulate_metrics(scn)["iteration_time_s"]


def main(argv: list[str]) -> int:
    t0 = time.perf_counter()
    found = pairs(read_rows(argv))
    jobs = [(row, spread) for pair in found for _, row in pair for spread in (True, False)]
    with ProcessPoolExecutor() as pool:
        times = list(pool.map(step_s, jobs))
    print("| recipe | GPUs | measured ratio | simulated | without the rule |\n|---|---|---:|---:|---:|")
    measured, simulated, alike = [], [], []
    for i, ((n_small, small), (n_large, large)) in enumerate(found):
        s_rule, s_alike, l_rule, l_alike = times[4 * i: 4 * i + 4]
        m = float(large["iteration_time_s"]) / float(small["iteration_time_s"])
        measured.append(m - 1)
        simulated.append(l_rule / s_rule - 1)
        alike.append(l_alike / s_alike - 1)
        print(f"| {small['name']} | {n_small} -> {n_large} | {m - 1:+.1%} | "
              f"{simulated[-1]:+.1%} | {alike[-1]:+.1%} |")
    n = len(found)
    if n:
        slower = sum(m > a for m, a in zip(measured, alike))
        print(f"\n{n} pairs: the larger count's step is {sum(measured) / n:+.1%} longer measured (mean), "
              f"{sum(simulated) / n:+.1%} simulated, {sum(alike) / n:+.1%} without the slowest-GPU rule; "
              f"measured above the rule-less simulation in {slower} of {n}")
    print(f"{time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
