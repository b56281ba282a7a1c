"""Links that cannot limit any rate, so max-min sharing may leave them out (``engine/network``).

A link every flow enters from a set of links whose capacities add up to no more than its own (or
leaves into such a set) never carries more than its capacity: its load is at most the sum of what
those feeders carry. Dropping such a constraint leaves the max-min fair allocation unchanged (the
allocation without it is feasible with it, and the allocation is unique; Bertsekas & Gallager,
Data Networks, §6.5.2). The typical case is a non-blocking leaf's trunk to the spine: everything on
it comes from the leaf's NICs, whose rates add up to the trunk's. Left in, the trunk joins every
transfer that crosses the spine into one connected set that is re-shared as a whole at each start
and end; left out, transfers that meet only on such trunks are shared apart.

The feeders are the links seen next to the link in the routes that ran: the decision follows the
routes, so it is exact whatever names or graph the links come from. A link is free (left out) when
it never starts (resp. ends) a route, the capacities of the links seen before (resp. after) it add
up to no more than its own, and none of those feeders could be free itself (so no two links justify
each other). New routes can only take a link's freedom away, never give it back.
"""

from __future__ import annotations

import math
from itertools import filterfalse
from typing import Hashable, Mapping, Sequence

LinkId = Hashable


class LinkBypass:
    """The free links among those of the routes observed so far (see the module docstring)."""

    def __init__(self, capacity_Bps: Mapping) -> None:
        self.capacity_Bps = capacity_Bps
        # link -> the links seen just before (after) it; None in it when a route starts (ends) there
        self._before: dict[LinkId, set] = {}
        self._after: dict[LinkId, set] = {}
        self._binding: set[LinkId] = set()
        self._routes: dict[int, tuple] = {}  # id -> route observed (held, so that ids stay unique)
        self._coupled: dict[int, tuple] = {}  # id(route) -> its links that can bind
        self._ok_memo: dict[tuple, bool] = {}  # (link, side) -> _ok, until that side changes
        self.free: set[LinkId] = set()

    def observe(self, routes: Sequence[tuple]) -> set[LinkId]:
        """Record ``routes`` (tuples of links); returns the links that were free and now bind."""
        seen = self._routes
        pairs: set = set()  # (link before or None, link after or None) next to each other in a route
        for route in routes:
            if id(route) not in seen:
                seen[id(route)] = route
                pairs.update(zip((None,) + route, route + (None,)))
        changed: set = set()  # links with a new neighbour: only their status can change
        for a, b in pairs:
            if b is not None and self._add(b, 0, a):
                changed.add(b)
            if a is not None and self._add(a, 1, b):
                changed.add(a)
        lost = set()
        for link in changed - self._binding:
            if self._dominated(link, 0) or self._dominated(link, 1):
                self.free.add(link)
            else:
                self._binding.add(link)
                if link in self.free:
                    self.free.discard(link)
                    lost.add(link)
        if lost:
            self._coupled.clear()
        return lost

    def couplings(self, routes: Sequence[tuple]) -> list[tuple]:
        """The links of each route that can bind (never none: a route's first link is free only
        when the next one binds), remembered per route until a free link binds."""
        out = []
        coupled, free, seen = self._coupled, self.free, self._routes
        for route in routes:
            hit = coupled.get(id(route))
            if hit is None:
                hit = tuple(filterfalse(free.__contains__, route)) if free else route
                if seen.get(id(route)) is route:  # held here, so its id names it
                    coupled[id(route)] = hit
            out.append(hit)
        return out

    def _add(self, link: LinkId, after: int, neighbour: LinkId | None) -> bool:
        """Note ``neighbour`` before (``after`` 0) or after (1) ``link``; whether it is new there."""
        sides = self._after if after else self._before
        side = sides.get(link)
        if side is None:
            if link not in self.capacity_Bps:
                raise ValueError(f"link {link!r} has no capacity in the network")
            self._before[link], self._after[link] = set(), set()
            side = sides[link]
        if neighbour in side:
            return False
        side.add(neighbour)
        self._ok_memo.pop((link, after), None)
        return True

    def _ok(self, link: LinkId, after: int) -> bool:
        """Whether every flow on ``link`` enters (``after`` 0) or leaves (1) it through links of no
        more capacity in all (remembered until that side changes)."""
        hit = self._ok_memo.get((link, after))
        if hit is None:
            side = (self._after if after else self._before)[link]
            # fsum: n equal capacities add up to exactly n x one of them, as a trunk's is built
            hit = None not in side and math.fsum(self.capacity_Bps[n] for n in side) <= self.capacity_Bps[link]
            self._ok_memo[(link, after)] = hit
        return hit

    def _dominated(self, link: LinkId, after: int) -> bool:
        """Free on this side: its own condition holds and no feeder could be free itself."""
        if not self._ok(link, after):
            return False
        side = (self._after if after else self._before)[link]
        return not any(self._ok(n, 0) or self._ok(n, 1) for n in side)
