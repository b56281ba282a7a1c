"""CommPlan: how a collective moves bytes over the topology's links, as the engine executes it.

``cost/collectives`` decomposes a collective into sequential steps; each step is a fixed latency
followed by concurrent flows, each flow holding every link of its route until its bytes are sent.
The engine shares each link's bandwidth between the flows on it (``engine/network``), so the
same plan gives the uncontended time alone and a slower time under contention.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from typing import Hashable, NamedTuple

LinkId = Hashable  # an edge (u, v) of the topology graph


class Flow(NamedTuple):
    """Bytes over a route. A NamedTuple rather than a frozen dataclass, as tasks.Task: an all-to-all
    over 64 ranks has 4,032 flows per plan, and tuple construction is several times cheaper."""

    links: tuple[LinkId, ...]
    size_bytes: float
    weight: float = 1.0  # identical concurrent flows this one stands for (symmetric peers)


_new_flow = partial(tuple.__new__, Flow)


def make_flows(links: Iterable[tuple[LinkId, ...]], sizes: Iterable[float], weights: Iterable[float]) -> tuple[Flow, ...]:
    """Flows from their columns, built by C-level maps (equal to ``Flow(l, s, w)`` one by one)."""
    return tuple(map(_new_flow, zip(links, sizes, weights)))


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
