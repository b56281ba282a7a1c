"""Layer kernels as plain PyTorch modules run them (``training.kernels = "eager"``).

The op graph's norm, rotary embedding and activation are single fused kernels by default (Transformer
Engine, Megatron-Core's fused kernels, Apex, torch.compile). Frameworks that write the layer as plain
PyTorch modules and run it eagerly (torchtitan without ``compile``, Hugging Face ``LlamaForCausalLM``)
launch one kernel per tensor operation, each reading its inputs from HBM and writing its output. Each
rule below follows the module's source operation by operation; bytes are per element of the op's
(tokens, width) tensor, ``d`` the activation dtype's size; a kernel on a per-row tensor (the mean
square, its rsqrt) moves about nothing but is still launched.

- RMSNorm (torchtitan ``RMSNorm``: ``self._norm(x.float()).type_as(x) * self.weight`` with
  ``x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)``; Hugging Face ``LlamaRMSNorm`` runs the same
  ops). Forward, 8 kernels: cast to fp32 (d + 4), pow (8), mean (4), add eps and rsqrt (per row), x * rsqrt
  (8), cast back (4 + d), times the weight (2d): 28 + 4d. Backward, autograd in reverse, 13 kernels:
  the weight product's input gradient (2d) and weight gradient (product 3d, sum over tokens d), the
  cast's (d + 4), x * rsqrt's two gradients (8 and 8 + 4 + 4 for the per-row sum), rsqrt's (per row),
  mean's broadcast (4), pow's 2x (8) times the gradient (12), the two gradients of the fp32 x summed
  (12), the first cast's (4 + d): 68 + 8d.
  Autograd keeps the fp32 x (pow and the product) and the normalised bf16 tensor (the weight
  product) where the fused kernel keeps x: 4 bytes per element more (``EAGER_RMSNORM_SAVED_EXTRA``).
  LayerNorm is ``F.layer_norm``, one native kernel each way in PyTorch: as fused.
- Rotary embedding (torchtitan ``apply_rotary_emb``: ``view_as_complex(xq.float())`` times
  ``freqs_cis``, ``view_as_real``, ``type_as``), per q or k element: cast (d + 4), complex product (8),
  cast back (4 + d), 3 kernels per tensor, the same backward (the product's gradient by the conjugate
  frequencies); 16 + 2d each way. Hugging Face's ``rotate_half`` form moves 10d, the same at bf16.
  ``freqs_cis`` needs no gradient, so autograd keeps nothing for it.
- Gated MLP (torchtitan ``FeedForward``: ``w2(F.silu(w1(x)) * w3(x))``; Hugging Face ``LlamaMLP``), per
  output element: silu (2d) and the product (3d), 2 kernels; backward the product's two gradients (3d
  each) and silu's (3d), 3 kernels: 5d and 9d where the fused kernel moves 3d and 5d. The product keeps
  silu's output as well: d per element more (``EAGER_GATED_SAVED_EXTRA_PER_D``).
- Squared ReLU (``torch.relu(x) ** 2``): relu (2d) and pow (2d) forward, pow's (3d) and relu's (3d)
  backward, 2 kernels each way; autograd keeps relu's output instead of x: no more memory.
- GELU, the residual adds, dropout, the embedding: one PyTorch kernel each, as fused.
- The loss as ``F.cross_entropy`` on upcast logits (``training.cross_entropy = "torch"``, torchtitan and
  the calibration model; any ``kernels``), per logit: the upcast (d + 4), log_softmax, whose CUDA kernel
  (``cunn_SoftMaxForward``) reads a row longer than its shared memory three times (max, sum of exps,
  output) and writes it once (16), and nll_loss's gather: d + 20 in 3 kernels; backward nll_loss's
  zero-filled gradient (4) and scatter, log_softmax's backward reading the gradient twice (row sum,
  then with the output) and writing once (16), the cast back (4 + d): 24 + d in 4 kernels. Measured
  on the lent H100 (scenarios/calibration/h100/llama31-8b-4layers, 8192 x 128,256 logits): 9.15 ms
  forward, 9.07 backward, against 8.1 and 9.6 by this rule at the HBM rate (Megatron's loss rule,
  model/opgraph, gave 12.5 and 8.1).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from ..units import DTYPE_BYTES

if TYPE_CHECKING:  # opgraph imports this module inside build_op_graph
    from .opgraph import Op
    from .spec import ModelSpec

KERNEL_MODES = ("fused", "eager")
# training.cross_entropy: Megatron-Core's fused vocab-parallel loss, or PyTorch's F.cross_entropy
# (strategy/activation_memory.loss_backward_bytes)
CROSS_ENTROPY_IMPLS = ("fused", "torch")
# Bytes per element (forward, backward) and kernels (forward, backward), d = activation dtype bytes.
FP32 = DTYPE_BYTES["fp32"]


def rmsnorm_bytes(d: int) -> tuple[int, int]:
    return 28 + 4 * d, 68 + 8 * d


RMSNORM_KERNELS = (8, 13)
EAGER_RMSNORM_SAVED_EXTRA = FP32  # bytes per element of each RMSNorm's input, on top of the fused kernel's


def rope_bytes(d: int) -> tuple[int, int]:
    return 16 + 2 * d, 16 + 2 * d


ROPE_KERNELS_PER_TENSOR = 3  # q and k: two tensors
EAGER_GATED_SAVED_EXTRA_PER_D = 1  # elements of d bytes per gated-product element: silu's output


def gated_bytes(d: int) -> tuple[int, int]:
    return 5 * d, 9 * d


GATED_KERNELS = (2, 3)


def squared_relu_bytes(d: int) -> tuple[int, int]:
    return 4 * d, 6 * d


SQUARED_RELU_KERNELS = (2, 2)


def torch_cross_entropy_bytes(d: int) -> tuple[int, int]:
    return d + 20, 24 + d


TORCH_CROSS_ENTROPY_KERNELS = (3, 4)


def loss_parallel_cross_entropy_bytes(d: int) -> tuple[int, int]:
    """F.cross_entropy under loss parallel (TP > 1: the logits a DTensor sharded over the vocabulary),
    whose handlers (torch/distributed/tensor/parallel/loss.py) run decompositions of plain ops, per logit:
    forward the upcast (d + 4), ``_log_softmax``'s amax (4), ``x - x_max`` (8), ``exp`` (8), ``sum`` (4),
    ``shifted - logsumexp`` (8); backward ``_nll_loss_and_log_softmax_backward``'s ``zeros_like`` (4),
    ``exp(x)`` (8), the add (12), the product with the upstream gradient (8), then the cast back (4 + d).
    The per-token ops (the max and sum all-reduces, the target gather) are not counted."""
    return d + 36, 36 + d


LOSS_PARALLEL_CROSS_ENTROPY_KERNELS = (6, 5)


def is_loss_parallel(cross_entropy: str, tp: int) -> bool:
    """PyTorch's loss runs loss parallel under TP: torchtitan enables ``loss_parallel`` whenever TP is on
    (the output layer's logits a DTensor sharded over the vocabulary)."""
    return cross_entropy == "torch" and tp > 1


def eager_head(ops: tuple[Op, ...], model: ModelSpec, kernels: str, cross_entropy: str,
               loss_parallel: bool = False) -> tuple[Op, ...]:
    """The head's ops with eager PyTorch's norm (``kernels = "eager"``) and torch's loss
    (``cross_entropy = "torch"``; ``loss_parallel``: under TP), each where the scenario runs it."""
    ops = eager_layer(ops, model) if kernels == "eager" else ops
    return torch_loss(ops, loss_parallel) if cross_entropy == "torch" else ops


def torch_loss(ops: tuple[Op, ...], loss_parallel: bool = False) -> tuple[Op, ...]:
    """The head's loss ops as ``F.cross_entropy`` on upcast logits runs them (the module docstring), or
    its loss-parallel decomposition (``loss_parallel_cross_entropy_bytes``)."""
    rule, kernels = ((loss_parallel_cross_entropy_bytes, LOSS_PARALLEL_CROSS_ENTROPY_KERNELS) if loss_parallel
                     else (torch_cross_entropy_bytes, TORCH_CROSS_ENTROPY_KERNELS))
    out = []
    for op in ops:
        if op.kind == "loss":
            n = math.prod(op.shape)
            fwd, bwd = rule(op.dtype_bytes)
            op = replace(op, fwd_bytes=float(fwd * n), bwd_bytes=float(bwd * n), kernels=kernels)
        out.append(op)
    return tuple(out)


def _eager_op(op: Op, model: ModelSpec) -> Op:
    """``op`` as eager PyTorch runs it (the module docstring's rules); unchanged where one kernel."""
    d, n = op.dtype_bytes, math.prod(op.shape)  # a vector op's (tokens, width)
    if op.kind == "norm" and model.norm == "rmsnorm":
        (fwd, bwd), kernels = rmsnorm_bytes(d), RMSNORM_KERNELS
    elif op.name == "rope":
        (fwd, bwd), kernels = rope_bytes(d), (2 * ROPE_KERNELS_PER_TENSOR,) * 2
    elif op.name.endswith("act") and model.gated_mlp:
        (fwd, bwd), kernels = gated_bytes(d), GATED_KERNELS
    elif op.name.endswith("act") and model.mlp == "squared-relu":
        (fwd, bwd), kernels = squared_relu_bytes(d), SQUARED_RELU_KERNELS
    else:
        return op
    return replace(op, fwd_bytes=float(fwd * n), bwd_bytes=float(bwd * n), kernels=kernels)


def eager_layer(ops: tuple[Op, ...], model: ModelSpec) -> tuple[Op, ...]:
    """A layer's ops with the norm, rotary embedding and activation kernels of eager PyTorch."""
    return tuple(_eager_op(op, model) for op in ops)
