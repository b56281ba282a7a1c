"""Measure what a GEMM loses when other kernels hold some of the GPU's SMs, as an NCCL collective's
CTAs do (one CTA per channel, resident for the whole collective): a spinning "hog" kernel of N CTAs,
each taking most of an SM's shared memory so that no GEMM CTA can share its SM, runs on a side stream
across a batch of back-to-back GEMMs on the main stream.

    python benchmarks/gpu_contention.py --out DIR

Writes ``DIR/gpu_contention.csv``: per GEMM shape and hog size, the time per GEMM and its ratio to the
time with no hog. Needs torch and CuPy with CUDA.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import cupy as cp
import torch
import torch.nn.functional as F

SHAPES = ((1536, 2816, 8192), (8192, 8192, 8192), (8192, 28672, 4096), (2048, 4608, 12288))
HOGS = (0, 8, 16, 24, 33, 66)
HOG_SMEM = 200 * 1024  # bytes of dynamic shared memory per hog CTA: no 2nd CTA fits on its SM
BATCH_S = 0.03  # GEMMs per batch: about this long
REPEATS = 5
SRC = r"""
extern "C" __global__ void hog(long long cycles) {
    extern __shared__ char smem[];
    long long start = clock64();
    while (clock64() - start < cycles) {
        if (threadIdx.x == 0) smem[start & 1023] = 1;
    }
}
"""


def batch_s(fn, n: int, hog_ctas: int, kernel, side: torch.cuda.Stream, guess_s: float = 0.004) -> float:
    """Seconds per call of ``n`` calls with ``hog_ctas`` hog CTAs resident throughout."""
    main = torch.cuda.current_stream()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    if hog_ctas:
        cycles = int(2.5e9 * (3.0 * n * guess_s + 0.005))  # outlasts the batch at any clock to 2.5 GHz
        with cp.cuda.ExternalStream(side.cuda_stream):
            kernel((hog_ctas,), (32,), (cp.int64(cycles),), shared_mem=HOG_SMEM)
    torch.cuda._sleep(int(2e6))  # let the hog's CTAs land first (about 1 ms)
    a.record(main)
    for _ in range(n):
        fn()
    b.record(main)
    b.synchronize()
    t = a.elapsed_time(b) * 1e-3 / n
    torch.cuda.synchronize()  # the hog finishes before the next measurement
    return t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    out = Path(ap.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    kernel = cp.RawKernel(SRC, "hog")
    kernel.max_dynamic_shared_size_bytes = HOG_SMEM
    side = torch.cuda.Stream()
    rows = []
    for m, n, k in SHAPES:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        fn = lambda: F.linear(x, w)  # noqa: E731
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        one = batch_s(fn, 5, 0, kernel, side)
        calls = max(5, int(BATCH_S / one))
        base = None
        for hogs in HOGS:
            t = sorted(batch_s(fn, calls, hogs, kernel, side, one) for _ in range(REPEATS))[REPEATS // 2]
            base = base or t
            rows.append(dict(m=m, n=n, k=k, hog_ctas=hogs, time_s=t, ratio=t / base))
            print(f"{m:6} {n:6} {k:6} hog {hogs:3}: {t * 1e6:9.1f} us  x{t / base:.3f}", flush=True)
    with open(out / "gpu_contention.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
