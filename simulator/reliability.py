"""Reliability of a long training run: the ``[reliability]`` settings, published failure counts per
component scaled to the cluster's device counts, and the checkpointing closed forms (Young 1974,
Daly 2006) that the goodput simulation (engine/goodput_sim.py) is tested against.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any
from dataclasses import dataclass

from .defaults import (DEFAULT_CHECKPOINT_MODE, DEFAULT_DETECTION_S, DEFAULT_FAILURE_DATA, DEFAULT_RESCHEDULE_S,
                       DEFAULT_STORAGE_GBPS, DEFAULT_STRAGGLER_JITTER, DEFAULT_WARMUP_S)
from .hardware.clusters import ClusterSpec
from .scenario_checks import ScenarioError

SECONDS_PER_DAY = 86400.0
SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True, slots=True)
class FailureCause:
    """One root cause of a published failure table: how many interruptions it caused in the window."""

    name: str
    component: str  # gpu | hbm | network | host | software | planned
    count: int
    unit: str  # the device its rate scales with: "gpu", "node" or "nic"
    replace_node: bool  # the job restarts without the failed node (a hot spare or the scheduler's)
    graceful: bool = False  # planned: a checkpoint is written first, nothing is lost, no hang to detect


@dataclass(frozen=True, slots=True)
class FleetData:
    """A published failure table and the fleet it was observed on."""

    source: str
    window_days: float
    gpus: int
    nodes: int
    nics: int
    causes: tuple[FailureCause, ...]


@dataclass(frozen=True, slots=True)
class CauseRate:
    """A failure cause at the rate it strikes this cluster (per second of wall time)."""

    name: str
    component: str
    rate_per_s: float
    replace_node: bool
    graceful: bool = False


def _c(name, component, count, unit, replace=True, graceful=False) -> FailureCause:
    return FailureCause(name, component, count, unit, replace, graceful)


# Dubey et al. 2024 ("The Llama 3 Herd of Models"), sec. 3.3.4 and Table 5: 466 job interruptions in a
# 54-day snapshot of Llama 3 405B pre-training on 16,384 H100 (2,048 nodes, one 400 Gb/s RoCE NIC per
# GPU, sec. 3.3.1): 47 planned (firmware upgrades, configuration or dataset updates), 419 unexpected,
# by root cause below. "Faulty GPU" includes NVLink failures (the paper: "GPU issues ... including
# NVLink"). Hardware causes exclude the failed node; software causes restart in place.
LLAMA3_405B = FleetData(
    source="Llama 3 (Dubey et al. 2024) Table 5: 54-day snapshot, 16,384 H100", window_days=54.0,
    gpus=16384, nodes=2048, nics=16384,
    causes=(
        _c("faulty GPU (incl. NVLink)", "gpu", 148, "gpu"), _c("GPU HBM3 memory", "hbm", 72, "gpu"),
        _c("software bug", "software", 54, "node", replace=False),
        _c("network switch/cable", "network", 35, "nic"), _c("host maintenance", "host", 32, "node"),
        _c("GPU SRAM memory", "gpu", 19, "gpu"), _c("GPU system processor", "gpu", 17, "gpu"),
        _c("NIC", "network", 7, "nic"), _c("NCCL watchdog timeout", "software", 7, "node", replace=False),
        _c("silent data corruption", "gpu", 6, "gpu"), _c("GPU thermal interface + sensor", "gpu", 6, "gpu"),
        _c("SSD", "host", 3, "node"), _c("power supply", "host", 3, "node"), _c("server chassis", "host", 2, "node"),
        _c("IO expansion board", "host", 2, "node"), _c("dependency", "software", 2, "node", replace=False),
        _c("CPU", "host", 2, "node"), _c("system memory", "host", 2, "node"),
        _c("planned maintenance", "planned", 47, "node", replace=False, graceful=True),
    ))

FLEETS: dict[str, FleetData | None] = {"llama3": LLAMA3_405B, "none": None}
CHECKPOINT_MODES = ("sync", "async")


@dataclass(frozen=True, slots=True)
class ReliabilitySpec:
    """The ``[reliability]`` table; every field has a documented default (defaults.py)."""

    failure_data: str = DEFAULT_FAILURE_DATA  # "llama3" | "none"
    failure_rate_scale: float = 1.0  # multiplies every cause's rate
    planned_maintenance: bool = True  # include the source's planned (graceful) interruptions
    checkpoint_interval_steps: int = 0  # 0: the Young/Daly optimum, rounded to whole steps
    checkpoint_mode: str = DEFAULT_CHECKPOINT_MODE  # "sync" | "async"
    storage_write_GBps: float = DEFAULT_STORAGE_GBPS  # aggregate, to persistent storage
    storage_read_GBps: float = DEFAULT_STORAGE_GBPS
    # Fractional step slowdown while an async checkpoint drains. 0 by default: the drain runs on host
    # CPUs and the frontend network, not the GPUs' fabric, and no interference measurement is published.
    async_step_slowdown: float = 0.0
    detection_s: float = DEFAULT_DETECTION_S
    reschedule_s: float = DEFAULT_RESCHEDULE_S
    warmup_s: float = DEFAULT_WARMUP_S
    hot_spares: int = 0  # standby nodes: a hardware failure restarts without rescheduling
    spare_repair_h: float = 0.0  # a failed node rejoins the spares after this; 0: not within the run
    straggler_jitter: float = DEFAULT_STRAGGLER_JITTER  # per-step slowdown ~ U(0, jitter)
    straggler_probability: float = 0.0  # chance a step also meets a heavy straggler ...
    straggler_slowdown: float = 0.0  # ... whose slowdown is exponential with this mean


RELIABILITY_KEYS = {f.name for f in dataclasses.fields(ReliabilitySpec)}
_KINDS = {"int": int, "float": float, "str": str, "bool": bool}


def parse_reliability(table: dict) -> ReliabilitySpec:
    """``[reliability]`` -> ReliabilitySpec: unknown keys and wrong types are ScenarioErrors (exit 2);
    the value rules are scenario_checks.check_reliability."""
    unknown = set(table) - RELIABILITY_KEYS
    if unknown:
        raise ScenarioError(f"[reliability] unknown key(s) {sorted(unknown)}; known: {', '.join(sorted(RELIABILITY_KEYS))}")
    types = {f.name: _KINDS[str(f.type)] for f in dataclasses.fields(ReliabilitySpec)}
    values: dict[str, Any] = {}
    for key, value in table.items():
        kind = types[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if (kind is int and isinstance(value, bool)) or not isinstance(value, kind):
            raise ScenarioError(f"reliability.{key} must be {kind.__name__}, got {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ScenarioError(f"reliability.{key} must be a finite number, got {value!r}")
        values[key] = value
    return ReliabilitySpec(**values)


def device_counts(cluster: ClusterSpec) -> dict[str, int]:
    """GPUs, nodes and NICs of a cluster (hardware.clusters.ClusterSpec), the units failure rates scale with."""
    return {"gpu": cluster.num_gpus, "node": cluster.num_nodes, "nic": cluster.num_nodes * cluster.nics_per_node}


def cause_rates(spec: ReliabilitySpec, cluster: ClusterSpec) -> tuple[CauseRate, ...]:
    """Each cause's rate on this cluster: its count per device per second in the source fleet, times
    this cluster's devices of the same kind, times ``failure_rate_scale`` (Poisson superposition)."""
    fleet = FLEETS[spec.failure_data]
    if fleet is None or spec.failure_rate_scale == 0:
        return ()
    here = device_counts(cluster)
    there = {"gpu": fleet.gpus, "node": fleet.nodes, "nic": fleet.nics}
    window_s = fleet.window_days * SECONDS_PER_DAY
    return tuple(CauseRate(c.name, c.component, c.count / (window_s * there[c.unit]) * here[c.unit]
                           * spec.failure_rate_scale, c.replace_node, c.graceful)
                 for c in fleet.causes if spec.planned_maintenance or not c.graceful)


def unexpected_rate_per_s(rates: tuple[CauseRate, ...]) -> float:
    """Total rate of the interruptions that lose work (planned ones checkpoint first)."""
    return sum(r.rate_per_s for r in rates if not r.graceful)


# ---- closed forms ------------------------------------------------------------------------------------
def young_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Young 1974, "A first order approximation to the optimum checkpoint interval": sqrt(2 C M),
    C the time to write a checkpoint, M the mean time between failures; compute time between checkpoints."""
    return math.sqrt(2.0 * checkpoint_s * mtbf_s)


def daly_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly 2006, "A higher order estimate of the optimum checkpoint interval for restart dumps", eq. 37:
    sqrt(2CM) [1 + 1/3 sqrt(C/2M) + 1/9 (C/2M)] - C for C < 2M, else M."""
    c, m = checkpoint_s, mtbf_s
    if c >= 2.0 * m:
        return m
    x = c / (2.0 * m)
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - c


def expected_goodput(work_s: float, checkpoint_s: float, restart_s: float, rate_per_s: float) -> float:
    """Fraction of wall time spent on kept work, periodic checkpoints under Poisson failures (Daly 2006
    eq. 13, exact for this model): each segment of ``work_s`` compute plus a ``checkpoint_s`` write must
    run failure-free; a failure loses the segment and costs ``restart_s`` (itself restarted by a failure).
    Expected wall time per segment M e^(R/M) (e^((tau+C)/M) - 1), M = 1/rate; rate 0: tau / (tau + C)."""
    if rate_per_s == 0:
        return work_s / (work_s + checkpoint_s)
    lam = rate_per_s
    try:
        return work_s * lam / (math.exp(lam * restart_s) * math.expm1(lam * (work_s + checkpoint_s)))
    except OverflowError:  # an expected wall time per segment beyond any float: no work is kept
        return 0.0
