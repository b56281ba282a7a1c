"""benchmarks/mpt_triton_attention.py computes attention and its gradients (Triton's CPU interpreter).

The kernel the H100 timed for MPT's ``attn_impl: triton`` must be attention, or its times mean nothing:
forward and both backward strategies against PyTorch's reference, causal and not, in float16 (the
interpreter has no bfloat16). Skips without torch and triton (CI installs neither)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CHECK = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import torch
import mpt_triton_attention as m
torch.manual_seed(0)
b, s, h, d = 1, 256, 2, 128
q, k, v, do = (torch.randn(b, s, h, d, dtype=torch.float16) for _ in range(4))
errors = {}
for causal in (True, False):
    out, lse = m.forward(q, k, v, causal)
    qf, kf, vf = (x.float().transpose(1, 2).requires_grad_() for x in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, is_causal=causal)
    ref.backward(do.float().transpose(1, 2))
    errors[f"out causal={causal}"] = (out.float().transpose(1, 2) - ref).abs().max().item()
    for sp in (True, False):
        grads = m.backward(do, q, k, v, out, lse, causal, sp)
        for name, g, r in zip(("dq", "dk", "dv"), grads, (qf.grad, kf.grad, vf.grad)):
            errors[f"{name} causal={causal} sp={sp}"] = (g.float().transpose(1, 2) - r).abs().max().item()
print(json.dumps(errors))
"""


def test_kernel_matches_pytorch_attention():
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, "-c", CHECK, str(ROOT / "benchmarks")], env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    errors = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(errors) == 14
    assert max(errors.values()) < 5e-3, errors  # float16 rounding of O(1) values
