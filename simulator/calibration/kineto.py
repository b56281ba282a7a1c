"""Import of real PyTorch-profiler (Kineto) Chrome traces as measured runs, without torch.

GPU kernels, memcpy and memset land on (rank, stream) lanes, classified by name into kernel
categories; each is linked through its correlation id to the CUDA runtime call that launched it and
so to the CPU op stack above that call (forward / backward / optimizer phase, profiler step, user
annotation). CPU-only traces (``torch.profiler`` on the CPU) use the top-level CPU ops as kernels.
"""

from __future__ import annotations

import gzip
import json
import re
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path

from ..analysis.measured import KERNEL_CATEGORIES
from ..trace import COMPUTE_STREAM, Trace, TraceEvent
from ..units import S_TO_US

__all__ = ["KERNEL_CATEGORIES", "MeasuredOp", "KinetoRun", "categorize", "parse_kineto", "run_to_trace",
           "load_kineto_trace", "parse_annotation"]
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
# Our own tiny model names each op region "sim:<microbatch>:<layer>:<op>" (calibration/tiny_model).
ANNOTATION_PREFIX = "sim:"

# Name patterns, tried in order (first match wins). Kernel names follow NCCL (ncclKernel_* /
# ncclDevKernel_*), cuBLAS/cuBLASLt/CUTLASS/cuDNN (gemm, xmma, implicit-GEMM conv), FlashAttention
# and PyTorch's fused attention (flash/fmha/efficient_attention), PyTorch's ATen kernels; CPU op
# names follow ATen ("aten::addmm") and autograd ("AddmmBackward0").
_PATTERNS: tuple[tuple[str, re.Pattern], ...] = tuple((c, re.compile(p, re.IGNORECASE)) for c, p in (
    ("nccl", r"nccl|c10d::|allreduce|all_reduce|allgather|reducescatter|all_to_all|alltoall"),
    ("memcpy", r"^memcpy|^memset|cudaMemcpy|aten::_?to_copy$|aten::copy_$"),
    ("attention", r"flash|fmha|attention|attn_fwd|attn_bwd|sdpa"),
    ("gemm", r"gemm|gemv|cublas|xmma|cutlass|scudnn|implicit_convolve|conv2d|convolution|dgrad|wgrad"
             r"|(^|::|_)(mm|addmm|bmm|baddbmm|matmul|linear)$|(Addmm|Mm|Bmm|Baddbmm|Linear|Convolution)"
             r"Backward"),
    ("other", r"^aten::(view|reshape|_?unsafe_view|t|transpose|permute|expand|as_strided|empty\w*|detach"
              r"|alias|slice|select|unsqueeze|squeeze|split\w*|chunk|contiguous|lift\w*|zeros|ones|"
              r"resolve_\w+|item|_local_scalar_dense|result_type|set_|record_stream)$"
              r"|(View|Reshape|Alias|Transpose|Permute|Expand|Unsqueeze|Squeeze|T|Select|Slice|Split)"
              r"Backward\d*$"),
    ("elementwise", r"elementwise|vectorized|unrolled|at::native|reduce_kernel|norm|softmax|gelu|silu|"
                    r"relu|dropout|adam|foreach|multi_tensor|cross_entropy|nll|embedding|index|scatter|"
                    r"gather|catarray|bn_fw|bn_bw|pool|rotary|rope|triton_|accumulategrad|^aten::|Backward\d*$"),
))


def categorize(name: str) -> str:
    """Kernel category of a GPU kernel or CPU op name (one of KERNEL_CATEGORIES)."""
    base = name.split(": ", 1)[1] if name.startswith("autograd::engine::evaluate_function: ") else name
    for cat, pat in _PATTERNS:
        if pat.search(base):
            return cat
    return "other"


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


def read_json(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"trace file {str(p)!r} does not exist")
    opener = gzip.open if p.name.endswith(".gz") else open
    try:
        with opener(p, "rt", encoding="utf-8") as f:
            doc = json.load(f)
    except (json.JSONDecodeError, OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{p}: not a JSON trace ({exc})") from None
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise ValueError(f"{p}: no 'traceEvents' list; not a Chrome/Kineto trace")
    return doc


def _phase(stack_names: list[str]) -> str:
    for n in stack_names:
        if n.startswith("autograd::engine::evaluate_function") or n == "## backward ##":
            return "B"
        if n.startswith("Optimizer.") or n == "## optimizer ##":
            return "O"
    return "F"


def _context(ev: dict, stack: list[dict], fwd_annotation: dict[int, str]) -> tuple[str, str, str]:
    """(phase, annotation, launcher) of an event given its enclosing CPU events (outermost first).

    The annotation is the innermost user annotation (ours, ``sim:...``, preferred); inside a backward
    node without an annotation of its own, the one of the forward op with the node's sequence number."""
    chain = stack + [ev]
    phase = _phase([s["name"] for s in chain])
    launcher = next((s["name"] for s in stack if s.get("cat") == "cpu_op"), ev["name"])
    node = max((i for i, s in enumerate(chain) if s["name"].startswith("autograd::engine::evaluate_function")),
               default=-1)
    annots = [(i, s["name"]) for i, s in enumerate(stack) if s.get("cat") == "user_annotation"
              and not s["name"].startswith("ProfilerStep#")]
    if node >= 0 and not any(i > node for i, _ in annots):
        seq = chain[node]["args"].get("Sequence number")
        if seq in fwd_annotation:
            return phase, fwd_annotation[seq], launcher
    names = [a for _, a in reversed(annots)]
    annotation = next((a for a in names if a.startswith(ANNOTATION_PREFIX)), names[0] if names else "")
    return phase, annotation, launcher


def _ends_before(top: dict, e: dict) -> bool:
    """True when ``top`` cannot enclose ``e`` (a zero-length ``e`` at ``top``'s end is its child)."""
    end = top["ts"] + top["dur"]
    return end < e["ts"] or (end == e["ts"] and (e["dur"] > 0 or top["dur"] == 0))


def parse_kineto(path: str | Path) -> KinetoRun:
    """Read a torch.profiler / Kineto trace (.json or .json.gz) into ops with their CPU context."""
    doc = read_json(path)
    events = [e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"
              and isinstance(e.get("pid"), int) and "ts" in e]
    for e in events:
        e["ts"], e["dur"] = float(e["ts"]), float(e.get("dur", 0.0))
        e.setdefault("args", {})
        e.setdefault("name", "")
    device = [e for e in events if e.get("cat") in DEVICE_CATS]
    host_cats = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")
    host = sorted((e for e in events if e.get("cat") in host_cats), key=lambda e: (e["ts"], -e["dur"]))
    if not device and not any(e.get("cat") == "cpu_op" for e in host):
        raise ValueError(f"{path}: no GPU kernels and no CPU ops; not a torch.profiler trace")
    t0 = min(e["ts"] for e in device + host)

    def s(ts_us: float) -> float:
        return (ts_us - t0) / S_TO_US

    steps = {int(e["name"].split("#", 1)[1]): (s(e["ts"]), s(e["ts"] + e["dur"])) for e in host
             if e["name"].startswith("ProfilerStep#") and e["name"].split("#", 1)[1].isdigit()}
    step_ids = sorted(steps, key=lambda k: steps[k][0])
    step_starts = [steps[k][0] for k in step_ids]

    def step_of(t_s: float) -> int:
        i = bisect_right(step_starts, t_s) - 1
        return step_ids[i] if i >= 0 and t_s <= steps[step_ids[i]][1] else -1

    # One sweep per thread keeps the stack of enclosing CPU events for every host event.
    fwd_annotation: dict[int, str] = {}
    launch_ctx: dict[int, tuple[str, str, str, float]] = {}  # correlation -> (phase, annot, launcher, t)
    cpu_ops, runtime = [], []
    stacks: dict[tuple[int, int], list[dict]] = {}
    for e in host:
        stack = stacks.setdefault((e["pid"], e["tid"]), [])
        while stack and _ends_before(stack[-1], e):
            stack.pop()
        phase, annot, launcher = _context(e, stack, fwd_annotation)
        cat = e.get("cat")
        if cat == "cpu_op":
            seq = e["args"].get("Sequence number")
            if phase == "F" and seq is not None and annot:
                fwd_annotation.setdefault(seq, annot)
            if not any(x.get("cat") == "cpu_op" for x in stack):
                cpu_ops.append(MeasuredOp(e["name"], categorize(e["name"]), 0, f"thread {e['tid']}",
                                          s(e["ts"]), s(e["ts"] + e["dur"]), phase, step_of(s(e["ts"])),
                                          annot, e["name"]))
        elif cat in ("cuda_runtime", "cuda_driver"):
            corr = e["args"].get("correlation")
            if corr is not None:
                launch_ctx[corr] = (phase, annot, launcher, s(e["ts"]))
            runtime.append(MeasuredOp(e["name"], "cuda_runtime", 0, f"thread {e['tid']}", s(e["ts"]),
                                      s(e["ts"] + e["dur"]), phase, step_of(s(e["ts"])), annot, launcher))
        stack.append(e)

    dist = doc.get("distributedInfo") or {}
    dist_rank = int(dist.get("rank", 0)) if isinstance(dist, dict) else 0
    devices = sorted({e["pid"] for e in device})
    ops: list[MeasuredOp] = []
    for e in sorted(device, key=lambda e: e["ts"]):
        corr = e["args"].get("correlation")
        phase, annot, launcher, t_launch = launch_ctx.get(corr, ("", "", "", s(e["ts"])))
        cat = "memcpy" if e["cat"] in ("gpu_memcpy", "gpu_memset") else categorize(e["name"])
        ops.append(MeasuredOp(e["name"], cat, e["pid"] if len(devices) > 1 else dist_rank,
                              f"stream {e['args'].get('stream', e['tid'])}", s(e["ts"]),
                              s(e["ts"] + e["dur"]), phase, step_of(t_launch), annot, launcher,
                              float(e["args"].get("bytes", 0.0))))
    cpu_only = not ops
    rank0 = dist_rank if len(devices) <= 1 else devices[0]
    cpu_ops = [_with_rank(o, rank0) for o in cpu_ops]
    runtime = [_with_rank(o, rank0) for o in runtime]
    props = doc.get("deviceProperties") or []
    meta = {
        "source_file": str(path), "importer": "kineto", "cpu_only": cpu_only,
        "device": "cpu" if cpu_only else next((p.get("name") for p in props if isinstance(p, dict)
                                                and p.get("id") == devices[0]), "GPU (no deviceProperties)"),
        "distributed": dist, "t0_us": t0, "base_time_ns": doc.get("baseTimeNanoseconds", 0),
        "flow_events": sum(1 for e in doc["traceEvents"] if isinstance(e, dict) and e.get("ph") in ("s", "f")),
        "counts": {"kernels": sum(1 for e in device if e["cat"] == "kernel"),
                   "memcpy": sum(1 for e in device if e["cat"] == "gpu_memcpy"),
                   "memset": sum(1 for e in device if e["cat"] == "gpu_memset"),
                   "cpu_ops": sum(1 for e in events if e.get("cat") == "cpu_op"),
                   "cuda_runtime": len(runtime),
                   "linked_kernels": sum(1 for e in device if e["args"].get("correlation") in launch_ctx)},
    }
    return KinetoRun(cpu_ops if cpu_only else ops, cpu_ops, runtime, steps, cpu_only, meta)


def _with_rank(op: MeasuredOp, rank: int) -> MeasuredOp:
    return op if op.rank == rank else MeasuredOp(
        op.name, op.category, rank, op.stream, op.start_s, op.end_s, op.phase, op.step, op.annotation,
        op.launcher, op.bytes)


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
