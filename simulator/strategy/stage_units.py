"""What a pipeline rank holds and what its passes allocate, written once: the virtual stages of each
rank (the schedule's stage map) and their layers, each virtual stage's units (embedding, layers, LM
head), the parameters of a unit and of a rank, and each unit's activation deltas per pass (F, B, W), with
the layers a full recompute re-runs from ``recompute``.

The lowering puts these deltas on its tasks, ``analysis.memory.schedule_trace`` on one event per
unit and the search estimate folds them per action; the parameters are the lowering's, the memory
report's and the search's. Sizes come from ``activation_memory`` and ``sharding.params_per_rank``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, Union

from ..model import repeat_kv
from ..model.opgraph import OpGraph, build_op_graph
from ..model.spec import ModelSpec
from .activation_memory import (embedding_activation_bytes, head_activation_bytes, layer_activation_bytes,
                                layer_activation_split, loss_backward_bytes)
from .recompute import layer_recompute_modes, recompute_groups
from .schedules import StageMap, splits_backward, stage_map
from .sharding import params_per_rank

if TYPE_CHECKING:  # scenario imports strategy: a type-only import
    from ..scenario import ParallelSpec, Scenario

Unit = Union[str, int]  # "embed", a global layer index, "head"


def chunk_sizes(layers_per_stage: tuple[int, ...], v: int, smap: StageMap | None = None) -> tuple[int, ...]:
    """Layers of every virtual stage (chunk c of rank r is virtual stage ``smap.stage(r, c)``, c·p + r in
    the default loop map).

    Each stage's layers are spread as evenly as possible over its v chunks. When they do not divide,
    the chunks holding the embedding (chunk 0 of stage 0) and the LM head (chunk v-1 of the last
    stage) are the ones left one layer short, as Megatron-core's account_for_embedding_in_pipeline_split
    / account_for_loss_in_pipeline_split count those as layers (Llama 3's 126 layers on 16 stages with
    one layer fewer on the first and the last, Dubey et al. 2024 §3.3.2); otherwise the later chunks
    get the extra layers."""
    p = len(layers_per_stage)
    if v < 1 or any(n < v for n in layers_per_stage):
        raise ValueError(f"layers per stage {list(layers_per_stage)} cannot fill virtual_stages = {v} chunks each")
    sizes = [0] * (p * v)
    smap = smap or StageMap("loop", p)
    for s, n in enumerate(layers_per_stage):
        held = smap.stages_of(s, v)
        ends = {c for c in range(v) if held[c] in (0, p * v - 1)}
        order = sorted(range(v), key=lambda c: (c in ends, -c if s != p - 1 else c))
        for k, c in enumerate(order):
            sizes[held[c]] = n // v + (1 if k < n % v else 0)
    return tuple(sizes)


def chunk_layers(layers_per_stage: tuple[int, ...], v: int, smap: StageMap | None = None,
                 mtp_layers: int = 0) -> tuple[tuple[int, ...], ...]:
    """Global layer indices of every virtual stage, in virtual-stage order (see ``chunk_sizes``). A map
    of two model copies ("dual") gives each copy's stage k the layers of pipeline stage k. The
    ``mtp_layers`` MTP modules (indices after the main layers) follow the last main layer, on the
    virtual stage that holds the LM head: Megatron-core builds them in the last stage's post-process
    part, outside num_layers_in_last_pipeline_stage."""
    if smap is not None and smap.copies > 1:
        return chunk_layers(layers_per_stage, v // smap.copies, None, mtp_layers) * smap.copies
    out, first = [], 0
    for n in chunk_sizes(layers_per_stage, v, smap):
        out.append(tuple(range(first, first + n)))
        first += n
    smap, nv = smap or StageMap("loop", len(layers_per_stage)), len(out)
    last = next(vs for vs in range(nv) if smap.next(vs, nv) is None)
    out[last] += tuple(range(first, first + mtp_layers))
    return tuple(out)


@dataclass(frozen=True)
class StageLayout:
    """The schedule a plan runs (one stage runs plain 1F1B), its stage map and every virtual stage's
    layers (``chunk_layers`` under that map)."""

    schedule: str
    p: int
    v: int
    smap: StageMap
    chunks: tuple[tuple[int, ...], ...]  # virtual stage -> global layer indices

    @property
    def nv(self) -> int:
        return self.p * self.v

    def held(self, stage: int) -> tuple[int, ...]:
        """The virtual stages pipeline rank ``stage`` holds, in chunk order."""
        return self.smap.stages_of(stage, self.v)

    def rank_stages(self) -> tuple[tuple[int, ...], ...]:
        """Every pipeline rank's virtual stages, in chunk order (``held``)."""
        return tuple(self.held(r) for r in range(self.p))

    def units(self, vs: int) -> tuple[Unit, ...]:
        """The virtual stage's units in forward order: "embed" at its model copy's first stage, its
        layers, "head" at the copy's last."""
        return ((("embed",) if self.smap.prev(vs) is None else ()) + self.chunks[vs]
                + (("head",) if self.smap.next(vs, self.nv) is None else ()))

    @property
    def head_rank(self) -> int:
        """The pipeline rank holding the last virtual stage (its LM head)."""
        return self.smap.rank(self.nv - 1)

    @property
    def ends_together(self) -> bool:
        """Every rank holding an embedding holds an LM head (one stage, a V map; DualPipe's end ranks
        each hold one copy's embedding and the other's head), so a tied word embedding is one tensor."""
        ends = [(self.smap.prev(vs) is None, self.smap.next(vs, self.nv) is None) for vs in range(self.nv)]
        return all(any(e for e, _ in held) == any(h for _, h in held)
                   for held in ([ends[vs] for vs in self.held(r)] for r in range(self.p)))

    @property
    def copies(self) -> int:
        """Model copies the ranks hold (2 for DualPipe: each micro-batch runs through one of them)."""
        return self.smap.copies

    def microbatches(self, m: int) -> int:
        """Micro-batches each virtual stage runs when the step has ``m``: each copy runs its share."""
        return m // self.copies

    def copy_peer(self, stage: int) -> int | None:
        """The pipeline rank holding the other copy of ``stage``'s virtual stages (DualPipe: copy A's
        stage r sits on rank r, copy B's on rank p - 1 - r), whose gradients are summed with this
        rank's before the optimizer step; None with one copy."""
        return self.p - 1 - stage if self.copies > 1 else None


def _schedule_map(par: ParallelSpec) -> tuple[str, int, StageMap]:
    """(schedule, virtual stages, stage map) a ``ParallelSpec`` runs: one stage runs plain 1F1B."""
    schedule, v = (par.schedule, par.virtual_stages) if par.pp > 1 else ("1f1b", 1)
    return schedule, v, stage_map(schedule, par.pp)


def layout_copies(par: ParallelSpec) -> int:
    """``stage_layout(par).copies`` without laying out the layers (the memory estimate asks it per plan)."""
    return _schedule_map(par)[2].copies


def stage_layout(par: ParallelSpec, mtp_layers: int = 0) -> StageLayout:
    """The layout of a ``ParallelSpec`` (with a model's ``mtp_layers`` MTP modules): schedule and
    chunks as the lowering runs them."""
    schedule, v, smap = _schedule_map(par)
    per_stage = tuple(par.layers_per_stage) or (0,) * par.pp
    return StageLayout(schedule, par.pp, v, smap, chunk_layers(per_stage, v, smap, mtp_layers))


def scenario_layout(scn: Scenario) -> StageLayout:
    """``stage_layout`` of a scenario: its parallelism with its model's MTP modules."""
    return stage_layout(scn.parallel, scn.model.mtp_layers)


# ---- activation deltas -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class LayerMemory:
    """Activation bytes of one layer kind and micro-batch on one rank, as the lowering moves them:
    ``stored`` allocated by F; freed ``at_b`` by B and ``at_w`` by W (B frees all when the schedule
    does not split the backward); ``transient``: what a recompute re-materialises from the recompute
    to the end of the layer's backward; ``group_alloc``: with Megatron's uniform groups of N layers
    (``recompute_groups``) what the layer's first recompute allocates, its whole group's transient for
    the group's last layer (the first backward) and nothing for the others (None: its own)."""

    stored: float
    at_b: float
    at_w: float
    transient: float
    group_alloc: float | None = None

    @property
    def recompute_alloc(self) -> float:
        """Bytes the layer's first recompute task allocates."""
        return self.transient if self.group_alloc is None else self.group_alloc


def layer_memory(scn: Scenario, split_backward: bool, dense_mlp: bool = False, recompute_workspace: bool = True,
                 recompute: str | None = None) -> LayerMemory:
    """The one rule for a layer's activation deltas (lowering, ``analysis.memory.schedule_trace`` and
    the search's estimate): a scenario's plan, a layer of the MoE or of the dense kind
    (``OpGraph.layer_ops``: an MoE model's first dense layers), under ``recompute`` (default the plan's;
    ``recompute.layer_recompute`` of the layer)."""
    m, par, tr = scn.model, scn.parallel, scn.training
    recompute = par.recompute if recompute is None else recompute
    args = (m, tr.micro_batch_size, par.tp, par.sequence_parallel, par.cp)
    kw: dict[str, Any] = {"dense_mlp": dense_mlp and m.is_moe, "etp": par.etp, "modules": par.recompute_modules,
                          "fp8": tr.dtype == "fp8", "eager": tr.kernels == "eager",
                          "kv_repeat": tr.kernels == "eager" and tr.attention_module == repeat_kv.MODULE}
    d, att, ep = tr.dtype_bytes, tr.attention, par.ep
    stored = layer_activation_bytes(*args, recompute, d, ep, att, **kw)
    transient = 0.0  # what the recompute re-materialises: stored without it less stored with it
    if recompute != "none" and recompute_workspace:
        transient = layer_activation_bytes(*args, "none", d, ep, att, **kw) - stored
    at_b, at_w = layer_activation_split(*args, recompute, d, ep, att, **kw) if split_backward else (stored, 0.0)
    return LayerMemory(stored, at_b, at_w, transient)


def layer_memories(scn: Scenario, split_backward: bool, recompute_workspace: bool,
                   modes: tuple[str, ...], groups: tuple[tuple[int, ...], ...] = ()) -> tuple[LayerMemory, ...]:
    """``layer_memory`` of every layer index, by its kind and its recompute mode (``modes``, per
    index: ``layer_recompute_modes``), one object per pair; then each of Megatron's uniform groups
    (``recompute_groups``) keeps only its first layer's input, and its last layer's recompute allocates
    what the whole group re-materialises (every other layer's input included)."""
    m = scn.model
    keys = [(m.has_dense_mlp(i), modes[i]) for i in range(m.total_layers)]  # MTP: the main kind
    kinds = {k: layer_memory(scn, split_backward, k[0], recompute_workspace, k[1]) for k in dict.fromkeys(keys)}
    out = [kinds[k] for k in keys]
    for group in groups:
        # a later layer of the group stores nothing; its re-materialised input joins its remainder
        inner = {i: LayerMemory(0.0, 0.0, 0.0, out[i].transient + (out[i].stored if recompute_workspace else 0.0),
                                0.0) for i in group[1:]}
        first = replace(out[group[0]], group_alloc=0.0)
        grouped = {group[0]: first, **inner}
        top = group[-1]
        grouped[top] = replace(grouped[top], group_alloc=sum(x.transient for x in grouped.values()))
        for i, lm in grouped.items():
            out[i] = lm
    return tuple(out)


# ---- parameters ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class UnitParams:
    """(dense, expert) parameters one rank holds of each unit; a head on the embedding's rank excludes
    the tied word embedding (counted once, in "embed")."""

    layers: tuple[tuple[float, float], ...]  # per global layer index, by its kind
    embed: tuple[float, float]
    head: tuple[float, float]

    def of(self, unit: Unit) -> tuple[float, float]:
        return self.embed if unit == "embed" else self.head if unit == "head" else self.layers[int(unit)]


def unit_params(graph: OpGraph, par: ParallelSpec, layout: StageLayout) -> UnitParams:
    tp, ep = par.tp, par.ep
    kinds: dict = {}
    layers = []
    for i in range(graph.model.total_layers):
        ops = graph.layer_ops(i)
        if id(ops) not in kinds:
            c = params_per_rank(graph, tp, ep, (i,), False, False, par.etp)
            kinds[id(ops)] = (c["dense"], c["expert"])
        layers.append(kinds[id(ops)])
    embed = params_per_rank(graph, tp, ep, 0, True, False)["dense"]
    head = (params_per_rank(graph, tp, ep, 0, True, True)["dense"] - embed if layout.ends_together
            else params_per_rank(graph, tp, ep, 0, False, True)["dense"])
    return UnitParams(tuple(layers), (embed, 0.0), (head, 0.0))


def stage_param_counts(graph: OpGraph, par: ParallelSpec, layout: StageLayout, stage: int) -> dict:
    """{"dense", "expert"} parameters a rank of pipeline ``stage`` holds: the layers of its virtual
    stages, each of its own kind (an MoE model's first dense layers), and the embedding / head where
    it holds the model's ends, under the schedule's stage map (a V map puts both on rank 0). The one
    parameter counter of the lowering, the memory report and the search.

    Megatron-LM layout (``sharding.params_per_rank``): column- and row-parallel weights and the
    column-parallel biases are split by tp; the row-parallel output biases and the norms are
    replicated (Shoeybi et al. 2019, sec. 3); GQA with fewer KV heads than tp replicates them; experts
    num_experts/ep per rank, each split by etp; the router replicated; the word embedding and LM head
    vocab-parallel, the learned position table replicated; with tied embeddings the head's rank keeps
    a copy of the word embedding unless it also holds the embedding."""
    if not 0 <= stage < layout.p:
        raise ValueError(f"stage_param_counts: stage {stage} outside 0..{layout.p - 1}")
    units = [u for vs in layout.held(stage) for u in layout.units(vs)]
    own = tuple(u for u in units if isinstance(u, int))
    return params_per_rank(graph, par.tp, par.ep, own, "embed" in units, "head" in units, par.etp)


def copy_sync_bytes(par: ParallelSpec, layout: StageLayout, counts: dict, grad_dtype_bytes: int) -> float:
    """Bytes of the all-reduce over (rank, ``copy_peer``) that sums the two model copies' gradients before
    the optimizer step (DualPipe: the example of the DeepSeek-AI repository adds the peer's gradients
    of the same stage, ``p0.grad += p1all[pp_size - 1 - rank]``), after the data-parallel reduction: the
    rank's whole gradient buffer ({"dense", "expert"} parameters ``counts``), the ZeRO-2/3 shard of it
    when the gradients are sharded (dense over the DP shard group, experts over the expert-DP group).
    0 with one copy."""
    if layout.copies == 1:
        return 0.0
    sharded = par.zero_stage >= 2
    dense_dp = (par.shard_group_size or par.dp * par.cp) if sharded else 1
    expert_dp = par.expert_dp if sharded else 1
    return grad_dtype_bytes * (counts.get("dense", 0) / dense_dp + counts.get("expert", 0) / expert_dp)


def rank_param_counts(model: ModelSpec, par: ParallelSpec, stage: int) -> dict:
    """``stage_param_counts`` from a model and a ``ParallelSpec`` (parameters do not depend on the
    micro-batch or the dtype: the op graph is built at 1 and bf16)."""
    return stage_param_counts(build_op_graph(model, 1, "bf16"), par, stage_layout(par, model.mtp_layers), stage)


# ---- activation deltas ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class UnitDeltas:
    """Activation bytes of one unit's pass on one rank: ``alloc_bytes`` allocated when the pass starts
    (F: what the unit stores; B: the output gradients W needs beyond what B frees),
    ``recompute_bytes`` re-materialised by its recompute (B of a recomputed layer) and ``free_bytes``
    released, with the recomputed bytes, when the pass ends."""

    alloc_bytes: float = 0.0
    recompute_bytes: float = 0.0
    free_bytes: float = 0.0
    recompute_free_bytes: float | None = None  # re-materialised bytes released at the end (None: recompute_bytes)

    def events(self) -> tuple[tuple[float, str], ...]:
        """(signed delta, phase tag) in order: the allocation ("R" when it includes a recompute), then the
        release, each omitted when zero (the walk of ``analysis.memory.schedule_trace``)."""
        up = self.alloc_bytes + self.recompute_bytes
        freed = self.recompute_bytes if self.recompute_free_bytes is None else self.recompute_free_bytes
        down = self.free_bytes + freed
        return (((up, "R" if self.recompute_bytes else ""),) if up else ()) + (((-down, ""),) if down else ())


@dataclass(frozen=True)
class ActivationRules:
    """The activation deltas of every unit and pass: F allocates a unit's stored activations; B frees
    the embedding's and the head's, and a layer's ``at_b`` part (a negative part is allocated: the
    output gradients W needs), a recomputed layer holding its re-materialised activations from its
    recompute to the end of its backward; W frees a layer's ``at_w`` part (``LayerMemory``)."""

    layers: tuple[LayerMemory, ...]
    embed_bytes: float
    head_bytes: float
    loss_backward_bytes: float = 0.0  # the head's B also allocates, then frees, the loss's gradients

    @cached_property
    def _table(self) -> dict:
        out: dict = {}
        for end, size in (("embed", self.embed_bytes), ("head", self.head_bytes)):
            out[end, "F"], out[end, "B"], out[end, "W"] = UnitDeltas(size), UnitDeltas(free_bytes=size), UnitDeltas()
        grads = self.loss_backward_bytes
        if grads:
            out["head", "B"] = UnitDeltas(grads, free_bytes=self.head_bytes + grads)
        for i, lm in enumerate(self.layers):
            out[i, "F"] = UnitDeltas(lm.stored)
            grouped = None if lm.group_alloc is None else lm.transient  # a uniform group frees its own share
            out[i, "B"] = UnitDeltas(max(-lm.at_b, 0.0), lm.recompute_alloc, max(lm.at_b, 0.0), grouped)
            out[i, "W"] = UnitDeltas(free_bytes=lm.at_w)
        return out

    def unit(self, unit: Unit, phase: str) -> UnitDeltas:
        """The deltas of ``unit`` ("embed", "head", a layer index or its string) in pass ``phase``."""
        return self._table[unit if unit in ("embed", "head") else int(unit), phase]

    def action(self, units: tuple[Unit, ...], phase: str) -> list[tuple[Unit, float, str]]:
        """(unit, signed delta, tag) of one action's units in program order (backward: reversed);
        the tag is "R" for a recompute's allocation, else the action's phase."""
        order = units if phase == "F" else units[::-1]
        return [(u, delta, tag or phase) for u in order for delta, tag in self.unit(u, phase).events()]


def activation_rules(scn: Scenario, split_backward: bool | None = None, recompute_workspace: bool = True) -> ActivationRules:
    """The rules of a scenario's plan (``split_backward``: default, whether its schedule splits it)."""
    m, par, tr = scn.model, scn.parallel, scn.training
    layout = scenario_layout(scn)
    if split_backward is None:
        split_backward = splits_backward(layout.schedule)
    args = (m, tr.micro_batch_size, par.tp, par.sequence_parallel, par.cp, tr.dtype_bytes)
    modes = layer_recompute_modes(par, layout, m)
    groups = recompute_groups(par, layout.chunks, m.num_layers)
    return ActivationRules(layer_memories(scn, split_backward, recompute_workspace, modes, groups),
                           embedding_activation_bytes(*args), head_activation_bytes(*args),
                           loss_backward_bytes(m, tr.micro_batch_size, par.tp, par.cp, tr.cross_entropy))


# ---- the output layer's deferred weight gradients -------------------------------------------------
@dataclass(frozen=True, slots=True)
class DeferredHeadWgrad:
    """Megatron-Core's ``defer_embedding_wgrad_compute``: the output layer's backward computes only its
    input gradient for the step's first ``microbatches`` micro-batches (``wgrad_deferral_limit``; 0: all
    of them), buffering its input (``embedding_activation_buffer``: the sequence-parallel shard the
    forward saved) and its output gradient (``grad_output_buffer``, cast to the activation dtype), and
    ``drain_embedding_wgrad_compute`` runs their weight-gradient GEMMs on the last stage after its last
    backward, before the gradients are reduced (megatron/core/tensor_parallel/layers.py,
    pipeline_parallel/schedules.py, utils.py). ``kept_bytes``: what each deferred micro-batch holds from
    its head backward to its GEMM in the flush."""

    microbatches: int = 0
    kept_bytes: float = 0.0


def deferred_head_wgrad(scn: Scenario) -> DeferredHeadWgrad:
    """The scenario's deferral (none unless ``parallelism.defer_embedding_wgrad_compute``)."""
    m, par, tr = scn.model, scn.parallel, scn.training
    if not par.defer_embedding_wgrad_compute or par.pp == 1:
        return DeferredHeadWgrad()
    n = scn.num_microbatches  # the head's backwards on the last stage in one step
    tokens = (m.seq_length // par.cp) * tr.micro_batch_size
    saved_input = tokens * m.hidden_size / (par.tp if par.sequence_parallel else 1)
    grad_output = tokens * -(-m.vocab_size // par.tp)
    return DeferredHeadWgrad(min(par.wgrad_deferral_limit or n, n), tr.dtype_bytes * (saved_input + grad_output))
