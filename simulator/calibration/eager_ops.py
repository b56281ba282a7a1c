"""The Llama layer's small ops as torchtitan writes them in plain PyTorch, for the calibration model.

``training.kernels = "eager"`` prices the norm, rotary embedding and gated MLP as torchtitan's modules
launch them (model/eager.py counts their kernels and bytes from that source). When ``calibrate
profile`` trains such a scenario, its model (tiny_model.py) runs these same operations, so that
``calibrate compare`` measures exactly what those rules describe. Our own code, following the
operations of torchtitan's ``torchtitan/models/norms.py`` (``RMSNorm``) and
``torchtitan/models/llama/model.py`` (``precompute_freqs_cis``, ``apply_rotary_emb``, ``repeat_kv``,
``FeedForward``) at commit 9dec370, the one its December 2024 benchmarks name. torch is imported
inside the functions only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import nn

# Llama 3's rotary base (Hugging Face Llama 3.1 config: rope_theta 500000); torchtitan's llama3 configs
# use the same. A different base changes no kernel, only the angles.
ROPE_THETA = 500000.0


def rms_norm_class():
    """torchtitan's RMSNorm: normalise in fp32, cast back, times the weight (8 kernels forward)."""
    import torch
    from torch import nn

    class EagerRMSNorm(nn.Module):
        def __init__(self, dim: int, eps: float) -> None:
            super().__init__()
            self.eps = eps
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight

    return EagerRMSNorm


def freqs_cis(head_dim: int, seq_length: int, theta: float = ROPE_THETA) -> torch.Tensor:
    """(seq, head_dim / 2) complex64 rotations, as torchtitan's ``precompute_freqs_cis``."""
    import torch

    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    angles = torch.outer(torch.arange(seq_length), freqs).float()
    return torch.polar(torch.ones_like(angles), angles)


def rotary(x: torch.Tensor, cis: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of a (batch, seq, heads, head_dim) tensor by complex multiplication: cast to
    fp32, multiply pairs by ``cis``, cast back (torchtitan's ``apply_rotary_emb``, one tensor)."""
    import torch

    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * cis[: x.shape[1]].view(1, x.shape[1], 1, -1)).flatten(3).type_as(x)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(batch, seq, kv_heads, head_dim) -> (batch, seq, kv_heads * n_rep, head_dim), materialised: the
    grouped K and V copied for every query head before the attention (torchtitan's ``repeat_kv``)."""
    if n_rep == 1:
        return x
    b, s, kv, hd = x.shape
    return x[:, :, :, None, :].expand(b, s, kv, n_rep, hd).reshape(b, s, kv * n_rep, hd)


def gated_projections(h: int, ffn: int, bias: bool) -> tuple[nn.Module, nn.Module]:
    """The gated MLP's two input projections w1 (gate) and w3 (up), separate GEMMs as torchtitan's
    ``FeedForward`` (the op graph's one fc1 of twice the width, same FLOPs)."""
    from torch import nn

    return nn.Linear(h, ffn, bias=bias), nn.Linear(h, ffn, bias=bias)
