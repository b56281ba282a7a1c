"""Time whole transformer layers on a CUDA GPU under sustained load: a Llama 3.1 8B layer (RMSNorm,
fused QKV GEMM, causal GQA attention through torch's cuDNN/Flash SDPA, output projection, residual
add, RMSNorm, SwiGLU MLP) at sequence 8192, micro-batch 1, BF16, or one TP rank's shard of a GPT-3
175B layer at TP 4 (LayerNorm, biases, GELU; sequence 2048), forward and backward of a stack of
layers back to back, with the SM clock and power they run at and the kernels' device time by kind.
This is the kernel mix of a training step, not one kernel: its clock is what the GPU holds when
GEMMs alternate with attention and memory-bound kernels (``gpu_kernels.py`` measures each alone).

    python benchmarks/gpu_layer.py --out DIR [--model llama3.1-70b-tp4|gpt3-175b-tp4|gpt-1.7b|mpt-1b|mpt-7b]

Models with a vocabulary also time their LM head GEMM with a cross-entropy over fp32 logits, forward
and backward. Writes ``DIR/gpu_layer.json`` (``gpu_layer_<model>.json`` for other models) and prints it. Rotary
embedding is left out; GQA keys and values are expanded to all heads when the SDPA backend takes no
GQA inputs.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from gpu_kernels import Sampler, provenance, timed  # run as a script: benchmarks/ is on sys.path

# Per-GPU shards of one layer (Hugging Face / paper configs): tp divides heads and widths as
# Megatron's column- and row-parallel linears do (the TP collectives themselves are not run here).
MODELS = {
    "llama3.1-8b": dict(hidden=4096, ffn=14336, heads=32, kv_heads=8, seq=8192, tp=1, mlp="swiglu",
                        norm="rmsnorm", bias=False),
    # Llama 3.1 70B's TP 4 shard (the DGX Cloud recipes' TP 4), tokens of the whole sequence on every
    # op (no sequence parallelism: its norms would run on seq / 4 tokens).
    "llama3.1-70b-tp4": dict(hidden=8192, ffn=28672, heads=64, kv_heads=8, seq=8192, tp=4, mlp="swiglu",
                             norm="rmsnorm", bias=False),
    "gpt3-175b-tp4": dict(hidden=12288, ffn=49152, heads=96, kv_heads=96, seq=2048, tp=4, mlp="gelu",
                          norm="layernorm", bias=True),
    # Megatron-LM README's 1.7B weak-scaling model (micro-batch not published: 1), and MPT 1B / 7B at
    # llm-foundry's published micro-batches (LayerNorm and linears without biases, exact GELU, vocab 50368).
    "gpt-1.7b": dict(hidden=2048, ffn=8192, heads=16, kv_heads=16, seq=4096, tp=1, mlp="gelu", gelu="none",
                     norm="layernorm", bias=True, vocab=131072),
    "mpt-1b": dict(hidden=2048, ffn=8192, heads=16, kv_heads=16, seq=2048, tp=1, mlp="gelu", gelu="none",
                   norm="layernorm", bias=False, mb=12, vocab=50368),
    "mpt-7b": dict(hidden=4096, ffn=16384, heads=32, kv_heads=32, seq=2048, tp=1, mlp="gelu", gelu="none",
                   norm="layernorm", bias=False, mb=6, vocab=50368),
}
LAYERS = 4
SUSTAIN_S = 15.0


class Layer(torch.nn.Module):
    def __init__(self, hidden, ffn, heads, kv_heads, tp, mlp, norm, bias, gelu="tanh", **_) -> None:
        super().__init__()
        self.heads, self.kv, self.hd, self.mlp = heads // tp, kv_heads // tp, hidden // heads, mlp
        self.gelu = gelu
        kw = dict(bias=bias, device="cuda", dtype=torch.bfloat16)
        Norm = torch.nn.RMSNorm if norm == "rmsnorm" else torch.nn.LayerNorm  # noqa: N806
        no_bias = {} if bias or norm == "rmsnorm" else dict(bias=False)  # RMSNorm takes no bias argument
        nkw = dict(eps=1e-5, device="cuda", dtype=torch.bfloat16) | no_bias
        self.n1 = Norm(hidden, **nkw)
        self.qkv = torch.nn.Linear(hidden, (self.heads + 2 * self.kv) * self.hd, **kw)
        self.proj = torch.nn.Linear(self.heads * self.hd, hidden, **kw)
        self.n2 = Norm(hidden, **nkw)
        self.fc1 = torch.nn.Linear(hidden, (2 if mlp == "swiglu" else 1) * ffn // tp, **kw)
        self.fc2 = torch.nn.Linear(ffn // tp, hidden, **kw)
        self.gqa = True

    def attention(self, q, k, v):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]):
            if self.gqa and self.kv != self.heads:
                try:
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                except (RuntimeError, TypeError):
                    self.gqa = False
            rep = self.heads // self.kv
            if rep > 1:
                k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.n1(x)).split([self.heads * self.hd, self.kv * self.hd, self.kv * self.hd], -1)
        q = q.view(b, s, self.heads, self.hd).transpose(1, 2)
        k = k.view(b, s, self.kv, self.hd).transpose(1, 2)
        v = v.view(b, s, self.kv, self.hd).transpose(1, 2)
        x = x + self.proj(self.attention(q, k, v).transpose(1, 2).reshape(b, s, self.heads * self.hd))
        h = self.fc1(self.n2(x))
        if self.mlp == "swiglu":
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h, approximate=self.gelu)
        return x + self.fc2(h)


CATEGORIES = (("attention", ("flash", "fmha", "cudnn", "sdpa", "attention")),
              ("gemm", ("gemm", "xmma", "cutlass", "nvjet", "cublas", "matmul")),
              ("norm", ("norm",)))


def kernel_breakdown(step, iters: int = 3, layers: int = LAYERS) -> dict:
    """Device time per layer and step of each kernel category, and the longest kernels, over ``iters``
    steps under torch.profiler (kernel durations are the device's; the profiler's host cost is not in
    them)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    per_name = {}
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)
        if us > 0:
            per_name[e.key] = per_name.get(e.key, 0.0) + us * 1e-6 / (iters * layers)
    cats: dict = {}
    for name, sec in per_name.items():
        low = name.lower()
        cat = next((c for c, keys in CATEGORIES if any(k in low for k in keys)), "elementwise")
        cats[cat] = cats.get(cat, 0.0) + sec
    top = sorted(per_name.items(), key=lambda kv: -kv[1])[:25]
    return {"per_layer_s": cats, "top_kernels_per_layer_s": top}


def head_and_loss(cfg: dict, sampler: Sampler) -> dict:
    """The LM head GEMM and a cross-entropy over fp32 logits (as autocast and Megatron's fp32 loss run
    it), forward and backward, back to back for SUSTAIN_S / 3: per micro-batch seconds and kernels."""
    tokens, vocab = cfg.get("mb", 1) * cfg["seq"], cfg["vocab"]
    x = torch.randn(tokens, cfg["hidden"], device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(vocab, cfg["hidden"], device="cuda", dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, vocab, (tokens,), device="cuda")

    def step():
        F.cross_entropy((x @ w.t()).float(), target).backward()

    start, series = time.perf_counter(), []
    while time.perf_counter() - start < SUSTAIN_S / 3:
        t, b0, b1 = timed(step)
        series.append(dict(s=t, **sampler.window(b0, b1)))
    tail = series[len(series) // 2:]
    return {"tokens": tokens, "vocab": vocab, "fwd_bwd_s": sorted(r["s"] for r in tail)[len(tail) // 2],
            "sm_MHz": tail[-1]["sm_MHz"], "kernels": kernel_breakdown(step, layers=1)}


def sustained(layers: torch.nn.Module, cfg: dict, sampler: Sampler) -> dict:
    """``layers`` forward alone, then forward + backward back to back for SUSTAIN_S: the median per layer
    over the second half with its SM clock and power, the whole series, and the kernel breakdown in
    the mix."""
    shape = (cfg.get("mb", 1), cfg["seq"], cfg["hidden"])
    x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)

    def fwd():
        with torch.no_grad():
            layers(x)

    def fwd_bwd():
        layers(x).backward(g)

    t_f, a0, a1 = timed(fwd)
    doc = {"forward_per_layer_s": t_f / LAYERS, "forward_clock": sampler.window(a0, a1)}
    start, series = time.perf_counter(), []
    while time.perf_counter() - start < SUSTAIN_S:
        t, b0, b1 = timed(fwd_bwd)
        series.append(dict(t_s=round(b0 - start, 2), per_layer_s=t / LAYERS, **sampler.window(b0, b1)))
    tail = series[len(series) // 2:]
    med = lambda key: sorted(r[key] for r in tail)[len(tail) // 2]  # noqa: E731
    doc.update(fwd_bwd_per_layer_s=med("per_layer_s"), fwd_bwd_sm_MHz=med("sm_MHz"), fwd_bwd_power_W=med("power_W"),
               series=series, kernels_in_mix=kernel_breakdown(fwd_bwd))
    return doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="llama3.1-8b", choices=sorted(MODELS))
    args = ap.parse_args()
    cfg = MODELS[args.model]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sampler = Sampler()
    sampler.start()
    layers = torch.nn.Sequential(*(Layer(**cfg) for _ in range(LAYERS)))
    doc = {"provenance": provenance(sampler), "model": dict(cfg, name=args.model, layers=LAYERS)}
    doc.update(sustained(layers, cfg, sampler), gqa_native=layers[0].gqa)
    if "vocab" in cfg:
        del layers
        torch.cuda.empty_cache()
        doc["head_and_loss"] = head_and_loss(cfg, sampler)
    sampler.stop()
    name = "gpu_layer.json" if args.model == "llama3.1-8b" else f"gpu_layer_{args.model}.json"
    (out / name).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: v for k, v in doc.items() if k not in ("series", "provenance")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
