"""FlowNetwork: links with shared bandwidth inside the simpy engine, max-min fair between flows.

A CommPlan's steps run in order: a step's latency elapses, then its flows start together and the
step ends when its last flow ends. Every flow holds all links of its route; whenever flows start
or end, the rates of the flows connected to them through shared links are re-shared max-min
(``cost/fairshare``), so concurrent TP/PP/DP/EP traffic slows each other exactly where it meets.
Links that can never bind (a non-blocking leaf's trunk to the spine: ``engine/bypass``) connect
nothing: transfers that meet only there are shared apart, with the same rates.

Flows are kept in cohorts (``engine/flowsets``): flows of one started step, connected through the
step's own links, with the same bytes left and the same rate, hence the same finish time (the
thousands of flows of one ring step over a large group are usually one cohort). A cohort is one
heap entry and one node of the link graph; it splits when a re-share gives its flows different
rates. The rates of a connected set of cohorts depend only on which flows they hold, so they are
cached under that key: a ring collective re-uses the rates of its first step for all later ones
(``cache_rates``).
"""

from __future__ import annotations

import heapq
import itertools
from operator import attrgetter
from typing import Any, Generator, Mapping

import simpy
from simpy.events import NORMAL

from ..cost.fairshare import REL_EPS
from ..cost.plan import CommPlan, CommStep
from .bypass import LinkBypass
from .events import Event, Fired, Pending, Timer, process
from .flowsets import Cohort, LinkIndex, Shape, Step, Subset, cohort_rates, link_totals


class FlowNetwork:
    """Shared links for the flows of concurrently running CommPlans (one per simpy environment).
    Per-link state is kept per flow set (``Subset``), so a cohort starts and ends in O(1) however
    many links it holds; ``link_stats`` adds the sets up per link when asked."""

    def __init__(self, env: simpy.Environment, capacity_Bps: Mapping, cache_rates: bool = True) -> None:
        self.env = env
        self.capacity_Bps = capacity_Bps
        self.cache_rates = cache_rates
        self._heap: list = []  # (finish time, tiebreak, cohort); stale entries skipped
        self._lazy: list = []  # the same for cohorts that end before their step, alone (``_start_alone``)
        self._count = itertools.count()
        self._timer_at = float("inf")
        self._token = 0
        self._shapes: dict[int, Shape] = {}  # id(CommStep) -> its shape (which holds the step)
        self._rates: dict[tuple, list] = {}  # subset keys of a component -> each cohort's rates
        self._splits: dict[tuple, list] = {}  # (component key, position) -> [(subset, rate)]
        self._subsets: list[Subset] = []  # every subset, for link_stats
        self._coupled_on: dict = {}  # link that can bind -> every subset that holds it
        self._live: set[Subset] = set()  # subsets with a live cohort
        self._bypass = LinkBypass(capacity_Bps)
        self._links = LinkIndex(capacity_Bps)
        self.flows_started = 0
        self._on_timer = self._fire  # one bound method for every timer

    def release(self) -> None:
        """Free the network's state at once, for a caller done with the step that will not ask
        ``link_stats``: it is held in reference cycles (a bound method of the network, subsets that
        overlap themselves, shapes and their subsets) that would otherwise wait for a full
        collection (a search worker ran one per plan, ~50 ms of its ~1.1 s)."""
        for sub in self._subsets:
            sub.overlaps = None
            sub.cohorts.clear()
        for shape in self._shapes.values():
            shape.subsets.clear()
            shape.start_subsets = None
        for held in (self._subsets, self._coupled_on, self._rates, self._splits, self._shapes, self._live,
                     self._heap, self._lazy):
            held.clear()
        del self._on_timer

    def run(self, plan: CommPlan, start_s: float | None = None) -> Generator[Event, Any, float]:
        """Execute ``plan``: ``elapsed_s = yield from net.run(plan)`` returns when its last step
        ends, with the seconds it took (compare with the uncontended time for contention).
        ``start_s``: when the transfer starts, if later than now (a stream's lazy clock); the wait
        and the first step's latency then elapse as one event, at the float time the two timeouts
        in turn would reach (one event fewer per transfer).

        A step repeated r times runs once with r x latency and r x bytes: exact alone, and
        the fluid limit of r identical steps under contention. A step with no bytes to move adds
        its latency to the next step's wait (the same float time as two waits in turn).
        ``plan.concurrent`` plans start with it and the run waits for them too."""
        env = self.env
        pending_s = None  # a time the process must reach before its next step starts
        now = env._now
        if start_s is not None and start_s > now:
            if plan.concurrent:
                yield env.timeout(start_s - now)
            else:
                pending_s = now + (start_s - now)  # where Timeout(start_s - now) lands
        begin = env._now if pending_s is None else pending_s
        others = [process(env, self.run(p)) for p in plan.concurrent] if plan.concurrent else None
        for step in plan.steps:
            latency = step.latency_s * step.repeat
            shape = self._shape(step)
            if not shape.starts:  # a latency-only step: its wait joins the next step's, one event
                if latency > 0:
                    pending_s = (env._now if pending_s is None else pending_s) + latency
                continue
            if pending_s is not None:
                yield self._at(pending_s + latency if latency > 0 else pending_s)
                pending_s = None
            elif latency > 0:
                yield self._at(env._now + latency)  # where Timeout(latency) lands
            done = Pending(env)
            self._start(shape, step.repeat, done)
            yield done
        if pending_s is not None:
            yield self._at(pending_s)
        if others:
            yield env.all_of(others)
        return env.now - begin

    def _at(self, t_s: float) -> Fired:
        """A timeout that fires at the absolute time ``t_s`` (>= now), scheduled as simpy's
        ``Environment.schedule`` would (its queue entry: time, priority, event id, event)."""
        env = self.env
        ev = Fired()
        heapq.heappush(env._queue, (t_s, NORMAL, next(env._eid), ev))  # type: ignore[misc]
        return ev

    def _shape(self, step: CommStep) -> Shape:
        shape = self._shapes.get(id(step))
        if shape is None or shape.step is not step:
            shape = Shape(step, len(self._shapes))
            if self._bypass.observe(shape.links_of):
                self._rebind()  # links left out so far can bind now: rebuild what depends on them
            shape.coupled_of = self._bypass.couplings(shape.links_of)
            self._shapes[id(step)] = shape
        return shape

    def _rebind(self) -> None:
        """Recompute every shape's and subset's links that can bind after some became able to
        (``LinkBypass.observe``); the rates cached so far were computed without them."""
        for shape in {**dict.fromkeys(self._shapes.values()), **{sub.shape: None for sub in self._subsets}}:
            shape.coupled_of = self._bypass.couplings(shape.links_of)
            shape.csr = None
        self._coupled_on = {}
        for sub in self._subsets:
            sub.links = frozenset().union(*[sub.shape.coupled_of[i] for i in sub.idx])
            sub.overlaps, sub.arrays = None, None
            for link in sub.links:
                self._coupled_on.setdefault(link, []).append(sub)
        self._rates.clear()
        self._splits.clear()

    def _subset(self, shape: Shape, idx: tuple[int, ...]) -> Subset:
        """The subset of ``shape`` holding flows ``idx``, indexed by link on first use."""
        sub = shape.subsets.get(idx)
        if sub is None:
            sub = shape.subsets[idx] = Subset(shape, idx)
            self._subsets.append(sub)
            on = self._coupled_on
            holders = [on[link] if link in on else on.setdefault(link, []) for link in sub.links]
            near: set[Subset] = set().union(*holders)  # the subsets sharing a link, each once
            for other in near:
                if other.overlaps is not None:
                    other.overlaps.add(sub)
            for h in holders:
                h.append(sub)
            near.add(sub)
            sub.overlaps = near  # what _overlaps would gather: the holders of its links, itself too
        return sub

    def _overlaps(self, sub: Subset) -> set[Subset]:
        if sub.overlaps is None:
            sub.overlaps = {o for link in sub.links for o in self._coupled_on[link]}
        return sub.overlaps

    def _start(self, shape: Shape, repeat: int, done: Pending) -> None:
        now = self.env._now
        if self._lazy and self._lazy[0][0] <= now:
            self._retire(now)
        step = Step(len(shape.links_of), done)
        seeds = shape.start_subsets
        if seeds is None:  # held by the shape: a tuple of thousands of indices is slow to hash
            seeds = shape.start_subsets = [self._subset(shape, idx) for idx in shape.starts]
        self.flows_started += len(shape.links_of)
        if len(seeds) == 1 and self._start_alone(seeds[0], shape.sizes[seeds[0].idx[0]] * repeat, step, now):
            return
        for sub in seeds:
            size = shape.sizes[sub.idx[0]] * repeat
            self._attach(Cohort(sub, size, size, now, step), now)
        self._reshare(seeds)

    def _start_alone(self, seed: Subset, size: float, step: Step, now: float) -> bool:
        """Start one cohort of ``size`` bytes on ``seed`` if nothing live shares its links and its
        rates (and split) alone are cached: its parts get the rates, bytes and finish times the
        general path (attach, ``_reshare``, ``_split``) would give them, without the cohort that
        the split replaces at once. False: nothing done, take the general path."""
        if seed.cohorts or not self._live.isdisjoint(self._overlaps(seed)):
            return False
        key = (seed.key,)
        rates = self._rates.get(key) if self.cache_rates else None
        if rates is None:
            return False
        mine = rates[0]
        plan = [(seed, mine)] if mine.__class__ is float else self._splits.get((key, 0))
        if plan is None:
            return False
        heap, count = self._heap, self._count
        parts = []
        last = now
        for sub, rate in plan:
            part = Cohort(sub, size, size, now, step)
            part.rate = rate
            self._attach(part, now)
            finish = part.finish = now + size / rate
            if finish > last:
                last = finish
            parts.append(part)
        for part in parts:
            if part.finish < last:  # ends before its step's last cohort, sharing with nothing
                part.lazy = True
                heapq.heappush(self._lazy, (part.finish, next(count), part))
            else:
                heapq.heappush(heap, (part.finish, next(count), part))
        self._arm()
        return True

    def _retire(self, until_s: float) -> None:
        """End the lazy cohorts due by ``until_s``, each at its finish: started alone by
        ``_start_alone``, ending before the last cohort of their step, and never since joined by
        another (``_reshare`` would have made them ordinary), their end changes no rate and needs no
        event of its own; they are retired before anything next looks at the links."""
        lazy = self._lazy
        while lazy and lazy[0][0] <= until_s:
            finish, _, c = heapq.heappop(lazy)
            if not c.live or not c.lazy or finish != c.finish:
                continue
            self._detach(c, finish)
            sub = c.sub
            sub.sent += c.size
            c.step.pending -= len(sub.idx)  # never 0: the step's last cohort is not lazy

    def _attach(self, c: Cohort, now: float) -> None:
        sub = c.sub
        if not sub.cohorts:
            sub.since = now
            self._live.add(sub)
        sub.cohorts[c] = None

    def _detach(self, c: Cohort, now: float) -> None:
        c.live = False
        sub = c.sub
        del sub.cohorts[c]
        if not sub.cohorts:
            self._live.discard(sub)
            sub.span_starts.append(sub.since)
            sub.span_ends.append(now)

    def _component(self, seeds: list[Subset]) -> list[Cohort]:
        """The live cohorts connected through shared links to the ``seeds`` subsets (live or just
        ended), ordered by subset key."""
        live = self._live
        comp: dict[Subset, None]
        if len(seeds) == 1:  # the usual case: the cohorts that ended at one time were one subset's
            seed = seeds[0]
            near = self._overlaps(seed)
            if live.isdisjoint(near):
                return []
            if seed.cohorts and len(live) == 1 or len(near) == 1:  # a transfer alone
                return list(seed.cohorts)
            comp = dict.fromkeys(near & live)
        else:
            comp = {}
            for s in seeds:
                comp.update(dict.fromkeys(self._overlaps(s) & live))
            if not comp:
                return []
        if len(comp) == 1 and len(seeds) == 1 and seeds[0] in comp:
            return list(seeds[0].cohorts)
        todo = list(comp)
        while todo:
            for o in self._overlaps(todo.pop()) & live:
                if o not in comp:
                    comp[o] = None
                    todo.append(o)
        if len(comp) == 1:
            return list(next(iter(comp)).cohorts)
        return [c for sub in sorted(comp, key=attrgetter("key")) for c in sub.cohorts]

    def _component_rates(self, comp: list[Cohort], key: tuple) -> list:
        """Max-min rates of the component's flows per cohort (``flowsets.cohort_rates``), cached by
        the component's subsets."""
        rates = self._rates.get(key) if self.cache_rates else None
        if rates is None:
            rates = cohort_rates(comp, self.capacity_Bps, self._links)
            if self.cache_rates:
                self._rates[key] = rates
        return rates

    def _reshare(self, seeds: list[Subset]) -> None:
        """Re-share max-min the flows connected (through shared links) to the ``seeds``."""
        comp = self._component(seeds)
        if not comp:
            return
        now = self.env._now
        key = tuple([c.sub.key for c in comp])
        rates = self._component_rates(comp, key)
        heap, count = self._heap, self._count
        for k, c in enumerate(comp):
            mine = rates[k]
            c.lazy = False  # joined by another: its end re-shares, on its own timer
            left = max(c.left - c.rate * (now - c.t), 0.0)
            if mine.__class__ is float:
                c.left, c.t, c.rate = left, now, mine
                c.finish = now + left / mine
                heapq.heappush(heap, (c.finish, next(count), c))
                continue
            for part in self._split(c, (key, k), mine, left, now):
                part.left, part.t = left, now
                part.finish = now + left / part.rate
                heapq.heappush(heap, (part.finish, next(count), part))
        self._arm()

    def _split(self, c: Cohort, where: tuple, mine: list[float], left: float, now: float) -> list[Cohort]:
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
            part = Cohort(sub, c.size, left, now, c.step)
            part.rate = r
            self._attach(part, now)
            parts.append(part)
        return parts

    def _arm(self) -> None:
        heap = self._heap
        while heap:  # drop the entries of cohorts that ended, split or were re-timed
            finish, _, c = heap[0]
            if c.live and finish == c.finish:
                break
            heapq.heappop(heap)
        else:
            return
        if finish >= self._timer_at:
            return
        self._timer_at = finish
        self._token += 1
        env = self.env
        now = env._now  # the queue entry env.timeout(max(timer_at - now, 0.0)) would make
        delay = finish - now
        heapq.heappush(env._queue, (now + (0.0 if 0.0 > delay else delay), NORMAL,  # type: ignore[misc]
                                    next(env._eid), Timer(self._token, self._on_timer)))

    def _fire(self, timer: Timer) -> None:
        if timer.token != self._token:  # a timer an earlier finish replaced
            return
        self._timer_at = float("inf")
        env = self.env
        now = env._now
        limit = now + REL_EPS * max(now, 1e-9)
        if self._lazy and self._lazy[0][0] <= limit:
            self._retire(limit)
        heap = self._heap
        ended: list[Subset] = []
        while heap and heap[0][0] <= limit:
            finish, _, c = heapq.heappop(heap)
            if not c.live or finish != c.finish:
                continue
            self._detach(c, now)
            sub = c.sub
            sub.sent += c.size
            ended.append(sub)
            step = c.step
            step.pending -= len(sub.idx)
            if step.pending == 0:
                step.done.succeed()
        self._reshare(ended)
        self._arm()

    def link_stats(self) -> dict:
        """LinkId -> (bytes_sent, busy_s) up to now (``flowsets.link_totals``)."""
        now = self.env.now
        self._retire(now)
        return link_totals(self._subsets, now)


def simulate_plan(plan: CommPlan, capacity_Bps: Mapping) -> float:
    """Seconds ``plan`` takes alone, run through a FlowNetwork."""
    env = simpy.Environment()
    net = FlowNetwork(env, capacity_Bps)
    process(env, net.run(plan))
    env.run()
    return env.now
