"""Per-rank work templates of one transformer layer, the embedding and the head.

The op graph is split into the segments between communication points (TP/SP collectives, CP K/V
exchange, EP all-to-all), each segment sharded once by ``strategy/sharding``. The lowering reuses
these tuples for every layer of a kind and every micro-batch (``layer_blocks``: one LayerBlocks per
distinct layer template, ``OpGraph.layer_ops``), which keeps lowering and costing O(segments).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, TypeVar

from ..model.opgraph import Op, OpGraph
from ..tasks import OpWork
from .embed_grad import embedding_grad_work
from .sharding import shard_ops, shard_ops_backward

T = TypeVar("T")

Work = tuple[OpWork, ...]


@dataclass(frozen=True)
class Segment:
    """Forward work, backward input-gradient (B) and weight-gradient (W) work of a run of ops.

    The backward of a segment that opens with a column-parallel GEMM (QKV, fc1, the router) is cut
    around that GEMM, as Megatron-LM's LinearWithGradAccumulationAndAsyncCommunication.backward
    runs it (core/tensor_parallel/layers.py): the input-gradient GEMM, then the TP all-reduce (SP:
    reduce-scatter) of that gradient launched asynchronously and overlapped with the weight-gradient
    GEMM, then the ops before the GEMM (the norm) once the collective is done.
    ``bwd_pre`` + ``bwd_wgrad`` + ``bwd_post`` is ``bwd`` regrouped; ``bwd_b_pre`` + ``bwd_b_post``
    is ``bwd_b`` cut at the same place (zero-bubble defers the weight gradient to W).
    """

    name: str
    fwd: Work
    bwd_b: Work
    bwd_w: Work
    bwd: Work  # B and W fused, as non-zero-bubble schedules run them
    bwd_pre: Work = ()
    bwd_wgrad: Work = ()
    bwd_post: Work = ()
    bwd_b_pre: Work = ()
    bwd_b_post: Work = ()


def split_off(seg: Segment, kind: str) -> tuple[Work, Segment]:
    """(the backward work of the segment's ops of ``kind``, the segment without them): the loss's
    backward run as a task of its own (``activation_memory.loss_backward_bytes``)."""
    def keep(w: Work) -> Work:
        return tuple(x for x in w if x.kind != kind)
    cut = tuple(x for x in seg.bwd if x.kind == kind)
    return cut, replace(seg, bwd=keep(seg.bwd), bwd_b=keep(seg.bwd_b), bwd_pre=keep(seg.bwd_pre),
                        bwd_b_pre=keep(seg.bwd_b_pre), bwd_post=keep(seg.bwd_post), bwd_b_post=keep(seg.bwd_b_post))


def _cut(name: str, bwd_b: Work, bwd_w: Work, bwd: Work) -> dict:
    """Backward parts around the first GEMM of the forward (the last one in backward order)."""
    gemms = [i for i, w in enumerate(bwd) if w.kind == "gemm"]
    if not gemms:
        return {"bwd_pre": bwd, "bwd_b_pre": bwd_b}
    i = gemms[-1]
    g = bwd[i].name
    b = tuple(w for w in bwd_b if w.name == g)
    wg = tuple(w for w in bwd_w if w.name == g)
    j = next(k for k, w in enumerate(bwd_b) if w.name == g)
    return {"bwd_pre": bwd[:i] + b, "bwd_wgrad": wg, "bwd_post": bwd[i + 1:],
            "bwd_b_pre": bwd_b[:j + 1], "bwd_b_post": bwd_b[j + 1:]}


def _segment(name: str, ops: tuple[Op, ...], tp: int, sp: bool, cp: int, ep: int, acc: float = 0.0,
             etp: int = 0, extra_w: Work = ()) -> Segment:
    """``extra_w``: weight-gradient work the ops' own does not hold (the embedding's dense gradient)."""
    b = shard_ops_backward(ops, tp, sp, cp, ep, "B", 0.0, etp)
    w = shard_ops_backward(ops, tp, sp, cp, ep, "W", acc, etp) + extra_w
    bw = shard_ops_backward(ops, tp, sp, cp, ep, "BW", acc, etp) + extra_w
    return Segment(name, shard_ops(ops, tp, sp, cp, ep, etp), b, w, bw, **_cut(name, b, w, bw))


# The shared experts' ops (model/opgraph), split as SharedExpertMLP runs them when overlapped:
# linear_fc1_forward_and_act beside the dispatch, linear_fc2_forward beside the combine.
SHARED_IN = frozenset({"shared_fc1", "shared_act"})
SHARED_OUT = frozenset({"shared_fc2"})


@dataclass(frozen=True)
class LayerBlocks:
    """One layer cut at its communication points.

    attn_pre | attn_core | attn_post  -- [TP collective] --  mlp_pre | experts | mlp_post  -- [TP collective]
    Dense layers have empty ``experts`` / ``mlp_post``; the MoE dispatch all-to-all sits between
    mlp_pre (norm + router) and experts, the combine between experts and mlp_post.
    ``core_steps``: the first of the cp ring-attention steps of the attention core (forward, B, B+W),
    ``core_later_steps`` each later one (``later_step_work``),
    ``layer_w``: every weight-gradient GEMM of the layer (zero-bubble's W pass). ``attn`` fuses the
    three attention segments into one task where nothing communicates between them (cp = 1), which
    keeps the task graph of large runs small. ``parallel_norms``: a parallel attention + MLP block's
    norms (``ModelSpec.parallel_norms``), 0 for a sequential block.
    """

    attn_pre: Segment
    attn_core: Segment
    attn_post: Segment
    mlp_pre: Segment
    experts: Segment | None
    mlp_post: Segment | None
    embed: Segment
    head: Segment
    core_flops_fwd: float  # attention-core FLOPs on this rank (selective recompute re-runs them)
    core_steps: dict  # "F" | "B" | "BW" -> work of the first of the cp ring steps
    core_later_steps: dict  # "F" | "B" | "BW" -> work of each of the cp - 1 later ring steps
    layer_w: Work
    attn: Segment  # attn_pre + attn_core + attn_post as one segment (no CP exchange inside: cp = 1)
    parallel_norms: int = 0
    # moe_shared_expert_overlap: the shared experts' fc1 + activation and their fc2, out of mlp_post,
    # run beside the dispatch and the combine (layer_emit._experts); None otherwise
    shared_in: Segment | None = None
    shared_out: Segment | None = None
    _picked: dict = field(default_factory=dict, compare=False, repr=False)  # forward_of's memo

    def forward_of(self, ops: frozenset[str]) -> Work:
        """The forward work of the layer's ops named in ``ops`` (with their FP8 quantization kernels,
        named ``op.kernel``), in forward order: what a recompute of those ops runs. One tuple per name
        set and layer template, since the cost model caches work by identity."""
        work = self._picked.get(ops)
        if work is None:
            work = self._picked[ops] = tuple(w for s in self.segments() for w in s.fwd
                                             if w.name.partition(".")[0] in ops)
        return work

    @property
    def shared_input(self) -> bool:
        """A parallel block with one shared norm: QKV and fc1 read one tensor, which enters the TP
        region once (mesh-transformer-jax layers.py: one ``f_psum`` before the norm, one ``g_psum``
        after both branches): one SP all-gather forward, one input-gradient collective backward."""
        return self.parallel_norms == 1

    def mlp_input_grad(self, split_w: bool) -> Work:
        """A shared-input block's MLP backward without fc1's weight gradient, which waits for the
        attention's (``entry_wgrad``); with ``split_w`` its B part."""
        pre = self.mlp_pre
        return pre.bwd_b if split_w else self.memo("mlp_grad", lambda: pre.bwd_pre + pre.bwd_post)

    def entry_wgrad(self, seg: Segment) -> Work:
        """The weight gradients overlapped with the input-gradient collective of ``seg`` (the attention's
        column-parallel segment): its own, and with a shared input fc1's too, whose input is the same
        gathered tensor."""
        if not self.shared_input:
            return seg.bwd_wgrad
        return self.memo(("wgrad", seg.name), lambda: seg.bwd_wgrad + self.mlp_pre.bwd_wgrad)

    def memo(self, key, build: Callable[[], T]) -> T:
        """One tuple per key and layer template, since the cost model caches work by identity."""
        if key not in self._picked:
            self._picked[key] = build()
        return self._picked[key]

    def segments(self) -> tuple[Segment, ...]:
        """The layer's segments in forward order."""
        return tuple(s for s in (self.attn_pre, self.attn_core, self.attn_post, self.mlp_pre, self.shared_in,
                                 self.experts, self.shared_out, self.mlp_post) if s is not None)

    def between_all_to_alls(self) -> tuple[Segment, ...]:
        """What runs between an MoE layer's dispatch and combine: the routed experts, and with
        moe_shared_expert_overlap the shared experts' two segments beside them."""
        return tuple(s for s in (self.shared_in, self.experts, self.shared_out) if s is not None)


def build_blocks(graph: OpGraph, tp: int, sp: bool, cp: int, ep: int,
                 grad_accum_bytes_per_param: float = 0.0, etp: int = 0, embedding_grad_bytes_per_param: float = 0.0,
                 layer: tuple[Op, ...] | None = None) -> LayerBlocks:
    """The blocks of one layer template (``layer``, default the model's main layer, ``graph.layer``)
    on one rank; ``etp``: expert tensor parallelism (0 -> tp); ``embedding_grad_bytes_per_param``: the
    table's dense gradient (``embed_grad``)."""
    ops = graph.layer if layer is None else layer
    attn = tuple(op for op in ops if op.block == "attn")
    mlp = tuple(op for op in ops if op.block == "mlp")
    core_at = next(i for i, op in enumerate(attn) if op.kind == "attention")
    experts_at = [i for i, op in enumerate(mlp) if op.tp_split == "expert"]

    def seg(name: str, ops: tuple[Op, ...]) -> Segment:
        return _segment(name, ops, tp, sp, cp, ep, grad_accum_bytes_per_param, etp)

    shared_in = shared_out = None
    if experts_at:
        lo, hi = experts_at[0], experts_at[-1] + 1
        post = mlp[hi:]
        if graph.model.moe_shared_expert_overlap:  # Megatron-core SharedExpertMLP's overlapped parts
            shared_in = seg("shared_in", tuple(op for op in post if op.name in SHARED_IN))
            shared_out = seg("shared_out", tuple(op for op in post if op.name in SHARED_OUT))
            post = tuple(op for op in post if op.name not in SHARED_IN | SHARED_OUT)
        mlp_pre, experts, mlp_post = seg("mlp_pre", mlp[:lo]), seg("experts", mlp[lo:hi]), seg("mlp_post", post)
    else:
        mlp_pre, experts, mlp_post = seg("mlp", mlp), None, None
    core = seg("attn_core", attn[core_at:core_at + 1])
    attn_pre, attn_post = seg("attn_pre", attn[:core_at]), seg("attn_post", attn[core_at + 1:])
    segs = [s for s in (attn_pre, core, attn_post, mlp_pre, shared_in, experts, shared_out, mlp_post) if s is not None]
    return LayerBlocks(
        attn_pre=attn_pre, attn_core=core, attn_post=attn_post,
        mlp_pre=mlp_pre, experts=experts, mlp_post=mlp_post, shared_in=shared_in, shared_out=shared_out,
        embed=_segment("embed", graph.embed, tp, sp, cp, ep, grad_accum_bytes_per_param, etp,
                       embedding_grad_work(graph, tp, embedding_grad_bytes_per_param)), head=seg("head", graph.head),
        core_flops_fwd=sum(w.flops for w in core.fwd),
        core_steps={"F": split_work(core.fwd, cp), "B": split_work(core.bwd_b, cp), "BW": split_work(core.bwd, cp)},
        core_later_steps={"F": later_step_work(core.fwd, cp), "B": later_step_work(core.bwd_b, cp),
                          "BW": later_step_work(core.bwd, cp)},
        layer_w=tuple(w for s in segs for w in s.bwd_w), attn=seg("attn", attn),
        parallel_norms=graph.model.parallel_norms if graph.model.parallel_attn_mlp else 0)


def layer_blocks(graph: OpGraph, tp: int, sp: bool, cp: int, ep: int, grad_accum_bytes_per_param: float = 0.0,
                 etp: int = 0, embedding_grad_bytes_per_param: float = 0.0) -> tuple[LayerBlocks, ...]:
    """The blocks of every layer (index -> LayerBlocks), built once per distinct template: layers of
    one kind share the same object (and so the same work tuples, which the cost model caches by id)."""
    built: dict = {}
    out = []
    for i in range(graph.model.total_layers):
        ops = graph.layer_ops(i)
        if id(ops) not in built:
            built[id(ops)] = build_blocks(graph, tp, sp, cp, ep, grad_accum_bytes_per_param, etp,
                                          embedding_grad_bytes_per_param, ops)
        out.append(built[id(ops)])
    return tuple(out)


def split_work(work: Work, parts: int) -> Work:
    """One of ``parts`` equal slices of a segment (ring-attention steps over K/V blocks)."""
    if parts < 1:
        raise ValueError(f"split_work: parts must be >= 1, got {parts}")
    return tuple(replace(w, flops=w.flops / parts, bytes=w.bytes / parts, shape=_step_shape(w, parts)) for w in work)


def later_step_work(work: Work, parts: int) -> Work:
    """A ring step after the first under load-balanced causal CP: the sequence is cut into 2·cp chunks,
    rank r holding chunks r and 2cp-1-r (Megatron-Core ``get_batch_on_this_cp_rank``; torch's round-robin
    load balancer), and step 0 attends the local chunks causally while every later step attends all
    local queries to the first half of a K/V block or the second half of the queries to a whole block,
    without a mask (Transformer Engine AttnFuncWithCPAndKVP2P: ``elif i <= rank`` / ``else``; torch
    ``_templated_ring_attention``, ``_is_causal_behavior``: NOT_IS_CAUSAL). The same FLOPs as the first
    step's slice, on a non-causal kernel over half the keys (one shape stands for both cases: the same
    work, the same shorter side)."""
    return tuple(replace(w, causal=False, shape=(*w.shape[:3], max(1, w.shape[3] // 2), w.shape[4]))
                 if w.kind == "attention" and len(w.shape) == 5 else w for w in split_work(work, parts))


def ring_steps(b: LayerBlocks) -> tuple[dict, dict]:
    """(the first ring step's works, each later step's) by pass of a ring CP algorithm: PyTorch's ring
    (``torch-allgather``, strategy/cp_torch) and Transformer Engine's (``ring``, strategy/cp_te: its
    ``AttnFuncWithCPAndKVP2P`` runs a later step with ``no_mask`` on the first half of the received K/V
    block or on the second half of the queries) run their later steps as non-causal half blocks
    (``later_step_work``); each module adds its own per-step copy and merge kernels. One rule for the
    lowering and the search's lower bound."""
    return b.core_steps, b.core_later_steps


def head_split_work(work: Work, cp: int) -> Work:
    """The attention core as an all-to-all CP rank runs it (``cp_algorithm = "a2a"``, strategy/cp_a2a):
    its heads / cp against the whole sequence, the queries and keys of every CP rank, where the
    sequence split ran the local s / cp queries of all its heads: the same FLOPs and bytes, one kernel
    of the full length, causal as without CP."""
    return tuple(replace(w, shape=(w.shape[0], w.shape[1] // cp, w.shape[2] * cp, w.shape[3], w.shape[4]))
                 if w.kind == "attention" and len(w.shape) == 5 else w for w in work)


def core_works(b: LayerBlocks, cp_algorithm: str, cp: int) -> tuple[dict, dict, int]:
    """(the attention core's first kernel works, each later one's, how many later) by pass ("F", "B",
    "BW") as the lowering runs them: cp ring steps (``ring_steps``) for the ring algorithms, one
    full-length head-split kernel for "a2a", the sequence-split core for "all-gather" and cp = 1.
    One rule for the lowering and the search's lower bound."""
    if cp > 1 and cp_algorithm in ("ring", "torch-allgather"):
        first, later = ring_steps(b)
        return first, later, cp - 1
    whole = {"F": b.attn_core.fwd, "B": b.attn_core.bwd_b, "BW": b.attn_core.bwd}
    if cp > 1 and cp_algorithm == "a2a":
        whole = b.memo("a2a", lambda: {k: head_split_work(w, cp) for k, w in whole.items()})
    return whole, {}, 0


def _step_shape(w: OpWork, parts: int) -> tuple[int, ...]:
    """A ring step of the attention core attends the local queries to one of ``parts`` K/V blocks."""
    if w.kind != "attention" or len(w.shape) != 5:
        return w.shape
    b, heads, sq, skv, hd = w.shape
    return (b, heads, sq, max(1, skv // parts), hd)
