"""Templates of repeated emission: a pass's or a layer's tasks built once per shape, stamped out with id arithmetic.

Identical layers of identical micro-batches emit identical task sequences that differ only in their
ids, their names' micro-batch prefix, their ``microbatch`` field and the tasks they wait for outside
(issue 20). ``Stamper.call`` runs an emitting function (one F/B/W pass of a virtual stage, or one
layer of it) the first time it meets a key (the function and its other arguments, the rank, the
chunk, the layer, the phase, the activation bytes pending on the rank and the pattern of the outside
dependencies: everything the emitted sequence depends on besides the micro-batch) and records what
it appended; later calls with that key append the same tasks again with shifted ids, the new name
prefix and micro-batch, and the new outside dependencies. The result is the graph the function
itself would have built, task for task (tests/test_stamp.py compares).

A recording is refused (the function then always runs itself) when the emitted tasks reach outside
what the key captures: a dependency on an earlier task that was not passed in, a task on another
rank, a name outside the prefix, or a release written onto a task emitted before the call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import repeat
from typing import Any

from ..tasks import Task
from .context import LowerCtx

_new = tuple.__new__
_UNSEEN = object()  # a key not met yet


@dataclass(frozen=True, slots=True)
class Template:
    """What one call appended, as columns over its tasks (in id order), so that a replay builds
    every task with C-level ``zip``/``map``. A dependency code is an offset from the call's first
    task (>= 0) or ~index into the call's outside dependencies (< 0); most tasks wait for exactly
    one task of the call (``single``), the others are listed in ``special``."""

    suffixes: tuple[str, ...]  # each name without the call's prefix
    kinds: tuple[str, ...]
    streams: tuple[str, ...]
    categories: tuple[str, ...]
    single: tuple[int, ...]  # offset of the one dependency (0 for tasks in ``special``)
    special: tuple[tuple[int, tuple[int, ...]], ...]  # (task offset, dependency codes), other shapes
    works: tuple
    comms: tuple
    phases: tuple[str, ...]
    layers: tuple[int, ...]
    mems: tuple[float, ...]
    groups: tuple[tuple[int, tuple[int, ...]], ...]  # (task offset, group) of barrier-numbered collectives
    lanes: tuple[tuple[str, tuple[int, ...]], ...]  # stream -> offsets of its tasks, in order
    shapes: tuple[int, ...]  # the recorded tasks' shapes (TaskGraph.shapes): their replays share them
    result: int | tuple[int, ...]  # the returned task (or tasks): offset (>= 0) or ~index of an outside dependency
    pending_after: float  # activation bytes the rank's next kernel allocates after the call
    last_kernel: int  # offset of the rank's latest activation kernel after the call; -1: unchanged


class Stamper:
    """Per lowering: the templates recorded so far, by key."""

    def __init__(self, ctx: LowerCtx) -> None:
        self.ctx = ctx
        self.templates: dict[tuple, Template | None] = {}

    def call(self, fn: Callable[..., Any], rank: int, deps: tuple, name: str, meta: dict, *args) -> Any:
        """``fn(ctx, rank, deps, name, meta, *args)``, from its template when one was recorded; ``fn``
        returns a task id or a tuple of them."""
        ctx = self.ctx
        ext = tuple([d for d in deps if d is not None]) if None in deps else deps
        pending = ctx._pending_alloc.get(rank, 0.0)
        key = (fn, rank, meta["chunk"], meta["phase"], meta["layer"], pending,
               tuple(map(ext.index, ext)), args)
        tpl = self.templates.get(key, _UNSEEN)
        if tpl is _UNSEEN:
            return self._record(key, fn, rank, deps, ext, name, meta, args)
        if tpl is None:
            return fn(ctx, rank, deps, name, meta, *args)
        return self._replay(tpl, rank, ext, name, meta["microbatch"], meta["chunk"])  # type: ignore[arg-type]

    def _record(self, key: tuple, fn: Callable[..., Any], rank: int, deps: tuple, ext: tuple, name: str,
                meta: dict, args: tuple) -> Any:
        ctx, tasks = self.ctx, self.ctx.builder._tasks
        base = len(tasks)
        before = ctx._last_kernel.get(rank)
        before_mem = tasks[before].mem_delta_bytes if before is not None else 0.0
        out = fn(ctx, rank, deps, name, meta, *args)
        after = ctx._last_kernel.get(rank)
        clean = before is None or tasks[before].mem_delta_bytes == before_mem
        outs = out if isinstance(out, tuple) else (out,)
        codes = [o - base if o is not None and o >= base else (~ext.index(o) if o in ext else None) for o in outs]
        result: int | tuple[int, ...] | None = None
        if None not in codes:
            result = tuple(c for c in codes if c is not None) if isinstance(out, tuple) else codes[0]
        tpl = _template(tasks[base:], base, ext, name, rank, meta, ctx.stage(rank)) if clean else None
        if tpl is None or result is None:
            self.templates[key] = None
            return out
        self.templates[key] = Template(**tpl, shapes=tuple(ctx.builder._shapes[base:]), result=result,
                                       pending_after=ctx._pending_alloc.get(rank, 0.0),
                                       last_kernel=after - base if after is not None and after >= base else -1)
        return out

    def _replay(self, tpl: Template, rank: int, ext: tuple, name: str, mb: int, chunk: int) -> Any:
        ctx = self.ctx
        b = ctx.builder
        base = len(b._tasks)
        ids = list(range(base, base + len(tpl.single)))  # one int object per id, shared by deps and lanes
        at = ids.__getitem__
        deps: list[tuple[int, ...]] = list(zip(map(at, tpl.single)))
        for k, codes in tpl.special:
            deps[k] = tuple([ids[o] if o >= 0 else ext[~o] for o in codes])
        syncs: Iterable[int] = repeat(-1)
        if tpl.groups:
            syncs = [-1] * len(deps)
            for k, group in tpl.groups:
                syncs[k] = ctx.sync_key(rank, group)
        b._tasks.extend(map(_new, repeat(Task), zip(
            ids, map(name.__add__, tpl.suffixes), tpl.kinds, repeat(rank), tpl.streams,
            tpl.categories, deps, tpl.works, tpl.comms, repeat(ctx.stage(rank)), repeat(mb), repeat(chunk),
            tpl.phases, tpl.layers, tpl.mems, syncs)))
        b._shapes.extend(tpl.shapes)
        streams = b._streams
        for stream, offsets in tpl.lanes:
            lane = streams.get((rank, stream))
            if lane is None:
                lane = streams[(rank, stream)] = []
            lane.extend(map(at, offsets))
        if tpl.pending_after:
            ctx._pending_alloc[rank] = tpl.pending_after
        else:
            ctx._pending_alloc.pop(rank, None)
        if tpl.last_kernel >= 0:
            ctx._last_kernel[rank] = base + tpl.last_kernel
        r = tpl.result
        if isinstance(r, int):
            return base + r if r >= 0 else ext[~r]
        return tuple([base + c if c >= 0 else ext[~c] for c in r])


def _template(new: list[Task], base: int, ext: tuple, name: str, rank: int, meta: dict,
              stage: int) -> dict | None:
    """The Template columns of the tasks ``new`` appended from id ``base``, or None when they depend
    on anything the key does not capture."""
    single: list[int] = []
    special: list[tuple[int, tuple[int, ...]]] = []
    groups: list[tuple[int, tuple[int, ...]]] = []
    lanes: dict[str, list[int]] = {}
    for k, t in enumerate(new):
        if (t.rank != rank or t.stage != stage or t.microbatch != meta["microbatch"] or t.chunk != meta["chunk"]
                or not t.name.startswith(name) or (t.sync_key >= 0 and t.comm is None)):
            return None
        codes = []
        for d in t.deps:
            if d >= base:
                codes.append(d - base)
            elif d in ext:
                codes.append(~ext.index(d))
            else:
                return None
        single.append(codes[0] if len(codes) == 1 and codes[0] >= 0 else 0)
        if len(codes) != 1 or codes[0] < 0:
            special.append((k, tuple(codes)))
        if t.sync_key >= 0 and t.comm is not None:
            groups.append((k, t.comm.group))
        lanes.setdefault(t.stream, []).append(k)
    cols = list(zip(*new)) if new else [()] * len(Task._fields)
    f = Task._fields.index
    return dict(suffixes=tuple(t.name[len(name):] for t in new), kinds=cols[f("kind")], streams=cols[f("stream")],
                categories=cols[f("category")], single=tuple(single), special=tuple(special), works=cols[f("work")],
                comms=cols[f("comm")], phases=cols[f("phase")], layers=cols[f("layer")], mems=cols[f("mem_delta_bytes")],
                groups=tuple(groups), lanes=tuple((s, tuple(o)) for s, o in lanes.items()))
