"""Torch implementations of the op graph's kernels, one zero-argument callable per profiled work.

Each callable runs the kernel a training framework runs for that op and pass (GEMM and its two
backward GEMMs, fused scaled-dot-product attention, norms, activations, dropout-add, embedding,
fp32 cross-entropy, AdamW, host<->device copies); inputs are allocated once, outside the callable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..model.spec import ModelSpec

# Same dropout and optimizer settings as the tiny model trains with.
from .tiny_model import ADAM_BETAS, ADAM_EPS, GPT_HIDDEN_DROPOUT, LEARNING_RATE, NORM_EPS, WEIGHT_DECAY

if TYPE_CHECKING:  # profile imports this module: a type-only import
    from .profile import KernelSpec

_TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def torch_dtype(dtype: str):
    import torch

    try:
        return getattr(torch, _TORCH_DTYPES[dtype])
    except KeyError:
        raise ValueError(f"dtype {dtype!r} cannot be profiled; known: {', '.join(_TORCH_DTYPES)}") from None


def make_runner(spec: KernelSpec, device: str, dtype: str):
    """A callable running ``spec`` (profile.KernelSpec) once on ``device`` in ``dtype``."""
    import torch

    dt = torch_dtype(dtype)
    w, p = spec.work, spec.pass_
    kind = w.kind
    if kind == "gemm":
        return _gemm(w.shape, p, device, dt)
    if kind == "attention":
        return _attention(spec, device, dt)
    if kind == "optimizer":
        if w.name == "grad_norm":
            return _grad_norm(w.shape[0], w.bytes / w.shape[0], device)
        return _adam(w.shape[0], device, dt)
    if kind == "memcpy":
        return _copy(w.shape[0], p, device)
    tokens, width = w.shape
    if kind == "norm":
        return _norm(spec.model, tokens, width, p, device, dt)
    if kind == "embedding":
        return _embedding(spec.model, spec.tp, tokens, width, p, device, dt)
    if kind == "loss":
        return _loss(tokens, width, p, device, dt)
    if kind == "softmax":
        return _backward_or_forward(lambda x: torch.softmax(x, dim=-1), [_rand((tokens, width), device, dt)], p)
    if kind == "elementwise":
        return _elementwise(spec.model, w.name, tokens, width, p, device, dt)
    raise ValueError(f"op {w.name!r}: no kernel to profile for kind {kind!r}")


def _rand(shape, device, dt, grad: bool = False):
    import torch

    return torch.randn(*shape, device=device, dtype=dt, requires_grad=grad)


def _gemm(shape, p: str, device: str, dt):
    """Forward Y = X·W; backward dX = dY·W^T (input gradient) and dW = X^T·dY (weight gradient)."""
    import torch

    m, n, k = shape
    if p == "fwd":
        x, wt = _rand((m, k), device, dt), _rand((k, n), device, dt)
        return lambda: torch.matmul(x, wt)
    dy = _rand((m, n), device, dt)
    x, wt = _rand((m, k), device, dt), _rand((k, n), device, dt)
    if p == "bwd_input":
        return lambda: torch.matmul(dy, wt.t())
    if p == "bwd_weight":
        return lambda: torch.matmul(x.t(), dy)
    return lambda: (torch.matmul(dy, wt.t()), torch.matmul(x.t(), dy))


def _backward_or_forward(f, inputs: list, p: str):
    """Forward: f(*inputs). Backward: the autograd backward of f through a retained graph."""
    import torch

    if p == "fwd":
        def run():
            with torch.no_grad():
                return f(*inputs)
        return run
    leaves = [x.detach().requires_grad_(x.is_floating_point()) for x in inputs]
    out = f(*leaves)
    grad_out = torch.randn_like(out)
    wrt = [x for x in leaves if x.requires_grad]
    return lambda: torch.autograd.grad(out, wrt, grad_out, retain_graph=True)


def _attention(spec: KernelSpec, device: str, dt):
    """torch's fused scaled_dot_product_attention (FlashAttention-2 backend on CUDA where available),
    causal when queries and keys cover the same sequence; GQA shares K/V heads."""
    import torch.nn.functional as F

    b, heads, sq, skv, hd = spec.work.shape
    tp = max(1, spec.model.num_attention_heads // heads) if spec.model else 1
    kv = max(1, spec.model.num_kv_heads // tp) if spec.model else heads
    q = _rand((b, heads, sq, hd), device, dt)
    k, v = _rand((b, kv, skv, hd), device, dt), _rand((b, kv, skv, hd), device, dt)
    causal = sq == skv
    return _backward_or_forward(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=kv != heads),
        [q, k, v], "fwd" if spec.pass_ == "fwd" else "bwd")


def _norm(model: ModelSpec | None, tokens: int, width: int, p: str, device: str, dt):
    import torch
    import torch.nn.functional as F

    x, g = _rand((tokens, width), device, dt), torch.ones(width, device=device, dtype=dt)
    if model is not None and model.norm == "rmsnorm":
        return _backward_or_forward(lambda x, g: F.rms_norm(x, (width,), g, NORM_EPS), [x, g], p)
    bias = torch.zeros(width, device=device, dtype=dt)
    return _backward_or_forward(lambda x, g, b: F.layer_norm(x, (width,), g, b, NORM_EPS), [x, g, bias], p)


def _elementwise(model: ModelSpec | None, name: str, tokens: int, width: int, p: str, device: str, dt):
    import torch
    import torch.nn.functional as F

    mlp = model.mlp if model is not None else "gelu"
    if name.endswith("act"):  # the MLP kinds of model/spec.py; gated kinds read gate and up
        fn = {"gelu": F.gelu, "squared-relu": lambda x: F.relu(x) ** 2, "swiglu": F.silu, "geglu": F.gelu}[mlp]
        if mlp not in ("swiglu", "geglu"):
            return _backward_or_forward(fn, [_rand((tokens, width), device, dt)], p)
        return _backward_or_forward(lambda g, u: fn(g) * u,
                                    [_rand((tokens, width), device, dt), _rand((tokens, width), device, dt)], p)
    if name.endswith("residual"):
        x, a = _rand((tokens, width), device, dt), _rand((tokens, width), device, dt)
        if model is None or model.dropout:  # GPT: dropout on the branch, then the residual add
            return _backward_or_forward(lambda x, a: x + F.dropout(a, GPT_HIDDEN_DROPOUT, True), [x, a], p)
        return _backward_or_forward(lambda x, a: x + a, [x, a], p)
    if name == "rope":
        x = _rand((tokens, width), device, dt)
        cos, sin = _rand((tokens, width), device, dt), _rand((tokens, width), device, dt)

        def rope(x, cos, sin):
            x1, x2 = x.chunk(2, dim=-1)
            return x * cos + torch.cat((-x2, x1), dim=-1) * sin
        return _backward_or_forward(lambda x: rope(x, cos, sin), [x], p)
    return _backward_or_forward(lambda x: x * 2.0, [_rand((tokens, width), device, dt)], p)


def _embedding(model: ModelSpec | None, tp: int, tokens: int, width: int, p: str, device: str, dt):
    """Token (+ learned position) lookup; the backward scatter-adds into this rank's vocab slice."""
    import torch
    import torch.nn.functional as F

    vocab = -(-model.vocab_size // tp) if model is not None else 32000
    seq = model.seq_length if model is not None else tokens
    idx = torch.randint(0, vocab, (tokens,), device=device)
    pos = torch.arange(tokens, device=device) % seq
    table = _rand((vocab, width), device, dt)
    if model is not None and model.position_embedding == "learned":
        ptable = _rand((seq, width), device, dt)
        return _backward_or_forward(lambda t, pt: F.embedding(idx, t) + F.embedding(pos, pt), [table, ptable], p)
    return _backward_or_forward(lambda t: F.embedding(idx, t), [table], p)


def _loss(tokens: int, width: int, p: str, device: str, dt):
    """Cross-entropy over this rank's logits in fp32 (Megatron's vocab-parallel cross entropy)."""
    import torch
    import torch.nn.functional as F

    logits = _rand((tokens, width), device, dt)
    target = torch.randint(0, width, (tokens,), device=device)
    return _backward_or_forward(lambda z: F.cross_entropy(z.float(), target), [logits], p)


def _adam(params: int, device: str, dt):
    """The mixed-precision step of a flat shard, as the tiny model runs it: 16-bit gradients into fp32
    master gradients, AdamW on the fp32 master weights (fused kernel on CUDA, foreach on the CPU), the
    16-bit weights written back."""
    import torch

    cuda = device.startswith("cuda")
    w16, g16 = torch.zeros(params, device=device, dtype=dt), torch.randn(params, device=device, dtype=dt)
    w = torch.zeros(params, device=device, dtype=torch.float32, requires_grad=True)
    w.grad = torch.zeros_like(w)
    opt = torch.optim.AdamW([w], lr=LEARNING_RATE, betas=ADAM_BETAS, eps=ADAM_EPS, weight_decay=WEIGHT_DECAY,
                            fused=cuda, foreach=None if cuda else True)

    def step():
        w.grad.copy_(g16)
        opt.step()
        w16.copy_(w.detach())
    return step


def _grad_norm(params: int, bytes_per_param: float, device: str):
    """Gradient clipping's global norm over the shard (``strategy/grad_sync.optimizer_step``: Megatron's
    clip_grad_norm_fp32, a multi-tensor L2 norm reading every gradient once): one L2 reduction over a
    flat gradient in the dtype its bytes per parameter name (4: fp32 main grads, 2: bf16)."""
    import torch

    g = torch.randn(params, device=device, dtype=torch.float32 if bytes_per_param >= 4 else torch.bfloat16)
    return lambda: torch.linalg.vector_norm(g, 2.0, dtype=torch.float32)


def _copy(nbytes: int, direction: str, device: str):
    """Pinned host <-> device copy of ``nbytes`` (cudaMemcpyAsync)."""
    import torch

    if not device.startswith("cuda"):
        raise ValueError("host <-> device copies are profiled on CUDA only")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    if direction == "h2d":
        return lambda: dev.copy_(host, non_blocking=True)
    return lambda: host.copy_(dev, non_blocking=True)
