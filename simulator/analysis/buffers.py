"""Per-rank memory allowances that do not follow the schedule: the CUDA context, NCCL's buffers, DeepSpeed's
reduce bucket or FSDP's reduce-scatter input, Transformer Engine's FP8 weight cache and the ZeRO-3 gathered
layers (``static_buffers``), and the parameter counts they are made of. ``analysis/memory`` adds them to the
simulated timeline's peak.
"""

from __future__ import annotations

import functools

from ..model.fp8 import fp8_transposes, is_fp8_linear, weight_copy_bytes_per_param
from ..model.opgraph import build_op_graph
from ..model.spec import ModelSpec
from ..scenario import ParallelSpec, Scenario
from ..strategy.sharding import layer_params_per_rank, layer_submodules, params_per_rank
from ..strategy.stage_units import layout_copies, stage_layout
from ..strategy.zero_impl import DEEPSPEED, deepspeed_live_params, pipelined_fsdp2
from ..units import DTYPE_BYTES, MiB

# ---- constants, each with its source ----------------------------------------------------------
# FP8 training (Transformer Engine) keeps the weights in bf16 and casts them to FP8 per GEMM
# (Micikevicius et al. 2022, "FP8 Formats for Deep Learning", sec. 4; TE's fp8_autocast), unless
# ``training.fp8_params`` stores them in FP8 (``TrainingSpec.param_bytes``), and keeps each linear
# layer's weight quantized in both usages across micro-batches (TE Linear's weight workspaces), bytes
# per parameter by scaling recipe: model/fp8.py WEIGHT_COPY_BYTES (2 for the per-tensor recipes: the
# FP8 weight and its transpose; the transpose alone with fp8_params).
FP8_WEIGHT_COPY_BYTES = weight_copy_bytes_per_param("delayed")
# CUDA context with lazy module loading (CUDA >= 11.7, PyTorch's default): "around 400MB"
# (PyTorch maintainers, pytorch/pytorch#109888; #86509 measured 287 MB for a minimal program).
CUDA_CONTEXT_BYTES = 400 * MiB
# NCCL receive buffers per channel and peer, one per protocol (NCCL src/init.cc defaults):
# Simple DEFAULT_BUFFSIZE = 4 MiB; LL128 = 120 elems/thread x 640 threads x 8 steps x 8 B;
# LL = 8 lines/thread x 512 threads x 8 steps x 16 B.
NCCL_CHANNEL_BUFFER_BYTES = 4 * MiB + 120 * 640 * 8 * 8 + 8 * 512 * 8 * 16
# Channels per communicator: the MAXCHANNELS cap of NCCL 2.x, 32 (src/include/device.h; newer
# releases allow 64). An upper bound: NCCL opens fewer on some topologies, and an OOM verdict
# should rather warn than miss.
NCCL_CHANNELS = 32
# DeepSpeed ZeRO-2/3 reduce gradients through a bucket of reduce_bucket_size = 5e8 elements
# (DeepSpeed configuration docs, zero_optimization.reduce_bucket_size default). Megatron-LM's DDP
# and distributed optimizer (zero_stage <= 1) reduce in place: buckets are views into the contiguous
# grad buffer (megatron/core/distributed/param_and_grad_buffer.py), no extra memory. FSDP has no such
# bucket: it reduce-scatters each unit's gradients from a copy of them in its reduce dtype (FSDP1
# FlatParamHandle's cast to reduce_dtype; FSDP2 foreach_reduce's reduce_scatter_input), one unit at a
# time (``fsdp_reduce_input_bytes``); under torch's pipelining that happens after the stage's last
# backward, off the activation peak, and the accumulated gradients are model state.
ZERO_REDUCE_BUCKET_ELEMENTS = 5e8
# FSDP holds the full (TP-sharded) parameters of the layer being computed plus the prefetched next
# one (FSDP forward/backward prefetch of one unit, PyTorch FSDP docs), and the layer's unsharded
# gradient until its reduce-scatter. DeepSpeed gathers per submodule (``zero3_gathered_bytes``).
ZERO3_GATHERED_LAYERS = 2


def layer_param_counts(model: ModelSpec, tp: int, ep: int = 1, etp: int = 0) -> dict:
    """{"dense", "expert"} parameters of one of the model's main layers on one (tp, ep) rank, by the
    one counter (``strategy.sharding.params_per_rank``; the layout: ``strategy.stage_units``). A new
    dict per call, counted once per (model, tp, ep, etp) (the search asks it for every ZeRO-3 plan)."""
    return dict(_layer_param_counts(model, tp, ep, etp))


@functools.lru_cache(maxsize=64)
def _layer_param_counts(model: ModelSpec, tp: int, ep: int, etp: int) -> tuple:
    return tuple(params_per_rank(build_op_graph(model, 1, "bf16"), tp, ep, 1, False, False, etp).items())


def static_buffers(scn: Scenario, counts: dict, stage: int, trace_has_buffers: bool = False) -> dict:
    """Allowances that do not follow the schedule, bytes on one rank of pipeline ``stage`` (see the
    constants above): CUDA context, NCCL buffers of every communicator the rank uses (DualPipe's copy
    pair included), DeepSpeed's ZeRO-2/3 reduce bucket or FSDP's reduce-scatter input, Transformer Engine's
    FP8 weight cache and the ZeRO-3 gathered layers, unless the trace carries buffer deltas (the gathers
    themselves)."""
    par, tr = scn.parallel, scn.training
    groups = sum(1 for size in (par.tp, par.cp, par.pp, par.dp * par.cp, par.ep) if size > 1)
    groups += par.pp > 1 and layout_copies(par) > 1  # DualPipe's pair summing the copies' gradients
    out = {"cuda_context": float(CUDA_CONTEXT_BYTES),
           "nccl": float(groups * NCCL_CHANNELS * NCCL_CHANNEL_BUFFER_BYTES)}
    params = counts.get("dense", 0) + counts.get("expert", 0)
    if par.zero_stage >= 2 and par.dp * par.cp > 1:
        if par.sharding in DEEPSPEED:
            out["dp_bucket"] = min(ZERO_REDUCE_BUCKET_ELEMENTS, params) * tr.grad_dtype_bytes
        elif par.zero_stage == 2 and not pipelined_fsdp2(par):  # ZeRO-3's is in zero3_gathered
            out["fsdp_reduce_input"] = fsdp_reduce_input_bytes(scn)
    if tr.dtype == "fp8" and par.zero_stage < 3:
        # Transformer Engine caches each FP8 linear layer's quantized weight in both usages across the
        # micro-batches of a step (``is_first_microbatch``): 1 + 1 B per parameter of those layers, plus the
        # block recipes' scales; with fp8_params the FP8 copy is the parameter itself: only its transpose
        # is cached. (ZeRO-3 gathers a layer's weights per use: no persistent copy.)
        copies = weight_copy_bytes_per_param(tr.fp8_recipe, fp8_transposes(scn.cluster.gpu.architecture))
        out["fp8_weight_cache"] = fp8_linear_params(scn, stage) * (copies - tr.fp8_params)
    if par.zero_stage >= 3 and not trace_has_buffers and par.dp * par.cp > 1 and not pipelined_fsdp2(par):
        out["zero3_gathered"] = zero3_gathered_bytes(scn)
    return out


def fp8_linear_params(scn: Scenario, stage: int) -> int:
    """Parameters one rank of pipeline ``stage`` holds in Transformer Engine linear modules: the column-,
    row-parallel and expert GEMMs of its layers (``model.fp8.is_fp8_linear``), their biases included (a
    1/hidden share), what TE's FP8 weight cache copies. The word embedding, the output layer (Megatron-
    Core's own ColumnParallelLinear, outside ``fp8_autocast``; torchtitan's float8 conversion skips
    ``output``), the norms and the router stay BF16 and are not cached."""
    return _fp8_linear_params_per_stage(scn.model, scn.parallel)[stage]


def fp8_params_bf16_bytes(scn: Scenario, counts: dict, stage: int) -> float:
    """With ``training.fp8_params`` only TE's linear weights are stored in FP8 (``TrainingSpec.param_bytes``,
    1 B); the rank's other parameters (``counts`` less ``fp8_linear_params``: embedding, output layer,
    norms, router) stay BF16: the byte each of them lacks there. fp8_params needs ZeRO <= 1, so
    parameters are whole on every rank."""
    if not scn.training.fp8_params:
        return 0.0
    rest = counts.get("dense", 0) + counts.get("expert", 0) - fp8_linear_params(scn, stage)
    return float(rest * (DTYPE_BYTES["bf16"] - scn.training.param_bytes))


@functools.lru_cache(maxsize=64)
def _fp8_linear_params_per_stage(model: ModelSpec, par: ParallelSpec) -> tuple[int, ...]:
    """``fp8_linear_params`` of every pipeline stage, each layer template (dense first layers, MoE layers,
    an MTP module) counted once: memory_report asks it for every simulated rank."""
    graph = build_op_graph(model, 1, "bf16")  # parameters depend on neither micro-batch nor dtype
    layout = stage_layout(par, model.mtp_layers)
    kinds: dict = {}

    def layer(i: int) -> int:
        ops = graph.layer_ops(i)
        if id(ops) not in kinds:
            kinds[id(ops)] = sum(layer_params_per_rank(tuple(filter(is_fp8_linear, ops)), par.tp, par.ep, par.etp))
        return kinds[id(ops)]
    return tuple(sum(layer(u) for vs in layout.held(s) for u in layout.units(vs) if isinstance(u, int))
                 for s in range(par.pp))


def zero3_gathered_bytes(scn: Scenario) -> float:
    """Parameters gathered at once and the unsharded gradient they produce, bytes on one rank. FSDP:
    ZERO3_GATHERED_LAYERS layers and one layer's gradient. DeepSpeed (``zero_impl.deepspeed_live_params``):
    the submodules its prefetch rule holds at once, the largest submodule's gradient until its bucket
    takes it, and for the 2021 engine ProcessGroupNCCL's flattened output beside the gathered buffer
    (one more largest fetch, freed after the copy-out)."""
    par, tr = scn.parallel, scn.training
    pbytes = tr.param_bytes
    if par.sharding not in DEEPSPEED:
        layer = layer_param_counts(scn.model, par.tp, par.ep, par.etp)
        return (layer["dense"] + layer["expert"]) * ZERO3_GATHERED_LAYERS * pbytes + fsdp_reduce_input_bytes(scn)
    graph = build_op_graph(scn.model, tr.micro_batch_size, tr.dtype, tr.fp8_recipe, tr.attention, tr.kernels,
                           tr.cross_entropy)
    kinds = {tuple(subs) for subs in layer_submodules(graph, par.tp, par.ep)}
    live, largest = (max(v) for v in zip(*(deepspeed_live_params(k) for k in kinds)))
    flat = largest * pbytes if par.sharding == "deepspeed-2021" else 0.0
    return live * pbytes + flat + largest * tr.grad_dtype_bytes


def fsdp_reduce_input_bytes(scn: Scenario) -> float:
    """FSDP's reduce-scatter input: one unit's (a layer's) unsharded gradients in the reduce dtype, bytes on
    one rank (ZERO_REDUCE_BUCKET_ELEMENTS' comment)."""
    par = scn.parallel
    layer = layer_param_counts(scn.model, par.tp, par.ep, par.etp)
    return (layer["dense"] + layer["expert"]) * scn.training.grad_dtype_bytes
