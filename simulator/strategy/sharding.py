"""Tensor, sequence, context and expert parallel split rules: one op's work on ONE rank.

Rules, per ``Op.tp_split`` (Shoeybi et al. 2019 §3; Korthikanti et al. 2022 §4.2.2; Liu et al. 2023
ring attention; Megatron-core MoE):
- "column" GEMMs divide n (output features) by tp, "row" GEMMs divide k; vector ops tagged
  column/row/heads divide their width by tp; "heads" divides query and key/value heads by tp;
  "vocab" divides the vocabulary, padded up to a multiple of tp as Megatron pads it (the
  embedding lookup itself is not divided: every rank writes the full masked output).
- "sequence" ops (norms, residual adds, router) are replicated under TP alone and see tokens / tp
  with sequence parallelism (the all-gather / reduce-scatter around them belong to ``lower``).
- Context parallelism divides every op's tokens by cp; attention keeps seq_q / cp queries against
  all seq_kv keys, which ring attention streams past, so its FLOPs are divided by cp.
- "expert" ops: split by expert tensor parallelism etp (0 -> tp, Megatron-core's default
  expert_tensor_parallel_size = tensor_model_parallel_size): expert_fc1 is column- and
  expert_fc2 row-parallel, expert_act divides its width. Expert parallelism is folded over the
  tp x cp x dp ranks of a stage (GShard, Lepikhin et al. 2020 §2; Megatron-core MoE parallel
  folding), so each EP rank holds num_experts / ep experts and computes as many token slots as it
  dispatched (balanced routing): its local tokens' cf·T·k slots, times etp after the expert-TP
  all-gather (with SP a rank's local tokens are s/(cp·tp): etp/tp of the sequence's slots). EP
  divides expert WEIGHTS (params, weight bytes), never expert FLOPs.
Shapes that do not divide raise ValueError naming the op and the numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from math import ceil, prod

from ..model.opgraph import TP_SPLITS, Op, OpGraph, attention_bytes, gemm_bytes, gemm_flops
from ..tasks import OpWork, Task, gemm_grad_shapes
from .zero_impl import persistent_sizes, submodule_params

BACKWARD_PARTS = ("B", "W", "BW")


def heads_per_tp_rank(heads: int, tp: int) -> int:
    """Attention heads (query or K/V) one TP rank holds: heads / tp, or one, replicated, when there are
    fewer heads than TP ranks (Megatron-core's GQA with tp above the K/V heads)."""
    return heads // tp if heads >= tp else 1


def _div(n: int, parts: int, op: Op, what: str) -> int:
    if n % parts:
        raise ValueError(f"op {op.name}: {what} {n} is not divisible by {parts}")
    return n // parts


def _check(op: Op, tp: int, cp: int, ep: int) -> None:
    for name, v in (("tp", tp), ("cp", cp), ("ep", ep)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    if op.tp_split not in TP_SPLITS:
        raise ValueError(f"op {op.name}: unknown tp_split {op.tp_split!r}; known: {TP_SPLITS}")
    if op.experts > 1 and op.experts % ep:
        raise ValueError(f"op {op.name}: num_experts {op.experts} is not divisible by ep {ep}")


def _expert_row_parallel(op: Op) -> bool:
    """expert_fc2 consumes the ffn width (k) that expert_fc1 produced split over tp."""
    return op.name.endswith("fc2")


def _expert_tokens(n: int, tp: int, sp: bool, cp: int, etp: int) -> int:
    """Token slots of an expert op on one rank (module doc): the sequence's n slots / cp, scaled by
    etp/tp where each rank dispatches its own tokens (SP, or tp = 1)."""
    if sp or tp == 1:
        return -(-n * etp // (cp * tp))
    return ceil(n / cp)


def sharded_shape(op: Op, tp: int, sp: bool, cp: int, etp: int = 0) -> tuple[int, ...]:
    """The op's shape on one rank (``etp``: expert tensor parallelism, 0 -> tp)."""
    s = op.tp_split
    if s == "expert":
        return _expert_shape(op, tp, sp, cp, etp or tp)
    if op.kind == "attention":
        b, heads, sq, skv, hd = op.shape
        return (b, _div(heads, tp, op, "attention heads"), _div(sq, cp, op, "seq_q"), skv, hd)
    if op.kind == "gemm":
        m, n, k = op.shape
        m = _div(m, cp, op, "tokens (m)")
        if s == "column":
            n = _div(n, tp, op, "output features (n)")
        elif s == "row":
            k = _div(k, tp, op, "input features (k)")
        elif s == "vocab":
            n = ceil(n / tp)
        elif s == "sequence" and sp:
            m = _div(m, tp, op, "tokens (m) under sequence parallelism")
        elif s == "heads":
            raise ValueError(f"op {op.name}: tp_split 'heads' does not apply to a gemm")
        return (m, n, k)
    tokens, width = op.shape
    tokens = _div(tokens, cp, op, "tokens")
    if op.kind == "embedding":
        return (tokens, width)
    if s in ("column", "row", "heads"):
        width = _div(width, tp, op, "width")
    elif s == "vocab":
        width = ceil(width / tp)
    elif s == "sequence" and sp:
        tokens = _div(tokens, tp, op, "tokens under sequence parallelism")
    return (tokens, width)


def _expert_shape(op: Op, tp: int, sp: bool, cp: int, etp: int) -> tuple[int, ...]:
    if op.kind == "gemm":
        m, n, k = op.shape
        m = _expert_tokens(m, tp, sp, cp, etp)
        if _expert_row_parallel(op):
            return (m, n, _div(k, etp, op, "input features (k)"))
        return (m, _div(n, etp, op, "output features (n)"), k)
    tokens, width = op.shape
    return (_expert_tokens(tokens, tp, sp, cp, etp), _div(width, etp, op, "width"))


def _work(op: Op, tp: int, sp: bool, cp: int, ep: int, etp: int = 0) -> tuple:
    """(shape, fwd flops, B flops, W flops, fwd bytes, B bytes, W bytes) on one rank."""
    _check(op, tp, cp, ep)
    shape = sharded_shape(op, tp, sp, cp, etp)
    d = op.dtype_bytes
    if op.kind == "gemm":
        m, n, k = shape
        g = op.experts // ep
        f, by = gemm_flops(m, n, k), gemm_bytes(m, n, k, d, g)
        return shape, f, f, f, by, by, by
    if op.kind == "attention":
        b, heads, sq, skv, hd = shape
        kv = _div(op.kv_heads, tp, op, "key/value heads")
        fwd = op.fwd_flops * prod(shape) / prod(op.shape)
        return (shape, fwd, op.bwd_input_flops * fwd / op.fwd_flops, 0.0,
                attention_bytes(b, heads, kv, sq, skv, hd, d),
                attention_bytes(b, heads, kv, sq, skv, hd, d, backward=True), 0.0)
    r = prod(shape) / prod(op.shape)
    if op.kind == "embedding":  # no input gradient (token ids); backward is the table's scatter-add
        return shape, 0.0, 0.0, 0.0, op.fwd_bytes * r, 0.0, op.bwd_bytes * r
    return (shape, op.fwd_flops * r, op.bwd_input_flops * r, op.bwd_weight_flops * r,
            op.fwd_bytes * r, op.bwd_bytes * r, 0.0)


def expert_parts(op: Op, ep: int) -> list[Op]:
    """The kernels an expert op runs on the slowest EP rank (the one holding the busiest expert,
    ``Op.expert_load``), each an Op over its share of the token slots: one grouped GEMM over the
    rank's n = experts/ep local experts, (busiest + (n - 1)·other)/n of the mean rows (Megatron-core
    TEGroupedMLP / GroupedMLP), or one GEMM per local expert (SequentialMLP), each holding one
    expert's weights. Any other op: itself."""
    if op.tp_split != "expert":
        return [op]
    n = max(1, op.experts // ep)
    busy, other = op.expert_load
    if op.grouped or n == 1:
        fractions, experts = [(busy + (n - 1) * other) / n], op.experts
    else:
        fractions, experts = [busy / n] + [other / n] * (n - 1), ep  # ep experts over ep ranks: one each
    return [_scaled_rows(op, f, experts) for f in fractions]


def expert_mean_share(op: Op, ep: int) -> float:
    """Token slots the mean EP rank's experts compute over those of the rank ``expert_parts`` lowers
    (the busiest): every rank is lowered as the busiest (the slowest sets the pace), so its expert
    FLOPs overstate the cluster's by the inverse of this. 1.0 for balanced routing and non-expert ops."""
    if op.tp_split != "expert":
        return 1.0
    busy, other = op.expert_load
    busiest_rows = sum(part.shape[0] for part in expert_parts(op, ep))  # whole rows, as lowered
    return (busy + (op.experts - 1) * other) / op.experts * op.shape[0] / busiest_rows


def imbalance_excess_flops(tasks: Sequence[Task], graph: OpGraph, ep: int) -> float:
    """FLOPs the ``tasks`` count beyond what their ranks compute on average because every EP rank is
    lowered as the busiest (``expert_mean_share``): subtracted from the hardware FLOPs (HFU)."""
    shares = {op.name: expert_mean_share(op, ep) for op in graph.layer + graph.mtp_layer}
    shares = {name: share for name, share in shares.items() if share != 1.0}
    if not shares:
        return 0.0
    per_work: dict[int, float] = {}
    excess = 0.0
    for t in tasks:
        x = per_work.get(id(t.work))
        if x is None:
            x = per_work[id(t.work)] = sum(w.flops * (1.0 - shares[w.name]) for w in t.work if w.name in shares)
        excess += x
    return excess


def _scaled_rows(op: Op, fraction: float, experts: int) -> Op:
    if fraction == 1.0 and experts == op.experts:
        return op
    rows = ceil(op.shape[0] * fraction - 1e-9)
    r = rows / op.shape[0]
    return replace(op, shape=(rows,) + tuple(op.shape[1:]), fwd_flops=op.fwd_flops * r,
                   bwd_input_flops=op.bwd_input_flops * r, bwd_weight_flops=op.bwd_weight_flops * r,
                   fwd_bytes=op.fwd_bytes * r, bwd_bytes=op.bwd_bytes * r, experts=experts,
                   params=op.params // op.experts * experts)


def shard_op(op: Op, tp: int, sp: bool, cp: int, ep: int, etp: int = 0) -> OpWork:
    """Forward work of ``op`` on one rank."""
    shape, f, _, _, by, _, _ = _work(op, tp, sp, cp, ep, etp)
    return OpWork(op.name, op.kind, f, by, shape, op.precision, kernels=op.kernels[0])


def shard_ops(ops: tuple[Op, ...], tp: int, sp: bool, cp: int, ep: int, etp: int = 0) -> tuple[OpWork, ...]:
    """Forward work of ``ops`` on one rank, in program order (ops with no forward work, such as the
    backward-only FP8 gradient casts, are left out)."""
    return tuple(shard_op(part, tp, sp, cp, ep, etp) for op in ops if op.fwd_flops or op.fwd_bytes
                 for part in expert_parts(op, ep))


def shard_ops_backward(ops: tuple[Op, ...], tp: int, sp: bool, cp: int, ep: int,
                       part: str, grad_accum_bytes_per_param: float = 0.0, etp: int = 0) -> tuple[OpWork, ...]:
    """Backward work on one rank in execution order (the reverse of the forward).

    part "B": input gradients (ops with weights-only backward, the embedding, are left out);
    "W": weight gradients of the GEMMs and the embedding (zero-bubble's deferred W, Qi et al. 2024);
    "BW": both, one OpWork per op. Ops with no work in the requested part are omitted.
    """
    if part not in BACKWARD_PARTS:
        raise ValueError(f"backward part must be one of {BACKWARD_PARTS}, got {part!r}")
    out = []
    for op in (part for whole in reversed(ops) for part in reversed(expert_parts(whole, ep))):
        shape, _, fb, fw, _, bb, bw = _work(op, tp, sp, cp, ep, etp)
        flops = (fb if "B" in part else 0.0) + (fw if "W" in part else 0.0)
        nbytes = (bb if "B" in part else 0.0) + (bw if "W" in part else 0.0)
        if flops or nbytes:
            out.append(OpWork(op.name, op.kind, flops, nbytes, _backward_shape(op.kind, shape, part), op.precision,
                              backward=True, kernels=op.kernels[1]))
        if grad_accum_bytes_per_param and "W" in part and op.kind == "gemm" and op.params:
            # unfused weight-gradient accumulation: a separate kernel adds the GEMM's 16-bit dW into
            # the fp32 main_grad buffer (see grad_accumulation_bytes_per_param)
            params = _op_params_per_rank(op, tp, ep, etp)
            out.append(OpWork(f"{op.name}.main_grad_add", "elementwise", 0.0,
                              params * grad_accum_bytes_per_param, (params, 1)))
    return tuple(out)


def _backward_shape(kind: str, shape: tuple[int, ...], part: str) -> tuple[int, ...]:
    """The GEMM a backward part runs (``tasks.gemm_grad_shapes``); "BW" keeps the forward shape with
    both parts' FLOPs, and the roofline splits it the same way."""
    if kind != "gemm" or len(shape) != 3 or part == "BW":
        return shape
    return gemm_grad_shapes(shape)[part == "W"]


def grad_accumulation_bytes_per_param(fused: bool, grad_dtype_bytes: int, dtype_bytes: int) -> float:
    """HBM bytes per parameter and micro-batch of accumulating a weight gradient into the main_grad
    buffer when the accumulation is NOT fused into the weight-gradient GEMM: read the GEMM's dW
    (training dtype), read and write the main_grad (grad dtype). Megatron-LM's
    --gradient-accumulation-fusion (fused_weight_gradient_mlp_cuda, 2021) makes the GEMM accumulate
    into main_grad itself, removing this kernel; 0 then."""
    return 0.0 if fused else dtype_bytes + 2 * grad_dtype_bytes


def _op_params_per_rank(op: Op, tp: int, ep: int, etp: int = 0) -> int:
    """Parameters of ``op`` one rank holds. Column-parallel layers split weight and bias;
    row-parallel layers split the weight and keep the full bias on every rank (Megatron
    RowParallelLinear);
    vector ops and the router are replicated; the vocabulary is padded to a multiple of tp."""
    if op.params == 0:
        return 0
    local_experts = op.experts // ep if op.experts > 1 else 1  # EP splits expert ops only
    per_group = op.params // op.experts
    s = op.tp_split
    if s == "expert":
        tp = etp or tp
    if op.kind == "gemm":
        m, n, k = op.shape
        row = s == "row" or (s == "expert" and _expert_row_parallel(op))
        if row:
            bias = per_group - n * k
            return local_experts * (_div(n * k, tp, op, "weight") + bias)
        if s in ("column", "expert"):
            return local_experts * _div(per_group, tp, op, "parameters")
        if s == "vocab":
            return ceil(n / tp) * k
        return op.params
    return op.params


def linear_params(graph: OpGraph, tp: int, ep: int, ops: tuple[Op, ...] | None = None) -> list[tuple[int, int]]:
    """(weight, bias) parameters one rank holds of each dense op of a layer (``ops``, default the
    model's main layer) that has parameters, in program order: a GEMM's weight matrix and the rest of
    its parameters (its bias), a norm's parameters as one entry. DeepSpeed ZeRO-3 fetches and
    persists them per parameter tensor."""
    out = []
    for op in graph.layer if ops is None else ops:
        if not op.params or op.tp_split == "expert":
            continue
        p = _op_params_per_rank(op, tp, ep)
        if op.kind == "gemm":
            _, n, k = sharded_shape(op, tp, False, 1)
            out.append((n * k, p - n * k))
        else:
            out.append((p, 0))
    return out


def param_tensors(graph: OpGraph, ops: Sequence[Op], tp: int, ep: int) -> list[int]:
    """Elements of each parameter tensor one rank holds of the dense ``ops``: ``linear_params``'s
    (weight, bias) pairs, a norm's entry split into its weight (and bias) of its width each, any other
    op's parameters (an embedding's) as one."""
    out = []
    dense = [op for op in ops if op.params and op.tp_split != "expert"]
    for op, (first, rest) in zip(dense, linear_params(graph, tp, ep, tuple(ops))):
        if op.kind == "norm" and first % op.shape[-1] == 0:
            out += [op.shape[-1]] * (first // op.shape[-1])
        else:
            out += [first] + ([rest] if rest else [])
    return out


def unit_persistent_sizes(graph: OpGraph, tp: int, ep: int, unit: str) -> tuple[int, ...]:
    """The DeepSpeed-persistent tensors (``zero_impl.persistent_sizes``) of a lowering unit: "embed",
    "head" or a layer's global index."""
    ops = graph.embed if unit == "embed" else graph.head if unit == "head" else graph.layer_ops(int(unit))
    return persistent_sizes(param_tensors(graph, ops, tp, ep))


def layer_submodules(graph: OpGraph, tp: int, ep: int) -> tuple[list[float], ...]:
    """DeepSpeed's submodule sizes (``zero_impl.submodule_params`` of ``linear_params``) of every layer
    by global index, each from its own template (dense first layers, an MTP module's projection)."""
    kinds: dict = {}
    out = []
    for i in range(graph.model.total_layers):
        ops = graph.layer_ops(i)
        if id(ops) not in kinds:
            kinds[id(ops)] = submodule_params(linear_params(graph, tp, ep, ops))
        out.append(kinds[id(ops)])
    return tuple(out)


def embedding_params_per_rank(graph: OpGraph, tp: int) -> int:
    """Vocab-parallel word embedding; learned position embeddings are replicated across TP."""
    m = graph.model
    pos = m.embedding_params() - m.vocab_size * m.hidden_size
    return ceil(m.vocab_size / tp) * m.hidden_size + pos


def layer_params_per_rank(ops: tuple[Op, ...], tp: int, ep: int, etp: int = 0) -> tuple[int, int]:
    """(dense, expert) parameters one rank holds of one layer's ``ops``."""
    dense = expert = 0
    for op in ops:
        n = _op_params_per_rank(op, tp, ep, etp)
        if op.tp_split == "expert":
            expert += n
        else:
            dense += n
    return dense, expert


def params_per_rank(graph: OpGraph, tp: int, ep: int, layers: int | tuple[int, ...], has_embed: bool,
                    has_head: bool, etp: int = 0) -> dict:
    """{"dense": ..., "expert": ...} parameters held by one rank of a pipeline stage holding
    ``layers`` (a count of the model's main layer, or the global indices of its layers, each taken
    with its own template, ``OpGraph.layer_ops``) ("expert" = the MoE expert weights, reduced over
    the expert-data-parallel group).

    Tied embeddings: with pp > 1 Megatron allocates the word embedding on both the first and the
    last stage and all-reduces their gradients (Megatron-LM ``setup_embeddings_and_output_layer``,
    ``_allreduce_word_embedding_grads``), so a head stage without the embedding holds a copy of the
    vocab-parallel word embedding; with one stage it is counted once. MTP modules read the shared
    word embedding on the head's stage (Megatron-core GPTModel builds its embedding where
    ``pre_process or mtp_process``): a copy there too."""
    for name, v in (("tp", tp), ("ep", ep)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    if isinstance(layers, int) and layers < 0:
        raise ValueError(f"layers must be >= 0, got {layers}")
    indices: tuple[int | None, ...] = (None,) * layers if isinstance(layers, int) else layers
    m = graph.model
    dense = expert = 0
    per_kind: dict = {}
    for i in indices:
        ops = graph.layer if i is None else graph.layer_ops(i)
        if id(ops) not in per_kind:
            per_kind[id(ops)] = layer_params_per_rank(ops, tp, ep, etp)
        d, e = per_kind[id(ops)]
        dense, expert = dense + d, expert + e
    if has_embed:
        dense += embedding_params_per_rank(graph, tp)
    if has_head:
        dense += sum(_op_params_per_rank(op, tp, ep) for op in graph.head)
        if (m.tie_embeddings or m.mtp_layers) and not has_embed:
            dense += ceil(m.vocab_size / tp) * m.hidden_size
    return {"dense": dense, "expert": expert}
