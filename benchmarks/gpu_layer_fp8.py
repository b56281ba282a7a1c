"""Time FP8 transformer layers as Transformer Engine's delayed-scaling recipe runs them, on a CUDA GPU
under sustained load, beside the same layers in BF16: the kernel mix of an FP8 training step, whose
clock and GEMM rate ``gpu_kernels.py`` (each kernel alone) cannot show.

    python benchmarks/gpu_layer_fp8.py --out DIR [--casts triton|torch]
        [--model llama3.1-8b|llama3.1-70b-tp4|gpt3-175b-tp4 ...]

Each linear of ``gpu_layer.Layer`` (QKV, projection, fc1, fc2) runs as TE's ``Linear`` does on Hopper
with ``DelayedScaling`` (TE 1.x ``module/linear.py``; the scales come from an amax history, so they are
known before the cast): the BF16 input is cast to E4M3 with its transposed copy, the forward GEMM is
an FP8 TN GEMM with fast accumulation (``torch._scaled_mm``), the output gradient is cast to E5M2
with its transposed copy, and dgrad (dY W) and wgrad (dY^T X) are FP8 TN GEMMs with split
accumulation (TE ``_2X_ACC_DGRAD = _2X_ACC_WGRAD = True``). The weight and its transposed copy are
cast once (TE caches them across a step's micro-batches). Attention, norms, SwiGLU/GELU and the
residual adds stay in BF16, as under ``fp8_autocast``.

Transformer Engine is not installed on the lent machine, so its kernels are emulated. ``--casts
triton`` (default): TE's ``fp8_cast_transpose`` as one Triton kernel (reads the BF16 tensor, writes the
scaled FP8 copy and its transpose, folds the tile's amax into the tensor's). ``--casts torch``: torch's
cast and a transpose copy (a non-vectorized kernel for 1-byte elements, far slower than TE's). Both
differ from TE where TE's norm kernel writes FP8 itself (here the BF16 norm output is cast) and where
TE folds a bias gradient into the cast (here a separate sum): ``emulation_extra_bytes_per_layer``
counts those bytes so that the model can price exactly what ran. wgrad writes BF16 (no fp32
main-grad accumulation).

Writes ``DIR/gpu_layer_fp8_<model>.json`` (``..._torch-casts.json``) with the FP8 and the BF16 layer
(forward alone, then forward
+ backward back to back for ``gpu_layer.SUSTAIN_S`` at the power limit: median time per layer, SM
clock, power, and the kernels' device time by kind under torch.profiler) and prints it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from gpu_kernels import Sampler, provenance  # run as a script: benchmarks/ is on sys.path
from gpu_layer import LAYERS, MODELS, Layer, sustained

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


CASTS = "triton"  # or "torch": set by --casts


def _torch_quantize(t: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's own kernels: a cast (read 2, write 1 B) and a transpose copy (read 1, write 1 B), with a
    unit scale (a delayed scale is known before the cast, so the kernels are the same)."""
    q = t.to(dtype)
    return q, q.t().contiguous()


def _triton_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def cast_transpose(x_ptr, q_ptr, qt_ptr, scale_ptr, amax_ptr, M, N, BLOCK: tl.constexpr, E5M2: tl.constexpr):
        """TE's fp8_cast_transpose: one read of the BF16 tile, the scaled FP8 tile written row-wise and
        transposed, the tile's amax folded into the tensor's (atomic max)."""
        rm = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        rn = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        x = tl.load(x_ptr + rm[:, None] * N + rn[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.atomic_max(amax_ptr, tl.max(tl.max(tl.abs(x), 1), 0))
        y = x * tl.load(scale_ptr)
        q = y.to(tl.float8e5) if E5M2 else y.to(tl.float8e4nv)
        tl.store(q_ptr + rm[:, None] * N + rn[None, :], q, mask=mask)
        tl.store(qt_ptr + rn[None, :] * M + rm[:, None], q, mask=mask)

    return cast_transpose


_KERNEL: list = []


def _triton_quantize(t: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """One kernel as TE's cast-transpose: read 2 B, write 1 + 1 B per element (plus the amax)."""
    if not _KERNEL:
        _KERNEL.append(_triton_kernel())
    m, n = t.shape
    q = torch.empty((m, n), device=t.device, dtype=dtype)
    qt = torch.empty((n, m), device=t.device, dtype=dtype)
    scale = torch.ones((), device=t.device, dtype=torch.float32)
    amax = torch.zeros((), device=t.device, dtype=torch.float32)
    block = 64
    grid = ((m + block - 1) // block, (n + block - 1) // block)
    _KERNEL[0][grid](t, q, qt, scale, amax, m, n, BLOCK=block, E5M2=dtype == E5M2)
    return q, qt


def _quantize(t: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The row-wise FP8 copy of a 2-D BF16 tensor and its transposed copy (TN operands)."""
    return (_triton_quantize if CASTS == "triton" else _torch_quantize)(t.contiguous(), dtype)


class FP8LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w8, w8t, bias, one):  # noqa: D401 - autograd signature
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        x8, x8t = _quantize(x2, E4M3)
        y = torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one, bias=bias, out_dtype=torch.bfloat16,
                             use_fast_accum=True)
        ctx.save_for_backward(x8t, w8t, one)
        ctx.shape, ctx.has_bias = shape, bias is not None
        return y.view(*shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, dy):
        x8t, w8t, one = ctx.saved_tensors
        dy2 = dy.reshape(-1, dy.shape[-1])
        d8, d8t = _quantize(dy2, E5M2)
        dx = torch._scaled_mm(d8, w8t.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                              use_fast_accum=False)
        dw = torch._scaled_mm(d8t, x8t.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                              use_fast_accum=False)
        db = dy2.sum(0) if ctx.has_bias else None
        return dx.view(ctx.shape), None, None, db, None


class FP8Linear(torch.nn.Module):
    """A BF16 ``nn.Linear``'s weight (n, k) held as E4M3 and its transposed copy; a trainable BF16 bias."""

    def __init__(self, lin: torch.nn.Linear) -> None:
        super().__init__()
        w = lin.weight.detach()
        self.register_buffer("w8", w.to(E4M3))
        self.register_buffer("w8t", w.t().contiguous().to(E4M3))
        self.bias = lin.bias
        self.register_buffer("one", torch.ones((), device=w.device, dtype=torch.float32))

    def forward(self, x):
        return FP8LinearFn.apply(x, self.w8, self.w8t, self.bias, self.one)


def fp8_layer(cfg: dict) -> Layer:
    layer = Layer(**cfg)
    for name in ("qkv", "proj", "fc1", "fc2"):
        setattr(layer, name, FP8Linear(getattr(layer, name)))
    return layer


def emulation_extra_bytes(cfg: dict, casts: str) -> float:
    """Bytes per layer (forward + backward) the emulated casts move beyond the model's delayed-recipe
    kernels (model/fp8.py): TE's norms write FP8, so only a transpose (2 B per element) follows them,
    where here the BF16 norm output is cast and transposed (4 B with ``triton``, a 3 B cast and a 2 B
    transpose with ``torch``); every other cast-transpose is TE's 4 B in one kernel with ``triton``, a 3 B
    cast and a 2 B transpose with ``torch``; a biased linear's bias gradient, which TE's
    ``fp8_cast_transpose_bgrad`` folds into the cast, is a separate read of dY (2 B)."""
    tokens = cfg.get("mb", 1) * cfg["seq"]
    hd, tp = cfg["hidden"] // cfg["heads"], cfg["tp"]
    q, kv = cfg["heads"] // tp * hd, cfg["kv_heads"] // tp * hd
    fc1_out = (2 if cfg["mlp"] == "swiglu" else 1) * cfg["ffn"] // tp
    outputs = (q + 2 * kv, cfg["hidden"], fc1_out, cfg["hidden"])  # qkv, proj, fc1, fc2: dY widths
    norm_out, plain_in = 2 * cfg["hidden"], q + cfg["ffn"] // tp  # qkv, fc1 inputs; proj, fc2 inputs
    per_cast = 0 if casts == "triton" else 1
    per_elem = (2 + 3 * per_cast) * norm_out + per_cast * (plain_in + sum(outputs))
    per_elem += 2 * sum(outputs) if cfg["bias"] else 0
    return float(tokens * per_elem)


def run(cfg: dict, make, sampler: Sampler) -> dict:
    """``gpu_layer.sustained`` over LAYERS layers made by ``make``, freed afterwards."""
    layers = torch.nn.Sequential(*(make(cfg) for _ in range(LAYERS)))
    doc = sustained(layers, cfg, sampler)
    del layers
    torch.cuda.empty_cache()
    return doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", action="append", choices=sorted(MODELS))
    ap.add_argument("--casts", choices=("triton", "torch"), default="triton",
                    help="TE's cast-transpose as one Triton kernel, or torch's cast and transpose copy")
    args = ap.parse_args()
    global CASTS
    CASTS = args.casts
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sampler = Sampler()
    sampler.start()
    for name in args.model or ["llama3.1-8b"]:
        cfg = {k: v for k, v in MODELS[name].items() if k != "vocab"}
        doc = {"provenance": provenance(sampler), "model": dict(cfg, name=name, layers=LAYERS),
               "recipe": f"delayed, casts emulated with {args.casts} (benchmarks/gpu_layer_fp8.py docstring)",
               "casts": args.casts, "emulation_extra_bytes_per_layer": emulation_extra_bytes(cfg, args.casts)}
        doc["fp8"] = run(cfg, fp8_layer, sampler)
        doc["bf16"] = run(cfg, lambda c: Layer(**c), sampler)
        suffix = "" if args.casts == "triton" else "_torch-casts"
        (out / f"gpu_layer_fp8_{name}{suffix}.json").write_text(json.dumps(doc, indent=1) + "\n")
        brief = {p: {k: v for k, v in doc[p].items() if k != "series"} for p in ("fp8", "bf16")}
        print(json.dumps({"model": name, **brief}, indent=1), flush=True)
    sampler.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
