"""Cross-field rules a scenario must satisfy before it is simulated (DESIGN.md §4.1).

Each rule raises ScenarioError with one line naming the key(s) and the numbers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .hardware.clusters import ClusterSpec
from .hardware.gpus import FP8_ARCHITECTURES
from .model.fp8 import RECIPE_ARCHITECTURES
from .model.spec import ModelSpec
from .strategy.activation_memory import RECOMPUTE_MODES as _RECOMPUTE, RECOMPUTE_MODULES
from .strategy.grad_sync import MASTER_WEIGHTS
from .strategy.recompute import RECOMPUTE_METHODS
from .strategy.schedules import SCHEDULES, StageMap, splits_backward
from .strategy.sharding import heads_per_tp_rank
from .strategy.zero_impl import IMPLEMENTATIONS

if TYPE_CHECKING:  # scenario and reliability import this module: type-only imports
    from .reliability import ReliabilitySpec
    from .scenario import ParallelSpec, Scenario, TrainingSpec


class ScenarioError(ValueError):
    """A scenario that cannot be simulated; the message names the key and the numbers."""


def validate(scn: Scenario) -> None:
    m, c, p, t = scn.model, scn.cluster, scn.parallel, scn.training
    if p.num_gpus != c.num_gpus:
        raise ScenarioError(f"parallelism: dp*tp*pp*cp = {p.dp}*{p.tp}*{p.pp}*{p.cp} = {p.num_gpus} != "
                            f"{c.num_gpus} GPUs ({c.num_nodes} nodes x {c.gpus_per_node})")
    if t.dtype == "fp8" and "fp8" not in c.gpu.peak_flops_per_s:
        raise ScenarioError(f"training.dtype = 'fp8' needs FP8 tensor cores; cluster.gpu {c.gpu.name} has none")
    if t.dtype == "fp8" and c.gpu.architecture not in FP8_ARCHITECTURES:
        raise ScenarioError(f"training.dtype = 'fp8' needs FP8 tensor cores (Hopper or later); cluster.gpu "
                            f"{c.gpu.name} is {c.gpu.architecture}, whatever its peak_tflops.fp8 says")
    if t.dtype != "fp8" and t.dtype not in c.gpu.peak_flops_per_s:
        raise ScenarioError(f"training.dtype = {t.dtype!r} needs cluster.gpu.peak_tflops.{t.dtype}; gpu "
                            f"{c.gpu.name} lists {', '.join(c.gpu.peak_flops_per_s)}")
    _check_fp8_recipe(c, t)
    _check_master_weights(t)
    _check_model_split(m, p, t)
    _check_batch_and_schedule(m, p, t)
    _check_recompute_modules(m, p, t)
    _check_step_size(scn)


# A resource guard, not a model constant: benchmarks/speed.py's GPT-3 175B step on 1,024 GPUs has
# 18,432 layer passes (96 layers x 192 micro-batches), 302k tasks (~16 per pass) and a peak RSS of
# ~200 MiB; 10^7 layer passes would be ~1.6 x 10^8 tasks and ~100 GiB, beyond what a run can hold.
MAX_LAYER_PASSES = 10**7
# Likewise: a step's memory and time grow with the cluster (the data-parallel groups' flows); 32,768
# DGX nodes (262,144 GPUs, beyond the largest cluster built) took 97 s and 2.8 GiB for GPT-3 1.3B.
MAX_GPUS = 2**18


def check_cluster_size(num_gpus: int, where: str) -> None:
    if num_gpus > MAX_GPUS:
        raise ScenarioError(f"{where}: {num_gpus} GPUs, more than the {MAX_GPUS:,} a simulation can hold")


def _check_step_size(scn: Scenario) -> None:
    """Refuse a step too large to build (a hang or an exhausted memory otherwise), naming its size."""
    c = scn.cluster
    check_cluster_size(c.num_gpus, f"cluster ({c.num_nodes} nodes x {c.gpus_per_node} GPUs)")
    layers = scn.model.num_layers + scn.model.mtp_layers
    passes = layers * scn.num_microbatches
    if passes > MAX_LAYER_PASSES:
        raise ScenarioError(f"one step has {passes:.3g} layer passes (model.num_layers + mtp_layers = {layers} x "
                            f"{scn.num_microbatches} micro-batches per pipeline), more than the {MAX_LAYER_PASSES:.0e} "
                            f"a simulation can hold")


def _check_fp8_recipe(c: ClusterSpec, t: TrainingSpec) -> None:
    """A scaling recipe other than delayed needs FP8 training and, for the block-scaled ones, a GPU
    whose FP8 GEMMs take block scales (model/fp8.py RECIPE_ARCHITECTURES)."""
    if t.fp8_recipe == "delayed":
        return
    if t.dtype != "fp8":
        raise ScenarioError(f"training.fp8_recipe = {t.fp8_recipe!r} needs training.dtype = 'fp8', got {t.dtype!r}")
    archs = RECIPE_ARCHITECTURES.get(t.fp8_recipe)
    if archs and c.gpu.architecture not in archs:
        raise ScenarioError(f"training.fp8_recipe = {t.fp8_recipe!r} needs a {' or '.join(archs)} GPU; "
                            f"cluster.gpu {c.gpu.name} is {c.gpu.architecture}")


def _check_master_weights(t: TrainingSpec) -> None:
    """Apex's remainders complete an fp32 master whose high half is a BF16 parameter; with no copy the
    BF16 parameter is the master, so the state must be BF16 too."""
    if t.master_weights not in MASTER_WEIGHTS:
        raise ScenarioError(f"training.master_weights must be one of {', '.join(MASTER_WEIGHTS)}, "
                            f"got {t.master_weights!r}")
    bf16_params = t.dtype in ("bf16", "fp8") and not t.fp8_params
    need = {"remainders": "fp32", "parameter": "bf16"}.get(t.master_weights)
    if need and (t.optimizer_state_dtype != need or not bf16_params):
        raise ScenarioError(f"training.master_weights = {t.master_weights!r} needs BF16 parameters and "
                            f"optimizer_state_dtype = {need!r}; got dtype {t.dtype!r}, fp8_params "
                            f"{t.fp8_params}, optimizer_state_dtype {t.optimizer_state_dtype!r}")


def _check_model_split(m: ModelSpec, p: ParallelSpec, t: TrainingSpec) -> None:
    """The model's shapes divide as TP, EP, CP and SP split them."""
    try:
        m.check()
    except ValueError as exc:
        raise ScenarioError(f"model.{exc}") from None
    if m.num_attention_heads % p.tp:
        raise ScenarioError(f"parallelism.tp = {p.tp} does not divide model.num_attention_heads = "
                            f"{m.num_attention_heads}")
    if m.num_kv_heads % p.tp:
        # Megatron-Core asserts num_query_groups % tensor_model_parallel_size == 0
        raise ScenarioError(f"parallelism.tp = {p.tp} does not divide model.num_kv_heads = {m.num_kv_heads} "
                            f"(each TP rank needs whole key/value heads)")
    if m.ffn_hidden_size % p.tp:
        raise ScenarioError(f"parallelism.tp = {p.tp} does not divide model.ffn_hidden_size = "
                            f"{m.ffn_hidden_size}")
    if m.sliding_window and m.sliding_window < m.seq_length and t.attention == "unfused":
        # the unfused path materialises the full s x s scores; windows are a FlashAttention feature
        raise ScenarioError(f"model.sliding_window = {m.sliding_window} needs training.attention = 'flash' "
                            f"(the unfused path computes all {m.seq_length} x {m.seq_length} scores)")
    _check_experts(m, p)
    if m.seq_length % p.cp:
        raise ScenarioError(f"parallelism.cp = {p.cp} does not divide model.seq_length = {m.seq_length}")
    if p.sequence_parallel and (m.seq_length // p.cp) % p.tp:
        raise ScenarioError(f"sequence_parallel: tp = {p.tp} does not divide the sequence "
                            f"{m.seq_length}/cp={m.seq_length // p.cp}")


def _check_experts(m: ModelSpec, p: ParallelSpec) -> None:
    """EP x ETP folded over the tp x cp x dp ranks of a stage (Megatron-Core MoE parallel folding:
    parallel_state.py requires world_size % (etp·ep·pp) == 0, i.e. etp·ep | tp·cp·dp)."""
    etp, ranks = p.etp or p.tp, p.tp * p.cp * p.dp
    if p.etp < 0:
        raise ScenarioError(f"parallelism.etp must be >= 0 (0: etp = tp), got {p.etp}")
    if m.is_moe and m.moe_ffn_hidden_size % etp:  # routed experts are split by expert TP (sharding.py)
        key = "etp" if p.etp else "tp"  # etp 0 follows tp
        raise ScenarioError(f"parallelism.{key} = {etp} does not divide model.moe_ffn_hidden_size = {m.moe_ffn_hidden_size}")
    if m.is_moe and m.moe_shared_expert_ffn_hidden_size % p.tp:  # shared experts run in the dense TP group
        raise ScenarioError(f"parallelism.tp = {p.tp} does not divide model.moe_shared_expert_ffn_hidden_size = "
                            f"{m.moe_shared_expert_ffn_hidden_size}")
    if p.ep > 1 and m.num_experts % p.ep:
        raise ScenarioError(f"parallelism.ep = {p.ep} does not divide model.num_experts = {m.num_experts}")
    if ranks % (p.ep * etp):
        raise ScenarioError(f"parallelism.ep*etp = {p.ep}*{etp} = {p.ep * etp} does not divide the tp*cp*dp = "
                            f"{p.tp}*{p.cp}*{p.dp} = {ranks} ranks of a pipeline stage (MoE parallel folding)")
    if etp != p.tp and p.tp > 1 and not p.sequence_parallel:
        # Megatron-Core's MoELayer refuses MoE with TP and no SP in training: TP ranks would hold copies
        raise ScenarioError(f"parallelism.etp = {etp} differs from tp = {p.tp}: needs sequence_parallel = true")


def _check_batch_and_schedule(m: ModelSpec, p: ParallelSpec, t: TrainingSpec) -> None:
    """Batch, ZeRO, schedule, recompute and pipeline layout settings exist and fit together."""
    if t.global_batch_size % (t.micro_batch_size * p.dp):
        raise ScenarioError(f"training.global_batch_size = {t.global_batch_size} is not divisible by "
                            f"micro_batch_size*dp = {t.micro_batch_size}*{p.dp} = {t.micro_batch_size * p.dp}")
    if not 0 <= p.zero_stage <= 3:
        raise ScenarioError(f"parallelism.zero_stage must be 0..3, got {p.zero_stage}")
    if p.schedule not in SCHEDULES:
        raise ScenarioError(f"parallelism.schedule {p.schedule!r} is unknown; known: {', '.join(SCHEDULES)}")
    if p.recompute not in _RECOMPUTE:
        raise ScenarioError(f"parallelism.recompute {p.recompute!r} is unknown; known: {', '.join(_RECOMPUTE)}")
    _check_recompute_layers(p)
    if p.recompute == "selective-op":
        _check_op_sac(m, p, t)
    if p.cp_algorithm not in _CP_ALGORITHMS:
        raise ScenarioError(f"parallelism.cp_algorithm must be one of {', '.join(map(repr, _CP_ALGORITHMS))}, "
                            f"got {p.cp_algorithm!r}")
    if p.cp_algorithm == "a2a" and p.cp > 1:
        _check_a2a_heads(m, p)
    _check_sharding(p)
    _check_wgrad_deferral(m, p, t)
    if t.fp8_params and p.zero_stage > 1:  # Megatron-Core's --fp8-param-gather: DDP or the distributed optimizer
        raise ScenarioError(f"training.fp8_params needs zero_stage 0 or 1 (DDP or Megatron-Core's distributed "
                            f"optimizer, which gathers the FP8 parameters), got zero_stage = {p.zero_stage}")
    if p.offload_optimizer and p.zero_stage == 0:
        raise ScenarioError("parallelism.offload_optimizer needs zero_stage >= 1 (ZeRO-Offload shards the "
                            "optimizer state), got zero_stage = 0")
    if p.pp > m.num_layers:
        raise ScenarioError(f"parallelism.pp = {p.pp} exceeds model.num_layers = {m.num_layers}")
    lps = p.layers_per_stage
    if len(lps) != p.pp or sum(lps) != m.num_layers or min(lps) < 1:
        raise ScenarioError(f"parallelism.layers_per_stage = {list(lps)} must have pp = {p.pp} positive "
                            f"entries summing to num_layers = {m.num_layers}")
    m_count = t.global_batch_size // (t.micro_batch_size * p.dp)
    if p.pp > 1 and m_count < 1:
        raise ScenarioError(f"no micro-batches: global_batch_size {t.global_batch_size} < micro_batch_size*dp")
    if p.pp > 1:
        try:  # the schedule's own rules: chunks per rank, fewest micro-batches, Megatron's multiple of pp
            SCHEDULES[p.schedule].check(p.pp, m_count, p.virtual_stages)
        except ValueError as e:
            raise ScenarioError(f"{e} (parallelism.schedule = {p.schedule!r}, micro-batches per pipeline = "
                                f"{m_count})") from None
        # a chunk of DualPipe is a whole stage of one of its two model copies (StageMap.copies)
        per_stage = p.virtual_stages // StageMap(SCHEDULES[p.schedule].stage_map, p.pp).copies
        if min(lps) < per_stage:
            raise ScenarioError(f"parallelism.virtual_stages = {p.virtual_stages} exceeds the layers of the "
                                f"smallest stage in {list(lps)} (each model chunk needs a layer)")


def _check_wgrad_deferral(m: ModelSpec, p: ParallelSpec, t: TrainingSpec) -> None:
    """Megatron-Core's own checks (model_parallel_config.py), and the plans it exists in here."""
    if p.wgrad_deferral_limit < 0:
        raise ScenarioError(f"parallelism.wgrad_deferral_limit must be >= 0 (0 defers every micro-batch), "
                            f"got {p.wgrad_deferral_limit}")
    if not p.defer_embedding_wgrad_compute:
        return
    if p.pp == 1:
        raise ScenarioError("parallelism.defer_embedding_wgrad_compute needs pp > 1 (Megatron-Core: the wgrads "
                            "are deferred into the pipeline flush), got pp = 1")
    if not t.grad_accumulation_fusion:
        raise ScenarioError("parallelism.defer_embedding_wgrad_compute needs training.grad_accumulation_fusion = "
                            "true (Megatron-Core refuses it without), got false")
    if p.zero_stage > 1 or p.sharding != "megatron-distopt":
        raise ScenarioError(f"parallelism.defer_embedding_wgrad_compute is Megatron-Core's (zero_stage 0 or 1, "
                            f"sharding 'megatron-distopt'), got zero_stage = {p.zero_stage}, sharding = "
                            f"{p.sharding!r}")
    if splits_backward(p.schedule):
        raise ScenarioError(f"parallelism.defer_embedding_wgrad_compute: schedule {p.schedule!r} already splits "
                            f"every weight gradient from its backward; use a 1F1B or interleaved schedule")
    if m.mtp_layers:  # Megatron-Core buffers every output-layer call, the MTP depths' too: not modelled
        raise ScenarioError(f"parallelism.defer_embedding_wgrad_compute is not modelled with multi-token "
                            f"prediction (model.mtp_layers = {m.mtp_layers})")


_SHARDING = IMPLEMENTATIONS
# the CP exchanges the lowering emits (strategy/layer_emit._core; "torch-allgather": strategy/cp_torch;
# "a2a": strategy/cp_a2a)
_CP_ALGORITHMS = ("ring", "all-gather", "torch-allgather", "a2a")


def _check_a2a_heads(m: ModelSpec, p: ParallelSpec) -> None:
    """All-to-all CP hands each CP rank heads / cp of its TP rank's heads (strategy/cp_a2a): Transformer
    Engine asserts both the query and the K/V heads divide (AttnFuncWithCPAndQKVOA2A)."""
    for key, heads in (("num_attention_heads", m.num_attention_heads), ("num_kv_heads", m.num_kv_heads)):
        per_tp = heads_per_tp_rank(heads, p.tp)
        if per_tp % p.cp:
            raise ScenarioError(f"parallelism.cp_algorithm = 'a2a' splits each TP rank's heads over the cp = {p.cp} "
                                f"ranks: model.{key} = {heads} / tp = {p.tp} gives {per_tp} per TP rank, "
                                f"not divisible by cp = {p.cp}")


def _check_op_sac(m: ModelSpec, p: ParallelSpec, t: TrainingSpec) -> None:
    """torchtitan's per-op SAC is modelled for dense layers (strategy/recompute.op_sac_rerun) without CP,
    whose K/V gathers its policy would re-run, with TP only sequence-parallel as torchtitan's plan runs
    it (its input all-gathers are re-run, the reduce-scatters saved), with a fused attention kernel
    (unfused attention's score matmuls would be saved too), and not under DeepSpeed's ZeRO-3, whose
    hooks would fetch the re-run linears' parameters again."""
    ds3 = p.zero_stage == 3 and p.sharding.startswith("deepspeed")
    unmodelled = [(what, value) for what, value, bad in (
        ("parallelism.sequence_parallel (with tp > 1)", p.sequence_parallel, p.tp > 1 and not p.sequence_parallel),
        ("parallelism.cp", p.cp, p.cp > 1),
        ("parallelism.sharding", p.sharding, ds3),
        ("model.num_experts", m.num_experts, m.is_moe), ("model.kv_lora_rank (MLA)", m.kv_lora_rank, m.is_mla),
        ("model.parallel_attn_mlp", m.parallel_attn_mlp, m.parallel_attn_mlp),
        ("training.attention", t.attention, t.attention == "unfused")) if bad]
    if unmodelled:
        what, value = unmodelled[0]
        raise ScenarioError(f"parallelism.recompute = 'selective-op' (torchtitan's per-op SAC) is modelled for "
                            f"dense layers with cp = 1, sequence-parallel TP and fused attention; got {what} = "
                            f"{value!r}")


def _check_recompute_layers(p: ParallelSpec) -> None:
    """Megatron-LM's --recompute-method / --recompute-num-layers and torchtitan's layer AC interval, for
    full recompute only."""
    if p.recompute_method not in RECOMPUTE_METHODS:
        names = ", ".join(map(repr, RECOMPUTE_METHODS[:-1])) + f" or {RECOMPUTE_METHODS[-1]!r}"
        raise ScenarioError(f"parallelism.recompute_method must be {names}, got {p.recompute_method!r}")
    if p.recompute_num_layers < 1:
        raise ScenarioError(f"parallelism.recompute_num_layers must be >= 1, got {p.recompute_num_layers}")
    if (p.recompute_method, p.recompute_num_layers) != ("uniform", 1) and p.recompute != "full":
        raise ScenarioError(f"parallelism.recompute_method = {p.recompute_method!r} with recompute_num_layers = "
                            f"{p.recompute_num_layers} needs recompute = 'full', got {p.recompute!r}")
    if p.recompute_method == "uniform" and p.recompute_num_layers != 1 and splits_backward(p.schedule):
        # a group's B and W passes would each need the whole group re-materialised (recompute.recompute_groups)
        raise ScenarioError(f"parallelism.recompute_num_layers = {p.recompute_num_layers} with recompute_method = "
                            f"'uniform' (groups of layers under one checkpoint) is not modelled with schedule "
                            f"{p.schedule!r}, which splits the backward: use 1, or 'block'")


def _check_sharding(p: ParallelSpec) -> None:
    """The implementation must run the stage: Megatron-core's distributed optimizer is ZeRO-1, FSDP
    shards gradients (SHARD_GRAD_OP = 2) or everything (FULL_SHARD = 3); HSDP is FSDP's."""
    if p.sharding not in _SHARDING:
        raise ScenarioError(f"parallelism.sharding {p.sharding!r} is unknown; known: {', '.join(_SHARDING)}")
    if p.sharding == "megatron-distopt" and p.zero_stage > 1:
        raise ScenarioError(f"parallelism.sharding = 'megatron-distopt' runs zero_stage 0 or 1, got "
                            f"zero_stage = {p.zero_stage}")
    if p.sharding.startswith("deepspeed") and p.zero_stage >= 2 and p.pp > 1:
        raise ScenarioError(f"parallelism.sharding = {p.sharding!r} with zero_stage {p.zero_stage} and pp = {p.pp}: "
                            f"DeepSpeed's pipeline engine refuses ZeRO-2 and ZeRO-3 (use pp = 1, zero_stage <= 1, "
                            f"or sharding fsdp2)")
    if p.sharding == "deepspeed-2021" and p.zero_stage != 3:  # zero_impl models its ZeRO-3 coordinator only
        raise ScenarioError(f"parallelism.sharding = 'deepspeed-2021' is DeepSpeed's 2021 ZeRO-3 engine: it needs "
                            f"zero_stage 3, got zero_stage = {p.zero_stage}")
    if p.sharding in ("fsdp1", "fsdp2") and p.zero_stage not in (2, 3):
        raise ScenarioError(f"parallelism.sharding = {p.sharding!r} needs zero_stage 2 (SHARD_GRAD_OP) or 3 "
                            f"(FULL_SHARD), got zero_stage = {p.zero_stage}")
    if p.shard_group_size < 0:
        raise ScenarioError(f"parallelism.shard_group_size must be >= 0, got {p.shard_group_size}")
    if p.shard_group_size:
        n = p.dp * p.cp
        if p.sharding not in ("fsdp1", "fsdp2"):
            raise ScenarioError(f"parallelism.shard_group_size (HSDP) needs sharding fsdp1 or fsdp2, got "
                                f"{p.sharding!r}")
        if n % p.shard_group_size:
            raise ScenarioError(f"parallelism.shard_group_size = {p.shard_group_size} does not divide dp*cp = "
                                f"{p.dp}*{p.cp} = {n}")
        if p.ep > 1:
            raise ScenarioError(f"parallelism.shard_group_size (HSDP) with ep = {p.ep} is not modelled")


_FAILURE_DATA = ("llama3", "none")  # reliability.FLEETS


def check_reliability(r: ReliabilitySpec) -> None:
    """``[reliability]`` values (reliability.ReliabilitySpec): known names, no negative times or rates."""
    if r.failure_data not in _FAILURE_DATA:
        raise ScenarioError(f"reliability.failure_data {r.failure_data!r} is unknown; known: {', '.join(_FAILURE_DATA)}")
    if r.checkpoint_mode not in ("sync", "async"):
        raise ScenarioError(f"reliability.checkpoint_mode must be 'sync' or 'async', got {r.checkpoint_mode!r}")
    for key in ("storage_write_GBps", "storage_read_GBps"):
        if getattr(r, key) <= 0:
            raise ScenarioError(f"reliability.{key} must be positive, got {getattr(r, key)}")
    for key in ("failure_rate_scale", "checkpoint_interval_steps", "async_step_slowdown", "detection_s",
                "reschedule_s", "warmup_s", "hot_spares", "spare_repair_h", "straggler_jitter",
                "straggler_slowdown"):
        if getattr(r, key) < 0:
            raise ScenarioError(f"reliability.{key} must be >= 0, got {getattr(r, key)}")
    if not 0 <= r.straggler_probability <= 1:
        raise ScenarioError(f"reliability.straggler_probability must be in [0, 1], got {r.straggler_probability}")


# Megatron-Core recompute_modules of architectures this simulator has no model of (GatedDeltaNet,
# GatedDeltaProduct, hyper-connections): refused by name rather than accepted and ignored
_UNMODELLED_RECOMPUTE = ("gdn_norm_out", "gdp_in_proj", "gdp_qkv", "mhc")


def _check_recompute_modules(m: ModelSpec, p: ParallelSpec, t: TrainingSpec) -> None:
    """Each selective-recompute module is one Megatron-Core has and this model runs, under the
    conditions Megatron-Core's TransformerConfig.__post_init__ imposes (transformer_config.py)."""
    mods = p.recompute_modules
    for name in mods:
        if name in _UNMODELLED_RECOMPUTE:
            raise ScenarioError(f"parallelism.recompute_modules: {name!r} is not modelled (the simulator has no "
                                f"such block); modelled: {', '.join(RECOMPUTE_MODULES)}")
        if name not in RECOMPUTE_MODULES:
            raise ScenarioError(f"parallelism.recompute_modules: {name!r} is unknown; known: "
                                f"{', '.join(RECOMPUTE_MODULES)}")
    if "mla_up_proj" in mods and not m.is_mla:  # "only supported with multi_latent_attention"
        raise ScenarioError("parallelism.recompute_modules: 'mla_up_proj' needs an MLA model (model.kv_lora_rank "
                            f"> 0), got kv_lora_rank = {m.kv_lora_rank}")
    if "moe_act" in mods and not (m.is_moe and m.moe_grouped_gemm):  # "only supported with moe_grouped_gemm"
        raise ScenarioError(f"parallelism.recompute_modules: 'moe_act' needs an MoE model with model.moe_grouped_gemm "
                            f"= true (num_experts = {m.num_experts}, moe_grouped_gemm = {m.moe_grouped_gemm})")
    if "mlp" in mods and m.parallel_attn_mlp:  # recompute_mlp checkpoints a sequential layer's MLP module
        raise ScenarioError("parallelism.recompute_modules: 'mlp' (Megatron-Core's recompute_mlp, the MLP module "
                            "with its TP collectives) has no counterpart in a parallel block "
                            "(model.parallel_attn_mlp = true), whose one TP reduction sums both branches")
    dense_only = [x for x in ("moe", "shared_experts") if x in mods and not m.is_moe]
    if dense_only:  # a dense model has no such module: the name would be accepted and do nothing
        raise ScenarioError(f"parallelism.recompute_modules: {dense_only[0]!r} needs an MoE model "
                            f"(model.num_experts = {m.num_experts})")
    bad = [x for x in ("moe_act", "layernorm") if x in mods]
    if bad and t.dtype == "fp8" and t.fp8_recipe == "delayed":
        # "Delayed scaling does not support moe_act and layernorm recompute for fp8."
        raise ScenarioError(f"parallelism.recompute_modules: {bad[0]!r} is not supported with FP8 delayed scaling "
                            "(training.fp8_recipe = 'delayed'), as in Megatron-Core")
