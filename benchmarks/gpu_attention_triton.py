"""Time, on a CUDA GPU, MPT's Triton FlashAttention (``mpt_triton_attention``) beside FlashAttention-2.

llm-foundry's MPT benchmark runs of ``attn_impl: triton`` (the 13B/30B rows and the single-node
long-sequence table) ran that kernel; the cost model had only FlashAttention-2's and cuDNN's curves.
Causal, BF16, head dim 128, in the papers' convention (batch x seq = 16k tokens, 16 heads: hidden 2048)
at 512 .. 16k, then the rows' own shapes. Each kernel runs back to back for at least ``MIN_TIME_S``
after a sustained GEMM load (the clock a training step holds):

    DISABLE_MMA_V3=1 python benchmarks/gpu_attention_triton.py --out DIR            # mma.sync, as pre-MLIR Triton
    python benchmarks/gpu_attention_triton.py --out DIR --tag wgmma --no-fa2 --no-rows  # today's Triton

Writes ``DIR/gpu_attention_triton[_TAG].csv`` (``gpu_kernels.py``'s columns; FLOPs in the FlashAttention
benchmarks' count: forward 4·b·h·s²·d/2 causal, backward 2.5x) and a ``.json`` with provenance. The
backward is timed alone (preprocess, dQ zeroing, the kernel, the dQ copy), for both of the original's
autotuned dQ strategies where one program per (batch, head) can fill the GPU.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mpt_triton_attention as mpt  # noqa: E402
from gpu_kernels import FIELDS, Sampler, bf16_gemm, provenance, row, summarize, sustained  # noqa: E402

MIN_TIME_S = 0.5
WARMUP_CALLS = 2
TOKENS, HEADS, HEAD_DIM = 16384, 16, 128
SEQS = (512, 1024, 2048, 4096, 8192, 16384)
# MPT benchmark rows (llm-foundry scripts/train/benchmarking): (label, micro-batch, heads, seq)
ROWS = (("mpt-13b", 16, 40, 2048), ("mpt-30b", 8, 56, 2048), ("mpt-70b", 8, 64, 2048),
        ("mpt-13b-32k", 1, 40, 32768), ("mpt-7b-64k", 1, 32, 65536))
WARM_GEMM_S = 15.0


def timed_long(fn) -> tuple[float, float, float]:
    """(median seconds per call, wall start, wall end): WARMUP_CALLS, then calls for MIN_TIME_S (3 at least)."""
    for _ in range(WARMUP_CALLS):
        fn()
    torch.cuda.synchronize()
    times, t0 = [], time.perf_counter()
    while time.perf_counter() - t0 < MIN_TIME_S or len(times) < 3:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    times.sort()
    return times[len(times) // 2], t0, time.perf_counter()


def tensors(b: int, h: int, s: int):
    """q, k, v, dO in MPT's (batch, seq, heads, head_dim) layout."""
    return [torch.randn(b, s, h, HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in range(4)]


def triton_rows(label: str, b: int, h: int, s: int, sampler: Sampler, impl: str) -> list[dict]:
    q, k, v, do = tensors(b, h, s)
    flops = 4.0 * b * h * s * s * HEAD_DIM / 2
    out, lse = mpt.forward(q, k, v)
    t, a0, a1 = timed_long(lambda: mpt.forward(q, k, v))
    rows = [row("attention", f"{impl}:{label}", "bf16", "fwd", b, h, s, t, flops, 0, sampler.window(a0, a1))]
    # one program per (batch, head) cannot fill 132 SMs below that many: the autotuner never picks it there
    for sp in (True, False) if b * h >= 132 else (True,):
        t, a0, a1 = timed_long(lambda: mpt.backward(do, q, k, v, out, lse, True, sp))
        rows.append(row("attention", f"{impl}{'' if sp else '-nosp'}:{label}", "bf16", "bwd", b, h, s, t,
                        2.5 * flops, 0, sampler.window(a0, a1)))
    return rows


def fa2_rows(label: str, b: int, h: int, s: int, sampler: Sampler) -> list[dict]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (torch.randn(b, h, s, HEAD_DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    g = torch.randn(b, h, s, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    flops = 4.0 * b * h * s * s * HEAD_DIM / 2

    def fwd():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    tf, a0, a1 = timed_long(fwd)
    rows = [row("attention", f"flash_attention:{label}", "bf16", "fwd", b, h, s, tf, flops, 0, sampler.window(a0, a1))]
    tfb, a0, a1 = timed_long(lambda: torch.autograd.grad(fwd(), (q, k, v), g))
    rows.append(row("attention", f"flash_attention:{label}", "bf16", "bwd", b, h, s, tfb - tf, 2.5 * flops, 0,
                    sampler.window(a0, a1)))
    return rows


def kernel_stats() -> dict:
    """Registers per thread and spilled bytes of the three compiled kernels (MPT-13B's shape)."""
    stats: dict = {}
    q, k, v, do = tensors(2, 40, 2048)
    out, lse = mpt.forward(q, k, v, stats=stats)
    for sp in (True, False):
        mpt.backward(do, q, k, v, out, lse, True, sp, stats=stats)
    return stats


def shapes(with_rows: bool) -> list[tuple[str, int, int, int]]:
    paper = [(f"paper-s{s}", TOKENS // s, HEADS, s) for s in SEQS]
    return paper + (list(ROWS) if with_rows else [])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tag", default="", help="file-name suffix (e.g. wgmma)")
    ap.add_argument("--no-fa2", action="store_true", help="skip FlashAttention-2")
    ap.add_argument("--no-rows", action="store_true", help="only the papers' shapes")
    ap.add_argument("--stats-only", action="store_true", help="only the compiled kernels' registers and spills")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "gpu_attention_triton" + (f"_{args.tag}" if args.tag else "")
    impl = "mpt_triton_mma_sync" if os.environ.get("DISABLE_MMA_V3") == "1" else "mpt_triton"
    sampler = Sampler()
    sampler.start()
    n = 8192
    doc: dict = {"provenance": dict(provenance(sampler), DISABLE_MMA_V3=os.environ.get("DISABLE_MMA_V3"),
                                    triton=__import__("triton").__version__), "errors": {}}
    doc["kernel_stats"] = kernel_stats()
    print(f"{impl} kernels: {json.dumps(doc['kernel_stats'])}", flush=True)
    if args.stats_only:
        (out / f"{stem}.json").write_text(json.dumps(doc, indent=1) + "\n")
        return 0
    doc["warm_gemm"] = summarize(sustained(bf16_gemm(n, n, n, "fwd"), 2.0 * n**3, WARM_GEMM_S, sampler))
    rows: list[dict] = []
    for label, b, h, s in shapes(not args.no_rows):
        for name, fn in [("triton", lambda: triton_rows(label, b, h, s, sampler, impl))] + (
                [] if args.no_fa2 else [("fa2", lambda: fa2_rows(label, b, h, s, sampler))]):
            try:
                res = fn()
            except Exception as exc:  # noqa: BLE001 - one failing shape must not lose the others
                doc["errors"][f"{name}:{label}"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                print(f"{name} {label}: FAILED {doc['errors'][f'{name}:{label}']}", flush=True)
                continue
            rows += res
            for r in res:
                print(f"{r['name']:38} {r['pass']:4} b{r['m']:<3} h{r['n']:<3} s{r['k']:<6} "
                      f"{r['time_s'] * 1e3:9.3f} ms "
                      f"{r['tflops']:6.1f} TF/s {r['sm_MHz']:6.0f} MHz {r['power_W']:4.0f} W", flush=True)
            torch.cuda.empty_cache()
        with open(out / f"{stem}.csv", "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=FIELDS)
            wr.writeheader()
            wr.writerows(rows)
        (out / f"{stem}.json").write_text(json.dumps(doc, indent=1) + "\n")
    sampler.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
