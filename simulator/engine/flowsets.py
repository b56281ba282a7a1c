"""The state ``engine/network`` keeps about flows: shapes (a CommStep's flows), subsets of them
that cohorts hold, cohorts, and the max-min rates of a connected set of cohorts.

A component's rates are computed per flow and handed back per cohort: one float when all its flows
get the same rate (the usual case), else the list of its flows' rates, by which it splits. Small
components go through ``fairshare.max_min_rates``; large ones (a 64-rank all-to-all has 4,032
flows) through its array form ``max_min_rates_arrays``, with each flow set's links as index arrays
built once (``LinkIndex``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..cost.fairshare import ARRAY_MIN_FLOWS, max_min_rates, max_min_rates_arrays
from ..cost.plan import CommStep

if TYPE_CHECKING:  # numpy is imported where the array form runs: most runs never need it
    import numpy as np


class Shape:
    """The flows of one CommStep that move bytes, and the cohorts they start as (flows of equal
    size); ``subsets`` holds the flow sets its cohorts have had, by index tuple. ``coupled_of``:
    each flow's links that can bind (``engine/bypass``), the ones rates are shared over."""

    __slots__ = ("step", "links_of", "coupled_of", "weights", "sizes", "starts", "subsets", "serial", "csr",
                 "start_subsets")

    def __init__(self, step: CommStep, serial: int) -> None:
        flows = [f for f in step.flows if f.size_bytes > 0 and f.links]
        self.step, self.serial = step, serial  # the step is held so that its id stays unique
        self.links_of = [f.links for f in flows]
        self.coupled_of = self.links_of
        self.weights = [f.weight for f in flows]
        self.sizes = [f.size_bytes for f in flows]
        self.subsets: dict[tuple[int, ...], Subset] = {}
        self.starts = _by_value(list(range(len(flows))), self.sizes)
        self.csr: tuple[np.ndarray, np.ndarray] | None = None  # (offsets, link indices) of coupled_of
        self.start_subsets: list[Subset] | None = None  # the subsets of ``starts``, once made


class Subset:
    """A set of flows of one shape that a cohort holds: its links that can bind (``links``), the
    subsets sharing one of them (``overlaps``, itself included), the live cohorts holding it, and
    what its links did (for ``link_stats``): spans of time with a cohort live (their starts and ends
    in two float lists: a step ends ~10^5 spans, and floats, unlike tuples, are not walked by the
    cyclic GC) and the bytes of its finished cohorts (per unit of weight)."""

    __slots__ = ("shape", "idx", "key", "links", "overlaps", "cohorts", "since", "span_starts", "span_ends",
                 "sent", "arrays")

    def __init__(self, shape: Shape, idx: tuple[int, ...]) -> None:
        self.shape, self.idx, self.key = shape, idx, (shape.serial, len(shape.subsets))
        coupled = shape.coupled_of
        self.links: frozenset = frozenset().union(*[coupled[i] for i in idx])
        self.overlaps: set[Subset] | None = None
        self.cohorts: dict[Cohort, None] = {}
        self.span_starts: list[float] = []
        self.span_ends: list[float] = []
        self.since, self.sent = 0.0, 0.0
        self.arrays: tuple | None = None  # (flow position, link index, weight) arrays

    def weight_on(self) -> dict:
        """Link -> the weight of this subset's flows on it (all links, free ones too)."""
        out: dict = {}
        shape = self.shape
        for i in self.idx:
            w = shape.weights[i]
            for link in shape.links_of[i]:
                out[link] = out.get(link, 0.0) + w
        return out


class Step:
    __slots__ = ("pending", "done")

    def __init__(self, pending: int, done) -> None:
        self.pending, self.done = pending, done


class Cohort:
    """Flows ``sub.idx`` of one started step with the same bytes left, rate and finish time."""

    __slots__ = ("sub", "size", "left", "rate", "t", "finish", "step", "live", "lazy")

    def __init__(self, sub: Subset, size: float, left: float, t: float, step: Step) -> None:
        self.sub, self.size, self.left, self.t, self.step = sub, size, left, t, step
        self.rate, self.finish, self.live, self.lazy = 0.0, t, True, False


def _by_value(idx: list[int], values: list[float]) -> list[tuple[int, ...]]:
    """``idx`` split by the value each index has in ``values``, first occurrence first."""
    out: dict[float, list[int]] = {}
    for i in idx:
        out.setdefault(values[i], []).append(i)
    return [tuple(v) for v in out.values()]


def busy_s(spans: list[tuple[float, float]]) -> float:
    """Length of the union of time spans."""
    total, end = 0.0, float("-inf")
    begin = end
    for t0, t1 in sorted(spans):
        if t0 > end:
            total += end - begin if end > begin else 0.0
            begin, end = t0, t1
        elif t1 > end:
            end = t1
    return total + (end - begin if end > begin else 0.0)


def link_totals(subsets: list[Subset], now: float) -> dict:
    """LinkId -> (bytes_sent, busy_s) over ``subsets``: bytes of finished flows (x weight) and the
    time the link carried at least one flow, up to ``now`` (``FlowNetwork.link_stats``)."""
    sent: dict = {}
    spans: dict = {}
    for sub in subsets:
        mine = list(zip(sub.span_starts, sub.span_ends))
        if sub.cohorts:
            mine.append((sub.since, now))
        for link, w in sub.weight_on().items():
            sent.setdefault(link, []).append(sub.sent * w)
            spans.setdefault(link, []).extend(mine)
    # fsum: the bytes are exactly rounded whatever order the subsets were made in
    return {link: (math.fsum(sent[link]), busy_s(spans[link])) for link in sent}


class LinkIndex:
    """Links numbered in order of first use, with their capacities as an array, for the array form
    of max-min sharing."""

    def __init__(self, capacity_Bps) -> None:
        self.capacity_Bps = capacity_Bps
        self.index: dict = {}
        self._caps: list[float] = []
        self._array: np.ndarray | None = None

    def capacities(self) -> np.ndarray:
        import numpy as np

        if self._array is None or len(self._array) != len(self._caps):
            self._array = np.array(self._caps)
        return self._array

    def csr(self, shape: Shape) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, link indices) of the shape's coupled links, flow after flow."""
        import numpy as np

        if shape.csr is None:
            index, caps = self.index, self._caps
            flat = []
            for links in shape.coupled_of:
                for link in links:
                    k = index.get(link)
                    if k is None:
                        cap = self.capacity_Bps[link]
                        if cap <= 0:
                            raise ValueError(f"link {link!r} has capacity {cap} B/s; it must be > 0")
                        k = index[link] = len(caps)
                        caps.append(cap)
                    flat.append(k)
            sizes = np.fromiter((len(links) for links in shape.coupled_of), dtype=np.int64,
                                count=len(shape.coupled_of))
            shape.csr = (np.concatenate(([0], np.cumsum(sizes))), np.array(flat, dtype=np.int64))
        return shape.csr

    def arrays(self, sub: Subset) -> tuple:
        """(flow position in the subset, link index, weight per flow) of the subset's flows."""
        import numpy as np

        if sub.arrays is None:
            ptr, flat = self.csr(sub.shape)
            idx = np.array(sub.idx, dtype=np.int64)
            counts = ptr[idx + 1] - ptr[idx]
            pos = np.repeat(np.arange(len(idx)), counts)
            first = np.repeat(ptr[idx] - np.concatenate(([0], np.cumsum(counts)[:-1])), counts)
            entries = first + np.arange(len(pos))
            weights = np.array([sub.shape.weights[i] for i in sub.idx])
            sub.arrays = (pos, flat[entries], weights)
        return sub.arrays


def cohort_rates(comp: list[Cohort], capacity_Bps, links: LinkIndex) -> list:
    """Max-min rates of the component's flows, cohort after cohort: a float when all the cohort's
    flows share one rate, else the list of its flows' rates."""
    sizes = [len(c.sub.idx) for c in comp]
    if sum(sizes) >= ARRAY_MIN_FLOWS:
        return _by_arrays(comp, sizes, links)
    links_of: list[tuple] = []
    weights: list[float] = []
    for c in comp:
        s = c.sub.shape
        links_of.extend(s.coupled_of[i] for i in c.sub.idx)
        weights.extend(s.weights[i] for i in c.sub.idx)
    flat = max_min_rates(links_of, weights, capacity_Bps)
    out: list = []
    pos = 0
    for n in sizes:
        mine = flat[pos:pos + n]
        pos += n
        out.append(mine[0] if mine.count(mine[0]) == n else mine)
    return out


def _by_arrays(comp: list[Cohort], sizes: list[int], links: LinkIndex) -> list:
    import numpy as np

    parts = [links.arrays(c.sub) for c in comp]
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    flow_of = np.concatenate([p[0] + offsets[k] for k, p in enumerate(parts)])
    # the links used, ascending, and each entry's position among them: np.unique's answer, found
    # through a mask over the numbered links instead of a sort
    flat = np.concatenate([p[1] for p in parts])
    present = np.zeros(len(links.capacities()), dtype=bool)
    present[flat] = True
    used = np.flatnonzero(present)
    link_of = (np.cumsum(present) - 1)[flat]
    weights = np.concatenate([p[2] for p in parts])
    rates = max_min_rates_arrays(flow_of, link_of, weights, links.capacities()[used])
    lo = np.minimum.reduceat(rates, offsets[:-1])
    hi = np.maximum.reduceat(rates, offsets[:-1])
    out: list = []
    for k, uniform in enumerate((lo == hi).tolist()):
        out.append(float(lo[k]) if uniform else rates[offsets[k]:offsets[k + 1]].tolist())
    return out
