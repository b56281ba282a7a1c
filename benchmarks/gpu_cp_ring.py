"""Time, on one CUDA GPU, one rank's attention under PyTorch's context parallelism, without its collectives.

torchtitan's long-context rows (Llama 3.1 8B at 64K-256K tokens, CP 2-8) ran
``torch.distributed.tensor.experimental._attention`` with the all-gather rotate method and round-robin
load balancing (strategy/cp_torch.py): per layer and pass, cp FlashAttention calls on one rank (step 0
causal over the local 2 chunks, each later step all local queries against the first half of a K/V
block, or the second half of the queries against a whole block, without a mask) and eager fp32 kernels
around them (``_SDPAMerger``'s merge forward; fp32 dQ/dK/dV accumulators backward). This runs exactly that
sequence of aten calls for one rank on one GPU, the K/V blocks of the other ranks being random tensors of
their shape (no all-gather, no dK/dV hop), to time what the cost model charges as compute:

    python benchmarks/gpu_cp_ring.py --out DIR [--cps 1,2,4,8] [--tokens-per-rank 32768]

Writes ``DIR/gpu_cp_ring.csv``: per CP degree, rank and pass, the median time per layer, its SDPA
kernels' share (torch.profiler) and the SM clock and power (``gpu_kernels.Sampler``). Llama 3.1 8B's
attention as torchtitan hands it to SDPA: 32 heads of 128 (K and V repeated to every query head), bf16.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_attention_triton import timed_long  # noqa: E402
from gpu_kernels import Sampler  # noqa: E402

HEADS, HEAD_DIM = 32, 128
FIELDS = ("cp", "rank", "pass", "tokens_per_rank", "time_s", "sdpa_share", "sm_MHz", "power_W")
FLASH = torch.ops.aten._scaled_dot_product_flash_attention
FLASH_BWD = torch.ops.aten._scaled_dot_product_flash_attention_backward


def plan(cp: int, rank: int) -> list[tuple[str, str, bool]]:
    """(queries, keys, causal) per step: "all"/"second" local queries, "local"/"first"/"all" of a block."""
    steps = [("all", "local", True)]
    for i in range(1, cp):
        steps.append(("all", "first", False) if i <= rank else ("second", "all", False))
    return steps


def _halves(x: torch.Tensor, which: str) -> torch.Tensor:
    n = x.shape[2]
    return {"all": x, "local": x, "first": x[:, :, : n // 2], "second": x[:, :, n // 2:]}[which]


def forward(q: torch.Tensor, kv: list[tuple[torch.Tensor, torch.Tensor]], steps: list) -> tuple:
    """The merged output (fp32) and lse of one rank's ring forward, and each step's flash outputs."""
    out = lse = None
    saved = []
    for (qs, ks, causal), (k, v) in zip(steps, kv):
        qq = _halves(q, qs)
        res = FLASH(qq, _halves(k, ks), _halves(v, ks), 0.0, causal)
        saved.append(res)
        bo, bl = res[0].float(), res[1].unsqueeze(-1).float()
        if out is None:
            out, lse = bo, bl
            continue
        o, lo = (out, lse) if qs == "all" else (_halves(out, "second"), _halves(lse, "second"))
        o = o - torch.sigmoid(bl - lo) * (o - bo)
        lo = lo - F.logsigmoid(lo - bl)
        if qs == "all":
            out, lse = o, lo
        else:  # _partial_update: the second half replaced in a new tensor
            out = torch.cat((_halves(out, "first"), o), dim=2)
            lse = torch.cat((_halves(lse, "first"), lo), dim=2)
    return out.to(q.dtype), lse, saved


def backward(dout, q, kv, steps, out, lse, saved) -> torch.Tensor:
    """One rank's ring backward: each step's flash backward against the merged out and lse, dQ and the
    step's dK, dV added into fp32 accumulators (the block's dK, dV then concatenated for the hop)."""
    dq = torch.zeros_like(q, dtype=torch.float32)
    lse_flat = lse.squeeze(-1)
    for (qs, ks, causal), (k, v), res in zip(steps, kv, saved):
        qq, kk, vv = _halves(q, qs), _halves(k, ks), _halves(v, ks)
        g = FLASH_BWD(_halves(dout, qs), qq, kk, vv, _halves(out, qs), _halves(lse_flat, qs).contiguous(),
                      res[2], res[3], res[4], res[5], 0.0, causal, res[6], res[7])
        dkv = torch.zeros(2, *k.shape, device=q.device, dtype=torch.float32)
        _halves(dkv[0], ks).add_(g[1])
        _halves(dkv[1], ks).add_(g[2])
        _halves(dq, qs).add_(g[0])
        torch.cat((dkv[0], dkv[1]), dim=0)  # the accumulators concatenated for the hop
    return dq.to(q.dtype)


def sdpa_share(fn) -> float:
    """Fraction of one call's CUDA kernel time in flash-attention kernels (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    total = sum(e.self_device_time_total for e in events) or 1.0
    return sum(e.self_device_time_total for e in events if "flash" in e.key.lower()) / total


def measure(cp: int, rank: int, tokens: int, sampler: Sampler) -> list[dict]:
    mk = lambda: torch.randn(1, HEADS, tokens, HEAD_DIM, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    q, dout = mk(), mk()
    steps = plan(cp, rank)
    kv = [(mk(), mk()) for _ in steps]
    out, lse, saved = forward(q, kv, steps)
    rows = []
    for pass_, fn in (("fwd", lambda: forward(q, kv, steps)),
                      ("bwd", lambda: backward(dout, q, kv, steps, out, lse, saved))):
        t, a, b = timed_long(fn)
        clk = sampler.window(a, b)
        rows.append(dict(cp=cp, rank=rank, tokens_per_rank=tokens, time_s=t, sdpa_share=round(sdpa_share(fn), 4),
                         sm_MHz=clk["sm_MHz"], power_W=clk["power_W"], **{"pass": pass_}))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cps", default="1,2,4,8")
    ap.add_argument("--tokens-per-rank", type=int, default=32768)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sampler = Sampler()
    sampler.start()
    rows: list[dict] = []
    for cp in map(int, args.cps.split(",")):
        for rank in sorted({0, cp - 1}):  # the two extremes of the step plan (ranks differ in halves only)
            for r in measure(cp, rank, args.tokens_per_rank, sampler):
                rows.append(r)
                print(f"cp {cp} rank {rank} {r['pass']}: {1e3 * r['time_s']:.2f} ms per layer, sdpa "
                      f"{100 * r['sdpa_share']:.0f}%, {r['sm_MHz']:.0f} MHz {r['power_W']:.0f} W", flush=True)
            torch.cuda.empty_cache()
        with open(out / "gpu_cp_ring.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS)
            w.writeheader()
            w.writerows(rows)
    sampler.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
