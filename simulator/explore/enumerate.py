"""Parallelism plans: the (tp, pp, dp, cp, ep, micro-batch, schedule, virtual stages, ZeRO stage,
recompute, SP) tuples of one model on one cluster, enumerated in a fixed order and turned into the
scenario dicts that ``scenario_from_dict`` validates, so a plan is valid exactly when a user's
scenario file with the same settings would be.

Dominance rules (DESIGN.md §4.2 search; each removes choices that can never be faster, only with
``prune_dominated``):

- sequence_parallel = (tp > 1): SP replaces each TP all-reduce by a reduce-scatter + all-gather of the
  same total volume and divides the norm/dropout work and activations by t (Korthikanti et al. 2022,
  §4.2.2), so it is never slower and never larger.
- gpipe is left out: the same bubble as 1F1B, (p - 1)/(m + p - 1) (Narayanan et al. 2021, §2.2), with
  m instead of p micro-batches in flight.
- recompute: the search keeps the least recompute that fits (none, then selective, then full;
  ``search``): recomputation only adds compute (Chen et al. 2016; Korthikanti et al. 2022 §5). Where
  only full recompute fits, it recomputes the fewest layers per model chunk that fit (Megatron-LM's
  "block" method, ``Plan.recompute_num_layers``; ``SearchSpace.partial_recompute``).
- ZeRO-3 only where no lower stage fits with the same degrees, micro-batch and schedule (``search``):
  it all-gathers every layer's parameters in every micro-batch's forward and backward, 2m gathers of
  the stage's weights per step where ZeRO-1/2 need one (Rajbhandari et al. 2020, §7.2.3: 1.5x the
  traffic of data parallelism with one micro-batch, more with gradient accumulation); it buys memory.
- ZeRO stages are equivalent without data parallelism (dp * cp = 1): stage 0 only.

Search-space bounds (``SearchSpace``; documented limits, not dominance):

- context parallelism, with a ring algorithm (``cp_algorithm`` "ring", "torch-allgather"), only where
  the ring can hide its K/V exchange: a rank's sequence block of s/cp tokens must reach F/B, the GPU's
  peak FLOP/s over the per-GPU bandwidth of the links the ring crosses (NVLink when tp*cp fits in a
  node, else the NIC): Liu et al. 2023, Ring Attention, §3 and Table 1 (A100: about 1K tokens over
  NVLink, 12.5K over InfiniBand). The blocking exchanges ("all-gather", "a2a") hide nothing: every
  degree the model divides is a plan.
- interleaving degrees v that split the largest stage's layers evenly (Megatron-LM's
  --num-layers-per-virtual-pipeline-stage keeps a stage's chunks equal), not every v up to the
  smallest stage that the scenario rules accept (chunks one layer apart).
- micro-batch sizes are powers of two up to 16.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, fields

from ..defaults import split_layers
from ..hardware.clusters import ClusterSpec
from ..model.spec import ModelSpec
from ..scenario import Scenario
from ..scenario_checks import ScenarioError
from ..strategy.schedules import SCHEDULES

# Parallelism keys a plan sets; the scenario's other [parallelism] keys (overlap flags, cp_algorithm,
# offload_optimizer) are kept, layers_per_stage only when its length matches the plan's pp.
PLAN_KEYS = ("tp", "pp", "dp", "cp", "ep", "sequence_parallel", "zero_stage", "schedule", "virtual_stages",
             "recompute")
RECOMPUTE_ORDER = ("none", "selective", "full")  # increasing compute, decreasing memory
RING_CP = ("ring", "torch-allgather")  # the CP algorithms whose exchange hides under the ring's steps


@dataclass(frozen=True, slots=True, order=True)
class Plan:
    tp: int
    pp: int
    dp: int
    cp: int = 1
    ep: int = 1
    micro_batch_size: int = 1
    schedule: str = "1f1b"
    virtual_stages: int = 1
    zero_stage: int = 0
    recompute: str = "none"
    sequence_parallel: bool = False
    # full recompute of the first N layers of every model chunk only (recompute_method "block"); 0: all
    recompute_num_layers: int = 0
    # the method N applies with when not "block" (what the search's partial recompute uses): "interval"
    # (every N-th layer) or "uniform" (groups of N layers); a sweep over a scenario's own methods sets it
    recompute_method: str = ""

    def label(self) -> str:
        """Compact text, e.g. ``tp8 pp16 dp8 b1 interleaved-1f1b v2 z1 full sp``."""
        parts = [f"tp{self.tp}", f"pp{self.pp}", f"dp{self.dp}"]
        parts += [f"cp{self.cp}"] if self.cp > 1 else []
        parts += [f"ep{self.ep}"] if self.ep > 1 else []
        parts += [f"b{self.micro_batch_size}"]
        if self.pp > 1:
            parts.append(self.schedule + (f" v{self.virtual_stages}" if self.virtual_stages > 1 else ""))
        parts += [f"z{self.zero_stage}", self.recompute_label()] + (["sp"] if self.sequence_parallel else [])
        return " ".join(parts)

    def recompute_label(self) -> str:
        """The plan's recompute as labels show it: none, selective, full, or blockN / intervalN / uniformN."""
        if self.recompute_num_layers:
            return f"{self.recompute_method or 'block'}{self.recompute_num_layers}"
        return self.recompute

    def as_dict(self) -> dict:
        return asdict(self)


PLAN_FIELDS = tuple(f.name for f in fields(Plan))


def plan_of(scn: Scenario) -> Plan:
    """The plan a validated Scenario runs."""
    p = scn.parallel
    every = (p.recompute_method, p.recompute_num_layers) == ("uniform", 1)
    return Plan(p.tp, p.pp, p.dp, p.cp, p.ep, scn.training.micro_batch_size, p.schedule if p.pp > 1 else "1f1b",
                p.virtual_stages if p.pp > 1 else 1, p.zero_stage, p.recompute, p.sequence_parallel,
                0 if every else p.recompute_num_layers,
                "" if every or p.recompute_method == "block" else p.recompute_method)


def apply_plan(raw: dict, plan: Plan) -> dict:
    """A copy of a scenario dict with the plan's settings (what ``--set`` would write)."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    par = {k: v for k, v in out.get("parallelism", {}).items() if k not in PLAN_KEYS}
    if len(par.get("layers_per_stage", ())) != plan.pp:
        par.pop("layers_per_stage", None)
    par.update({k: getattr(plan, k) for k in PLAN_KEYS})
    if plan.recompute != "selective":  # the scenario's modules apply to its selective plans only
        par.pop("recompute_modules", None)
    if plan.pp == 1 or plan.zero_stage > 1 or SCHEDULES[plan.schedule].splits_backward:
        # Megatron-Core's deferred head wgrads need its pipeline and DDP: the scenario's choice where they exist
        par.pop("defer_embedding_wgrad_compute", None)
        par.pop("wgrad_deferral_limit", None)
    par.pop("recompute_method", None)  # the plan's: every layer, or N by its method (block by default)
    par.pop("recompute_num_layers", None)
    if plan.recompute_num_layers:
        par.update(recompute_method=plan.recompute_method or "block", recompute_num_layers=plan.recompute_num_layers)
    out["parallelism"] = par
    out["training"] = dict(out.get("training", {}), micro_batch_size=plan.micro_batch_size)
    return out


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class SearchSpace:
    """The choices per axis. Degrees are the divisors the model and cluster allow; the lists below
    bound the rest: micro-batch sizes are powers of two (Megatron-LM's published configurations use
    1..8, Narayanan et al. 2021 Table 1 and §5.7; larger ones only add bubble and memory)."""

    micro_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    schedules: tuple[str, ...] = ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble")
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    recompute: tuple[str, ...] = RECOMPUTE_ORDER
    cp_min_block: bool = True  # apply the ring-attention block-size condition above
    even_chunks: bool = True  # interleaving degrees that split the largest stage evenly
    prune_dominated: bool = True
    partial_recompute: bool = True  # where only full recompute fits, also its least "block" variant that fits


def _virtual_choices(num_layers: int, pp: int, layers_per_stage: tuple[int, ...] | None,
                     even_chunks: bool) -> list[int]:
    """Chunks per rank for interleaved-1F1B: 2 up to the layers of the smallest stage (the scenario rule;
    chunks may then differ by a layer, ``strategy.lower.chunk_sizes``), or with ``even_chunks`` only the
    divisors of the largest stage's layers (Megatron-LM keeps a stage's chunks equal; with uneven stages
    the short ones get one short chunk, the Llama 3 layout of ``defaults.default_virtual_stages``)."""
    lps = layers_per_stage if layers_per_stage and len(layers_per_stage) == pp else split_layers(num_layers, pp)
    return [v for v in range(2, min(lps) + 1) if not even_chunks or max(lps) % v == 0]


def min_cp_block_tokens(cluster: ClusterSpec, dtype: str, tp: int, cp: int) -> float:
    """Smallest sequence block per CP rank whose attention hides the ring's K/V transfer, F/B
    (Liu et al. 2023, Ring Attention, §3): peak FLOP/s over the per-GPU bandwidth of the ring's links."""
    inside = tp * cp <= cluster.gpus_per_node
    per_gpu = cluster.nvlink_bandwidth_Bps if inside else \
        cluster.nic_bandwidth_Bps * cluster.nics_per_node / cluster.gpus_per_node
    return cluster.gpu.peak(dtype) / per_gpu


def enumerate_plans(model: ModelSpec, num_gpus: int, global_batch_size: int, space: SearchSpace | None = None,
                    layers_per_stage: tuple[int, ...] | None = None, cluster: ClusterSpec | None = None,
                    dtype: str = "bf16", cp_algorithm: str = "ring") -> Iterator[Plan]:
    """Every plan of the space whose degrees multiply to ``num_gpus``, in a fixed order.

    Only the divisibility that defines the plan itself is applied here (tp*pp*cp*dp = GPUs, b dividing
    the per-replica batch, interleaving within the smallest stage) and the space's bounds (the CP block
    condition needs ``cluster``); the scenario rules decide validity (``valid_plans``)."""
    space = space or SearchSpace()
    if num_gpus < 1 or global_batch_size < 1:
        raise ValueError(f"search: the cluster's GPUs ({num_gpus}) and training.global_batch_size "
                         f"({global_batch_size}) must be >= 1")
    schedules = [s for s in space.schedules if not (space.prune_dominated and s == "gpipe")]
    experts = model.num_experts if model.num_experts > 1 else 1
    for tp in divisors(num_gpus):
        for cp in divisors(num_gpus // tp):
            if model.seq_length % cp:
                continue
            if cp > 1 and space.cp_min_block and cluster is not None and cp_algorithm in RING_CP and \
                    model.seq_length / cp < min_cp_block_tokens(cluster, dtype, tp, cp):
                continue
            for pp in divisors(num_gpus // (tp * cp)):
                if pp > model.num_layers:
                    continue
                dp = num_gpus // (tp * cp * pp)
                for ep in divisors(experts):
                    if (dp * cp) % ep:
                        continue
                    yield from _inner(model, tp, pp, dp, cp, ep, global_batch_size, space, schedules,
                                      layers_per_stage)


def _inner(model: ModelSpec, tp: int, pp: int, dp: int, cp: int, ep: int, batch: int, space: SearchSpace,
           schedules: Sequence[str], layers_per_stage: tuple[int, ...] | None) -> Iterator[Plan]:
    sps = (tp > 1,) if space.prune_dominated else ((False, True) if tp > 1 else (False,))
    zeros = space.zero_stages if dp * cp > 1 or not space.prune_dominated else (0,)
    for b in space.micro_batch_sizes:
        if batch % (b * dp):
            continue
        m = batch // (b * dp)
        for schedule in (schedules if pp > 1 else ("1f1b",)):
            chunks = SCHEDULES[schedule].chunks  # 0: the user picks the chunks per rank (interleaving)
            vs = [chunks] if chunks else []
            if not chunks and (m % pp == 0 or not SCHEDULES[schedule].microbatches_multiple_of_p):
                vs = _virtual_choices(model.num_layers, pp, layers_per_stage, space.even_chunks)
            for v in vs:
                for zero in zeros:
                    for rc in space.recompute:
                        for sp in sps:
                            yield Plan(tp, pp, dp, cp, ep, b, schedule, v, zero, rc, sp)


def valid_plans(plans: Iterable[Plan],
                build: Callable[[Plan], Scenario]) -> Iterator[tuple[Plan, Scenario | None, str]]:
    """(plan, Scenario, "") for the plans the scenario rules accept, (plan, None, reason) for the others;
    ``build(plan)`` makes the Scenario (``scenario_from_dict`` of ``apply_plan``, see ``sweep.BaseScenario``)."""
    for plan in plans:
        try:
            yield plan, build(plan), ""
        except ScenarioError as exc:
            yield plan, None, str(exc)
