"""Which measured kernel ran which simulated op: by our annotation, by shape, by order.

A trace of our tiny model names every op region ``sim:<microbatch>:<layer>:<op>``; any other trace is
matched per kernel class: GEMMs by their (rows, columns, inner) dimensions up to transposition against
each op's forward, input-gradient and weight-gradient GEMM, fused attention by (batch, heads, seq_q,
seq_kv, head_dim), norms and other vector kernels by element count, all from the launching ATen op's
``Input Dims`` (torch.profiler ``record_shapes``); kernels without shapes are matched by order when a
step holds as many of a class and phase as the simulated rank runs. Candidates sharing a shape take the
launches in program order, round robin (the i-th qkv-shaped GEMM of a step is the i-th qkv op).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from ..tasks import OpWork, gemm_grad_shapes
from .kernel_names import attention_dims, elements, gemm_dims, gemm_key
from .kineto import MeasuredOp, parse_annotation

# Kernel class of each OpWork kind (tasks.OpWork): the other vector kinds are elementwise kernels.
KIND_CATEGORY = {"gemm": "gemm", "attention": "attention", "norm": "norm", "memcpy": "memcpy"}
UNANNOTATED = "(unannotated)"
COMMUNICATION = "(communication)"
OPTIMIZER_OP = "adam"  # strategy/grad_sync's optimizer OpWork, the tiny model's optimizer annotation
# NCCL / RCCL kernel names (ncclDevKernel_AllReduce_Sum_bf16_RING_LL, ncclKernel_SendRecv_...) -> tasks ops
_NCCL_OPS = (("allreduce", "all_reduce"), ("allgather", "all_gather"), ("reducescatter", "reduce_scatter"),
             ("alltoall", "all_to_all"), ("sendrecv", "send_recv"), ("send", "send_recv"), ("recv", "send_recv"),
             ("broadcast", "broadcast"))


def kind_category(kind: str) -> str:
    return KIND_CATEGORY.get(kind, "elementwise")


def nccl_op(name: str) -> str | None:
    """The collective a communication kernel (or c10d / nccl: annotation) runs, in tasks' names."""
    flat = name.lower().replace("_", "").replace(":", "")
    return next((op for key, op in _NCCL_OPS if key in flat), None)


@dataclass(frozen=True, slots=True)
class SimOp:
    """One OpWork of one simulated compute task, with its phase as a profiler sees it."""

    name: str
    kind: str
    phase: str  # F | B | O (W and R run inside backward)
    microbatch: int
    layer: int
    start_s: float
    end_s: float
    work: OpWork | None = None
    pass_: str = ""  # calibration.profile.pass_of: fwd | bwd | bwd_input | bwd_weight | step

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


class Match(NamedTuple):
    key: tuple[str, str]  # (phase, op) as compare reports it
    instance: tuple  # one execution of one simulated op: its kernels add up
    sim: SimOp | None  # None for communication
    how: str  # annotation | shape | order | communication


def gemm_pass_shapes(shape: tuple[int, ...], pass_: str) -> list[tuple[int, int, int]]:
    """The (m, n, k) GEMMs a forward (m, n, k) GEMM's work runs in pass ``pass_``
    (``profile.pass_of``): itself forward, its input- or weight-gradient GEMM, or both for a full
    backward (``tasks.gemm_grad_shapes``)."""
    m, n, k = shape
    dgrad, wgrad = gemm_grad_shapes((m, n, k))
    return {"fwd": [(m, n, k)], "bwd_input": [dgrad], "bwd_weight": [wgrad]}.get(pass_, [dgrad, wgrad])


def _shape_keys(s: SimOp) -> list[tuple]:
    """Index keys of a simulated op for shape matching (class, shape signature)."""
    w = s.work
    cat = kind_category(s.kind)
    if w is None or not w.shape:
        return []
    if s.kind == "gemm" and len(w.shape) == 3:
        return [(cat, gemm_key(x)) for x in gemm_pass_shapes(w.shape, s.pass_)]
    if s.kind == "attention":
        return [(cat, tuple(w.shape))]
    return [(cat, math.prod(w.shape))]


def _measured_key(o: MeasuredOp) -> tuple | None:
    if not o.dims:
        return None
    if o.category == "gemm":
        g = gemm_dims(o.op, o.dims)
        return ("gemm", gemm_key(g)) if g else None
    if o.category == "attention":
        a = attention_dims(o.op, o.dims)
        return ("attention", a) if a else None
    n = elements(o.dims)
    return (o.category, n) if n else None


def _units(ops: list[MeasuredOp]) -> list[list[int]]:
    """Kernels grouped by the CPU op call that launched them (consecutive, same op instance)."""
    units: list[list[int]] = []
    last = None
    for i, o in enumerate(ops):
        ident = (o.op_id, o.op) if o.op_id >= 0 else None
        if ident is not None and ident == last:
            units[-1].append(i)
        else:
            units.append([i])
        last = ident
    return units


def match_step(ops: list[MeasuredOp], sim: list[SimOp], comm_ops: set[str]) -> list[Match | None]:
    """One profiler step of one rank: for each measured op (in time order), its match or None."""
    by_note = {(s.phase, s.microbatch, s.layer, s.name): s for s in sim}
    by_name: dict[tuple[str, str], SimOp] = {}
    for s in sim:
        by_name.setdefault((s.phase, s.name), s)
    index: dict[tuple, list[SimOp]] = {}
    for s in sim:
        for k in _shape_keys(s):
            index.setdefault((s.phase,) + k, []).append(s)
    out: list[Match | None] = [None] * len(ops)
    seen: dict[tuple, int] = {}
    pending: dict[tuple[str, str], list[list[int]]] = {}
    for unit in _units(ops):
        o = ops[unit[0]]
        m = _match_one(o, by_note, by_name, index, seen, comm_ops)
        if m is None and o.category not in ("nccl", "memcpy") and not parse_annotation(o.annotation):
            pending.setdefault((o.phase, o.category), []).append(unit)
        for i in unit:
            out[i] = m
    _match_by_order(pending, sim, out)
    return out


def _match_one(o: MeasuredOp, by_note, by_name, index, seen, comm_ops) -> Match | None:
    if o.category == "nccl":
        op = nccl_op(o.name) or nccl_op(o.annotation) or nccl_op(o.op)
        return Match((o.phase, COMMUNICATION), (), None, "communication") if op in comm_ops else None
    note = parse_annotation(o.annotation)
    if note is not None:
        mb, layer, name = note
        phase = "O" if name == OPTIMIZER_OP else o.phase
        s = by_note.get((phase, mb, layer, name)) or by_name.get((phase, name))
        return Match((phase, name), (phase, mb, layer, name), s, "annotation") if s is not None else None
    key = _measured_key(o)
    cands = index.get((o.phase,) + key) if key else None
    if not key or not cands:
        return None
    n = seen.get((o.phase,) + key, 0)
    seen[(o.phase,) + key] = n + 1
    s = cands[n % len(cands)]
    return Match((s.phase, s.name), (s.phase, s.microbatch, s.layer, s.name, n // len(cands)), s, "shape")


def _match_by_order(pending: dict, sim: list[SimOp], out: list) -> None:
    """Kernels without shapes: the i-th launch of a (phase, class) is the i-th simulated op of it, when
    the step holds exactly as many launches as the simulated rank runs ops."""
    by_cat: dict[tuple[str, str], list[SimOp]] = {}
    for s in sim:
        by_cat.setdefault((s.phase, kind_category(s.kind)), []).append(s)
    for key, units in pending.items():
        ss = by_cat.get(key, [])
        if len(ss) != len(units):
            continue
        for unit, s in zip(units, ss):
            for i in unit:
                out[i] = Match((s.phase, s.name), (s.phase, s.microbatch, s.layer, s.name), s, "order")


def coverage(ops: list[MeasuredOp], matches: list[Match | None]) -> dict[str, dict]:
    """Per kernel class: kernels, matched kernels, their seconds and the matched seconds."""
    out: dict[str, dict] = {}
    for o, m in zip(ops, matches):
        c = out.setdefault(o.category, {"kernels": 0, "matched": 0, "time_s": 0.0, "matched_s": 0.0})
        c["kernels"] += 1
        c["time_s"] += o.duration_s
        if m is not None:
            c["matched"] += 1
            c["matched_s"] += o.duration_s
    return out


def coverage_fraction(per_class: dict[str, dict]) -> float:
    total = sum(c["time_s"] for c in per_class.values())
    return sum(c["matched_s"] for c in per_class.values()) / total if total > 0 else 0.0
