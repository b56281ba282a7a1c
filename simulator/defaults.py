"""The documented default rules for settings a scenario (or a published run) leaves out.

Every user, every scenario file and every validation row gets the same rule; the README lists them.
"""

from __future__ import annotations


def split_layers(num_layers: int, pp: int) -> tuple[int, ...]:
    """Layers per pipeline stage when none are given.

    Even when pp divides the layers. Otherwise every stage gets ceil(L/pp) layers and the excess is
    taken one layer at a time from the first stage, then the last, then the second, the second to
    last, ... because the first and last stages also hold the embedding and the LM head (the rule of
    the Llama 3 paper, Dubey et al. 2024 §3.3.2: 126 layers on 16 stages -> 7 on the first and last).
    """
    if pp <= 0 or num_layers < pp:
        raise ValueError(f"cannot split {num_layers} layers over pp={pp} stages")
    per = -(-num_layers // pp)
    counts = [per] * pp
    excess = per * pp - num_layers
    order = [i for pair in zip(range(pp), range(pp - 1, -1, -1)) for i in pair]
    seen: list[int] = []
    for i in order:
        if i not in seen:
            seen.append(i)
    for i in seen[:excess]:
        counts[i] -= 1
    return tuple(counts)


def default_virtual_stages(num_layers: int, pp: int) -> int:
    """Model chunks per rank for interleaved-1F1B when the source does not say.

    The smallest interleaving above 1 that splits the largest stage evenly: the smallest divisor
    > 1 of ceil(L / pp) (Megatron-LM requires the chunks of a stage to be equal; with an uneven
    split the short stages get a short chunk, as in Llama 3's layout). 1 when a stage holds a
    single layer.
    """
    if pp <= 1:
        return 1
    per_stage = -(-num_layers // pp)
    for v in range(2, per_stage + 1):
        if per_stage % v == 0:
            return v
    return 1


DEFAULT_MICRO_BATCH_SIZE = 1  # Megatron-LM's --micro-batch-size default when a source omits it


def default_grad_dtype(zero_stage: int, dtype: str) -> str:
    """Gradient precision (memory per parameter and DP reduction volume) when not given.

    Megatron-LM (DDP and its distributed optimizer, i.e. ZeRO-1) accumulates and all-reduces
    gradients in fp32 ``main_grad`` buffers with bf16 training (``accumulate_allreduce_grads_in_fp32``):
    18 bytes/param. DeepSpeed ZeRO-2/3 and FSDP keep gradients in the training dtype: 16 bytes/param,
    the accounting of Rajbhandari et al. 2020 (2 + 2 + 12).
    """
    if zero_stage < 2:
        return "fp32"
    return "bf16" if dtype == "fp8" else dtype  # FP8 training (TE) produces BF16 weight gradients


def default_sharding(zero_stage: int, pp: int = 1) -> str:
    """The framework whose ZeRO implementation a ``zero_stage`` means when ``parallelism.sharding`` is
    not given (``strategy/zero_impl``).

    Stage 0/1: Megatron-core's DDP and distributed optimizer (the simulator's Megatron-LM baseline).
    Stage 2: DeepSpeed, the framework that defines ZeRO-2 (gradients partitioned as produced,
    reduce_bucket_size buckets); Megatron-core has no stage 2. With a pipeline (``pp`` > 1) DeepSpeed
    runs no ZeRO-2 or 3 (its PipelineEngine asserts "ZeRO-2 and ZeRO-3 are incompatible with pipeline
    parallelism", deepspeed/runtime/pipe/engine.py), so stage 2 there is FSDP2's SHARD_GRAD_OP under
    torch.distributed.pipelining, as torchtitan runs it. Stage 3: PyTorch FSDP2 (``fully_shard``),
    PyTorch's current sharded data parallelism (torchtitan's default) and the idealised ZeRO-3 of
    Rajbhandari et al. 2020: one all-gather per block and pass, one-block prefetch.
    """
    if zero_stage <= 1:
        return "megatron-distopt"
    return "deepspeed" if zero_stage == 2 and pp == 1 else "fsdp2"


# ---- [reliability] defaults (simulator/reliability.py; the goodput command) -----------------------
# Failure data when the scenario names none: the Llama 3 paper's 54-day snapshot on 16,384 H100
# (Dubey et al. 2024, sec. 3.3.4, Table 5), the only published per-component breakdown at this scale.
DEFAULT_FAILURE_DATA = "llama3"
# Hang detection: a rank that dies leaves its peers blocked in a collective until the NCCL watchdog
# times out: 10 minutes, PyTorch's default timeout of an NCCL process group
# (torch.distributed.init_process_group docs: "10 minutes for NCCL").
DEFAULT_DETECTION_S = 600.0
# Replacing a failed node: Slurm declares an unresponsive node DOWN after SlurmdTimeout = 300 s
# (slurm.conf default) and only then starts the requeued job on a replacement.
DEFAULT_RESCHEDULE_S = 300.0
# Warm-up (launch, communicator initialisation, first steps) of a restarted job of thousands of GPUs:
# MegaScale (Jiang et al. NSDI 2024, sec. 3.6) reports cutting the initialisation of a 2,048-GPU job from
# about 1,047 s to under 30 s (figures from the paper as recalled: its text is not in this project's
# sources; check before relying on them); Llama 3 (sec. 3.3.4) also "reduced job startup ... time".
# 30 s, the optimised end; a stack without those fixes should set reliability.warmup_s ~ 1000.
DEFAULT_WARMUP_S = 30.0
# Checkpoint storage: Llama 3's Tectonic fabric sustains 2 TB/s for checkpoint writes (7 TB/s peak),
# Dubey et al. 2024 sec. 3.3.1; reads get the same sustained rate.
DEFAULT_STORAGE_GBPS = 2000.0
# Megatron-LM saves synchronously unless --async-save is given.
DEFAULT_CHECKPOINT_MODE = "sync"
# Per-step slowdown of the slowest rank: Llama 3 (sec. 3.3.4) reports a diurnal 1-2% throughput
# variation of the 16K-GPU run; each step is slowed by a fraction drawn uniformly in [0, 2%].
DEFAULT_STRAGGLER_JITTER = 0.02
