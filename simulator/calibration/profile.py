"""Kernel profiling: time, on the device at hand, the kernels the op graph produces and write the
calibration tables that ``cost/calibrated`` reads.

On CUDA every kernel is timed with CUDA events after warm-up calls (median of the repetitions); on the
CPU the same pipeline uses ``time.perf_counter`` so that it runs, and is tested, everywhere. torch is
imported inside the functions only.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from ..cost.calibrated import KernelRow
from ..model.opgraph import build_op_graph, gemm_flops
from ..model.presets import MODEL_PRESETS
from ..model.spec import ModelSpec
from ..scenario import Scenario
from ..strategy.grad_sync import ADAM_STATE_RW_BYTES
from ..strategy.sharding import shard_ops, shard_ops_backward
from ..tasks import OpWork
from ..units import DTYPE_BYTES
from .kernels import make_runner

# Timing protocol (as nccl-tests and triton.testing.do_bench): warm-up calls, then repetitions until
# TARGET_TIME_S of measurement or MAX_REPS, at least MIN_REPS; the median is robust to outliers.
WARMUP_CALLS = 3
MIN_REPS = 10
MAX_REPS = 50
TARGET_TIME_S = 0.05
TP_DEGREES = (1, 2, 4, 8)  # tensor-parallel sizes inside one 8-GPU node (DGX A100/H100)
# Adam and gradient-norm shard sizes profiled on a GPU, 2^20..2^28 parameters: from a small TP shard to a 268M-parameter
# ZeRO-less stage; sizes outside are extended by the table reader (bandwidth-bound, linear).
ADAM_SIZES = tuple(2 ** e for e in range(20, 29, 2))
# Queued GPU timing (queued_cuda_times): batches per kernel, and the sleep that holds the GPU while the
# host queues a batch, sized for the slowest clock of the kernel's cycle count: 3 GHz is above every
# datasheet boost clock (H100 SXM 1,980 MHz), so the sleep lasts at least the host's time, plus a margin.
QUEUED_BATCHES = 5
SLEEP_CLOCK_HZ = 3.0e9
SLEEP_MARGIN_S = 200e-6
COPY_SIZES_BYTES = tuple(2 ** e for e in range(16, 31, 2))  # host <-> device copies, 64 KiB .. 1 GiB


@dataclass(frozen=True, slots=True)
class KernelSpec:
    """One kernel to time: the work as the lowering emits it, its pass, and the model variant."""

    work: OpWork
    pass_: str  # fwd | bwd | bwd_input | bwd_weight | step | h2d | d2h
    model: ModelSpec | None
    tp: int = 1

    @property
    def key(self) -> tuple:
        w = self.work
        return (w.kind, w.name, self.pass_, tuple(w.shape), w.flops, w.bytes)


def pass_of(work: OpWork, phase: str) -> str:
    """The pass of a task's work: F/R forward; B/W backward, split as zero-bubble splits it."""
    if work.kind == "optimizer":
        return "step"
    if phase in ("F", "R", ""):
        return "fwd"
    if work.kind == "gemm":
        full = gemm_flops(*work.shape)
        if work.flops > 1.5 * full:
            return "bwd"
        return "bwd_weight" if phase == "W" else "bwd_input"
    if work.kind == "attention":
        return "bwd"
    return "bwd_weight" if phase == "W" else "bwd"


def adam_work(params: int, grad_dtype: str = "fp32") -> OpWork:
    """The optimizer OpWork of ``strategy/grad_sync`` for a shard of ``params`` parameters."""
    return OpWork("adam", "optimizer", 0.0, params * (ADAM_STATE_RW_BYTES + DTYPE_BYTES[grad_dtype]), (params,))


def grad_norm_work(params: int, grad_dtype: str = "fp32") -> OpWork:
    """The gradient-norm OpWork of ``strategy/grad_sync`` (every gradient of the shard read once)."""
    return OpWork("grad_norm", "optimizer", 0.0, params * DTYPE_BYTES[grad_dtype], (params,))


def scenario_specs(scn: Scenario) -> list[KernelSpec]:
    """Every distinct compute work of the scenario's lowered task graph (exactly what it will look up)."""
    from ..strategy.lower import lower

    plan = lower(scn)
    out: dict[tuple, KernelSpec] = {}
    for t in plan.graph.tasks:
        if t.kind != "compute":
            continue
        for w in t.work:
            s = KernelSpec(w, pass_of(w, t.phase), scn.model, scn.parallel.tp)
            out.setdefault(s.key, s)
    return list(out.values())


def preset_specs(models: tuple[ModelSpec, ...] | None = None, tps: tuple[int, ...] = TP_DEGREES,
                 micro_batch_size: int = 1, dtype: str = "bf16") -> list[KernelSpec]:
    """Forward and backward work of every layer op of the model presets under TP (with and without
    sequence parallelism), plus Adam over a range of shard sizes."""
    out: dict[tuple, KernelSpec] = {}
    for model in models if models is not None else tuple(MODEL_PRESETS.values()):
        g = build_op_graph(model, micro_batch_size, dtype)
        ops = g.embed + g.layer + g.head
        for tp in tps:
            for sp in ((False, True) if tp > 1 else (False,)):
                try:
                    fwd = shard_ops(ops, tp, sp, 1, 1)
                    bwd = shard_ops_backward(ops, tp, sp, 1, 1, "BW")
                except ValueError:  # tp does not divide this model's heads / widths
                    continue
                for w, p in [(w, "fwd") for w in fwd] + [(w, pass_of(w, "B")) for w in bwd]:
                    s = KernelSpec(w, p, model, tp)
                    out.setdefault(s.key, s)
    for n in ADAM_SIZES:
        for work in (adam_work(n), grad_norm_work(n)):
            s = KernelSpec(work, "step", None)
            out.setdefault(s.key, s)
    return list(out.values())


def copy_specs() -> list[KernelSpec]:
    return [KernelSpec(OpWork(f"memcpy_{d}", "memcpy", 0.0, float(n), (n,)), d, None)
            for d in ("h2d", "d2h") for n in COPY_SIZES_BYTES]


def cuda_event_times(fn, reps: int) -> list[float]:
    """Sorted seconds of ``reps`` calls, each bracketed by CUDA events on the current stream."""
    import torch

    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in events:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return sorted(a.elapsed_time(b) * 1e-3 for a, b in events)


def queued_cuda_times(fn, reps: int, batches: int = QUEUED_BATCHES) -> list[float]:
    """Sorted seconds per call of ``batches`` batches of about ``reps / batches`` calls each, every
    batch queued behind a sleep kernel so that the events bracket the calls back to back on the GPU.

    Bracketing each call alone times the host's dispatch too wherever a kernel is shorter than its
    launch: measured on an H100 here, an eager launch takes 6.0 us of host time
    (scenarios/calibration/h100/gpu_kernels.csv, ``host`` rows), longer than most norm and
    elementwise kernels of a small model, and the first tables made on that GPU timed such kernels at
    several times their trace durations. The simulator prices the host floor separately
    (cost/compute.with_host_floor_s), so the tables must hold the GPU's time alone."""
    import torch

    n = max(1, math.ceil(reps / batches))
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    host_s = time.perf_counter() - t  # the host's cost of one call (the GPU was idle: no wait)
    torch.cuda.synchronize()
    sleep_cycles = int(SLEEP_CLOCK_HZ * (1.25 * n * host_s + SLEEP_MARGIN_S))
    out = []
    for _ in range(batches):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(sleep_cycles)  # the GPU waits here while the host queues the batch
        a.record()
        for _ in range(n):
            fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e-3 / n)  # elapsed_time is in milliseconds (CUDA event API)
    return sorted(out)


def time_callable(fn, device: str) -> tuple[float, int]:
    """(median seconds per call, calls timed) after warm-up; on a GPU the calls run queued back to
    back (queued_cuda_times), on the CPU each call is timed with perf_counter."""
    import torch

    cuda = device.startswith("cuda")
    for _ in range(WARMUP_CALLS):
        fn()
    if cuda:
        torch.cuda.synchronize()
        one_s = queued_cuda_times(fn, 1, 1)[0]
    else:
        t = time.perf_counter()
        fn()
        one_s = time.perf_counter() - t
    reps = max(MIN_REPS, min(MAX_REPS, math.ceil(TARGET_TIME_S / max(one_s, 1e-9))))
    if cuda:
        times = queued_cuda_times(fn, reps)
        return times[len(times) // 2], len(times) * math.ceil(reps / QUEUED_BATCHES)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2], reps


def profile_kernels(specs: list[KernelSpec], device: str, dtype: str,
                    progress=None) -> tuple[list[KernelRow], list[str]]:
    """Time every spec; (rows, skipped). A row carries the work's own shape, FLOPs and bytes so that
    lookups match exactly; a kernel the device cannot run (out of memory, no backend for the shape) is
    skipped with its error, and the table reader's fallback (the roofline) covers it."""
    import torch

    rows, skipped = [], []
    for i, spec in enumerate(specs):
        w = spec.work
        failed = False
        try:
            t, reps = time_callable(make_runner(spec, device, dtype), device)
        except (RuntimeError, ValueError) as exc:  # torch.OutOfMemoryError is a RuntimeError
            failed = True
            skipped.append(f"{w.kind}:{w.name}[{'x'.join(map(str, w.shape))}] {spec.pass_}: "
                           f"{(str(exc).splitlines() or [''])[0][:120]}")
        else:
            rows.append(KernelRow(w.kind, w.name, spec.pass_, dtype, tuple(int(d) for d in w.shape),
                                  float(w.flops), float(w.bytes), t, reps))
        if device.startswith("cuda") and (failed or i % 64 == 63):
            torch.cuda.empty_cache()
        if progress is not None:
            progress(i + 1, len(specs), spec)
    return rows, skipped


def kernel_rows_csv(rows: list[KernelRow]) -> list[tuple]:
    return [(r.kind, r.name, r.pass_, r.dtype, r.shape, r.flops, r.bytes, r.time_s, r.samples) for r in rows]
