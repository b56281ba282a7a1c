"""Max-min fair bandwidth sharing (progressive filling) and the fluid time of flows run alone.

Shared by ``cost/collectives`` (uncontended collective times) and ``engine/network`` (contended
runs), so a plan run alone through the engine takes exactly the time the cost model predicts.
Reference: Bertsekas & Gallager, Data Networks (1992), §6.5.2, max-min fairness by progressive
filling; a flow of weight w stands for w identical flows, each receiving the fair share.
"""

from __future__ import annotations

import heapq
from typing import Mapping, Sequence

# Relative tolerance for "this flow has finished" in fluid time stepping (float round-off).
REL_EPS = 1e-12


def max_min_rates(links_of: Sequence[tuple], weights: Sequence[float],
                  capacity_Bps: Mapping) -> list[float]:
    """Per-flow rate (bytes/s of one of the ``weight`` identical flows) under max-min fairness.

    Repeatedly the link with the smallest fair share (remaining capacity / unfrozen weight) is
    saturated and its flows are frozen at that share (Bertsekas & Gallager §6.5.2).
    """
    n = len(links_of)
    rates = [0.0] * n
    remaining: dict = {}
    wsum: dict = {}
    members: dict = {}
    for i, links in enumerate(links_of):
        w = weights[i]
        for link in links:
            if link not in remaining:
                try:
                    cap = capacity_Bps[link]
                except KeyError:
                    raise ValueError(f"link {link!r} has no capacity in the topology") from None
                if cap <= 0:
                    raise ValueError(f"link {link!r} has capacity {cap} B/s; it must be > 0")
                remaining[link] = cap
                wsum[link] = 0.0
                members[link] = []
            wsum[link] += w
            members[link].append(i)
    version = dict.fromkeys(remaining, 0)
    heap = [(remaining[link] / wsum[link], k, 0, link) for k, link in enumerate(remaining)]
    heapq.heapify(heap)
    tiebreak = len(heap)
    frozen = [False] * n
    while heap:
        share, _, ver, link = heapq.heappop(heap)
        if ver != version[link] or wsum[link] <= 0:
            continue
        touched = set()
        for i in members[link]:
            if frozen[i]:
                continue
            frozen[i] = True
            rates[i] = share
            w = weights[i]
            for other in links_of[i]:
                remaining[other] -= share * w
                wsum[other] -= w
                touched.add(other)
        wsum[link] = 0.0
        touched.discard(link)
        for other in touched:
            version[other] += 1
            if wsum[other] > 1e-12:
                tiebreak += 1
                heapq.heappush(heap, (max(remaining[other], 0.0) / wsum[other], tiebreak,
                                      version[other], other))
    return rates


def isolated_time_s(sizes: Sequence[float], links_of: Sequence[tuple], weights: Sequence[float],
                    capacity_Bps: Mapping) -> float:
    """Fluid time until the last of these flows ends when they run alone, started together:
    max-min rates, re-shared each time a flow finishes (what ``engine/network`` does)."""
    active = [i for i, s in enumerate(sizes) if s > 0 and links_of[i]]
    left = list(sizes)
    t = 0.0
    while active:
        rates = max_min_rates([links_of[i] for i in active], [weights[i] for i in active],
                              capacity_Bps)
        dt = min(left[i] / r for i, r in zip(active, rates))
        t += dt
        still = []
        for i, r in zip(active, rates):
            left[i] -= r * dt
            if left[i] > REL_EPS * sizes[i]:
                still.append(i)
        active = still
    return t
