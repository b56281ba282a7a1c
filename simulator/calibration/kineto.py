"""Import of real PyTorch-profiler (Kineto) Chrome traces as measured runs, without torch.

GPU kernels, memcpy and memset land on (rank, stream) lanes, classified by name into kernel classes
(``calibration/kernel_names``); each is linked through its correlation id to the CUDA / HIP runtime
call that launched it and so to the CPU op stack above that call (forward / backward / optimizer phase,
profiler step, user annotation, the innermost ATen op and its ``Input Dims`` when the trace was
recorded with ``record_shapes``). Both Kineto schemas are read: the current lower-case categories
(``cpu_op``, ``cuda_runtime``, ``kernel``, ``gpu_memcpy`` ...) and the older capitalised ones of torch
1.8 (``Operator``, ``Runtime``, ``Kernel``, ``Memcpy``, ``Memset``). CPU-only traces (``torch.profiler``
on the CPU) use the top-level CPU ops as kernels.
"""

from __future__ import annotations

import gzip
import json
import math
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from ..trace import COMPUTE_STREAM, Trace, TraceEvent
from ..units import S_TO_US
from .kernel_names import categorize

__all__ = ["MeasuredOp", "KinetoRun", "categorize", "parse_kineto", "run_to_trace", "load_kineto_trace",
           "parse_annotation", "read_json"]
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
# Kineto category -> ours. The lower-case names are Kineto's ActivityType strings (torch >= 1.9); the
# capitalised ones are the older schema, as the TensorBoard plugin's EventTypeMap reads them too.
CATEGORY = {"cpu_op": "cpu_op", "operator": "cpu_op", "user_annotation": "user_annotation",
            "gpu_user_annotation": "gpu_user_annotation", "cuda_runtime": "cuda_runtime",
            "cuda_driver": "cuda_runtime", "runtime": "cuda_runtime", "kernel": "kernel",
            "gpu_memcpy": "gpu_memcpy", "memcpy": "gpu_memcpy", "gpu_memset": "gpu_memset", "memset": "gpu_memset"}
HOST_CATS = ("cpu_op", "user_annotation", "cuda_runtime")
STEP_PREFIX = "ProfilerStep#"
# Our own tiny model names each op region "sim:<microbatch>:<layer>:<op>" (calibration/tiny_model).
ANNOTATION_PREFIX = "sim:"
_AUTOGRAD_NODE = "autograd::engine::evaluate_function"


@dataclass(frozen=True, slots=True)
class MeasuredOp:
    """One kernel (or, in a CPU-only trace, one top-level CPU op) with its launch context."""

    name: str
    category: str
    rank: int
    stream: str  # "stream 7" on a GPU; "thread 123" for CPU ops
    start_s: float
    end_s: float
    phase: str = ""  # F | B | O (optimizer) | "" (unknown)
    step: int = -1  # profiler step number (ProfilerStep#N), -1 outside any step
    annotation: str = ""  # innermost user annotation (for backward: the forward op's one)
    launcher: str = ""  # outermost CPU op above the launch
    bytes: float = 0.0  # memcpy / memset bytes
    op: str = ""  # innermost CPU (ATen) op above the launch
    dims: tuple = ()  # that op's Input Dims (record_shapes), nested tuples; () when not recorded
    op_id: int = -1  # that op call's identity (its start in ns): kernels of one call share it

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass
class KinetoRun:
    ops: list[MeasuredOp]  # device kernels, or top-level CPU ops when cpu_only
    cpu_ops: list[MeasuredOp]  # top-level CPU ops (all traces)
    runtime: list[MeasuredOp]  # CUDA runtime calls
    steps: dict[int, tuple[float, float]]  # profiler step -> CPU (start_s, end_s)
    cpu_only: bool
    metadata: dict = field(default_factory=dict)
    gpu_steps: dict[int, tuple[float, float]] = field(default_factory=dict)  # ProfilerStep on the GPU timeline


class _Ctx(NamedTuple):
    phase: str
    annotation: str
    launcher: str
    op: str
    dims: tuple
    op_id: int


def read_json(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"trace file {str(p)!r} " + ("is a folder, not a file" if p.is_dir() else "does not exist"))
    opener = gzip.open if p.name.endswith(".gz") else open
    try:
        with opener(p, "rt", encoding="utf-8") as f:
            doc = json.load(f)
    except (json.JSONDecodeError, OSError, UnicodeDecodeError, EOFError) as exc:
        raise ValueError(f"{p}: not a JSON trace ({exc})") from None
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise ValueError(f"{p}: no 'traceEvents' list; not a Chrome/Kineto trace")
    return doc


def _as_tuple(x):
    return tuple(_as_tuple(v) for v in x) if isinstance(x, list) else x


def _input_dims(args: dict) -> tuple:
    dims = args.get("Input Dims", args.get("Input dims", args.get("input_dims")))
    return _as_tuple(dims) if isinstance(dims, list) else ()


def _pid(v) -> int | None:
    if isinstance(v, int):
        return v
    return int(v) if isinstance(v, str) and v.isdigit() else None


def _microseconds(e: dict, key: str, where: str, default: float | None = None) -> float:
    """An event's ``ts`` or ``dur``: a finite number (``dur`` >= 0), else a one-line error naming it."""
    v = e.get(key, default)
    if not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and (key == "ts" or v >= 0):
        return float(v)
    raise ValueError(f"{where}: event {str(e.get('name', ''))[:60]!r} has {key} = {json.dumps(v)}, "
                     f"not a finite {'time' if key == 'ts' else 'duration >= 0'} in microseconds")


def _complete_events(doc: dict, where: str = "trace") -> list[dict]:
    """The complete ("X") events with a numeric pid, categories normalised, ts/dur floats (us)."""
    out = []
    for e in doc["traceEvents"]:
        if not isinstance(e, dict) or e.get("ph") != "X" or "ts" not in e:
            continue
        pid = _pid(e.get("pid"))
        name = str(e.get("name", ""))
        cat = "user_annotation" if name.startswith(STEP_PREFIX) and CATEGORY.get(
            str(e.get("cat", "")).lower()) != "gpu_user_annotation" else CATEGORY.get(str(e.get("cat", "")).lower())
        if pid is None or cat is None:
            continue
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        out.append(dict(e, pid=pid, cat=cat, name=name, args=args, ts=_microseconds(e, "ts", where),
                        dur=_microseconds(e, "dur", where, 0.0)))
    return out


def _phase(stack_names: list[str]) -> str:
    for n in stack_names:
        if n.startswith(_AUTOGRAD_NODE) or n == "## backward ##":
            return "B"
        if n.startswith("Optimizer.") or n == "## optimizer ##":
            return "O"
    return "F"


def _context(ev: dict, stack: list[dict], fwd_annotation: dict[int, str]) -> _Ctx:
    """Phase, annotation, launcher and innermost op of an event given its enclosing CPU events
    (outermost first). The annotation is the innermost user annotation (ours, ``sim:...``, preferred);
    inside a backward node without an annotation of its own, the one of the forward op with the node's
    sequence number."""
    chain = stack + [ev]
    phase = _phase([s["name"] for s in chain])
    launcher = next((s["name"] for s in stack if s["cat"] == "cpu_op"), ev["name"])
    inner = next((s for s in reversed(chain) if s["cat"] == "cpu_op"), None)
    op, dims, op_id = (inner["name"], _input_dims(inner["args"]), round(inner["ts"] * 1e3)) if inner else ("", (), -1)
    node = max((i for i, s in enumerate(chain) if s["name"].startswith(_AUTOGRAD_NODE)), default=-1)
    annots = [(i, s["name"]) for i, s in enumerate(stack) if s["cat"] == "user_annotation"
              and not s["name"].startswith(STEP_PREFIX)]
    if node >= 0 and not any(i > node for i, _ in annots):
        seq = chain[node]["args"].get("Sequence number")
        if seq in fwd_annotation:
            return _Ctx(phase, fwd_annotation[seq], launcher, op, dims, op_id)
    names = [a for _, a in reversed(annots)]
    annotation = next((a for a in names if a.startswith(ANNOTATION_PREFIX)), names[0] if names else "")
    return _Ctx(phase, annotation, launcher, op, dims, op_id)


def _ends_before(top: dict, e: dict) -> bool:
    """True when ``top`` cannot enclose ``e`` (a zero-length ``e`` at ``top``'s end is its child)."""
    end = top["ts"] + top["dur"]
    return end < e["ts"] or (end == e["ts"] and (e["dur"] > 0 or top["dur"] == 0))


class _Clock:
    """Trace microseconds -> seconds from the trace's first event, and the profiler step of a time."""

    def __init__(self, t0_us: float, steps: dict[int, tuple[float, float]]) -> None:
        self.t0_us = t0_us
        self.steps = steps
        self._ids = sorted(steps, key=lambda k: steps[k][0])
        self._starts = [steps[k][0] for k in self._ids]

    def s(self, ts_us: float) -> float:
        return (ts_us - self.t0_us) / S_TO_US

    def step_of(self, t_s: float) -> int:
        i = bisect_right(self._starts, t_s) - 1
        return self._ids[i] if i >= 0 and t_s <= self.steps[self._ids[i]][1] else -1


def _step_spans(events: list[dict], clock_s, cat: str) -> dict[int, tuple[float, float]]:
    spans: dict[int, tuple[float, float]] = {}
    for e in events:
        if e["cat"] == cat and e["name"].startswith(STEP_PREFIX) and e["name"][len(STEP_PREFIX):].isdigit():
            k, a, b = int(e["name"][len(STEP_PREFIX):]), clock_s(e["ts"]), clock_s(e["ts"] + e["dur"])
            old = spans.get(k)
            spans[k] = (min(a, old[0]), max(b, old[1])) if old else (a, b)
    return spans


def _sweep_host(host: list[dict], clock: _Clock) -> tuple[list[MeasuredOp], list[MeasuredOp], dict]:
    """One sweep per thread keeps the stack of enclosing CPU events of every host event: (top-level
    CPU ops, runtime calls, correlation -> (launch context, launch time))."""
    fwd_annotation: dict[int, str] = {}
    launch_ctx: dict = {}
    cpu_ops, runtime = [], []
    stacks: dict[tuple[int, int | None], list[dict]] = {}  # (pid, tid); legacy traces may lack the tid
    for e in host:
        stack = stacks.setdefault((e["pid"], e.get("tid")), [])
        while stack and _ends_before(stack[-1], e):
            stack.pop()
        ctx = _context(e, stack, fwd_annotation)
        start, end = clock.s(e["ts"]), clock.s(e["ts"] + e["dur"])
        if e["cat"] == "cpu_op":
            seq = e["args"].get("Sequence number")
            if ctx.phase == "F" and seq is not None and ctx.annotation:
                fwd_annotation.setdefault(seq, ctx.annotation)
            if not any(x["cat"] == "cpu_op" for x in stack):
                cpu_ops.append(MeasuredOp(e["name"], categorize(e["name"]), 0, f"thread {e.get('tid')}", start, end,
                                          ctx.phase, clock.step_of(start), ctx.annotation, e["name"],
                                          op=e["name"], dims=ctx.dims, op_id=ctx.op_id))
        elif e["cat"] == "cuda_runtime":
            corr = e["args"].get("correlation")
            if corr is not None:
                launch_ctx[corr] = (ctx, start)
            runtime.append(MeasuredOp(e["name"], "cuda_runtime", 0, f"thread {e.get('tid')}", start, end,
                                      ctx.phase, clock.step_of(start), ctx.annotation, ctx.launcher))
        stack.append(e)
    return cpu_ops, runtime, launch_ctx


def _device_ops(device: list[dict], launch_ctx: dict, clock: _Clock, rank_of) -> list[MeasuredOp]:
    ops = []
    for e in sorted(device, key=lambda e: e["ts"]):
        start = clock.s(e["ts"])
        ctx, t_launch = launch_ctx.get(e["args"].get("correlation"), (_Ctx("", "", "", "", (), -1), start))
        cat = "memcpy" if e["cat"] in ("gpu_memcpy", "gpu_memset") else categorize(e["name"])
        ops.append(MeasuredOp(e["name"], cat, rank_of(e), f"stream {e['args'].get('stream', e.get('tid'))}",
                              start, clock.s(e["ts"] + e["dur"]), ctx.phase, clock.step_of(t_launch),
                              ctx.annotation, ctx.launcher, float(e["args"].get("bytes", 0.0) or 0.0),
                              ctx.op, ctx.dims, ctx.op_id))
    return ops


def parse_kineto(path: str | Path) -> KinetoRun:
    """Read a torch.profiler / Kineto trace (.json or .json.gz) into ops with their CPU context."""
    doc = read_json(path)
    events = _complete_events(doc, str(path))
    device = [e for e in events if e["cat"] in DEVICE_CATS]
    host = sorted((e for e in events if e["cat"] in HOST_CATS), key=lambda e: (e["ts"], -e["dur"]))
    if not device and not any(e["cat"] == "cpu_op" for e in host):
        raise ValueError(f"{path}: no GPU kernels and no CPU ops; not a torch.profiler trace")
    t0 = min(e["ts"] for e in device + host)
    clock = _Clock(t0, _step_spans(host, lambda ts: (ts - t0) / S_TO_US, "user_annotation"))
    cpu_ops, runtime, launch_ctx = _sweep_host(host, clock)
    dist = _distributed_info(doc)
    dist_rank = int(dist.get("rank", 0) or 0)
    devices = sorted({e["pid"] for e in device})
    ops = _device_ops(device, launch_ctx, clock, lambda e: e["pid"] if len(devices) > 1 else dist_rank)
    cpu_only = not ops
    rank0 = dist_rank if len(devices) <= 1 else devices[0]
    cpu_ops = [_with_rank(o, rank0) for o in cpu_ops]
    runtime = [_with_rank(o, rank0) for o in runtime]
    meta = _metadata(doc, path, events, device, devices, runtime, launch_ctx, cpu_only)
    meta["t0_us"] = t0
    gpu_steps = _step_spans([e for e in events if e["cat"] == "gpu_user_annotation"], clock.s, "gpu_user_annotation")
    return KinetoRun(cpu_ops if cpu_only else ops, cpu_ops, runtime, clock.steps, cpu_only, meta, gpu_steps)


def _distributed_info(doc: dict) -> dict:
    """The trace's ``distributedInfo`` (rank, world size, backend), {} when absent or malformed."""
    info = doc.get("distributedInfo")
    return info if isinstance(info, dict) else {}


def _metadata(doc: dict, path, events, device, devices, runtime, launch_ctx, cpu_only: bool) -> dict:
    props = doc.get("deviceProperties") or []
    dist = _distributed_info(doc)
    name = next((p.get("name") for p in props if isinstance(p, dict) and devices and p.get("id") == devices[0]),
                "GPU (no deviceProperties)")
    return {
        "source_file": str(path), "importer": "kineto", "cpu_only": cpu_only, "device": "cpu" if cpu_only else name,
        "distributed": dist, "base_time_ns": doc.get("baseTimeNanoseconds", 0),
        "record_shapes": any(_input_dims(e["args"]) for e in events if e["cat"] == "cpu_op"),
        "flow_events": sum(1 for e in doc["traceEvents"] if isinstance(e, dict) and e.get("ph") in ("s", "f")),
        "counts": {"kernels": sum(1 for e in device if e["cat"] == "kernel"),
                   "memcpy": sum(1 for e in device if e["cat"] == "gpu_memcpy"),
                   "memset": sum(1 for e in device if e["cat"] == "gpu_memset"),
                   "cpu_ops": sum(1 for e in events if e["cat"] == "cpu_op"),
                   "cuda_runtime": len(runtime),
                   "linked_kernels": sum(1 for e in device if e["args"].get("correlation") in launch_ctx)},
    }


def _with_rank(op: MeasuredOp, rank: int) -> MeasuredOp:
    return op if op.rank == rank else MeasuredOp(
        op.name, op.category, rank, op.stream, op.start_s, op.end_s, op.phase, op.step, op.annotation,
        op.launcher, op.bytes, op.op, op.dims, op.op_id)


def parse_annotation(annotation: str) -> tuple[int, int, str] | None:
    """(microbatch, layer, op name) of a ``sim:<microbatch>:<layer>:<op>`` annotation, else None."""
    if not annotation.startswith(ANNOTATION_PREFIX):
        return None
    parts = annotation[len(ANNOTATION_PREFIX):].split(":", 2)
    try:
        return int(parts[0]), int(parts[1]), parts[2]
    except (ValueError, IndexError):
        return None


def compute_stream_of(ops: list[MeasuredOp], rank: int) -> str | None:
    """The lane with the most non-communication kernel time: a measured run's "compute" stream."""
    busy: dict[str, float] = {}
    for o in ops:
        if o.rank == rank and o.category not in ("nccl", "memcpy"):
            busy[o.stream] = busy.get(o.stream, 0.0) + o.duration_s
    return max(busy, key=lambda k: (busy[k], k)) if busy else None


def run_to_trace(run: KinetoRun, include_host: bool = True) -> Trace:
    """The measured run as a Trace: kernels (category = kernel class) on their streams, the busiest
    stream of each rank renamed "compute"; with a GPU, top-level CPU ops ("cpu_op") and CUDA runtime
    calls ("cuda_runtime") on host lanes "cpu <thread>" / "runtime <thread>"."""
    names: dict[tuple[int, str], str] = {}
    for r in sorted({o.rank for o in run.ops}):
        cs = compute_stream_of(run.ops, r)
        if cs is not None:
            names[(r, cs)] = COMPUTE_STREAM
    events = [_event(o, names.get((o.rank, o.stream), o.stream), o.category) for o in run.ops]
    if include_host and not run.cpu_only:
        events += [_event(o, f"cpu {o.stream}", "cpu_op") for o in run.cpu_ops]
        events += [_event(o, f"runtime {o.stream}", "cuda_runtime") for o in run.runtime]
    events.sort(key=lambda e: (e.start_s, e.rank, e.stream))
    meta = dict(run.metadata, steps={str(k): list(v) for k, v in sorted(run.steps.items())},
                stream_names={f"{r}/{v}": k for (r, k), v in names.items()})
    ranks = sorted({e.rank for e in events})
    return Trace(tuple(events), source="measured", rank_labels={r: f"rank {r} (measured)" for r in ranks},
                 metadata=meta)


def _event(o: MeasuredOp, stream: str, category: str) -> TraceEvent:
    parsed = parse_annotation(o.annotation)
    mb, layer = (parsed[0], parsed[1]) if parsed else (-1, -1)
    return TraceEvent(o.name, category, o.rank, stream, o.start_s, o.end_s, microbatch=mb, phase=o.phase,
                      layer=layer)


def load_kineto_trace(path: str | Path) -> Trace:
    """A .json / .json.gz torch.profiler (Kineto) trace as a Trace(source="measured")."""
    return run_to_trace(parse_kineto(path))
