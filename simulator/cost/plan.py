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
    # Plans started together with this one and awaited with it (the representative-rank mode's sibling
    # copies whose steps do not line up with these); the run ends when the last of them ends.
    concurrent: tuple["CommPlan", ...] = ()
