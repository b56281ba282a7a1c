"""Max-min fair bandwidth sharing (progressive filling) and the fluid time of flows run alone.

Shared by ``cost/collectives`` (uncontended collective times) and ``engine/network`` (contended
runs), so a plan run alone through the engine takes exactly the time the cost model predicts.
Reference: Bertsekas & Gallager, Data Networks (1992), §6.5.2, max-min fairness by progressive
filling; a flow of weight w stands for w identical flows, each receiving the fair share.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Mapping, Sequence

if TYPE_CHECKING:  # numpy is imported where the array forms run: most runs never need it
    import numpy as np

# Relative tolerance for "this flow has finished" in fluid time stepping (float round-off).
REL_EPS = 1e-12
# Sets of at least this many flows are shared with the array form (``max_min_rates_arrays``); below
# it the pure-Python form is as fast, and it keeps the figures of small runs as they were.
ARRAY_MIN_FLOWS = 1024


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
    if len(active) >= ARRAY_MIN_FLOWS:
        return _isolated_time_arrays(sizes, links_of, weights, capacity_Bps, active)
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


def max_min_rates_arrays(flow_of: np.ndarray, link_of: np.ndarray, weights: np.ndarray,
                         capacity_Bps: np.ndarray) -> np.ndarray:
    """``max_min_rates`` for flows given as arrays, vectorised for large sets of flows: entry e
    says flow ``flow_of[e]`` crosses link ``link_of[e]`` (an index into ``capacity_Bps``).

    Progressive filling as above, but each round saturates every link whose fair share equals the
    smallest at once (a symmetric collective has hundreds of such ties), so the rounds are the
    distinct bottleneck levels. The same allocation up to float round-off: link budgets are
    decremented in another order (``tests/test_network.py`` bounds the difference)."""
    import numpy as np

    n_links = len(capacity_Bps)
    w_e = weights[flow_of]
    wsum = np.bincount(link_of, weights=w_e, minlength=n_links)
    remaining = np.array(capacity_Bps, dtype=float)
    rates = np.zeros(len(weights))
    open_ = wsum > 1e-12
    share = np.full(n_links, np.inf)
    while True:
        share.fill(np.inf)
        np.divide(np.maximum(remaining, 0.0), wsum, out=share, where=open_)
        level = share.min()
        if level == np.inf:
            return rates
        full = share == level
        hit = full[link_of]
        new = np.zeros(len(weights), dtype=bool)
        new[flow_of[hit]] = True
        rates[new] = level
        take = new[flow_of]  # entries of the flows frozen this round, which leave the arrays
        freed_w = np.bincount(link_of[take], weights=w_e[take], minlength=n_links)
        remaining -= level * freed_w
        wsum -= freed_w
        open_ &= ~full & (wsum > 1e-12)
        keep = ~take
        flow_of, link_of, w_e = flow_of[keep], link_of[keep], w_e[keep]


def _isolated_time_arrays(sizes: Sequence[float], links_of: Sequence[tuple], weights: Sequence[float],
                          capacity_Bps: Mapping, active: list[int]) -> float:
    """``isolated_time_s`` of many flows, with the array form of max-min sharing."""
    import numpy as np

    index: dict = {}
    flow_list, link_list = [], []
    for j, i in enumerate(active):
        for link in links_of[i]:
            k = index.get(link)
            if k is None:
                k = index[link] = len(index)
            flow_list.append(j)
            link_list.append(k)
    caps = []
    for link in index:
        cap = capacity_Bps.get(link)
        if cap is None or cap <= 0:
            raise ValueError(f"link {link!r} has capacity {cap} B/s in the topology; it must be > 0")
        caps.append(cap)
    capacity = np.array(caps)
    flow_of, link_of = np.array(flow_list), np.array(link_list)
    size = np.array([sizes[i] for i in active], dtype=float)
    weight = np.array([weights[i] for i in active], dtype=float)
    left = size.copy()
    alive = np.ones(len(active), dtype=bool)
    t = 0.0
    while alive.any():
        ids = np.flatnonzero(alive)
        renumber = np.cumsum(alive) - 1
        keep = alive[flow_of]
        rates = max_min_rates_arrays(renumber[flow_of[keep]], link_of[keep], weight[ids], capacity)
        dt = float((left[ids] / rates).min())
        t += dt
        left[ids] -= rates * dt
        alive[ids] = left[ids] > REL_EPS * size[ids]
    return t
