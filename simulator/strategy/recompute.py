"""Which layers recompute and what a layer's backward runs again of its forward: the whole layer
(full recompute) or the ops of Megatron-Core's selective-recompute modules. One rule for the lowering
(``layer_emit.layer_backward`` emits the ops as tasks of category "recompute", phase R) and the search's
time estimate (``explore/estimate._layer_times`` adds their seconds to the backward).

Megatron-Core (megatron/core/transformer/, TransformerConfig.recompute_modules, default
["core_attn"]) re-runs each module's forward right before the backward that needs it:

- "core_attn" (attention.py checkpoint_core_attention, tensor_parallel.checkpoint): the attention
  core, when the backward reaches it (Korthikanti et al. 2022 §4.3), with its CP exchange;
- "mla_up_proj" (multi_latent_attention.py recompute_up_proj, CheckpointWithoutOutput): the q and
  kv up projections (or q_proj without a q LoRA rank) and RoPE, from a gradient hook on the core
  attention's output, i.e. after the output projection's backward and before the core's;
- "moe_act" (moe/experts.py TEGroupedMLP activation_recompute, CheckpointWithoutOutput): the
  experts' activation, from a hook on the fc2 output: after the combine's backward, before the
  experts' backward;
- "layernorm" (transformer_layer.py input_layernorm_checkpoint / pre_mlp_norm_checkpoint,
  CheckpointWithoutOutput): a norm that is a module of its own (``activation_memory.standalone_norms``),
  from a hook on its block's output: before the attention's (MLP's) backward;
- "mlp" (transformer_layer.py recompute_mlp, dense layers only, tensor_parallel.checkpoint): the
  dense MLP module (TE's linear_fc1 with the pre-MLP norm, the activation, linear_fc2) with its TP
  collectives (SP all-gather of the input, reduce-scatter or all-reduce of the output), before the
  MLP's backward;
- "moe" (moe/moe_layer.py moe_layer_recompute, tensor_parallel.checkpoint): the MoE layer from the
  pre-MLP norm's output on (router, permutation, EP dispatch, experts, combine, unpermutation,
  shared experts) with the MLP block's TP collectives, before the MLP's backward;
- "shared_experts" (moe_layer.py shared_experts_recompute, tensor_parallel.checkpoint): the shared
  experts' GEMMs and activation, before their backward. Their own TP collectives are not re-run:
  the layer model has none of its own for them (the MLP block's stand for them).

torchtitan's per-op selective AC (``recompute = "selective-op"``; torchtitan
distributed/activation_checkpoint.py ``SelectiveAC``, ``selective_ac_option = "op"``) wraps each block in
a non-reentrant checkpoint whose policy saves the outputs of matmuls and attention except every second
matmul of the block, counted in forward order (q, k, v, the output projection, then the MLP's gate, up
and down projections, or up and down); the backward's first use of a saved tensor re-runs the block's
forward (``early_stop=False``: all of it), with the saved ops' outputs taken from the cache: the norms,
RoPE, activations and residual adds, and the k, output and up projections (fc2 without a gate). Each
matmul of a fused op-graph GEMM is its own GEMM there (``op_sac_rerun``). With TP (torchtitan's plan is
sequence-parallel) the policy's save list holds ``_c10d_functional.reduce_scatter_tensor`` but not the
all-gathers (torchtitan models/llama3/parallelize_llama.py ``_save_list`` at 9dec370 and 820504e), so the
re-run gathers the attention's and the MLP's inputs again, each before its block's re-run ops, and
skips the reduce-scatters.

Nested checkpoints run again as Megatron-Core's do: with "moe", the experts' activation ("moe_act")
and the shared experts ("shared_experts") are re-run by the MoE recompute and once more before
their own backward. The bytes the recompute re-materialises (``LayerMemory.transient``) are
allocated by the layer's first recompute task and released when its backward ends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from ..model.spec import ModelSpec
from ..tasks import InternalError, OpWork
from .activation_memory import standalone_norms
from .blocks import LayerBlocks, Work

if TYPE_CHECKING:  # layer_emit and stage_units import this module; scenario imports strategy: type-only imports
    from ..scenario import ParallelSpec
    from .blocking_tp import BlockingTP
    from .stage_units import StageLayout

# recompute_method with recompute = "full": Megatron-LM's uniform and block, torchtitan's interval
# (``recomputed_layers``, ``recompute_groups``)
RECOMPUTE_METHODS = ("uniform", "block", "interval")
# the op graph's op names (model/opgraph.py) each module re-runs
_UP_PROJ = frozenset({"q_up", "q_proj", "kv_up", "rope"})  # MLA's up projections and RoPE
_DENSE_MLP = frozenset({"ln2", "fc1", "act", "fc2"})  # TE linear_fc1 holds the norm (layer spec)
_ROUTER = frozenset({"router", "router_topk", "moe_permute"})
_SHARED = frozenset({"shared_fc1", "shared_act", "shared_fc2"})
_COMBINED = frozenset({"moe_unpermute"}) | _SHARED
_LN1, _LN2, _ACT = frozenset({"ln1"}), frozenset({"ln2"}), frozenset({"expert_act"})


class LayerRecompute(NamedTuple):
    """The re-run forward of one layer kind (see the module doc), in backward order of emission.

    ``layer``: the whole forward (full). ``mlp_norm``: the pre-MLP norm; ``mlp_pre`` / ``experts`` /
    ``mlp_post``: the MLP block's forward, before, as and after the routed experts ("mlp": the dense
    MLP in ``mlp_pre``; "moe": router and permutation, the experts between the EP all-to-alls, the
    unpermutation and the shared experts), with the block's blocking TP collectives when ``mlp_tp``;
    ``shared``: the shared experts; ``act``: the experts' activation; ``attn_norm``: the input norm;
    ``up_proj``: MLA's up projections and RoPE; ``core``: the attention core; ``ops``: what torchtitan's
    per-op SAC re-runs of the whole layer, before its backward, and ``ops_split`` the same as (the
    attention block's, the MLP block's), which TP re-runs with the blocks' input all-gathers between."""

    layer: bool = False
    mlp_norm: Work = ()
    mlp_pre: Work = ()
    experts: bool = False
    mlp_post: Work = ()
    mlp_tp: bool = False
    shared: Work = ()
    act: Work = ()
    attn_norm: Work = ()
    up_proj: Work = ()
    core: bool = False
    ops: Work = ()
    ops_split: tuple[Work, Work] = ((), ())

    @property
    def any(self) -> bool:
        """Whether anything is re-run."""
        return self.layer or self.core or self.experts or any(self.works_without_experts())

    @property
    def inside_attention(self) -> bool:
        """Whether something is re-run between the attention's output projection and its core, so the
        attention's backward is emitted in its parts."""
        return self.core or bool(self.up_proj)

    def collectives(self, tp: BlockingTP) -> tuple[tuple, ...]:
        """The blocking TP collectives re-run, (op, overlap site) as ``tp`` (the layer's) lists them:
        per-op SAC's input gathers (none without TP), or the MLP block's entry and exit."""
        if self.ops:
            return tuple(c for c in (tp.attn_in, tp.mlp_in) if c is not None)
        return tuple(c for c in (tp.mlp_in, tp.mlp_out) if c is not None) if self.mlp_tp else ()

    def works_without_experts(self) -> tuple[Work, ...]:
        """The re-run compute other than the experts' and the core's, in emission order."""
        return (self.ops, self.mlp_norm, self.mlp_pre, self.mlp_post, self.shared, self.act, self.attn_norm,
                self.up_proj)


def recomputed_forward(recompute: str, modules: tuple[str, ...], model: ModelSpec, b: LayerBlocks) -> LayerRecompute:
    """What the backward of a layer whose blocks are ``b`` runs again of its forward, for
    ``parallelism.recompute`` and (when "selective") ``parallelism.recompute_modules``."""
    if recompute == "full":  # Chen et al. 2016; Megatron-LM --recompute-granularity full
        return LayerRecompute(layer=True)
    if recompute == "selective-op":
        attn, mlp = b.memo(("selective-op", "split"), lambda: op_sac_rerun(b, model))
        return LayerRecompute(ops=b.memo(("selective-op",), lambda: attn + mlp), ops_split=(attn, mlp))
    if recompute != "selective":
        return LayerRecompute()
    moe_layer = b.experts is not None
    attn_norm, mlp_norm = standalone_norms(model, moe_layer)
    picked = lambda ops, on: b.forward_of(ops) if on else ()  # noqa: E731
    moe = "moe" in modules and moe_layer
    dense_mlp = "mlp" in modules and not moe_layer  # transformer_layer.py: recompute_mlp if not is_moe_layer
    return LayerRecompute(
        mlp_norm=picked(_LN2, "layernorm" in modules and mlp_norm),
        mlp_pre=picked(_DENSE_MLP, dense_mlp) or picked(_ROUTER, moe),
        experts=moe,
        # with moe_shared_expert_overlap the shared experts re-run beside the all-to-alls (layer_emit._experts)
        mlp_post=picked(_COMBINED if b.shared_in is None else _COMBINED - _SHARED, moe),
        mlp_tp=moe or dense_mlp,
        shared=picked(_SHARED, "shared_experts" in modules and moe_layer),
        act=picked(_ACT, "moe_act" in modules and moe_layer),
        attn_norm=picked(_LN1, "layernorm" in modules and attn_norm),
        up_proj=picked(_UP_PROJ, "mla_up_proj" in modules and model.is_mla),
        core="core_attn" in modules)


def _matmuls(name: str, model: ModelSpec) -> tuple[int, ...]:
    """Output widths of the matmuls torchtitan's modules run for the op graph's GEMM ``name``, in order
    (its Attention: wq, wk, wv; its FeedForward: w1 (gate) and w3 (up), then w2)."""
    if name == "qkv":
        kv = model.num_kv_heads * model.head_dim
        return (model.num_attention_heads * model.head_dim, kv, kv)
    if name == "fc1" and model.gated_mlp:
        return (model.ffn_hidden_size,) * 2
    if name in ("fc1", "fc2", "attn_out"):
        return (0,)  # the whole GEMM
    raise InternalError(f"selective-op recompute: no matmul order for the GEMM {name!r}")


def op_sac_rerun(b: LayerBlocks, model: ModelSpec) -> tuple[Work, Work]:
    """The forward work torchtitan's per-op SAC re-runs (module doc), as (the attention block's, the
    MLP block's): every op but the attention core and the odd-numbered matmuls of the layer, each
    matmul of a fused GEMM scaled to its own columns."""
    attn: list[OpWork] = []
    mlp: list[OpWork] = []
    count = 0
    for seg in b.segments():
        count = _op_sac_segment(seg.fwd, model, count, attn if seg.name.startswith("attn") else mlp)
    return tuple(attn), tuple(mlp)


def _op_sac_segment(fwd: Work, model: ModelSpec, count: int, out: list[OpWork]) -> int:
    """Append to ``out`` what per-op SAC re-runs of one segment's forward ``fwd``, whose first matmul
    is the layer's ``count`` + 1-th; returns the layer's matmul count after it."""
    for w in fwd:
        if w.kind == "attention":
            continue
        if w.kind != "gemm":
            out.append(w)
            continue
        m, n, k = w.shape
        widths = _matmuls(w.name.partition(".")[0], model)
        dtype_bytes = w.bytes / (m * k + k * n + m * n)
        for part, width in enumerate(widths):
            count += 1
            if count % 2:
                continue
            cols = width or n
            out.append(OpWork(f"{w.name}.mm{part}", "gemm", w.flops * cols / n, (m * k + k * cols + m * cols)
                              * dtype_bytes, (m, cols, k), w.precision, w.backward, w.kernels))
    return count


# ---- which layers recompute (one rule for the lowering, the memory rules and the estimate) ----------
def recomputed_layers(par: ParallelSpec, chunks: tuple[tuple[int, ...], ...], num_layers: int,
                      held: tuple[tuple[int, ...], ...] = ()) -> frozenset[int]:
    """The layers whose backward re-runs their whole forward (``recompute = "full"``; none otherwise).
    Megatron-Core's TransformerBlock._checkpointed_forward: method "uniform" checkpoints every layer;
    "block" only the first ``recompute_num_layers`` layers of each model chunk (one TransformerBlock per
    virtual stage, "the rest without any recomputing"). torchtitan's selective layer AC
    (``selective_ac_option = N``, "interval" here): every N-th transformer block a rank builds, counted
    from 1 over its model parts in order (``_apply_layer_sac``'s process-wide ``_count``), i.e. over
    ``held``, each pipeline rank's virtual stages in chunk order (StageLayout.held). MTP layers (indices
    from ``num_layers``) are recomputed under full recompute whatever the method (the MTP block
    checkpoints its layers for full granularity). One rule for the lowering, the memory rules and the
    estimate."""
    if par.recompute != "full":
        return frozenset()
    every = frozenset(i for chunk in chunks for i in chunk)
    mtp = (i for i in every if i >= num_layers)
    if par.recompute_method == "uniform":
        return every
    n = par.recompute_num_layers
    if par.recompute_method == "interval":
        if not held:
            raise InternalError("recomputed_layers: the interval method needs each rank's virtual stages")
        rank_layers = ([i for vs in stages for i in chunks[vs] if i < num_layers] for stages in held)
        return frozenset(i for layers in rank_layers for k, i in enumerate(layers, 1) if k % n == 0).union(mtp)
    first = (i for chunk in chunks for i in [j for j in chunk if j < num_layers][:n])
    return frozenset(first).union(mtp)


def recompute_groups(par: ParallelSpec, chunks: tuple[tuple[int, ...], ...],
                     num_layers: int) -> tuple[tuple[int, ...], ...]:
    """Megatron-Core's uniform method with ``recompute_num_layers`` N > 1 (TransformerBlock.
    _checkpointed_forward: ``checkpoint_handler(custom(layer_idx, layer_idx + N))`` over each model
    chunk's layers): the consecutive groups of N layers of every chunk that share one checkpoint, each
    in forward order; () for any other plan (every recomputed layer its own checkpoint). MTP layers
    (indices from ``num_layers``) keep their own."""
    n = par.recompute_num_layers
    if par.recompute != "full" or par.recompute_method != "uniform" or n <= 1:
        return ()
    mains = ([i for i in chunk if i < num_layers] for chunk in chunks)
    groups = (tuple(layers[k:k + n]) for layers in mains for k in range(0, len(layers), n))
    return tuple(g for g in groups if len(g) > 1)


def layer_recompute(par: ParallelSpec, recomputed: frozenset[int], layer: int) -> str:
    """The recompute mode layer ``layer`` runs: the plan's, except "none" for the layers the "block"
    method leaves out of a full recompute (``recomputed_layers``)."""
    if par.recompute != "full":
        return par.recompute
    return "full" if layer in recomputed else "none"


def layer_recompute_modes(par: ParallelSpec, layout: StageLayout, model: ModelSpec) -> tuple[str, ...]:
    """``layer_recompute`` of every layer index of ``model`` (MTP layers included) under ``layout``."""
    done = recomputed_layers(par, layout.chunks, model.num_layers, layout.rank_stages())
    return tuple(layer_recompute(par, done, i) for i in range(model.total_layers))
