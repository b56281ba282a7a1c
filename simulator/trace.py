"""One Trace type for simulated and measured runs, with Chrome/Perfetto trace JSON in and out.

A Trace is a flat list of timed events on (rank, stream) lanes; the simulator's engine and the
profiler-trace importer both produce it, so every metric and plot applies to both.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TraceEvent:
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

    @property
    def start_s(self) -> float:
        return min((e.start_s for e in self.events), default=0.0)

    @property
    def end_s(self) -> float:
        return max((e.end_s for e in self.events), default=0.0)

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def ranks(self) -> list[int]:
        return sorted({e.rank for e in self.events})

    def on(self, rank: int, stream: str | None = None) -> list[TraceEvent]:
        return [e for e in self.events if e.rank == rank and (stream is None or e.stream == stream)]
