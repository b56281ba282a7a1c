"""CommPlan: how a collective moves bytes over the topology's links, as the engine executes it.

``cost/collectives`` decomposes a collective into sequential steps; each step is a fixed latency
followed by concurrent flows, each flow holding every link of its route until its bytes are sent.
The engine shares each link's bandwidth between the flows on it (``engine/network``), so the
same plan gives the uncontended time alone and a slower time under contention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

LinkId = Hashable  # an edge (u, v) of the topology graph


@dataclass(frozen=True, slots=True)
class Flow:
    links: tuple[LinkId, ...]
    size_bytes: float
    weight: float = 1.0  # identical concurrent flows this one stands for (symmetric peers)


@dataclass(frozen=True, slots=True)
class CommStep:
    latency_s: float
    flows: tuple[Flow, ...] = ()
    # A step that repeats n times with identical flows (ring steps) is stored once.
    repeat: int = 1


@dataclass(frozen=True, slots=True)
class CommPlan:
    algorithm: str
    steps: tuple[CommStep, ...]

    def uncontended_time_s(self, capacity_Bps: dict) -> float:
        """Time with no other traffic: each step ends when its slowest flow ends."""
        total = 0.0
        for step in self.steps:
            slowest = 0.0
            load: dict = {}
            for f in step.flows:
                for link in f.links:
                    load[link] = load.get(link, 0.0) + f.weight
            for f in step.flows:
                if f.size_bytes <= 0 or not f.links:
                    continue
                rate = min(capacity_Bps[link] / load[link] for link in f.links)
                slowest = max(slowest, f.size_bytes / rate)
            total += step.repeat * (step.latency_s + slowest)
        return total
