"""Time whole transformer layers on a CUDA GPU under sustained load: a Llama 3.1 8B layer (RMSNorm,
fused QKV GEMM, causal GQA attention through torch's cuDNN/Flash SDPA, output projection, residual
add, RMSNorm, SwiGLU MLP) at sequence 8192, micro-batch 1, BF16, forward and backward of a stack
of layers back to back, with the SM clock and power they run at. This is the kernel mix of a training
step, not one kernel: its clock is what the GPU holds when GEMMs alternate with attention and
memory-bound kernels (``gpu_kernels.py`` measures each kernel alone).

    python benchmarks/gpu_layer.py --out DIR

Writes ``DIR/gpu_layer.json`` and prints it. Rotary embedding is left out (it is not in this layer);
GQA keys and values are expanded to all heads when the SDPA backend takes no GQA inputs.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from gpu_kernels import Sampler, provenance, timed  # run as a script: benchmarks/ is on sys.path

HIDDEN, FFN, HEADS, KV_HEADS, SEQ, LAYERS = 4096, 14336, 32, 8, 8192, 4  # Llama 3.1 8B (HF config)
SUSTAIN_S = 15.0


class Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hd = HIDDEN // HEADS
        kw = dict(bias=False, device="cuda", dtype=torch.bfloat16)
        self.n1 = torch.nn.RMSNorm(HIDDEN, eps=1e-5, device="cuda", dtype=torch.bfloat16)
        self.qkv = torch.nn.Linear(HIDDEN, (HEADS + 2 * KV_HEADS) * self.hd, **kw)
        self.proj = torch.nn.Linear(HIDDEN, HIDDEN, **kw)
        self.n2 = torch.nn.RMSNorm(HIDDEN, eps=1e-5, device="cuda", dtype=torch.bfloat16)
        self.fc1 = torch.nn.Linear(HIDDEN, 2 * FFN, **kw)
        self.fc2 = torch.nn.Linear(FFN, HIDDEN, **kw)
        self.gqa = True

    def attention(self, q, k, v):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]):
            if self.gqa:
                try:
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                except (RuntimeError, TypeError):
                    self.gqa = False
            rep = HEADS // KV_HEADS
            return F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                                  is_causal=True)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.n1(x)).split([HIDDEN, KV_HEADS * self.hd, KV_HEADS * self.hd], dim=-1)
        q = q.view(b, s, HEADS, self.hd).transpose(1, 2)
        k = k.view(b, s, KV_HEADS, self.hd).transpose(1, 2)
        v = v.view(b, s, KV_HEADS, self.hd).transpose(1, 2)
        a = self.attention(q, k, v).transpose(1, 2).reshape(b, s, HIDDEN)
        x = x + self.proj(a)
        gate, up = self.fc1(self.n2(x)).chunk(2, dim=-1)
        return x + self.fc2(F.silu(gate) * up)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sampler = Sampler()
    sampler.start()
    layers = torch.nn.Sequential(*(Layer() for _ in range(LAYERS)))
    x = torch.randn(1, SEQ, HIDDEN, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(1, SEQ, HIDDEN, device="cuda", dtype=torch.bfloat16)

    def fwd():
        with torch.no_grad():
            layers(x)

    def fwd_bwd():
        layers(x).backward(g)

    doc = {"provenance": provenance(sampler), "model": dict(hidden=HIDDEN, ffn=FFN, heads=HEADS,
                                                             kv_heads=KV_HEADS, seq=SEQ, layers=LAYERS)}
    t_f, a0, a1 = timed(fwd)
    doc["forward_per_layer_s"], doc["forward_clock"] = t_f / LAYERS, sampler.window(a0, a1)
    start = time.perf_counter()
    iters, series = 0, []
    while time.perf_counter() - start < SUSTAIN_S:
        t, b0, b1 = timed(fwd_bwd)
        iters += 1
        series.append(dict(t_s=round(b0 - start, 2), per_layer_s=t / LAYERS, **sampler.window(b0, b1)))
    tail = series[len(series) // 2:]
    med = lambda key: sorted(r[key] for r in tail)[len(tail) // 2]  # noqa: E731
    doc.update(gqa_native=layers[0].gqa, fwd_bwd_per_layer_s=med("per_layer_s"), fwd_bwd_sm_MHz=med("sm_MHz"),
               fwd_bwd_power_W=med("power_W"), series=series)
    sampler.stop()
    (out / "gpu_layer.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: v for k, v in doc.items() if k != "series"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
