"""A few-layer GPT (or Llama-style) decoder in plain torch, built from a scenario's ModelSpec and trained
for a few steps under torch.profiler, writing a real Chrome/Kineto trace of the machine at hand.

Every op region carries a ``sim:<microbatch>:<layer>:<op>`` annotation named after the op graph's ops
(``model/opgraph``), so ``calibrate compare`` maps measured kernels to simulated ops exactly. torch is
imported inside the functions only.
"""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from ..model.spec import ModelSpec
from .eager_ops import freqs_cis, gated_projections, repeat_kv, rms_norm_class, rotary
from .kineto import ANNOTATION_PREFIX

if TYPE_CHECKING:  # type-only: torch is imported inside the functions, scenario where a command loads one
    from torch import nn

    from ..scenario import Scenario

# GPT-2/3 and Megatron train with hidden (residual) dropout 0.1 (Radford et al. 2019; Brown et al. 2020;
# Megatron-LM --hidden-dropout default); Llama trains without dropout (Touvron et al. 2023).
GPT_HIDDEN_DROPOUT = 0.1
# AdamW hyper-parameters of GPT-3 (Brown et al. 2020, App. B): beta2 0.95, eps 1e-8, weight decay 0.1.
ADAM_BETAS = (0.9, 0.95)
ADAM_EPS = 1e-8
WEIGHT_DECAY = 0.1
LEARNING_RATE = 1e-4
# LayerNorm / RMSNorm epsilon of GPT-2 and Llama configs (1e-5).
NORM_EPS = 1e-5
# Weight init N(0, 0.02) (GPT-2, Radford et al. 2019; Megatron-LM --init-method-std default). torch's
# default N(0, 1) embeddings give logits of std ~sqrt(h), whose softmax underflows into denormals that
# are slow on CPUs and would distort the CPU trace.
INIT_STD = 0.02
# Unrecorded steps before the profiled ones: the first steps allocate and warm caches (torch.profiler's
# schedule(wait, warmup, active) recipe in its documentation uses warmup=1..2).
WARMUP_STEPS = 2


def _tag(mb: int, layer: int, op: str) -> str:
    return f"{ANNOTATION_PREFIX}{mb}:{layer}:{op}"


def _check_buildable(spec: ModelSpec) -> None:
    """The tiny model builds dense GPT / Llama layers only; anything else is one clear error."""
    if spec.is_moe:
        raise ValueError(f"model {spec.name}: the tiny model has no MoE layers (num_experts = {spec.num_experts})")
    for key, value, plain in (("head_dim", spec.q_size, spec.hidden_size), ("qk_norm", spec.qk_norm, False),
                              ("sandwich_norm", spec.sandwich_norm, False), ("sliding_window", spec.sliding_window, 0),
                              ("kv_lora_rank", spec.kv_lora_rank, 0), ("qkv_bias", spec.qkv_bias, spec.bias)):
        if value != plain:
            raise ValueError(f"model {spec.name}: the tiny model does not build model.{key} = "
                             f"{getattr(spec, key)!r}")


def _norm(spec: ModelSpec, eager: bool = False):
    from torch import nn

    h = spec.hidden_size
    if spec.norm == "layernorm":
        return nn.LayerNorm(h, eps=NORM_EPS)
    return rms_norm_class()(h, NORM_EPS) if eager else nn.RMSNorm(h, eps=NORM_EPS)


def _rope(x, cos, sin, hd: int):
    """Rotary embedding, rotate-half form (Su et al. 2021; GPT-NeoX / Llama implementation)."""
    import torch

    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def _activate(act, y, gated: bool):
    """The MLP's activation on fc1's output: plain kinds on all of it, gated ones on its gate half times the
    up half."""
    if not gated:
        return act(y)
    gate, up = y.chunk(2, dim=-1)
    return act(gate) * up


def _block_class(spec: ModelSpec, eager: bool = False):
    """One decoder layer; every op region annotated ``sim:<microbatch>:<layer>:<op>`` (eager: _eager_block)."""
    import torch.nn.functional as F
    from torch import nn
    from torch.profiler import record_function

    h, heads, kv, hd = spec.hidden_size, spec.num_attention_heads, spec.num_kv_heads, spec.head_dim
    p_drop = GPT_HIDDEN_DROPOUT if spec.dropout else 0.0
    # the MLP kinds of model/spec.py: plain kinds act on fc1's output, gated ones on its gate half
    act = {"gelu": F.gelu, "squared-relu": lambda x: F.relu(x) ** 2, "swiglu": F.silu, "geglu": F.gelu}[spec.mlp]

    class Block(nn.Module):
        def __init__(self, index: int) -> None:
            super().__init__()
            self.index = index
            self.ln1, self.ln2 = _norm(spec, eager), _norm(spec, eager)
            bias = bool(spec.bias)  # ModelSpec resolves None to the style's default
            self.qkv = nn.Linear(h, h + 2 * kv * hd, bias=bias)
            self.attn_out = nn.Linear(h, h, bias=bias)
            self.fc1 = nn.Linear(h, (spec.mlp_matrices - 1) * spec.ffn_hidden_size, bias=bias)
            self.fc2 = nn.Linear(spec.ffn_hidden_size, h, bias=bias)

        def forward(self, x, mb: int, rot):
            return self._mlp(self._attention(x, mb, rot), mb)

        def _attention(self, x, mb: int, rot):
            b, s, _ = x.shape
            with record_function(_tag(mb, self.index, "ln1")):
                y = self.ln1(x)
            with record_function(_tag(mb, self.index, "qkv")):
                q, k, v = self.qkv(y).split([h, kv * hd, kv * hd], dim=-1)
                q, k, v = (t.view(b, s, n, hd).transpose(1, 2) for t, n in ((q, heads), (k, kv), (v, kv)))
            if rot is not None:
                with record_function(_tag(mb, self.index, "rope")):
                    q, k = (_rope(t, rot[0], rot[1], hd) for t in (q, k))
            if kv != heads:  # GQA: K and V copied to every query head, as the scenario's "sdpa" module says
                with record_function(_tag(mb, self.index, "kv_repeat")):  # model/repeat_kv.py's op
                    k, v = (repeat_kv(t.transpose(1, 2), heads // kv).transpose(1, 2) for t in (k, v))
            with record_function(_tag(mb, self.index, "attn_core")):
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                a = a.transpose(1, 2).reshape(b, s, h)
            with record_function(_tag(mb, self.index, "attn_out")):
                a = self.attn_out(a)
            with record_function(_tag(mb, self.index, "attn_residual")):
                return x + F.dropout(a, p_drop, self.training)

        def _mlp(self, x, mb: int):
            with record_function(_tag(mb, self.index, "ln2")):
                y = self.ln2(x)
            with record_function(_tag(mb, self.index, "fc1")):
                y = self.fc1(y)
            with record_function(_tag(mb, self.index, "act")):
                y = _activate(act, y, spec.gated_mlp)
            with record_function(_tag(mb, self.index, "fc2")):
                y = self.fc2(y)
            with record_function(_tag(mb, self.index, "mlp_residual")):
                return x + F.dropout(y, p_drop, self.training)

    return _eager_block(Block, spec, act) if eager else Block


def _eager_block(block: type, spec: ModelSpec, act) -> type:
    """``block`` for ``training.kernels = "eager"`` on a Llama-style layer: torchtitan's separate q/k/v
    and w1/w3 projections, fp32 RMSNorm, complex rotary embedding in the (batch, seq, heads, head_dim)
    layout, K/V repeated to every query head (eager_ops.py: the operations model/eager.py prices)."""
    import torch.nn.functional as F
    from torch.profiler import record_function

    h, heads, kv, hd = spec.hidden_size, spec.num_attention_heads, spec.num_kv_heads, spec.head_dim
    bias = bool(spec.bias)

    class EagerBlock(block):
        def __init__(self, index: int) -> None:
            super().__init__(index)
            from torch import nn

            del self.qkv, self.fc1
            self.wq, self.wk, self.wv = (nn.Linear(h, n * hd, bias=bias) for n in (heads, kv, kv))
            self.w1, self.w3 = gated_projections(h, spec.ffn_hidden_size, bias)

        def _attention(self, x, mb: int, cis):
            b, s, _ = x.shape
            with record_function(_tag(mb, self.index, "ln1")):
                y = self.ln1(x)
            with record_function(_tag(mb, self.index, "qkv")):
                q, k, v = (w(y).view(b, s, n, hd) for w, n in ((self.wq, heads), (self.wk, kv), (self.wv, kv)))
            with record_function(_tag(mb, self.index, "rope")):
                q, k = rotary(q, cis), rotary(k, cis)
            with record_function(_tag(mb, self.index, "kv_repeat")):  # model/repeat_kv.py's op
                k, v = repeat_kv(k, heads // kv), repeat_kv(v, heads // kv)
            with record_function(_tag(mb, self.index, "attn_core")):
                a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                   is_causal=True)
                a = a.transpose(1, 2).reshape(b, s, h)
            with record_function(_tag(mb, self.index, "attn_out")):
                a = self.attn_out(a)
            with record_function(_tag(mb, self.index, "attn_residual")):
                return x + a

        def _mlp(self, x, mb: int):
            with record_function(_tag(mb, self.index, "ln2")):
                y = self.ln2(x)
            with record_function(_tag(mb, self.index, "fc1")):
                gate, up = self.w1(y), self.w3(y)
            with record_function(_tag(mb, self.index, "act")):
                y = act(gate) * up
            with record_function(_tag(mb, self.index, "fc2")):
                y = self.fc2(y)
            with record_function(_tag(mb, self.index, "mlp_residual")):
                return x + y

    return EagerBlock


def _init_weights(model: nn.Module, spec: ModelSpec, eager: bool) -> None:
    """N(0, INIT_STD) Linear and Embedding weights, zero biases; the rotate-half form's cos / sin buffers
    (``eager`` models rotate by torchtitan's complex ``cis``, set in build_model)."""
    import torch
    from torch import nn

    for mod in model.modules():
        if isinstance(mod, (nn.Linear, nn.Embedding)):
            nn.init.normal_(mod.weight, 0.0, INIT_STD)
            bias = getattr(mod, "bias", None)
            if isinstance(bias, torch.Tensor):
                nn.init.zeros_(bias)
    if model.wpe is None and not eager:
        hd = spec.head_dim
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        ang = torch.outer(torch.arange(spec.seq_length, dtype=torch.float32), inv)
        ang = torch.cat((ang, ang), dim=-1)
        model.register_buffer("cos", ang.cos(), persistent=False)
        model.register_buffer("sin", ang.sin(), persistent=False)


def build_model(spec: ModelSpec, device: str, eager: bool = False):
    """The decoder as a torch.nn.Module whose forward(idx, targets, mb) returns the mean loss; ``eager``:
    a Llama layer's small ops as torchtitan writes them (``training.kernels = "eager"``)."""
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.profiler import record_function

    _check_buildable(spec)
    eager = eager and spec.gated_mlp and spec.position_embedding == "rope"  # torchtitan's ops: Llama layers
    h = spec.hidden_size
    block = _block_class(spec, eager)

    class TinyGPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(spec.vocab_size, h)
            self.wpe = nn.Embedding(spec.seq_length, h) if spec.position_embedding == "learned" else None
            self.blocks = nn.ModuleList(block(i) for i in range(spec.num_layers))
            self.final_norm = _norm(spec, eager)
            self.lm_head = nn.Linear(h, spec.vocab_size, bias=False)
            if spec.tie_embeddings:
                self.lm_head.weight = self.wte.weight
            _init_weights(self, spec, eager)

        def forward(self, idx, targets, mb: int = 0, scale: float = 1.0):
            with record_function(_tag(mb, -1, "embed")):
                x = self.wte(idx)
                if self.wpe is not None:
                    x = x + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            rot = None if self.wpe is not None else self.cis if eager else (self.cos.to(x.dtype), self.sin.to(x.dtype))
            for blk in self.blocks:
                x = blk(x, mb, rot)
            with record_function(_tag(mb, -1, "final_norm")):
                x = self.final_norm(x)
            with record_function(_tag(mb, -1, "lm_head")):
                logits = self.lm_head(x)
            with record_function(_tag(mb, -1, "loss")):
                # fp32 cross-entropy, as Megatron's vocab-parallel cross entropy
                # (the mean over the micro-batches of a step folded into the loss, as Megatron scales it)
                return F.cross_entropy(logits.float().view(-1, spec.vocab_size), targets.view(-1)) * scale

    model = TinyGPT().to(device)
    # complex64 rotations as a plain attribute, not a buffer: the model's cast to bf16 must not touch them
    if eager:
        model.cis = freqs_cis(spec.head_dim, spec.seq_length).to(device)
    return model


def _mixed_precision_adamw(model: nn.Module, cuda: bool):
    """Megatron-style mixed precision (Micikevicius et al. 2018; Megatron's Float16OptimizerWithFloat16Params):
    16-bit parameters and kernels, fp32 master weights and gradients for AdamW, no per-op casts."""
    import torch

    params = [p for p in model.parameters()]
    master = [p.detach().float().requires_grad_(True) for p in params]
    for m in master:
        m.grad = torch.zeros_like(m)
    opt = torch.optim.AdamW(master, lr=LEARNING_RATE, betas=ADAM_BETAS, eps=ADAM_EPS,
                            weight_decay=WEIGHT_DECAY, fused=cuda, foreach=None if cuda else True)
    return params, master, opt


def train_profiled(scn: Scenario, device: str, out_path: str | Path, steps: int = 3, warmup: int = WARMUP_STEPS,
                   seed: int = 0) -> Path:
    """Train ``scn``'s model for warmup + steps optimizer steps (each: all micro-batches of the global
    batch, then AdamW) under torch.profiler; the last ``steps`` are recorded. Returns the trace path
    (gzip-compressed when ``out_path`` ends with .gz)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    if scn.parallel.num_gpus != 1:
        raise ValueError(f"the tiny model trains on one device; scenario {scn.name} has "
                         f"{scn.parallel.num_gpus} GPUs (tp*pp*dp*cp)")
    if steps < 1 or warmup < 0:
        raise ValueError(f"steps must be >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")
    torch.manual_seed(seed)
    spec, tr = scn.model, scn.training
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(tr.dtype)
    if dt is None:
        raise ValueError(f"training.dtype {tr.dtype!r}: the tiny model trains in bf16 or fp16")
    model = build_model(spec, device, eager=tr.kernels == "eager").to(dt)
    cuda = device.startswith("cuda")
    params, master, opt = _mixed_precision_adamw(model, cuda)
    n_mb = scn.num_microbatches
    batches = [(torch.randint(0, spec.vocab_size, (tr.micro_batch_size, spec.seq_length), device=device),
                torch.randint(0, spec.vocab_size, (tr.micro_batch_size, spec.seq_length), device=device))
               for _ in range(n_mb)]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    raw = out_path.with_name(out_path.name.removesuffix(".gz")) if out_path.name.endswith(".gz") else out_path
    sched = schedule(wait=0, warmup=warmup, active=steps, repeat=1)
    # record_shapes: every op's Input Dims go into the trace, which ``calibrate fit`` and ``compare``
    # match against the op graph's shapes (the annotations already name the ops of our own model)
    with profile(activities=activities, schedule=sched, record_shapes=True,
                 on_trace_ready=lambda p: p.export_chrome_trace(str(raw))) as prof:
        for _ in range(warmup + steps):
            for mb, (x, y) in enumerate(batches):
                model(x, y, mb, scale=1.0 / n_mb).backward()
            with record_function(_tag(-1, -1, "adam")), torch.no_grad():
                torch._foreach_copy_([m.grad for m in master], [p.grad for p in params])
                opt.step()
                torch._foreach_copy_(params, master)
            for p in params:
                p.grad = None
            if cuda:
                torch.cuda.synchronize()
            prof.step()
    if raw != out_path:
        with open(raw, "rb") as src, gzip.open(out_path, "wb") as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()
    return out_path
