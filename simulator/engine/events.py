"""The engine's events: simpy's protocol with less per-event work, and the loop that processes them.

simpy's ``Environment.step`` pops ``(time, priority, event id, event)`` from the queue, sets the
event's ``callbacks`` to None, calls each callback with the event and raises a failed event's
exception if nothing defused it; a process waits on an event by appending its ``_resume`` to the
event's ``callbacks`` and reads ``_ok`` and ``_value`` when it resumes. Anything with those three
attributes is an event to both. The engine's hot events are made here with ``__slots__`` and class
defaults, and scheduled with the queue entry simpy would make (same time expression, priority and
next event id), so they are processed in exactly simpy's order (a step of GPT-3 175B or of
DeepSeek-V3 makes 10^5-10^6 of them). ``run`` is ``Environment.run()`` with ``step`` inlined.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from heapq import heappop, heappush
from typing import Any, Union

import simpy
from simpy.events import NORMAL, URGENT


class Fired:
    """An event already triggered (ok, value None) when scheduled: a timeout at an absolute time."""

    __slots__ = ("callbacks",)
    _ok = True
    _value = None

    def __init__(self) -> None:
        self.callbacks: list = []


class Pending:
    """An event triggered later by ``succeed``, as ``simpy.Event`` (a task's end, a step's flows);
    ``_ok`` is None until then."""

    __slots__ = ("env", "callbacks", "_ok", "_value")

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.callbacks: list = []
        self._ok: bool | None = None

    def succeed(self) -> None:
        """``simpy.Event.succeed()``: ok with value None, scheduled now."""
        if self._ok is not None:
            raise RuntimeError(f"{self!r} has already been triggered")
        self._ok, self._value = True, None
        env = self.env
        heappush(env._queue, (env._now + 0, NORMAL, next(env._eid), self))  # type: ignore[misc]


class Timer:
    """A timer of the flow network: calls ``fire(timer)`` when processed; its ``token`` tells the
    network whether a later arming has replaced it."""

    __slots__ = ("callbacks", "token")
    _ok = True
    _value = None

    def __init__(self, token: int, fire: Callable[[Timer], Any]) -> None:
        self.token = token
        self.callbacks: list = [fire]


Event = Union[simpy.Event, Fired, Pending, Timer]  # what an engine process yields


class Clocks:
    """Start and end time of every task (end None until it ran), and the events of the tasks some
    process waits on, created on the first wait and fired by ``finish``."""

    __slots__ = ("env", "start", "end", "waiters")

    def __init__(self, env: simpy.Environment, n: int) -> None:
        self.env = env
        self.start = [0.0] * n
        self.end: list[float | None] = [None] * n
        self.waiters: dict[int, Pending] = {}

    def finish(self, i: int, t_end: float) -> None:
        self.end[i] = t_end
        ev = self.waiters.pop(i, None)
        if ev is not None:
            ev.succeed()

    def event(self, i: int) -> Pending:
        """The event that fires when task i finishes (i has not finished yet)."""
        ev = self.waiters.get(i)
        if ev is None:
            ev = self.waiters[i] = Pending(self.env)
        return ev

    def first_of(self, ids: list[int]) -> Pending:
        """An event that fires when the first of tasks ``ids`` (none finished yet) finishes: what
        ``env.any_of`` gives, scheduled at the same point of the event queue, without a Condition's
        bookkeeping (the callbacks left on the later events find it triggered and do nothing)."""
        wake = Pending(self.env)

        def trigger(_ev: Pending) -> None:
            if wake._ok is None:
                wake.succeed()
        for i in ids:
            self.event(i).callbacks.append(trigger)
        return wake


def process(env: simpy.Environment, body: Generator[Event, Any, Any]) -> simpy.Process:
    """``env.process(body)`` for a body that yields the events here too (simpy's protocol)."""
    return env.process(body)  # type: ignore[arg-type]


class Runner:
    """A process body run as ``env.process`` runs it, for a process nothing waits on (a stream):
    started by an urgent event scheduled when it is made, as simpy's ``Initialize``, and resumed by
    the events it yields, which never fail; it ends without scheduling an event of its own (nothing
    would be called by it, and the other events keep their order). One bound method waits on every
    event, where ``Process._resume`` keeps the active process and a failure path per resume."""

    __slots__ = ("_send", "_resume")

    def __init__(self, env: simpy.Environment, body: Generator[Event, Any, Any]) -> None:
        self._send = body.send
        self._resume = self.resume
        start = Fired()
        start.callbacks.append(self._resume)
        heappush(env._queue, (env._now + 0, URGENT, next(env._eid), start))  # type: ignore[misc]

    def resume(self, event: Event) -> None:
        send = self._send
        try:
            nxt = send(event._value)
            while nxt.callbacks is None:  # already processed: its value at once, as simpy does
                nxt = send(nxt._value)
        except StopIteration:
            return
        nxt.callbacks.append(self._resume)


def run(env: simpy.Environment) -> None:
    """``env.run()``: process every event until the queue is empty, in the queue's order."""
    queue: list = env._queue
    while queue:
        env._now, _, _, event = heappop(queue)
        callbacks, event.callbacks = event.callbacks, None
        for callback in callbacks:
            callback(event)
        if not event._ok and not hasattr(event, "_defused"):
            exc = type(event._value)(*event._value.args)  # as Environment.step raises it
            exc.__cause__ = event._value
            raise exc
