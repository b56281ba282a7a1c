"""Measure, on a CUDA GPU at its power limit, how fast GEMMs run when memory-bound kernels share the
GPU's time with them: the data a power model of a step's kernel mix needs (the lent H100 ran a Llama
layer's GEMMs 11-15% faster than back to back, scenarios/calibration/README.md).

    python benchmarks/gpu_mix.py --out DIR [--seconds 8]

For each GEMM share of the queue (1.0, 0.8, 0.6, 0.4, 0.2) the script queues BF16 GEMMs
(8192 x 8192 x 4096) and device-to-device copies (1 GiB) in that proportion of their time alone, back
to back on one stream, for ``--seconds`` seconds, and times every kernel of the second half with CUDA
events. Writes ``DIR/gpu_mix.csv`` (one row per share: GEMM TFLOP/s, copy TB/s, the time shares
measured, SM clock and power sampled by nvidia-smi) and prints it. Needs torch with CUDA.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import threading
import time
from pathlib import Path

import torch

SHARES = (1.0, 0.8, 0.6, 0.4, 0.2)
M, N, K = 8192, 8192, 4096
COPY_BYTES = 2 ** 30
FIELDS = ("gemm_share_target", "gemm_share", "gemm_tflops", "copy_TBps", "sm_MHz", "power_W", "gemms", "copies")


class Smi(threading.Thread):
    """nvidia-smi's SM clock and power every 0.2 s."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[tuple[float, float, float]] = []
        self.stop_flag = threading.Event()

    def run(self) -> None:
        while not self.stop_flag.is_set():
            out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True).stdout.split(",")
            if len(out) == 2:
                self.samples.append((time.perf_counter(), float(out[0]), float(out[1])))
            time.sleep(0.2)

    def mean(self, t0: float, t1: float) -> tuple[float, float]:
        rows = [(c, p) for t, c, p in self.samples if t0 <= t <= t1]
        return (sum(c for c, _ in rows) / len(rows), sum(p for _, p in rows) / len(rows)) if rows else (0.0, 0.0)


def alone_s(fn, calls: int = 20) -> float:
    """Seconds per call of ``fn`` back to back (after a warm-up)."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / calls


def run_share(share: float, gemm, copy, ratio: tuple[int, int], seconds: float, smi: Smi) -> dict:
    """Queue ``ratio`` = (gemms, copies) per round for ``seconds``; time the second half's kernels."""
    timed: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
    t0 = time.perf_counter()
    half = t0 + seconds / 2
    while (now := time.perf_counter()) < t0 + seconds:
        for kind, fn, n in (("g", gemm, ratio[0]), ("c", copy, ratio[1])):
            for _ in range(n):
                if now >= half:
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    fn()
                    b.record()
                    timed.append((kind, a, b))
                else:
                    fn()
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    g = [a.elapsed_time(b) / 1e3 for k, a, b in timed if k == "g"]
    c = [a.elapsed_time(b) / 1e3 for k, a, b in timed if k == "c"]
    clock, power = smi.mean(half, t1)
    busy = sum(g) + sum(c)
    return {"gemm_share_target": share, "gemm_share": sum(g) / busy if busy else 0.0,
            "gemm_tflops": 2.0 * M * N * K * len(g) / sum(g) / 1e12 if g else 0.0,
            "copy_TBps": 2.0 * COPY_BYTES * len(c) / sum(c) / 1e12 if c else 0.0,
            "sm_MHz": clock, "power_W": power, "gemms": len(g), "copies": len(c)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=8.0)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    src = torch.empty(COPY_BYTES, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)

    def gemm():
        torch.mm(a, b, out=y)

    def copy():
        dst.copy_(src)

    g_s, c_s = alone_s(gemm), alone_s(copy)
    smi = Smi()
    smi.start()
    run_share(1.0, gemm, copy, (1, 0), max(args.seconds, 10.0), smi)  # the power-limited steady state first
    rows = []
    for share in SHARES:
        # per round: gemms and copies in the share of their time alone, about 10 ms a round
        n_g = max(1, round(share * 0.01 / g_s))
        n_c = round((1 - share) / share * n_g * g_s / c_s) if share < 1 else 0
        rows.append(run_share(share, gemm, copy, (n_g, n_c), args.seconds, smi))
        print({k: round(v, 3) if isinstance(v, float) else v for k, v in rows[-1].items()}, flush=True)
    smi.stop_flag.set()
    with open(out / "gpu_mix.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=FIELDS)
        wr.writeheader()
        wr.writerows(rows)
    print(f"alone: GEMM {2.0 * M * N * K / g_s / 1e12:.0f} TFLOP/s in {g_s * 1e3:.3f} ms, copy "
          f"{2.0 * COPY_BYTES / c_s / 1e12:.2f} TB/s in {c_s * 1e3:.3f} ms (short bursts); {out / 'gpu_mix.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
