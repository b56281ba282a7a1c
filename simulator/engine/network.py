"""FlowNetwork: links with shared bandwidth inside the simpy engine, max-min fair between flows.

A CommPlan's steps run in order: a step's latency elapses, then its flows start together and the
step ends when its last flow ends. Every flow holds all links of its route; whenever flows start
or end, the rates of the flows connected to them through shared links are re-shared max-min
(``cost/fairshare``), so concurrent TP/PP/DP/EP traffic slows each other exactly where it meets.

Flows are kept in cohorts: flows of one started step, connected through the step's own links,
with the same bytes left and the same rate, hence the same finish time (the thousands of flows of
one ring step over a large group are usually one cohort). A cohort is one heap entry and one
node of the link graph; it splits when a re-share gives its flows different rates. The rates of
a connected set of cohorts depend only on which flows they hold, so they are cached under that
key: a ring collective re-uses the rates of its first step for all later ones (``cache_rates``).
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any, Generator, Mapping

import simpy

from ..cost.fairshare import REL_EPS, max_min_rates
from ..cost.plan import CommPlan, CommStep


class _Shape:
    """The flows of one CommStep that move bytes, and the cohorts they start as (flows of equal
    size); ``subsets`` holds the flow sets its cohorts have had, by index tuple."""

    __slots__ = ("step", "links_of", "weights", "sizes", "starts", "subsets", "serial")

    def __init__(self, step: CommStep, serial: int) -> None:
        flows = [f for f in step.flows if f.size_bytes > 0 and f.links]
        self.step, self.serial = step, serial  # the step is held so that its id stays unique
        self.links_of = [f.links for f in flows]
        self.weights = [f.weight for f in flows]
        self.sizes = [f.size_bytes for f in flows]
        self.subsets: dict[tuple[int, ...], _Subset] = {}
        self.starts = _by_value(list(range(len(flows))), self.sizes)


class _Subset:
    """A set of flows of one shape that a cohort holds: their links, the weight each link carries,
    the live cohorts holding it, and what its links did (for ``link_stats``): spans of time with a
    cohort live and the bytes of its finished cohorts (per unit of weight)."""

    __slots__ = ("shape", "idx", "key", "links", "weight_on", "overlaps", "cohorts", "since", "spans", "sent")

    def __init__(self, shape: _Shape, idx: tuple[int, ...]) -> None:
        self.shape, self.idx, self.key = shape, idx, (shape.serial, len(shape.subsets))
        weight_on: dict = {}
        for i in idx:
            w = shape.weights[i]
            for link in shape.links_of[i]:
                weight_on[link] = weight_on.get(link, 0.0) + w
        self.weight_on, self.links = weight_on, frozenset(weight_on)
        self.overlaps: set[_Subset] | None = None  # subsets sharing a link with it (itself too)
        self.cohorts: dict[_Cohort, None] = {}
        self.spans: list[tuple[float, float]] = []
        self.since, self.sent = 0.0, 0.0


def _by_value(idx: list[int], values: list[float]) -> list[tuple[int, ...]]:
    """``idx`` split by the value each index has in ``values``, first occurrence first."""
    out: dict[float, list[int]] = {}
    for i in idx:
        out.setdefault(values[i], []).append(i)
    return [tuple(v) for v in out.values()]


class _Step:
    __slots__ = ("pending", "done")

    def __init__(self, pending: int, done: simpy.Event):
        self.pending, self.done = pending, done


class _Cohort:
    """Flows ``sub.idx`` of one started step with the same bytes left, rate and finish time."""

    __slots__ = ("sub", "size", "left", "rate", "t", "finish", "step", "live")

    def __init__(self, sub: _Subset, size: float, left: float, t: float, step: _Step) -> None:
        self.sub, self.size, self.left, self.t, self.step = sub, size, left, t, step
        self.rate, self.finish, self.live = 0.0, t, True


def _busy_s(spans: list[tuple[float, float]]) -> float:
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


class FlowNetwork:
    """Shared links for the flows of concurrently running CommPlans (one per simpy environment).
    Per-link state is kept per flow set (``_Subset``), so a cohort starts and ends in O(1) however
    many links it holds; ``link_stats`` adds the sets up per link when asked."""

    def __init__(self, env: simpy.Environment, capacity_Bps: Mapping, cache_rates: bool = True) -> None:
        self.env = env
        self.capacity_Bps = capacity_Bps
        self.cache_rates = cache_rates
        self._heap: list = []  # (finish time, tiebreak, cohort); stale entries skipped
        self._count = itertools.count()
        self._timer_at = float("inf")
        self._token = 0
        self._shapes: dict[int, _Shape] = {}  # id(CommStep) -> its shape (which holds the step)
        self._rates: dict[tuple, list[float]] = {}  # subset keys of a component -> its rates
        self._splits: dict[tuple, list] = {}  # (component key, position) -> [(subset, rate)]
        self._on_link: dict = {}  # link -> every subset that holds it
        self._live: set[_Subset] = set()  # subsets with a live cohort
        self.flows_started = 0

    def run(self, plan: CommPlan) -> Generator[simpy.Event, Any, float]:
        """Execute ``plan``: ``elapsed_s = yield from net.run(plan)`` returns when its last step
        ends, with the seconds it took (compare with the uncontended time for contention).

        A step repeated r times runs once with r x latency and r x bytes: exact alone, and
        the fluid limit of r identical steps under contention. ``plan.concurrent`` plans start with
        it and the run waits for them too."""
        env = self.env
        begin = env.now
        others = [env.process(self.run(p)) for p in plan.concurrent]
        for step in plan.steps:
            latency = step.latency_s * step.repeat
            if latency > 0:
                yield env.timeout(latency)
            shape = self._shape(step)
            if shape.starts:
                done = env.event()
                self._start(shape, step.repeat, done)
                yield done
        if others:
            yield env.all_of(others)
        return env.now - begin

    def _shape(self, step: CommStep) -> _Shape:
        shape = self._shapes.get(id(step))
        if shape is None or shape.step is not step:
            shape = self._shapes[id(step)] = _Shape(step, len(self._shapes))
        return shape

    def _subset(self, shape: _Shape, idx: tuple[int, ...]) -> _Subset:
        """The subset of ``shape`` holding flows ``idx``, indexed by link on first use."""
        sub = shape.subsets.get(idx)
        if sub is None:
            sub = shape.subsets[idx] = _Subset(shape, idx)
            for link in sub.links:
                if link not in self.capacity_Bps:
                    raise ValueError(f"link {link!r} has no capacity in the network")
                holders = self._on_link.setdefault(link, [])
                for other in holders:
                    if other.overlaps is not None:
                        other.overlaps.add(sub)
                holders.append(sub)
        return sub

    def _overlaps(self, sub: _Subset) -> set[_Subset]:
        if sub.overlaps is None:
            sub.overlaps = {o for link in sub.links for o in self._on_link[link]}
        return sub.overlaps

    def _start(self, shape: _Shape, repeat: int, done: simpy.Event) -> None:
        now = self.env.now
        step = _Step(len(shape.links_of), done)
        seeds = []
        for idx in shape.starts:
            size = shape.sizes[idx[0]] * repeat
            c = _Cohort(self._subset(shape, idx), size, size, now, step)
            self._attach(c, now)
            seeds.append(c.sub)
        self.flows_started += len(shape.links_of)
        self._reshare(seeds)

    def _attach(self, c: _Cohort, now: float) -> None:
        sub = c.sub
        if not sub.cohorts:
            sub.since = now
            self._live.add(sub)
        sub.cohorts[c] = None

    def _detach(self, c: _Cohort, now: float) -> None:
        c.live = False
        sub = c.sub
        del sub.cohorts[c]
        if not sub.cohorts:
            self._live.discard(sub)
            sub.spans.append((sub.since, now))

    def _component(self, seeds: list[_Subset]) -> list[_Cohort]:
        """The live cohorts connected through shared links to the ``seeds`` subsets (live or just
        ended), ordered by subset key."""
        live = self._live
        comp: dict[_Subset, None] = {}
        for s in seeds:
            comp.update(dict.fromkeys(self._overlaps(s) & live))
        todo = list(comp)
        while todo:
            for o in self._overlaps(todo.pop()) & live:
                if o not in comp:
                    comp[o] = None
                    todo.append(o)
        return [c for sub in sorted(comp, key=lambda sub: sub.key) for c in sub.cohorts]

    def _component_rates(self, comp: list[_Cohort], key: tuple) -> list[float]:
        """Max-min rates of the component's flows, cohort after cohort (cached by its subsets)."""
        rates = self._rates.get(key) if self.cache_rates else None
        if rates is None:
            links_of: list[tuple] = []
            weights: list[float] = []
            for c in comp:
                s = c.sub.shape
                links_of.extend(s.links_of[i] for i in c.sub.idx)
                weights.extend(s.weights[i] for i in c.sub.idx)
            rates = max_min_rates(links_of, weights, self.capacity_Bps)
            if self.cache_rates:
                self._rates[key] = rates
        return rates

    def _reshare(self, seeds: list[_Subset]) -> None:
        """Re-share max-min the flows connected (through shared links) to the ``seeds``."""
        comp = self._component(seeds)
        if not comp:
            return
        now = self.env.now
        key = tuple(c.sub.key for c in comp)
        rates = self._component_rates(comp, key)
        pos = 0
        heap, count = self._heap, self._count
        for k, c in enumerate(comp):
            n = len(c.sub.idx)
            mine = rates[pos:pos + n]
            pos += n
            left = max(c.left - c.rate * (now - c.t), 0.0)
            parts = [c] if mine.count(mine[0]) == n else self._split(c, (key, k), mine, left, now)
            for part in parts:
                rate = mine[0] if part is c else part.rate
                part.left, part.t, part.rate = left, now, rate
                part.finish = now + left / rate
                heapq.heappush(heap, (part.finish, next(count), part))
        self._arm()

    def _split(self, c: _Cohort, where: tuple, mine: list[float], left: float, now: float) -> list[_Cohort]:
        """Replace cohort ``c`` by one cohort per distinct rate of its flows; ``where`` (component
        key, position) determines the rates, hence the parts, which are cached under it."""
        plan = self._splits.get(where) if self.cache_rates else None
        if plan is None:
            by_rate: dict[float, list[int]] = {}
            for i, r in zip(c.sub.idx, mine):
                by_rate.setdefault(r, []).append(i)
            plan = [(self._subset(c.sub.shape, tuple(idx)), r) for r, idx in by_rate.items()]
            if self.cache_rates:
                self._splits[where] = plan
        self._detach(c, now)
        parts = []
        for sub, r in plan:
            part = _Cohort(sub, c.size, left, now, c.step)
            part.rate = r
            self._attach(part, now)
            parts.append(part)
        return parts

    def _arm(self) -> None:
        heap = self._heap
        while heap and (not heap[0][2].live or heap[0][0] != heap[0][2].finish):
            heapq.heappop(heap)
        if not heap or heap[0][0] >= self._timer_at:
            return
        self._timer_at = heap[0][0]
        self._token += 1
        token = self._token
        timer = self.env.timeout(max(self._timer_at - self.env.now, 0.0))
        timer.callbacks.append(lambda _ev: self._fire(token))

    def _fire(self, token: int) -> None:
        if token != self._token:
            return
        self._timer_at = float("inf")
        now = self.env.now
        limit = now + REL_EPS * max(now, 1e-9)
        heap = self._heap
        ended: list[_Subset] = []
        while heap and heap[0][0] <= limit:
            finish, _, c = heapq.heappop(heap)
            if not c.live or finish != c.finish:
                continue
            self._detach(c, now)
            c.sub.sent += c.size
            ended.append(c.sub)
            c.step.pending -= len(c.sub.idx)
            if c.step.pending == 0:
                c.step.done.succeed()
        self._reshare(ended)
        self._arm()

    def link_stats(self) -> dict:
        """LinkId -> (bytes_sent, busy_s): bytes of finished flows (x weight) and the time the
        link carried at least one flow, up to now."""
        now = self.env.now
        out = {}
        for link, subs in self._on_link.items():
            spans = [span for sub in subs for span in sub.spans]
            spans += [(sub.since, now) for sub in subs if sub.cohorts]
            out[link] = (sum(sub.sent * sub.weight_on[link] for sub in subs), _busy_s(spans))
        return out


def simulate_plan(plan: CommPlan, capacity_Bps: Mapping) -> float:
    """Seconds ``plan`` takes alone, run through a FlowNetwork."""
    env = simpy.Environment()
    net = FlowNetwork(env, capacity_Bps)
    env.process(net.run(plan))
    env.run()
    return env.now
