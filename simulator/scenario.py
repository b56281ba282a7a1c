"""Scenario files: TOML (tomllib) into frozen dataclasses, presets, ``--set`` overrides, validation.

Sections map one-to-one onto dataclasses (DESIGN.md §4.1). Every rejection is a ScenarioError
whose message names the key and the numbers; the CLI prints it on one line and exits 2.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

from .hardware.clusters import ClusterSpec
from .hardware.hwfile import CLUSTER_KEYS, cluster_from_table, read_cluster_file, read_text
from .model.eager import CROSS_ENTROPY_IMPLS, KERNEL_MODES
from .model.te_layout import ATTENTION_MODULES
from .model.fp8 import FP8_RECIPES
from .model.opgraph import ATTENTION_IMPLS
from .model.spec import ModelSpec
from .tasks import COLLECTIVE_OPS
from .units import DTYPE_BYTES
from .defaults import default_grad_dtype, default_sharding, default_virtual_stages, split_layers
from .strategy.activation_memory import DEFAULT_RECOMPUTE_MODULES, RECOMPUTE_MODES
from .strategy.schedules import SCHEDULES
from .strategy.ub_config import TE_DEFAULT
from .scenario_checks import ScenarioError, check_reliability, validate
from .scenario_fields import MODEL_KEYS, check_keys, fields_of, model_from_table, ub_config_name
from .reliability import RELIABILITY_KEYS, ReliabilitySpec, parse_reliability

SCHEDULE_NAMES = tuple(SCHEDULES)
OPTIMIZERS = ("adam", "adamw", "sgd")
COMPUTE_MODELS = ("roofline", "calibrated")


@dataclass(frozen=True, slots=True)
class ParallelSpec:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    # expert tensor parallelism of MoE parallel folding (Megatron-Core expert_tensor_parallel_size);
    # 0 -> tp, Megatron-Core's default. EP x ETP spans the tp x cp x dp ranks of a stage.
    etp: int = 0
    sequence_parallel: bool = False
    zero_stage: int = 0
    schedule: str = "1f1b"
    virtual_stages: int = 1
    recompute: str = "none"
    # recompute = "full" only (Megatron-LM --recompute-method / --recompute-num-layers): "uniform" re-runs
    # every layer, one checkpoint per group of recompute_num_layers layers; "block" re-runs only the first
    # recompute_num_layers layers of every model chunk and keeps the others' activations; "interval"
    # (torchtitan's selective layer AC, selective_ac_option = N) every N-th layer of a rank
    # (strategy/recompute.recomputed_layers)
    recompute_method: str = "uniform"
    recompute_num_layers: int = 1
    # Megatron-Core recompute_modules of recompute = "selective" (strategy/activation_memory.RECOMPUTE_MODULES)
    recompute_modules: tuple[str, ...] = DEFAULT_RECOMPUTE_MODULES
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True  # distributed optimizer / ZeRO all-gather overlapped with forward
    offload_optimizer: bool = False
    # "ring" (ring attention P2P) | "all-gather" (Llama 3's K/V all-gather) | "torch-allgather" (torchtitan)
    # | "a2a" (heads split by all-to-all: Megatron-Core cp_comm_type a2a, DeepSpeed-Ulysses)
    cp_algorithm: str = "ring"
    sharding: str = ""  # megatron-distopt | deepspeed | deepspeed-2021 | fsdp1 | fsdp2; "" -> defaults.default_sharding
    shard_group_size: int = 0  # HSDP: FSDP shards inside groups of this many DP ranks, replicates across; 0 = all
    tp_comm_overlap: bool = False  # SP all-gather / reduce-scatter chunked and overlapped with their GEMMs
    # its userbuffers settings per site (strategy/ub_config): "te2-default" / "te1-default" (TE's own, what
    # Megatron-LM's --tp-comm-overlap runs without --tp-comm-overlap-cfg), a bundled recipe table, or a TOML file
    tp_comm_overlap_cfg: str = TE_DEFAULT
    # Megatron-Core's defer_embedding_wgrad_compute / wgrad_deferral_limit: the output layer's weight-gradient
    # GEMMs of the step's first wgrad_deferral_limit micro-batches (0: all) run in the pipeline flush
    defer_embedding_wgrad_compute: bool = False
    wgrad_deferral_limit: int = 0
    layers_per_stage: tuple[int, ...] = ()

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def expert_tp(self) -> int:
        return self.etp or self.tp

    @property
    def expert_dp(self) -> int:
        """Expert-data-parallel degree (expert gradients' reduction group): tp·cp·dp / (ep·etp)."""
        return max(1, self.tp * self.cp * self.dp // (self.ep * self.expert_tp))


@dataclass(frozen=True, slots=True)
class TrainingSpec:
    global_batch_size: int
    micro_batch_size: int = 1
    dtype: str = "bf16"
    optimizer: str = "adam"
    grad_dtype: str = ""  # "" -> defaults.default_grad_dtype (fp32 main grads for Megatron, ZeRO >= 2: dtype)
    attention: str = "flash"  # "flash" (FlashAttention-2) | "flash-varlen" (FA2 on unpadded tokens, llm-foundry)
    #                           | "cudnn" (TE fused attention) | "unfused" (pre-2022 Megatron)
    grad_accumulation_fusion: bool = True  # weight-gradient GEMMs accumulate into fp32 main_grad directly
    cuda_graphs: bool = False  # kernels replayed from CUDA graphs: no per-kernel eager host dispatch
    fp8_recipe: str = "delayed"  # TE FP8 scaling recipe (dtype "fp8"): delayed | current | blockwise | mxfp8
    # the optimizer's master copy and moments (Apex DistributedFusedAdam ``dtype``, NeMo optim.dtype)
    optimizer_state_dtype: str = "fp32"
    # the optimizer's master copy of the weights: "stored" in optimizer_state_dtype | "remainders" (Apex
    # store_param_remainders) | "parameter" (none: the BF16 parameter; strategy/grad_sync.MASTER_WEIGHTS)
    master_weights: str = "stored"
    # dtype fp8: the linear layers' weights stored in FP8 (TE fp8_model_init; NeMo fp8_params,
    # Megatron-Core --fp8-param-gather), gathered by the distributed optimizer in FP8
    fp8_params: bool = False
    # "fused": the layer's norms, RoPE and activations as single fused kernels (Transformer Engine,
    # Megatron-Core, torch.compile); "eager": as plain PyTorch modules run them (model/eager.py)
    kernels: str = "fused"
    # the loss: "fused" (Megatron-Core's vocab-parallel cross entropy, the gradient written over its
    # fp32 softmax) | "torch" (F.cross_entropy on fp32 logits: torchtitan, plain PyTorch loops)
    cross_entropy: str = "fused"
    # attention flash/cudnn reached through: "te" (Megatron-Core's SelfAttention and Transformer Engine's
    # DotProductAttention, with their Q/K/V layout copies, model/te_layout.py) | "sdpa" (PyTorch's SDPA called
    # by a PyTorch module, torchtitan's or Hugging Face's, with GQA's K and V repeated: model/repeat_kv.py)
    attention_module: str = "te"

    @property
    def dtype_bytes(self) -> int:
        """Bytes of an activation element. FP8 training keeps activations, weights and their
        communication in BF16; only the linear layers' GEMM operands are FP8 (model/fp8.py)."""
        return DTYPE_BYTES["bf16" if self.dtype == "fp8" else self.dtype]

    @property
    def grad_dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.grad_dtype]

    @property
    def param_bytes(self) -> int:
        """Bytes of a stored model parameter: the training dtype, BF16 under FP8 training (TE casts the
        weights per GEMM), one byte with ``fp8_params`` for TE's linear weights (the memory report adds
        the byte the rank's BF16 embedding, output layer and norms lack: ``analysis.buffers``)."""
        return 1 if self.fp8_params else max(DTYPE_BYTES[self.dtype], DTYPE_BYTES["bf16"])

    @property
    def optimizer_state_bytes(self) -> int:
        """Bytes of one element of the optimizer's state tensors (master copy, moments)."""
        return DTYPE_BYTES[self.optimizer_state_dtype]


@dataclass(frozen=True, slots=True)
class CostSpec:
    compute: str = "roofline"
    tables: str = ""  # directory of calibration tables when compute = "calibrated"
    collective_algorithms: tuple[tuple[str, str], ...] = ()  # (op, algorithm) overrides
    # compute beside a collective runs on the SMs its NCCL kernel leaves (cost/sm_share); false: the
    # collective takes no SM from compute (the model of earlier releases)
    sm_contention: bool = True

    def algorithm_for(self, op: str) -> str | None:
        return dict(self.collective_algorithms).get(op)


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    model: ModelSpec
    cluster: ClusterSpec
    parallel: ParallelSpec
    training: TrainingSpec
    cost: CostSpec = field(default_factory=CostSpec)
    source: str = ""  # path of the file it came from
    reliability: ReliabilitySpec = field(default_factory=ReliabilitySpec)  # the goodput command's settings

    @property
    def num_gpus(self) -> int:
        return self.cluster.num_gpus

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per pipeline per iteration: B / (b · dp)."""
        return self.training.global_batch_size // (self.training.micro_batch_size * self.parallel.dp)


# ---- reading ------------------------------------------------------------------------------
_SECTIONS = ("model", "cluster", "parallelism", "training", "cost", "reliability")
_CLUSTER_KEYS = set(CLUSTER_KEYS) | {"hardware"}
_PARALLEL_KEYS = {f.name for f in dataclasses.fields(ParallelSpec)}
_TRAINING_KEYS = {f.name for f in dataclasses.fields(TrainingSpec)}
_COST_KEYS = {"compute", "tables", "collective_algorithms", "sm_contention"}


def read_raw(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """A scenario file as a plain dict with ``section.key=value`` overrides applied, not yet built."""
    p = Path(path)
    try:
        text = read_text(p, "scenario file")
    except ValueError as exc:
        raise ScenarioError(str(exc)) from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{p}: malformed TOML: {exc}") from None
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise ScenarioError(f"{p}: malformed TOML: arrays or tables nested too deeply") from None
    return apply_overrides(raw, overrides)


def load_scenario(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Scenario:
    """Read a scenario file, apply ``section.key=value`` overrides, validate, build the dataclasses."""
    p = Path(path)
    return scenario_from_dict(read_raw(p, overrides), default_name=p.stem, base_dir=p.parent, source=str(p))


def apply_overrides(raw: dict, overrides: list[str] | tuple[str, ...]) -> dict:
    """``--set parallelism.tp=4``: the value is read as a TOML value (string when it is not one)."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    for item in overrides:
        key, sep, text = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not dot or not name or section not in _SECTIONS:
            raise ScenarioError(f"--set {item!r}: expected SECTION.KEY=VALUE with SECTION one of "
                                f"{', '.join(_SECTIONS)}")
        try:
            parsed = tomllib.loads(f"v = {text.strip()}")
        except tomllib.TOMLDecodeError:
            parsed = {"v": text.strip()}
        if set(parsed) != {"v"}:  # a second line would be read as keys of its own and dropped
            raise ScenarioError(f"--set {item!r}: the value must be one TOML value on one line")
        value = parsed["v"]
        table = out.setdefault(section, {})
        if not isinstance(table, dict):
            raise ScenarioError(f"--set {item!r}: [{section}] must be a table, got {type(table).__name__} "
                                f"{table!r}")
        table[name] = value
    return out


def scenario_from_dict(raw: dict, default_name: str = "scenario", base_dir: Path | None = None,
                       source: str = "") -> Scenario:
    check_structure(raw)
    name = raw.get("name", default_name)
    if not isinstance(name, str) or not name:
        raise ScenarioError(f"name must be a non-empty string, got {name!r}")
    if name in (".", "..") or any(c in name for c in "/\\\0"):  # it names the results folder
        raise ScenarioError(f"name {name!r} must be a plain folder name (no '/', '\\', NUL, '.' or '..'): "
                            f"results go to results/<name>")
    if len(name.encode()) > 200:  # file systems allow 255 bytes per name; results/<name> is a folder
        raise ScenarioError(f"name is {len(name.encode())} bytes long, at most 200: results go to results/<name>")
    model = model_from_table(raw.get("model", {}), base_dir or Path("."))
    cluster = cluster_spec(raw.get("cluster", {}), base_dir or Path("."))
    training = _training(raw.get("training", {}))
    parallel = _parallel(raw.get("parallelism", {}), model, cluster, training, base_dir or Path("."))
    cost = _cost(raw.get("cost", {}), base_dir or Path("."))
    if not training.grad_dtype:
        training = replace(training, grad_dtype=default_grad_dtype(parallel.zero_stage, training.dtype))
    reliability = parse_reliability(raw.get("reliability", {}))
    check_reliability(reliability)
    scn = Scenario(name, model, cluster, parallel, training, cost, source, reliability)
    validate(scn)
    return scn


def check_structure(raw: dict, via: str = "") -> None:
    """The sections and keys a scenario may hold, before any value is read: sweep and search check
    their base and grid once instead of failing every point alike. ``via``: the flag that set them."""
    known = {"model": MODEL_KEYS, "cluster": _CLUSTER_KEYS, "parallelism": _PARALLEL_KEYS,
             "training": _TRAINING_KEYS, "cost": _COST_KEYS, "reliability": RELIABILITY_KEYS}
    unknown = set(raw) - set(_SECTIONS) - {"name"}
    if unknown:
        raise ScenarioError(f"{via}unknown top-level key(s) {sorted(unknown)}; known: name, {', '.join(_SECTIONS)}")
    for sec, keys in known.items():
        table = raw.get(sec, {})
        if not isinstance(table, dict):
            raise ScenarioError(f"{via}[{sec}] must be a table, got {type(table).__name__}")
        try:
            check_keys(sec, table, keys)
        except ScenarioError as exc:
            raise ScenarioError(f"{via}{exc}") from None


def cluster_spec(table: dict, base_dir: Path) -> ClusterSpec:
    """A preset (default dgx-a100-80gb) or the hardware file ``cluster.hardware`` names (relative to
    the scenario), with the table's other fields (hardware/hwfile.CLUSTER_KEYS) overriding it."""
    check_keys("cluster", table, _CLUSTER_KEYS)
    table = dict(table)
    try:
        base = None
        if "hardware" in table:
            if "preset" in table:
                raise ScenarioError("cluster.hardware and cluster.preset both given; a hardware file replaces the preset")
            path = table.pop("hardware")
            if not isinstance(path, str) or not path:
                raise ScenarioError(f"cluster.hardware must be a path to a TOML file, got {path!r}")
            base = read_cluster_file(Path(path) if Path(path).is_absolute() else base_dir / path)
        else:
            table.setdefault("preset", "dgx-a100-80gb")
        return cluster_from_table(table, "cluster", base)
    except ValueError as exc:
        raise ScenarioError(str(exc)) from None


def _training(table: dict) -> TrainingSpec:
    if "global_batch_size" not in table:
        raise ScenarioError("[training] needs global_batch_size")
    t = TrainingSpec(**fields_of("training", table, TrainingSpec))
    for key in ("global_batch_size", "micro_batch_size"):
        if getattr(t, key) <= 0:
            raise ScenarioError(f"training.{key} must be positive, got {getattr(t, key)}")
    if t.dtype not in ("bf16", "fp16", "fp8"):
        raise ScenarioError(f"training.dtype must be bf16, fp16 or fp8, got {t.dtype!r}")
    if t.optimizer not in OPTIMIZERS:
        raise ScenarioError(f"training.optimizer must be one of {', '.join(OPTIMIZERS)}, got {t.optimizer!r}")
    if t.attention not in ATTENTION_IMPLS:
        raise ScenarioError(f"training.attention must be one of {', '.join(ATTENTION_IMPLS)}, got {t.attention!r}")
    if t.grad_dtype not in ("", "fp32", "bf16", "fp16"):
        raise ScenarioError(f"training.grad_dtype must be fp32, bf16 or fp16, got {t.grad_dtype!r}")
    if t.fp8_recipe not in FP8_RECIPES:
        raise ScenarioError(f"training.fp8_recipe must be one of {', '.join(FP8_RECIPES)}, got {t.fp8_recipe!r}")
    if t.optimizer_state_dtype not in ("fp32", "bf16"):
        raise ScenarioError(f"training.optimizer_state_dtype must be fp32 or bf16, got {t.optimizer_state_dtype!r}")
    if t.kernels not in KERNEL_MODES:
        raise ScenarioError(f"training.kernels must be one of {', '.join(KERNEL_MODES)}, got {t.kernels!r}")
    if t.cross_entropy not in CROSS_ENTROPY_IMPLS:
        raise ScenarioError(f"training.cross_entropy must be one of {', '.join(CROSS_ENTROPY_IMPLS)}, "
                            f"got {t.cross_entropy!r}")
    if t.attention_module not in ATTENTION_MODULES:
        raise ScenarioError(f"training.attention_module must be one of {', '.join(ATTENTION_MODULES)}, "
                            f"got {t.attention_module!r}")
    if t.kernels == "eager" and t.dtype == "fp8":
        raise ScenarioError("training.kernels = \"eager\" cannot run dtype fp8: FP8 training is Transformer Engine's "
                            "fused modules (use kernels = \"fused\")")
    if t.fp8_params and (t.dtype != "fp8" or t.fp8_recipe not in ("delayed", "current")):
        raise ScenarioError(f"training.fp8_params needs dtype fp8 with a per-tensor recipe (delayed, current), "
                            f"got dtype {t.dtype!r}, fp8_recipe {t.fp8_recipe!r}")
    return t


def _parallel(table: dict, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
              base_dir: Path) -> ParallelSpec:
    vals = fields_of("parallelism", table, ParallelSpec)
    if "tp_comm_overlap_cfg" in vals:
        vals["tp_comm_overlap_cfg"] = ub_config_name(vals["tp_comm_overlap_cfg"], base_dir)
    for key in ("tp", "pp", "dp", "cp", "ep", "virtual_stages"):
        if key in vals and vals[key] <= 0:
            raise ScenarioError(f"parallelism.{key} must be positive, got {vals[key]}")
    if "dp" not in vals:
        tp, pp, cp = vals.get("tp", 1), vals.get("pp", 1), vals.get("cp", 1)
        if cluster.num_gpus % (tp * pp * cp):
            raise ScenarioError(f"parallelism: tp*pp*cp = {tp}*{pp}*{cp} = {tp * pp * cp} does not divide "
                                f"the {cluster.num_gpus} GPUs of the cluster")
        vals["dp"] = cluster.num_gpus // (tp * pp * cp)
    chunks = SCHEDULES[vals["schedule"]].chunks if vals.get("schedule") in SCHEDULES else 1
    if chunks != 1 and "virtual_stages" not in vals and vals.get("pp", 1) > 1:  # fixed (V maps) or the default rule
        vals["virtual_stages"] = chunks or default_virtual_stages(model.num_layers, vals["pp"])
        if vals["virtual_stages"] == 1:  # the rule found no split: say so rather than blame a value never set
            raise ScenarioError(f"parallelism.schedule = {vals['schedule']!r} needs virtual_stages >= 2, and the "
                                f"default rule (the smallest divisor > 1 of ceil(num_layers / pp) = "
                                f"ceil({model.num_layers} / {vals['pp']})) finds none: set "
                                f"parallelism.virtual_stages or use '1f1b'")
    if not vals.get("sharding"):
        vals["sharding"] = default_sharding(vals.get("zero_stage", 0), vals.get("pp", 1))
    par = ParallelSpec(**vals)
    if vals.get("recompute_modules") and par.recompute != "selective":  # Megatron-Core reads them for selective only
        raise ScenarioError(f"parallelism.recompute_modules = {list(par.recompute_modules)} needs recompute = "
                            f"'selective', got {par.recompute!r}")
    if par.tp_comm_overlap and par.tp > 1 and not par.sequence_parallel:
        # Megatron-LM arguments.py: "Tensor parallel communication/GEMM overlap can happen only when
        # sequence parallelism is enabled"
        raise ScenarioError(f"parallelism.tp_comm_overlap needs sequence_parallel = true (tp = {par.tp})")
    if not par.layers_per_stage and par.pp <= model.num_layers:
        par = replace(par, layers_per_stage=split_layers(model.num_layers, par.pp))
    return par


def _cost(table: dict, base_dir: Path) -> CostSpec:
    compute = table.get("compute", "roofline")
    if compute not in COMPUTE_MODELS:
        raise ScenarioError(f"cost.compute must be one of {', '.join(COMPUTE_MODELS)}, got {compute!r}")
    tables = table.get("tables", "")
    if not isinstance(tables, str):
        raise ScenarioError(f"cost.tables must be a path string, got {tables!r}")
    if compute == "calibrated":
        if not tables:
            raise ScenarioError("cost.tables is required when cost.compute = 'calibrated'")
        tp = Path(tables)
        if not tp.is_absolute() and (base_dir / tp).is_dir():
            tp = base_dir / tp  # relative to the scenario file first, then to the working directory
        if not tp.is_dir():
            raise ScenarioError(f"cost.tables directory {tables!r} does not exist")
        tables = str(tp)
    algs = table.get("collective_algorithms", {})
    if not isinstance(algs, dict) or not all(isinstance(v, str) for v in algs.values()):
        raise ScenarioError(f"cost.collective_algorithms must be a table of op = \"algorithm\", got {algs!r}")
    unknown_ops = sorted(set(algs) - set(COLLECTIVE_OPS))
    if unknown_ops:
        raise ScenarioError(f"cost.collective_algorithms: unknown op(s) {unknown_ops}; known: {', '.join(COLLECTIVE_OPS)}")
    sm_contention = table.get("sm_contention", True)
    if not isinstance(sm_contention, bool):
        raise ScenarioError(f"cost.sm_contention must be true or false, got {sm_contention!r}")
    return CostSpec(compute, tables, tuple(sorted(algs.items())), sm_contention)

