"""Time, on one CUDA GPU, the Q/K/V layout copies ``model/te_layout.py`` charges to Megatron-Core's attention
through Transformer Engine, as the same tensor ops on the same shapes (TE itself is not needed):

- GPT-3 175B's TP 4 shard (24 heads of 128, sequence 2048, multi-head, no RoPE): FlashAttention's
  transposes of the interleaved q, k, v views to [b, s, h, d] and of its output back, and the backward's
  interleaving of dQ, dK, dV (``fa_prepare_bwd``'s bytes, as a ``torch.cat`` along the last dimension);
- Llama 3.1 8B at CP 1 (32 query heads, 8 K/V heads of 128, sequence 8192, GQA with RoPE): the query's
  reshape copy out of the split view, the value's ``.contiguous()``, and ``SplitAlongDim``'s backward
  concatenation of dQ, dK, dV.

    python benchmarks/gpu_layout_copies.py --out DIR

Writes ``DIR/gpu_layout_copies.csv``: per case and op, the bytes moved (read + write) and the median time
(CUDA events over back-to-back calls, ``gpu_kernels.timed``), with the SM clock and power.
"""

from __future__ import annotations

import argparse
import csv
from collections.abc import Callable
from pathlib import Path

import torch
from gpu_kernels import Sampler, timed  # benchmarks/ on sys.path

FIELDS = ("case", "op", "bytes", "time_s", "gbps", "sm_MHz", "power_W")


def _cases() -> list[tuple[str, str, int, Callable]]:
    """(case, op, bytes moved, function) for each copy."""
    r = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    out = []
    s, b, h, d = 2048, 1, 24, 128  # GPT-3 175B, TP 4
    mixed = r(s, b, h, 3 * d)  # [s, b, groups, 3 head_dim]: the interleaved sbh3d views
    q, k, v = mixed.split(d, dim=-1)
    o = r(b, s, h, d)
    grads = [r(b, s, h, d) for _ in range(3)]
    n = s * b * h * d * 2
    out.append(("gpt3-175b-tp4-flash", "qkv_to_bshd", 6 * n,
                lambda: [x.transpose(0, 1).contiguous() for x in (q, k, v)]))
    out.append(("gpt3-175b-tp4-flash", "out_to_sbhd", 2 * n, lambda: o.view(b, s, -1).transpose(0, 1).contiguous()))
    out.append(("gpt3-175b-tp4-flash", "dqkv_interleave", 6 * n,
                lambda: torch.cat([g.transpose(0, 1) for g in grads], dim=-1)))
    s, hq, hkv = 8192, 32, 8  # Llama 3.1 8B
    w = (hq // hkv + 2) * d
    mixed = r(s, b, hkv, w)
    qv, kv_, vv = mixed.split([hq // hkv * d, d, d], dim=-1)
    nq, nkv = s * b * hq * d * 2, s * b * hkv * d * 2
    out.append(("llama31-8b-gqa-rope", "query_reshape", 2 * nq, lambda: qv.reshape(s, b, -1, d)))
    out.append(("llama31-8b-gqa-rope", "value_contiguous", 2 * nkv, lambda: vv.contiguous()))
    dq, dk, dv = r(s, b, hkv, hq // hkv * d), r(s, b, hkv, d), r(s, b, hkv, d)
    out.append(("llama31-8b-gqa-rope", "dqkv_cat", 2 * (nq + 2 * nkv), lambda: torch.cat((dq, dk, dv), dim=-1)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    out = Path(ap.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    sampler = Sampler()
    sampler.start()
    rows = []
    for case, op, nbytes, fn in _cases():
        t, t0, t1 = timed(fn)
        clk = sampler.window(t0, t1)
        rows.append(dict(case=case, op=op, bytes=nbytes, time_s=t, gbps=nbytes / t / 1e9, sm_MHz=clk["sm_MHz"],
                         power_W=clk["power_W"]))
        print(f"{case:22} {op:17} {nbytes / 1e6:8.1f} MB {t * 1e6:8.1f} us {nbytes / t / 1e9:7.0f} GB/s", flush=True)
    sampler.stop()
    with open(out / "gpu_layout_copies.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=FIELDS)
        wr.writeheader()
        wr.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
