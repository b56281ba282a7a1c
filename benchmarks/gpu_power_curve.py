"""Measure, on a CUDA GPU at its power limit, the SM clock GEMMs hold when another load takes part of
the board's power: the shape of the clock-power curve below the sustained clock, which a power limit
set under the TDP (the Grand Teton H100s' 500 W) moves along and which a lent machine cannot set.

    python benchmarks/gpu_power_curve.py --out DIR [--seconds 10]

BF16 GEMMs (8192 x 8192 x 4096) run back to back on one stream while device-to-device copies of 1 GiB
(``cudaMemcpyAsync``, which torch's same-dtype contiguous ``copy_`` issues) run on a second stream, one
copy per 1, 2 or 4 GEMMs; also idle, copies alone and GEMMs alone. Every phase runs ``--seconds``
seconds after a warm-up of the same length; CUDA events every 50 kernels time each stream, nvidia-smi
samples clock and power. Writes ``DIR/gpu_power_curve.csv`` (per phase: GEMM TFLOP/s, GEMM TFLOP/s per
GHz of SM clock, copy TB/s, SM clock, power) and prints it. If the GEMMs' rate per clock stays while
the copies run, the copies ran on copy engines beside them, and the clock the power limit left them
is the curve's point at that power. Needs torch with CUDA.
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import torch
from gpu_mix import COPY_BYTES, K, M, N, Smi  # run as a script: benchmarks/ is on sys.path; gpu_mix's shapes

EVERY = 50
FIELDS = ("phase", "gemms_per_copy", "gemm_tflops", "gemm_tflops_per_GHz", "copy_TBps", "sm_MHz", "power_W")


def _run(seconds: float, gemm, copy, per_copy: int, smi: Smi) -> dict:
    """GEMMs on one stream and a copy per ``per_copy`` GEMMs on another (0: no copies; -1: copies
    alone; None: idle), ``seconds`` of warm-up then ``seconds`` measured."""
    gs, cs = torch.cuda.Stream(), torch.cuda.Stream()
    marks: dict = {"g": [], "c": []}
    t_start, n = time.perf_counter(), 0
    while time.perf_counter() - t_start < 2 * seconds:
        if per_copy is None:
            time.sleep(0.05)
            continue
        measuring = time.perf_counter() - t_start >= seconds
        if per_copy >= 0:
            with torch.cuda.stream(gs):
                gemm()
                if measuring and n % EVERY == 0:
                    e = torch.cuda.Event(enable_timing=True)
                    e.record()
                    marks["g"].append((n, e, time.perf_counter()))
        if per_copy != 0 and (per_copy < 0 or n % per_copy == 0):
            with torch.cuda.stream(cs):
                copy()
                k = n if per_copy < 0 else n // per_copy
                if measuring and k % EVERY == 0:
                    e = torch.cuda.Event(enable_timing=True)
                    e.record()
                    marks["c"].append((k, e, time.perf_counter()))
        n += 1
    torch.cuda.synchronize()
    t_end = time.perf_counter()
    out: dict = {"gemm_tflops": 0.0, "copy_TBps": 0.0}
    for key, work in (("g", 2 * M * N * K / 1e12), ("c", 2 * COPY_BYTES / 1e12)):
        m = marks[key]
        if len(m) >= 2:
            s = m[0][1].elapsed_time(m[-1][1]) / 1e3
            out["gemm_tflops" if key == "g" else "copy_TBps"] = (m[-1][0] - m[0][0]) * work / s
    t0 = t_start + seconds + 1.0
    out["sm_MHz"], out["power_W"] = smi.mean(t0, t_end)
    out["gemm_tflops_per_GHz"] = out["gemm_tflops"] / (out["sm_MHz"] / 1e3) if out["sm_MHz"] else 0.0
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    src = torch.empty(COPY_BYTES // 2, device="cuda", dtype=torch.bfloat16).normal_()
    dst = torch.empty_like(src)

    def gemm():
        torch.mm(a, b, out=c)

    def copy():
        dst.copy_(src)

    smi = Smi()
    smi.start()
    rows = []
    for phase, per_copy in (("idle", None), ("copies alone", -1), ("gemms alone", 0), ("gemms + copies", 4),
                            ("gemms + copies", 2), ("gemms + copies", 1), ("gemms alone", 0)):
        r = _run(args.seconds, gemm, copy, per_copy, smi)
        rows.append({"phase": phase, "gemms_per_copy": per_copy if per_copy and per_copy > 0 else "", **r})
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in rows[-1].items()}, flush=True)
    smi.stop_flag.set()
    with (out / "gpu_power_curve.csv").open("w", newline="") as f:
        f.write(f"# device: {torch.cuda.get_device_name(0)}; torch {torch.__version__}; command: "
                f"python benchmarks/gpu_power_curve.py --out DIR --seconds {args.seconds:g}\n")
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in r.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
