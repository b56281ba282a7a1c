"""The `collective` command: one collective over every GPU of a cluster, timed through the engine.

Reports nccl-tests' figures (doc/PERFORMANCE.md): algbw = size / time and busbw = algbw x the
op's factor, so users compare the simulator with their nccl-tests runs like with like.
"""

from __future__ import annotations

from typing import Sequence

from ..cost.collectives import busbw_factor, plan_collective
from ..engine.network import simulate_plan
from ..hardware.clusters import ClusterSpec
from ..hardware.topology import Topology, build_topology
from ..tasks import COLLECTIVE_OPS, Collective
from ..units import GB

# nccl-tests' usual sweep, -b 8 -e 8G -f 2: 8 B to 8 GiB in powers of two.
SWEEP_SIZES = tuple(2 ** k for k in range(3, 34))


def _measure(topo: Topology, op: str, size_bytes: float, algorithm: str | None) -> dict:
    if op not in COLLECTIVE_OPS:
        raise ValueError(f"unknown collective op {op!r}; known: {', '.join(COLLECTIVE_OPS)}")
    if size_bytes <= 0:
        raise ValueError(f"size_bytes must be > 0, got {size_bytes}")
    n = topo.num_gpus
    if n < 2:
        raise ValueError(f"a collective needs at least 2 GPUs; the cluster has {n}")
    plan = plan_collective(Collective(op, float(size_bytes), tuple(range(n)), "dp"), topo,
                           algorithm)
    time_s = simulate_plan(plan, topo.capacity_Bps)
    algbw = size_bytes / time_s / GB
    return {"op": op, "num_gpus": n, "size_bytes": size_bytes, "time_s": time_s,
            "algbw_GBps": algbw, "busbw_GBps": algbw * busbw_factor(op, n),
            "algorithm": plan.algorithm}


def run_collective(cluster: ClusterSpec, op: str, size_bytes: float,
                   algorithm: str | None = None) -> dict:
    """One collective over all GPUs of ``cluster`` (ranks in order), simulated alone."""
    return _measure(build_topology(cluster), op, size_bytes, algorithm)


def sweep_collective(cluster: ClusterSpec, op: str, sizes: Sequence[float] = SWEEP_SIZES,
                     algorithm: str | None = None) -> list[dict]:
    """``run_collective`` for each size (default 8 B .. 8 GiB), on one topology."""
    topo = build_topology(cluster)
    return [_measure(topo, op, size, algorithm) for size in sizes]
