"""How a framework's kernels change the tensors a layer keeps for its backward: ``ActivationTerm`` (one
such tensor) and the variants of the per-tensor rule of ``activation_memory`` (eager PyTorch modules,
the K/V repeat before SDPA, FP8 linear layers' inputs).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..model.eager import EAGER_GATED_SAVED_EXTRA_PER_D, EAGER_RMSNORM_SAVED_EXTRA
from ..model.repeat_kv import repeats_kv
from ..model.spec import ModelSpec

# FP8 training (Transformer Engine): a linear layer keeps its weight-gradient input in FP8, one byte per
# element (TE 1.11 linear.py ``saved_inputmat``; layernorm_linear/_mlp.py: ``ln_out``, ``gelu_out`` in FP8);
# a BF16 tensor kept for another backward (the attention output) gets the FP8 copy on top. Block-scaled
# recipes' scales (MXFP8: one byte per 32 elements) are not counted.
FP8_SAVED_BYTES = 1
FP8_SAVED_INPUTS = ("qkv_input", "fc1_input", "fc2_input", "expert_fc1_input", "expert_fc2_input", "shared_fc2_input")
FP8_COPIED_INPUTS = ("proj_input",)


@dataclass(frozen=True, slots=True)
class ActivationTerm:
    """One tensor a layer keeps for its backward.

    ``modules``: the selective-recompute modules (``RECOMPUTE_MODULES``) that do not keep it, as
    Megatron-Core implements them (see ``activation_terms``); "core_attn" marks the attention core
    (scores, softmax, attention dropout), which fused attention kernels never store either.
    ``weight_grad``: needed by the weight-gradient GEMMs (the W pass of zero-bubble schedules): a
    weight GEMM's input X, or its output gradient dY, which the B pass creates and W consumes (Qi et
    al. 2024, sec. 2 and Table 1).
    """

    name: str
    bytes: float
    modules: tuple[str, ...] = ()
    weight_grad: bool = False
    stored_at_f: bool = True  # False: an output gradient allocated during B, kept until W


def repeated_kv_saved(terms: list[ActivationTerm], model: ModelSpec) -> list[ActivationTerm]:
    """What SDPA keeps beyond the K and V terms when a PyTorch module repeats them first (model/repeat_kv.py)
    and runs eagerly: the repeated K and V, a query block (the "q" term) each, in place of the "k" and "v"
    terms (which nothing else keeps: RoPE's and the repeat's backward need no input), counted as the
    difference. torch.compile's partitioner may keep the un-repeated tensors and repeat them again in the
    backward: not modelled."""
    if not repeats_kv(model):
        return []
    by_name = {x.name: x.bytes for x in terms}
    extra = 2 * by_name["q"] - by_name["k"] - by_name["v"]
    return [ActivationTerm("kv_repeated_extra", max(extra, 0.0))]


def eager_saved(terms: list[ActivationTerm], model: ModelSpec, d: int) -> list[ActivationTerm]:
    """The terms as eager PyTorch keeps them (model/eager.py): a residual-stream RMSNorm's fp32 input
    (qk and MLA latent norms not counted); a gated product's silu output, the product's size."""
    out = []
    for x in terms:
        out.append(x)
        if model.norm == "rmsnorm" and x.name in ("attn_norm_input", "mlp_norm_input"):
            out.append(ActivationTerm(x.name + "_eager_fp32", x.bytes * EAGER_RMSNORM_SAVED_EXTRA / d, ("layernorm",)))
        if model.gated_mlp and x.name.endswith("fc2_input"):
            out.append(replace(x, name=x.name + "_eager_silu", bytes=x.bytes * EAGER_GATED_SAVED_EXTRA_PER_D,
                               weight_grad=False))
    return out


def fp8_saved_inputs(terms: list[ActivationTerm], d: int) -> list[ActivationTerm]:
    """The terms as FP8 training keeps them (FP8_SAVED_INPUTS): the linear layers' inputs in FP8, and an
    FP8 copy of the attention output for the projection's weight gradient beside the BF16 one."""
    out = []
    for x in terms:
        if x.name in FP8_SAVED_INPUTS:
            x = replace(x, bytes=x.bytes * FP8_SAVED_BYTES / d)
        elif x.name in FP8_COPIED_INPUTS:
            out.append(replace(x, name=x.name + "_fp8", bytes=x.bytes * FP8_SAVED_BYTES / d))
            x = replace(x, weight_grad=False)
        out.append(x)
    return out
