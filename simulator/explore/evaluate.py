"""Parallel evaluation of scenarios for validate, sweep and search: a process pool on one machine
(or inline with one job), or a Ray cluster (the optional ``cluster`` extra); identical scenarios are
simulated once per run; rows stream to a CSV that stays valid if the run is interrupted.
"""

from __future__ import annotations

import csv
import io
import os
from collections import deque
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import replace
from pathlib import Path

from ..analysis.metrics import BREAKDOWN_KEYS
from ..analysis.memory import BREAKDOWN_KEYS as MEMORY_KEYS
from ..hardware.clusters import ClusterSpec
from ..hardware.topology import Topology, build_topology
from ..pipeline import simulate_metrics
from ..scenario import Scenario

METRIC_COLUMNS = ("iteration_time_s", "tokens_per_s", "mfu", "hfu", "model_tflops_per_gpu",
                  "hardware_tflops_per_gpu", "bubble_fraction")
BREAKDOWN_COLUMNS = tuple(f"time_{k}_s" for k in BREAKDOWN_KEYS)
MEMORY_COLUMNS = tuple(f"memory_{k}_bytes" for k in MEMORY_KEYS) + ("memory_capacity_bytes", "fits_in_memory")
RESULT_COLUMNS = ("status", "reason") + METRIC_COLUMNS + BREAKDOWN_COLUMNS + MEMORY_COLUMNS
MAX_LOCAL_JOBS = 256  # local worker processes: beyond any one machine's cores (--backend ray for more)


class _SameCluster:
    """The topology of the last scenario a process simulated, reused while the cluster stays the
    same: the plans of one search share it, and with it the collective plans and times memoised on
    it (``cost/collectives``). One per process (workers are separate processes)."""

    cluster: ClusterSpec | None = None
    topology: Topology | None = None

    @classmethod
    def topology_for(cls, cluster: ClusterSpec) -> Topology:
        if cls.topology is None or cls.cluster != cluster:
            cls.cluster, cls.topology = cluster, build_topology(cluster)
        return cls.topology


def evaluate_scenario(scn: Scenario) -> dict:
    """Simulate one scenario (in a worker): {"status": "ok", "metrics": ...} or {"status": "failed", "reason"}."""
    try:
        metrics = simulate_metrics(scn, topology=_SameCluster.topology_for(scn.cluster))
    except (ValueError, RuntimeError) as exc:  # a plan the lowering or engine rejects
        return {"status": "failed", "reason": (str(exc).splitlines() or [type(exc).__name__])[0]}
    return {"status": "ok", "reason": "", "metrics": metrics}


def scenario_key(scn: Scenario) -> str:
    """Two scenarios with the same key simulate identically (the name and source are labels only)."""
    return repr(replace(scn, name="", source=""))


def flatten(result: dict) -> dict:
    """One CSV row's result columns from ``evaluate_scenario``'s answer."""
    row = dict.fromkeys(RESULT_COLUMNS, "")
    row["status"], row["reason"] = result["status"], result.get("reason", "")
    m = result.get("metrics")
    if m:
        row.update({k: m[k] for k in METRIC_COLUMNS})
        row.update({f"time_{k}_s": m["time_breakdown_s"].get(k, 0.0) for k in BREAKDOWN_KEYS})
        row.update({f"memory_{k}_bytes": m["memory_bytes"].get(k, 0.0) for k in MEMORY_KEYS})
        row["memory_capacity_bytes"] = m["memory_capacity_bytes"]
        row["fits_in_memory"] = m["fits_in_memory"]
    return row


def default_jobs() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class Evaluator:
    """Submit scenarios under a tag, collect (tag, result) as they finish; a scenario already
    simulated (or in flight) in this run is not simulated again."""

    def __init__(self, jobs: int = 0, backend: str = "local", address: str | None = None) -> None:
        if backend not in ("local", "ray"):
            raise ValueError(f"--backend must be 'local' or 'ray', got {backend!r}")
        if jobs < 0:
            raise ValueError(f"--jobs must be >= 0 (0 = all cores), got {jobs}")
        if backend == "local" and jobs > MAX_LOCAL_JOBS:  # one process each on this machine
            raise ValueError(f"--jobs {jobs} exceeds {MAX_LOCAL_JOBS} local worker processes (this machine has "
                             f"{os.cpu_count()} cores); use --backend ray for a cluster")
        self.jobs = jobs or default_jobs()
        self.backend = backend
        self.cache: dict[str, dict] = {}
        self.cache_hits = 0
        self.simulated = 0
        self._waiting: dict[str, list] = {}  # key -> tags waiting for it
        self._running: dict = {}  # future / ray ref / inline scenario -> key
        self._done: deque = deque()
        self._inline: dict[int, Scenario] = {}  # jobs = 1: handle -> scenario, simulated on collect
        self._handles = 0
        self._pool = None
        self._ray = None
        if backend == "ray":
            try:
                import ray
            except ImportError:
                raise ValueError("--backend ray needs the optional extra: "
                                 "pip install 'llm-cluster-simulator[cluster]'") from None
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
            self._ray = ray
            self._remote = ray.remote(evaluate_scenario)
        elif self.jobs > 1:
            self._pool = ProcessPoolExecutor(max_workers=self.jobs)

    @property
    def pending(self) -> int:
        return sum(len(v) for v in self._waiting.values()) + len(self._done)

    def submit(self, tag, scn: Scenario) -> None:
        key = scenario_key(scn)
        if key in self.cache:
            self.cache_hits += 1
            self._done.append((tag, self.cache[key]))
            return
        if key in self._waiting:
            self.cache_hits += 1
            self._waiting[key].append(tag)
            return
        self._waiting[key] = [tag]
        if self._ray is not None:
            self._running[self._remote.remote(scn)] = key
        elif self._pool is not None:
            self._running[self._pool.submit(evaluate_scenario, scn)] = key
        else:
            self._handles += 1
            self._inline[self._handles] = scn
            self._running[self._handles] = key

    def next_done(self):
        """(tag, result) of a finished evaluation; blocks until one is available."""
        if not self._done:
            if not self._running:
                raise ValueError("Evaluator.next_done: nothing was submitted")
            self._collect()
        return self._done.popleft()

    def _collect(self) -> None:
        if self._ray is not None:
            ready, _ = self._ray.wait(list(self._running), num_returns=1)
            finished = [(r, self._ray.get(r)) for r in ready]
        elif self._pool is not None:
            done, _ = wait(list(self._running), return_when=FIRST_COMPLETED)
            finished = [(f, f.result()) for f in done]
        else:
            handle = next(iter(self._running))
            finished = [(handle, evaluate_scenario(self._inline.pop(handle)))]
        for handle, result in finished:
            key = self._running.pop(handle)
            self.simulated += 1
            self.cache[key] = result
            for tag in self._waiting.pop(key):
                self._done.append((tag, result))

    def close(self, cancel: bool = False) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=not cancel, cancel_futures=cancel)
            self._pool = None
        if self._ray is not None and cancel:
            for ref in self._running:
                self._ray.cancel(ref, force=True)
        self._running.clear()
        self._inline.clear()

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(cancel=exc_type is not None)


class CsvStream:
    """A CSV written row by row: header first, each row one write + flush, so the file parses at
    every moment (an interrupted run keeps what it found)."""

    def __init__(self, path: str | Path, columns: tuple[str, ...]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.columns = tuple(columns)
        self._f = open(self.path, "w", newline="")
        self._emit(self.columns)
        self.rows = 0

    def _emit(self, values) -> None:
        buf = io.StringIO()
        csv.writer(buf).writerow(values)
        self._f.write(buf.getvalue())
        self._f.flush()

    def write(self, row: dict) -> None:
        self._emit([_cell(row.get(c, "")) for c in self.columns])
        self.rows += 1

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> CsvStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _cell(value):
    if isinstance(value, float):
        return repr(value)
    return value


def progress(total: int, desc: str):
    """A tqdm bar on stderr (silent when stderr is not a terminal)."""
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit="plan", disable=None, leave=False)
