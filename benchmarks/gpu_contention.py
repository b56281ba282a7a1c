"""Measure what a GEMM loses when other kernels hold some of the GPU's SMs, as an NCCL collective's
CTAs do (one CTA per channel, resident for the whole collective): a "hog" kernel of N CTAs, each
taking most of an SM's shared memory so that no GEMM CTA can share its SM, runs on a side stream
across a batch of back-to-back GEMMs on the main stream. ``--hog spin`` CTAs only spin; ``--hog copy``
CTAs copy memory as fast as they can, as NCCL's CTAs move their buffers (HBM traffic and its power
beside the GEMM; the copy rate is recorded).

    python benchmarks/gpu_contention.py --out DIR [--hog spin|copy] [--victim gemm|memory]

``--victim memory`` times memory-bound kernels instead of GEMMs (a BF16 add of two 8192 x 8192
tensors, LayerNorm over 8192 x 8192, a 512 MiB device copy): what they lose beside the hog's CTAs
(SMs for ``spin``; SMs and the HBM bandwidth the copying CTAs take for ``copy``).

Writes ``DIR/gpu_contention.csv`` (``gpu_contention_copy.csv``; with ``--victim memory``
``gpu_contention_memory_<hog>.csv``): per GEMM shape (memory-bound kernel) and hog size, the time per
call and its ratio to the time with no hog. Needs torch and CuPy with CUDA.
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
extern "C" __global__ void copyhog(const float4* src, float4* dst, long long n, long long cycles,
                                   unsigned long long* moved) {
    extern __shared__ char smem[];
    long long start = clock64();
    long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long count = 0;
    if (threadIdx.x == 0) smem[0] = 1;
    while (clock64() - start < cycles) {
        for (int r = 0; r < 64; ++r) {
            dst[i] = src[i];
            i += stride;
            if (i >= n) i -= n;
            ++count;
        }
    }
    atomicAdd(moved, count * 32ULL);  // 16 bytes read + 16 written per element
}
"""
COPY_THREADS = 512
COPY_ELEMENTS = 1 << 24  # float4 elements per buffer: 256 MiB, far beyond the 50 MiB L2


def batch_s(fn, n: int, hog_ctas: int, kernel, side: torch.cuda.Stream, guess_s: float = 0.004,
            copy: tuple | None = None) -> float:
    """Seconds per call of ``n`` calls with ``hog_ctas`` hog CTAs resident throughout; ``copy`` (src,
    dst, moved counter, side-stream events): the copying hog, timed on its stream."""
    main = torch.cuda.current_stream()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    if hog_ctas:
        cycles = int(2.5e9 * (3.0 * n * guess_s + 0.005))  # outlasts the batch at any clock to 2.5 GHz
        with cp.cuda.ExternalStream(side.cuda_stream):
            if copy is None:
                kernel((hog_ctas,), (32,), (cp.int64(cycles),), shared_mem=HOG_SMEM)
            else:
                src, dst, moved, (c0, c1) = copy
                c0.record(side)
                kernel((hog_ctas,), (COPY_THREADS,), (src, dst, cp.int64(COPY_ELEMENTS), cp.int64(cycles), moved),
                       shared_mem=HOG_SMEM)
                c1.record(side)
    torch.cuda._sleep(int(2e6))  # let the hog's CTAs land first (about 1 ms)
    a.record(main)
    for _ in range(n):
        fn()
    b.record(main)
    b.synchronize()
    t = a.elapsed_time(b) * 1e-3 / n
    torch.cuda.synchronize()  # the hog finishes before the next measurement
    return t


def victims(shapes):
    """(m, n, k, call) of each GEMM shape: F.linear of (m, k) by (n, k)."""
    for m, n, k in shapes:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        yield m, n, k, lambda x=x, w=w: F.linear(x, w)


def memory_victims():
    """(m, n, k, call) of memory-bound kernels, k naming the kind (1 add, 2 LayerNorm, 3 copy): a BF16
    add of two 8192 x 8192 tensors (384 MiB moved), LayerNorm over 8192 x 8192 (256 MiB), a copy of
    512 MiB (1 GiB moved)."""
    x, y = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    yield 8192, 8192, 1, lambda: torch.add(x, y)
    yield 8192, 8192, 2, lambda: F.layer_norm(x, (8192,))
    src = torch.randn(2 ** 28, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    yield 2 ** 28, 1, 3, lambda: dst.copy_(src)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--hog", default="spin", choices=("spin", "copy"))
    ap.add_argument("--shapes", default="", help="m x n x k GEMMs, comma-separated (default: SHAPES)")
    ap.add_argument("--hogs", default="", help="hog CTA counts, comma-separated, 0 first (default: HOGS)")
    ap.add_argument("--name", default="", help="CSV file name (default by --hog)")
    ap.add_argument("--victim", default="gemm", choices=("gemm", "memory"))
    args = ap.parse_args()
    shapes = [tuple(map(int, x.split("x"))) for x in args.shapes.split(",")] if args.shapes else SHAPES
    hog_counts = tuple(map(int, args.hogs.split(","))) if args.hogs else HOGS
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    kernel = cp.RawKernel(SRC, "hog" if args.hog == "spin" else "copyhog")
    kernel.max_dynamic_shared_size_bytes = HOG_SMEM
    side = torch.cuda.Stream()
    copy = None
    if args.hog == "copy":
        src, dst = (cp.zeros(COPY_ELEMENTS * 4, dtype=cp.float32) for _ in range(2))
        copy = (src, dst, cp.zeros(1, dtype=cp.uint64),
                (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
    rows = []
    for m, n, k, fn in (victims(shapes) if args.victim == "gemm" else memory_victims()):
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        one = batch_s(fn, 5, 0, kernel, side)
        calls = max(5, int(BATCH_S / one))
        base = None
        for hogs in hog_counts:
            runs, rates = [], []
            for _ in range(REPEATS):
                if copy is not None:
                    copy[2].fill(0)
                runs.append(batch_s(fn, calls, hogs, kernel, side, one, copy))
                if copy is not None and hogs:  # bytes the hog moved over its own time
                    rates.append(float(copy[2].get()[0]) / (copy[3][0].elapsed_time(copy[3][1]) * 1e-3))
            t = sorted(runs)[REPEATS // 2]
            base = base or t
            gbps = sorted(rates)[len(rates) // 2] / 1e9 if rates else 0.0
            rows.append(dict(m=m, n=n, k=k, hog=args.hog, hog_ctas=hogs, time_s=t, ratio=t / base, hog_GBps=gbps))
            print(f"{m:6} {n:6} {k:6} {args.hog} hog {hogs:3}: {t * 1e6:9.1f} us  x{t / base:.3f}  "
                  f"hog {gbps:7.0f} GB/s", flush=True)
    name = args.name or ("gpu_contention.csv" if args.hog == "spin" else "gpu_contention_copy.csv")
    if args.victim == "memory" and not args.name:
        name = f"gpu_contention_memory_{args.hog}.csv"
    with open(out / name, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
