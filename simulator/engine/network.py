"""FlowNetwork: links with shared bandwidth inside the simpy engine, max-min fair between flows.

A CommPlan's steps run in order: a step's latency elapses, then its flows start together and the
step ends when its last flow ends. Every flow holds all links of its route; whenever flows start
or end, the rates of the flows connected to them through shared links are re-shared max-min
(``cost/fairshare``), so concurrent TP/PP/DP/EP traffic slows each other exactly where it meets.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any, Generator, Mapping

import simpy

from ..cost.fairshare import REL_EPS, max_min_rates
from ..cost.plan import CommPlan, Flow


class _Active:
    __slots__ = ("links", "weight", "size", "left", "rate", "t", "finish", "step", "live")

    def __init__(self, links: tuple, weight: float, size: float, step: "_Step", now: float):
        self.links, self.weight, self.size, self.step = links, weight, size, step
        self.left, self.rate, self.t, self.finish, self.live = size, 0.0, now, now, True


class _Step:
    __slots__ = ("pending", "done")

    def __init__(self, pending: int, done: simpy.Event):
        self.pending, self.done = pending, done


class FlowNetwork:
    """Shared links for the flows of concurrently running CommPlans (one per simpy environment)."""

    def __init__(self, env: simpy.Environment, capacity_Bps: Mapping) -> None:
        self.env = env
        self.capacity_Bps = capacity_Bps
        self._on: dict = {}  # link -> set of active flows
        self._heap: list = []  # (finish time, tiebreak, flow); stale entries skipped
        self._count = itertools.count()
        self._timer_at = float("inf")
        self._token = 0
        self._bytes: dict = {}
        self._busy: dict = {}
        self._busy_since: dict = {}
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
            flows = [f for f in step.flows if f.size_bytes > 0 and f.links]
            if flows:
                done = env.event()
                self._start(flows, step.repeat, done)
                yield done
        if others:
            yield env.all_of(others)
        return env.now - begin

    def _start(self, flows: list[Flow], repeat: int, done: simpy.Event) -> None:
        now = self.env.now
        step = _Step(len(flows), done)
        seeds = set()
        for f in flows:
            a = _Active(f.links, f.weight, f.size_bytes * repeat, step, now)
            for link in f.links:
                on = self._on.get(link)
                if on is None:
                    if link not in self.capacity_Bps:
                        raise ValueError(f"link {link!r} has no capacity in the network")
                    on = self._on[link] = set()
                if not on:
                    self._busy_since[link] = now
                on.add(a)
                seeds.add(link)
        self.flows_started += len(flows)
        self._reshare(seeds)

    def _reshare(self, seeds: set) -> None:
        """Re-share max-min the flows connected (through shared links) to the ``seeds`` links."""
        comp: list[_Active] = []
        seen_flows = set()
        seen = set(seeds)
        stack = list(seeds)
        while stack:
            for fl in self._on.get(stack.pop(), ()):
                if fl not in seen_flows:
                    seen_flows.add(fl)
                    comp.append(fl)
                    for link in fl.links:
                        if link not in seen:
                            seen.add(link)
                            stack.append(link)
        if not comp:
            return
        now = self.env.now
        rates = max_min_rates([fl.links for fl in comp], [fl.weight for fl in comp],
                              self.capacity_Bps)
        for fl, rate in zip(comp, rates):
            fl.left = max(fl.left - fl.rate * (now - fl.t), 0.0)
            fl.t = now
            fl.rate = rate
            fl.finish = now + fl.left / rate
            heapq.heappush(self._heap, (fl.finish, next(self._count), fl))
        self._arm()

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
        freed = set()
        while heap and heap[0][0] <= limit:
            finish, _, fl = heapq.heappop(heap)
            if not fl.live or finish != fl.finish:
                continue
            fl.live = False
            moved = fl.size * fl.weight
            for link in fl.links:
                on = self._on[link]
                on.discard(fl)
                self._bytes[link] = self._bytes.get(link, 0.0) + moved
                if not on:
                    self._busy[link] = self._busy.get(link, 0.0) + now - self._busy_since.pop(link)
                freed.add(link)
            fl.step.pending -= 1
            if fl.step.pending == 0:
                fl.step.done.succeed()
        self._reshare(freed)
        self._arm()

    def link_stats(self) -> dict:
        """LinkId -> (bytes_sent, busy_s): bytes of finished flows (x weight) and the time the
        link carried at least one flow, up to now."""
        now = self.env.now
        out = {}
        for link in set(self._bytes) | set(self._busy_since):
            busy = self._busy.get(link, 0.0)
            if link in self._busy_since:
                busy += now - self._busy_since[link]
            out[link] = (self._bytes.get(link, 0.0), busy)
        return out


def simulate_plan(plan: CommPlan, capacity_Bps: Mapping) -> float:
    """Seconds ``plan`` takes alone, run through a FlowNetwork."""
    env = simpy.Environment()
    net = FlowNetwork(env, capacity_Bps)
    env.process(net.run(plan))
    env.run()
    return env.now
