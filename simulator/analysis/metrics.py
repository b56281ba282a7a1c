"""Metrics of one simulated (or measured) step: time, throughput, MFU/HFU, and the exposed-time breakdown.

The breakdown is read off the critical rank's timeline with a sweep line: at every instant the rank
is either computing (the compute stream's category), exposed on communication (a comm stream busy
while compute idles), or idle (bubble). The parts therefore add up to the iteration time exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

import numpy as np

from ..cost.clocks import slowest_speed_ratio
from ..scenario import Scenario
from ..trace import COMPUTE_STREAM, Trace
from ..units import TFLOP
from .memory import MemoryReport

BREAKDOWN_KEYS = ("compute", "recompute", "comm_tp", "comm_cp", "comm_ep", "comm_pp", "comm_dp", "bubble",
                  "optimizer", "offload", "other")
# When compute idles and several streams are busy, the time is charged to the first busy one in
# this order: blocking collectives first, then the overlappable ones.
_EXPOSED_ORDER = ("comm_ep", "comm_cp", "comm_tp", "offload", "optimizer", "comm_pp", "comm_dp", "other",
                  "compute", "recompute")


def exposed_breakdown(trace: Trace, rank: int, t0: float, t1: float) -> dict[str, float]:
    """Seconds of [t0, t1] on ``rank`` by what is exposed (DESIGN.md §4.3 time_breakdown_s).

    A sweep over the rank's event boundaries: between two consecutive instants the rank is in the
    state all boundaries up to the first leave it (per (compute stream or not, category), the number
    of events running), charged to the first running category in _EXPOSED_ORDER on the compute stream,
    else on the other streams, else to the bubble; each category's seconds summed interval by interval
    in time order."""
    start, end, streams, categories = trace.columns(rank)
    keep = np.flatnonzero(end > start)
    k = len(BREAKDOWN_KEYS)
    index = {c: i for i, c in enumerate(BREAKDOWN_KEYS)}
    other = index["other"]
    col = np.array([index.get(categories[i], other) + (0 if streams[i] == COMPUTE_STREAM else k) for i in keep.tolist()],
                   dtype=np.int64)
    times = np.concatenate((start[keep], end[keep]))
    order = np.argsort(times, kind="stable")
    times = times[order]
    counts = np.zeros((len(times), 2 * k), dtype=np.int64)
    counts[np.arange(len(times)), np.concatenate((col, col))[order]] = np.concatenate(
        (np.ones(len(keep), np.int64), -np.ones(len(keep), np.int64)))[order]
    last = np.flatnonzero(np.append(times[1:] != times[:-1], True)) if len(times) else np.zeros(0, np.int64)
    times, state = times[last], np.cumsum(counts, axis=0)[last] > 0
    # the state before each instant: none before the first
    before = np.vstack((np.zeros((1, 2 * k), bool), state))
    charged = _charged(before)
    # interval j ends at instant j (from the instant before, or t0) and the last one at t1
    lo = np.maximum(np.append(-np.inf, times), t0)
    hi = np.minimum(np.append(times, t1), t1)
    hi[-1] = t1
    use = np.flatnonzero((hi > lo) & (np.append(times, np.inf) > t0))
    # bincount adds each category's seconds one interval after another in time order, as a loop would
    seconds = np.bincount(charged[use], weights=hi[use] - lo[use], minlength=k).tolist()
    return {key: seconds[i] for i, key in enumerate(BREAKDOWN_KEYS)}


def _charged(running: np.ndarray) -> np.ndarray:
    """Per state row (running on the compute stream per category, then on the others), the category
    charged (index into BREAKDOWN_KEYS)."""
    k = len(BREAKDOWN_KEYS)
    prio = np.array([BREAKDOWN_KEYS.index(c) for c in _EXPOSED_ORDER + ("bubble",)])
    comp, rest = running[:, :k][:, prio], running[:, k:][:, prio]
    bubble = BREAKDOWN_KEYS.index("bubble")
    return np.where(comp.any(axis=1), prio[comp.argmax(axis=1)],
                    np.where(rest.any(axis=1), prio[rest.argmax(axis=1)], bubble))


def critical_rank(trace: Trace) -> int:
    """The rank whose last event ends last (lowest rank on ties)."""
    last = trace.last_end_by_rank()
    return min(last, key=lambda r: (-last[r], r))


def busiest_rank(trace: Trace, ranks: list[int]) -> int:
    """The rank idle the least (the longest union of busy streams): the pipeline's bottleneck stage,
    whose own work sets the step; the rank that ends last (``critical_rank``) can be a light stage
    waiting for it. Lowest rank on ties."""
    return min(sorted(ranks), key=lambda r: -trace.busy_s(r))


class BusiestRank(TypedDict):
    rank: int
    time_breakdown_s: dict[str, float]


class Metrics(TypedDict):
    """metrics.json (DESIGN.md §4.3), key for key; a dict at run time, so it serializes as it always
    did, and typed for the code that reads it."""

    scenario: str
    num_gpus: int
    iteration_time_s: float
    tokens_per_s: float
    model_flops_per_iteration: float
    hardware_flops_per_iteration: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    hfu: float
    bubble_fraction: float
    time_breakdown_s: dict[str, float]
    memory_bytes: dict[str, float]
    memory_capacity_bytes: float
    fits_in_memory: bool
    # extension: seconds network transfers took beyond their time alone, summed per category
    # (shared links: DP buckets slowing PP sends on the same NIC, ...); not exposed time
    network_contention_s: dict[str, float]
    # extension: the rank idle the least (the bottleneck pipeline stage) and its exposed breakdown;
    # time_breakdown_s is read on the rank that ends last, which waits for it
    busiest_rank: BusiestRank
    # extension: seconds the busiest rank's compute ran longer because collectives beside it held SMs
    # (cost/sm_share); they are part of its compute and recompute time, not an extra category
    sm_contention_s: float
    # extension: the tensor-core speed of the job's slowest GPU over its SKU's median
    # (cost/clocks.slowest_speed_ratio); the compute above already runs at that pace
    slowest_gpu_speed_ratio: float


@dataclass(frozen=True)
class StepTimes:
    """What the simulation of one step measured, as ``summarize`` reads it."""

    iteration_time_s: float
    model_flops: float
    hardware_flops: float  # every simulated task's FLOPs, recompute included, over all GPUs
    breakdown_s: dict[str, float]  # exposed seconds per category on the rank that ends last
    busiest_rank: int
    busiest_breakdown_s: dict[str, float]
    network_contention_s: dict[str, float]
    sm_contention_s: float = 0.0


def summarize(scn: Scenario, step: StepTimes, memory: MemoryReport) -> Metrics:
    """metrics.json (DESIGN.md §4.3); MFU/HFU against the GPU's dense peak (PaLM, Chowdhery 2022 App. B)."""
    n = scn.num_gpus
    peak = scn.cluster.gpu.peak(scn.training.dtype)
    t = step.iteration_time_s
    tokens = scn.training.global_batch_size * scn.model.seq_length
    return {
        "scenario": scn.name,
        "num_gpus": n,
        "iteration_time_s": t,
        "tokens_per_s": tokens / t,
        "model_flops_per_iteration": step.model_flops,
        "hardware_flops_per_iteration": step.hardware_flops,
        "model_tflops_per_gpu": step.model_flops / t / n / TFLOP,
        "hardware_tflops_per_gpu": step.hardware_flops / t / n / TFLOP,
        "mfu": step.model_flops / (t * n * peak),
        "hfu": step.hardware_flops / (t * n * peak),
        "bubble_fraction": step.breakdown_s["bubble"] / t if t > 0 else 0.0,
        "time_breakdown_s": step.breakdown_s,
        "memory_bytes": memory.peak,
        "memory_capacity_bytes": memory.capacity_bytes,
        "fits_in_memory": memory.fits,
        "network_contention_s": dict(step.network_contention_s),
        "busiest_rank": {"rank": step.busiest_rank, "time_breakdown_s": step.busiest_breakdown_s},
        "sm_contention_s": step.sm_contention_s,
        "slowest_gpu_speed_ratio": slowest_speed_ratio(scn.cluster.gpu, n),
    }
