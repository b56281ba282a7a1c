"""One Trace type for simulated and measured runs, with Chrome/Perfetto trace JSON in and out.

A Trace is a flat list of timed events on (rank, stream) lanes; the simulator's engine and the
profiler-trace importer both produce it, so every metric and plot applies to both.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from functools import cached_property, partial
from itertools import chain
from operator import itemgetter
from pathlib import Path
from typing import Any, Iterable, NamedTuple, Sequence

import numpy as np

from .units import S_TO_US


COMPUTE_STREAM = "compute"  # the stream whose idle time is the pipeline bubble

# Optional per-event fields written as Chrome-trace args, with the defaults that are omitted.
_ARG_DEFAULTS: dict[str, Any] = {"stage": -1, "microbatch": -1, "chunk": -1, "phase": "", "layer": -1,
                 "flops": 0.0, "mem_delta_bytes": 0.0}
# otherData key holding source, rank labels and metadata as one JSON string, so that reading our
# own file back restores their types (Perfetto shows otherData values as plain strings).
_EXACT_KEY = "simulator.trace"
# Timestamps are written rounded to 1 ns (3 decimals of a microsecond): exact enough for any
# kernel and keeps 200k-event files small.
_US_DECIMALS = 3


class TraceEvent(NamedTuple):
    """One timed task on a (rank, stream) lane. A NamedTuple rather than a frozen dataclass: a
    simulation creates hundreds of thousands of them and tuple construction is ~5x cheaper."""

    name: str
    category: str  # a tasks.CATEGORIES entry for simulated runs; kernel class for measured ones
    rank: int
    stream: str
    start_s: float
    end_s: float
    stage: int = -1
    microbatch: int = -1
    chunk: int = -1
    phase: str = ""
    layer: int = -1
    flops: float = 0.0
    mem_delta_bytes: float = 0.0

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class Trace:
    events: tuple[TraceEvent, ...]
    source: str = "simulated"  # "simulated" | "measured"
    rank_labels: dict = field(default_factory=dict)  # rank -> label ("stage 3 (rank 24)")
    metadata: dict = field(default_factory=dict)

    @cached_property
    def start_s(self) -> float:
        return min((e.start_s for e in self.events), default=0.0)

    @cached_property
    def end_s(self) -> float:
        return max((e.end_s for e in self.events), default=0.0)

    @cached_property
    def by_rank(self) -> dict[int, list[TraceEvent]]:
        """Events of each rank, in trace order (computed once: views and metrics ask per rank)."""
        out: dict[int, list[TraceEvent]] = {}
        for e in self.events:
            out.setdefault(e.rank, []).append(e)
        return out

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def ranks(self) -> list[int]:
        return sorted(self.by_rank)

    def streams(self) -> list[str]:
        """Stream names, "compute" first, then alphabetical (the lane order of every view)."""
        return sorted({e.stream for e in self.events}, key=lambda s: (s != COMPUTE_STREAM, s))

    def label(self, rank: int) -> str:
        return str(self.rank_labels.get(rank, f"rank {rank}"))

    def on(self, rank: int, stream: str | None = None) -> list[TraceEvent]:
        return [e for e in self.by_rank.get(rank, ()) if stream is None or e.stream == stream]

    def memory_events(self, rank: int) -> list[TraceEvent]:
        """The events of ``rank`` that allocate or free memory (mem_delta_bytes != 0), in trace order:
        all a memory timeline reads."""
        return [e for e in self.by_rank.get(rank, ()) if e.mem_delta_bytes]

    def columns(self, rank: int) -> tuple[np.ndarray, np.ndarray, list[str], list[str]]:
        """``on(rank)`` as columns: start and end seconds, stream, category."""
        events = self.on(rank)
        return (np.array([e.start_s for e in events], dtype=float), np.array([e.end_s for e in events], dtype=float),
                [e.stream for e in events], [e.category for e in events])

    def memory_columns(self, rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
        """``memory_events(rank)`` as columns: start and end seconds, mem_delta_bytes, phase."""
        events = self.memory_events(rank)
        return (np.array([e.start_s for e in events], dtype=float), np.array([e.end_s for e in events], dtype=float),
                np.array([e.mem_delta_bytes for e in events], dtype=float), [e.phase for e in events])

    def busy_s(self, rank: int) -> float:
        """Seconds during which at least one of ``rank``'s streams is busy (the union of its events)."""
        events = self.by_rank.get(rank, ())
        return union_length_s([e.start_s for e in events], [e.end_s for e in events])

    def last_end_by_rank(self) -> dict[int, float]:
        """rank -> the latest end of its events, ranks in order of first appearance."""
        last: dict[int, float] = {}
        for e in self.events:
            if e.end_s > last.get(e.rank, float("-inf")):
                last[e.rank] = e.end_s
        return last

    def total_flops(self) -> float:
        return sum(e.flops for e in self.events)


class ColumnTrace(Trace):
    """A simulated Trace held as columns (the engine's task tuples and start/end lists); the
    TraceEvents are made on first use of ``events``, all at once in C loops (``zip``/``map``),
    equal to those built one by one. The few answers metrics need come from the columns: with
    ``lanes`` (the task graph's (rank, stream) -> task ids in program order, along which end times
    never decrease) a rank's last end and its events are found without making the others'."""

    _columns: tuple[Sequence[tuple], Sequence[float], Sequence[float], Sequence[float]]
    _lanes: dict

    def __init__(self, tasks: Sequence[tuple], start_s: Sequence[float], end_s: Sequence[float],
                 flops: Sequence[float], source: str = "simulated", rank_labels: dict | None = None,
                 metadata: dict | None = None, lanes: dict | None = None) -> None:
        for name, value in (("source", source), ("rank_labels", dict(rank_labels or {})),
                            ("metadata", dict(metadata or {})), ("_columns", (tasks, start_s, end_s, flops)),
                            ("_lanes", lanes or {})):
            object.__setattr__(self, name, value)

    @cached_property
    def events(self) -> tuple[TraceEvent, ...]:  # type: ignore[override]
        tasks, start, end, flops = self._columns
        return tuple(_events(tasks, start, end, flops))

    def _make(self, ids: Sequence[int]) -> list[TraceEvent]:
        """The events of tasks ``ids``, in that order."""
        tasks, start, end, flops = self._columns
        return _events(list(map(tasks.__getitem__, ids)), *(list(map(c.__getitem__, ids)) for c in (start, end, flops)))

    @cached_property
    def start_s(self) -> float:  # min() of the column, from the array the metrics read anyway
        start = self._arrays[0]
        return float(start.min()) if len(start) else 0.0

    @cached_property
    def end_s(self) -> float:
        end = self._arrays[1]
        return float(end.max()) if len(end) else 0.0

    def on(self, rank: int, stream: str | None = None) -> list[TraceEvent]:
        if not self._lanes or "events" in self.__dict__:
            return super().on(rank, stream)
        return self._make(self._ids(rank, stream))

    def memory_events(self, rank: int) -> list[TraceEvent]:
        if not self._lanes or "events" in self.__dict__:
            return super().memory_events(rank)
        return self._make(self._memory_ids(rank)[0].tolist())

    def columns(self, rank: int) -> tuple[np.ndarray, np.ndarray, list[str], list[str]]:
        if not self._lanes or "events" in self.__dict__:
            return super().columns(rank)
        ids = self._rank_ids.get(rank, np.zeros(0, np.int64))
        start, end = self._arrays
        rows = list(map(self._columns[0].__getitem__, ids.tolist()))
        return start[ids], end[ids], list(map(itemgetter(4), rows)), list(map(itemgetter(5), rows))  # stream, category

    def memory_columns(self, rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
        if not self._lanes or "events" in self.__dict__:
            return super().memory_columns(rank)
        ids, delta = self._memory_ids(rank)
        start, end = self._arrays
        tasks = self._columns[0]
        return start[ids], end[ids], delta, list(map(itemgetter(12), map(tasks.__getitem__, ids.tolist())))  # phase

    def _memory_ids(self, rank: int) -> tuple[np.ndarray, np.ndarray]:
        """Ids (trace order) and mem_delta_bytes of ``rank``'s tasks that allocate or free."""
        ids = self._rank_ids.get(rank, np.zeros(0, np.int64))
        delta = self._mem_deltas[ids]
        keep = delta != 0.0
        return ids[keep], delta[keep]

    @cached_property
    def _mem_deltas(self) -> np.ndarray:
        """Every task's mem_delta_bytes (the memory report asks for every rank's)."""
        tasks = self._columns[0]
        return np.fromiter(map(itemgetter(14), tasks), float, len(tasks))

    def _ids(self, rank: int, stream: str | None) -> list[int]:
        """Task ids of ``rank`` (on ``stream`` only, if given) in trace order, from the lanes."""
        if stream is None:
            return self._rank_ids.get(rank, np.zeros(0, np.int64)).tolist()
        lanes = [ids for s, ids in self._lanes_of_rank.get(rank, ()) if s == stream]
        return sorted(chain.from_iterable(lanes))

    @cached_property
    def _rank_ids(self) -> dict[int, np.ndarray]:
        """rank -> the ids of all its tasks, sorted (trace order): asked by every per-rank question."""
        return {rank: np.sort(np.concatenate([np.fromiter(ids, np.int64, len(ids)) for _, ids in lanes]))
                for rank, lanes in self._lanes_of_rank.items()}

    @cached_property
    def _lanes_of_rank(self) -> dict[int, list[tuple[str, Sequence[int]]]]:
        """rank -> its (stream, task ids) lanes: one pass over the lanes for every per-rank question."""
        out: dict[int, list[tuple[str, Sequence[int]]]] = {}
        for (rank, stream), ids in self._lanes.items():
            out.setdefault(rank, []).append((stream, ids))
        return out

    def last_end_by_rank(self) -> dict[int, float]:
        tasks, _, end, _ = self._columns
        if self._lanes:  # each lane's last task ends last; ranks by their first task
            first: dict[int, int] = {}
            last: dict[int, float] = {}
            for (rank, _stream), ids in self._lanes.items():
                if ids:
                    first[rank] = min(first.get(rank, ids[0]), ids[0])
                    last[rank] = max(last.get(rank, end[ids[-1]]), end[ids[-1]])
            return {r: last[r] for r in sorted(first, key=first.__getitem__)}
        last = {}
        for rank, e in zip(map(itemgetter(3), tasks), end):
            if e > last.get(rank, float("-inf")):
                last[rank] = e
        return last

    def total_flops(self) -> float:
        return sum(self._columns[3])

    def busy_s(self, rank: int) -> float:
        if not self._lanes:
            return super().busy_s(rank)
        start, end = self._arrays
        ids = self._rank_ids.get(rank, np.zeros(0, np.int64))
        return union_length_s(start[ids], end[ids])

    @cached_property
    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        start, end = self._columns[1], self._columns[2]
        return np.fromiter(start, float, len(start)), np.fromiter(end, float, len(end))


def union_length_s(start_s, end_s) -> float:
    """Length of the union of the intervals [start_s[i], end_s[i]] (arrays or sequences)."""
    start_s, end_s = np.asarray(start_s, dtype=float), np.asarray(end_s, dtype=float)
    if not start_s.size:
        return 0.0
    order = np.argsort(start_s, kind="stable")
    a, b = start_s[order], end_s[order]
    reach = np.concatenate(([-np.inf], np.maximum.accumulate(b)[:-1]))
    return float(np.clip(b - np.maximum(a, reach), 0.0, None).sum())


def _events(tasks: Sequence[tuple], start: Iterable[float], end: Iterable[float],
            flops: Iterable[float]) -> list[TraceEvent]:
    """TraceEvents of ``tasks`` (tasks.Task tuples) with their times and FLOPs, made by C loops
    (one pass over the tasks per field, no intermediate lists)."""
    # tasks.Task fields: name 1, rank 3, stream 4, category 5, stage 9, microbatch 10, chunk 11,
    # phase 12, layer 13, mem_delta_bytes 14
    col = [map(itemgetter(k), tasks) for k in (1, 5, 3, 4, 9, 10, 11, 12, 13, 14)]
    rows = zip(*col[:4], start, end, *col[4:9], flops, col[9])
    return list(map(partial(tuple.__new__, TraceEvent), rows))  # type: ignore[arg-type]


def to_chrome_json(trace: Trace) -> dict:
    """The trace in the Trace Event Format (JSON object form) that Perfetto and chrome://tracing load.

    One process per rank (pid = rank, named by its rank label), one thread per stream ("compute"
    sorted first), one complete ("X") event per TraceEvent with ts/dur in microseconds. Thread ids
    are unique over the whole file and start at 1: Perfetto names threads by tid alone and treats
    tid 0 as the idle thread (Trace Event Format spec, "Metadata Events"; Perfetto FAQ on JSON).
    """
    streams = trace.streams()
    stream_pos = {s: i for i, s in enumerate(streams)}
    lanes = sorted({(e.rank, e.stream) for e in trace.events},
                   key=lambda k: (k[0], stream_pos[k[1]]))
    # displayTimeUnit goes first: Perfetto only honours it near the start of the file.
    out: dict = {"displayTimeUnit": "ms", "traceEvents": [], "otherData": _other_data(trace)}
    events = out["traceEvents"]
    tid_of: dict[tuple[int, str], int] = {}
    named: set[int] = set()
    for rank, stream in lanes:
        tid = rank * len(streams) + stream_pos[stream] + 1
        if rank not in named:
            named.add(rank)
            events.append({"name": "process_name", "ph": "M", "pid": rank, "tid": tid,
                           "args": {"name": trace.label(rank)}})
            events.append({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": tid,
                           "args": {"sort_index": rank}})
        tid_of[(rank, stream)] = tid
        events.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid,
                       "args": {"name": stream}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": rank, "tid": tid,
                       "args": {"sort_index": stream_pos[stream]}})
    for e in trace.events:
        ts_us = round(e.start_s * S_TO_US, _US_DECIMALS)
        # dur from the rounded end, so that ts + dur lands within 1 ns of end_s.
        dur_us = round(round(e.end_s * S_TO_US, _US_DECIMALS) - ts_us, _US_DECIMALS)
        ev = {"name": e.name, "cat": e.category, "ph": "X", "ts": ts_us, "dur": dur_us,
              "pid": e.rank, "tid": tid_of[(e.rank, e.stream)]}
        args = {k: getattr(e, k) for k, d in _ARG_DEFAULTS.items() if getattr(e, k) != d}
        if args:
            ev["args"] = args
        events.append(ev)
    return out


def write_chrome_trace(trace: Trace, path) -> Path:
    """Write ``to_chrome_json(trace)``; gzip-compressed when the name ends with ``.gz``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # One dumps + one write: json.dump streams tiny chunks and is ~3x slower on 200k events.
    data = json.dumps(to_chrome_json(trace), separators=(",", ":")).encode("utf-8")
    if path.name.endswith(".gz"):
        data = gzip.compress(data, compresslevel=6)  # zlib's default speed/size trade-off
    path.write_bytes(data)
    return path


def read_chrome_trace(path) -> Trace:
    """Read a file written by ``write_chrome_trace`` back into a Trace (times exact to 1 ns).

    Only complete ("X") events become TraceEvents; the stream of an event is its thread's name.
    Profiler (Kineto) traces are imported by ``calibration/``, not here.
    """
    path = Path(path)
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        try:
            doc = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not a JSON trace ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise ValueError(f"{path}: no 'traceEvents' list; not a Chrome trace written by this tool")
    names: dict[tuple[int, int], str] = {}
    labels: dict[int, str] = {}
    for ev in doc["traceEvents"]:
        if ev.get("ph") == "M" and ev.get("name") == "thread_name":
            names[(ev["pid"], ev["tid"])] = ev["args"]["name"]
        elif ev.get("ph") == "M" and ev.get("name") == "process_name":
            labels[ev["pid"]] = ev["args"]["name"]
    events = []
    for ev in doc["traceEvents"]:
        if ev.get("ph") != "X":
            continue
        ts_us, dur_us = float(ev["ts"]), float(ev.get("dur", 0.0))
        args = ev.get("args", {})
        events.append(TraceEvent(
            name=ev.get("name", ""), category=ev.get("cat", ""), rank=int(ev["pid"]),
            stream=names.get((ev["pid"], ev["tid"]), f"tid {ev['tid']}"),
            start_s=ts_us / S_TO_US, end_s=(ts_us + dur_us) / S_TO_US,
            **{k: type(d)(args[k]) for k, d in _ARG_DEFAULTS.items() if k in args}))
    other = doc.get("otherData", {})
    if _EXACT_KEY in other:
        exact = json.loads(other[_EXACT_KEY])
        return Trace(tuple(events), source=exact["source"],
                     rank_labels={int(r): v for r, v in exact["rank_labels"].items()},
                     metadata=exact["metadata"])
    return Trace(tuple(events), rank_labels=labels,
                 metadata={k: v for k, v in other.items()})


def _other_data(trace: Trace) -> dict:
    """Metadata as strings for viewers, plus one exact JSON copy for ``read_chrome_trace``."""
    other = {str(k): v if isinstance(v, str) else json.dumps(v, default=str)
             for k, v in trace.metadata.items()}
    other[_EXACT_KEY] = json.dumps({"source": trace.source,
                                    "rank_labels": {str(r): v for r, v in trace.rank_labels.items()},
                                    "metadata": trace.metadata}, default=str)
    return other
