"""Re-time, on a CUDA GPU, the ``grad_norm`` kernels of committed calibration tables.

``calibrate profile`` timed every optimizer op as the AdamW step until 2026-11-27, so the tables'
``optimizer,grad_norm`` rows held Adam's time and were dropped. This times only those kernels with the
fixed runner (``calibration/kernels._grad_norm``: one L2 reduction over the gradients) and the same
timing as ``calibrate profile``, for the scenarios whose tables lost the row, and with ``--presets`` at
the shard sizes ``calibrate profile`` now times it at (``ADAM_SIZES``, as for the Adam step):

    python benchmarks/gpu_grad_norm.py --out DIR [--presets] [scenario.toml ...]

Writes ``DIR/grad_norm_rows.csv`` (the table columns plus ``scenario``, ``device``, ``command``) and
prints it; the rows go back into the tables by hand, with the command in their header.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.calibration.profile import (ADAM_SIZES, KernelSpec, grad_norm_work, kernel_rows_csv,  # noqa: E402
                                           profile_kernels, scenario_specs)
from simulator.cost.calibrated import KERNEL_COLUMNS  # noqa: E402
from simulator.scenario import load_scenario  # noqa: E402

DEFAULT_SCENARIOS = ("scenarios/calibration/tiny-gpt.toml", "scenarios/calibration/llama31-8b-4layers.toml")


def main() -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--presets", action="store_true", help="also the preset shard sizes (ADAM_SIZES)")
    ap.add_argument("scenarios", nargs="*", default=list(DEFAULT_SCENARIOS))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_grad_norm: no CUDA device", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device, command = torch.cuda.get_device_name(0), " ".join(["python", *sys.argv])
    lines = []
    jobs = [(path, [s for s in scenario_specs(load_scenario(ROOT / path)) if s.work.name == "grad_norm"])
            for path in args.scenarios]
    if args.presets:
        jobs.append(("presets", [KernelSpec(grad_norm_work(n), "step", None) for n in ADAM_SIZES]))
    for path, specs in jobs:
        rows, skipped = profile_kernels(specs, "cuda", "bf16")  # the tables' dtype column (all bf16 runs)
        for line in skipped:
            print(f"warning: not profiled: {line}", file=sys.stderr)
        for r in kernel_rows_csv(rows):
            lines.append((*r[:4], "x".join(map(str, r[4])), *r[5:], path, device, command))
    with open(out / "grad_norm_rows.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*KERNEL_COLUMNS, "scenario", "device", "command"])
        w.writerows(lines)
    print((out / "grad_norm_rows.csv").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
