"""Goodput of a whole training run: a simpy simulation over days at step granularity.

A trainer process runs segments of steps (each step slowed by the slowest rank's straggler draw),
writes a checkpoint every ``interval_steps`` (synchronously, or a short snapshot followed by a
background drain that slows the steps it overlaps), and a failure process interrupts it at the
Poisson times of every failure cause. An interruption loses the steps since the last finished
checkpoint and costs detection, rescheduling (unless a hot spare is free), warm-up and the checkpoint
read; a planned one finishes the step, checkpoints, and restarts without loss. Every second of wall
time lands in one bucket of ``BREAKDOWN_KEYS``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import simpy

from ..reliability import CauseRate

BREAKDOWN_KEYS = ("compute", "slowdown", "checkpoint", "lost", "recovery", "unfinished")
STRAGGLER_BLOCK = 1 << 14  # straggler draws per refill of the step-time buffer
MAX_SEGMENT_STEPS = 1 << 14  # a long interval runs as several segments (bounded arrays), same timeline


@dataclass(frozen=True)
class GoodputConfig:
    """Everything the run needs, in seconds (built from a scenario by explore/goodput.py)."""

    step_s: float
    interval_steps: int
    checkpoint_write_s: float  # persisting a checkpoint (sync: the job waits for it)
    checkpoint_read_s: float
    causes: tuple[CauseRate, ...] = ()
    asynchronous: bool = False
    checkpoint_block_s: float = 0.0  # async: the pause to snapshot the state to host memory
    async_step_slowdown: float = 0.0
    detection_s: float = 0.0
    reschedule_s: float = 0.0
    warmup_s: float = 0.0
    hot_spares: int = 0
    spare_repair_s: float = 0.0  # 0: a used spare does not come back within the run
    straggler_jitter: float = 0.0
    straggler_probability: float = 0.0
    straggler_slowdown: float = 0.0

    def __post_init__(self):
        if self.step_s <= 0 or self.interval_steps < 1:
            raise ValueError(f"goodput: step_s = {self.step_s} must be > 0 and interval_steps = "
                             f"{self.interval_steps} >= 1")


@dataclass(frozen=True)
class Interruption:
    time_s: float
    cause: str
    component: str
    lost_steps: int


@dataclass(frozen=True)
class GoodputRun:
    """One seed's run: wall time, kept steps, where the time went, what interrupted it."""

    seed: int
    step_s: float
    wall_s: float
    steps: int  # steps whose progress survives at the end (checkpointed or not yet lost)
    breakdown_s: dict
    interruptions: tuple[Interruption, ...]
    progress: tuple[tuple[float, int], ...]  # (time, steps) after each segment and around each failure
    checkpoints: int
    reached_target: bool

    @property
    def goodput(self) -> float:
        """Fraction of wall time spent on useful steps at their failure- and straggler-free speed."""
        return self.steps * self.step_s / self.wall_s if self.wall_s else 0.0

    @property
    def effective_training_fraction(self) -> float:
        """Fraction of wall time spent running steps that were kept (stragglers included): Meta's
        effective training time (no recovery, no lost work, no checkpoint stalls)."""
        b = self.breakdown_s
        return (b["compute"] + b["slowdown"]) / self.wall_s if self.wall_s else 0.0


class _Steps:
    """Steps not yet safe in a finished checkpoint and the wall time they took."""

    def __init__(self):
        self.n, self.wall_s = 0, 0.0

    def take(self) -> tuple[int, float]:
        out = (self.n, self.wall_s)
        self.n, self.wall_s = 0, 0.0
        return out


class _Run:
    def __init__(self, cfg: GoodputConfig, env: simpy.Environment, seed: int, target_steps: int | None):
        self.cfg, self.env, self.target = cfg, env, target_steps
        self.rng_steps = np.random.default_rng([seed, 1])
        self.rng_fail = np.random.default_rng([seed, 2])
        self._times, self._next = np.empty(0), 0
        self.acc = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
        self.committed, self.live, self.inflight = 0, _Steps(), _Steps()
        self.drain_end = -np.inf
        self.recovery: float | None = None  # seconds of the restart under way
        self.replace_pending = self.planned_pending = self.need_checkpoint = False
        self.resume: tuple | None = None
        self.spares = cfg.hot_spares
        self.interruptions: list[Interruption] = []
        self.checkpoints, self.progress = 0, [(0.0, 0)]
        self.phase: tuple = ("idle", 0.0, 0.0, None)
        self.proc = env.process(self.trainer())
        if cfg.causes and sum(c.rate_per_s for c in cfg.causes) > 0:
            env.process(self.failures())

    # ---- progress bookkeeping --------------------------------------------------------------------
    def kept_steps(self) -> int:
        return self.committed + self.inflight.n + self.live.n

    def _keep(self, n: int, wall_s: float) -> None:
        self.committed += n
        self.acc["compute"] += n * self.cfg.step_s
        self.acc["slowdown"] += wall_s - n * self.cfg.step_s

    def settle(self) -> None:
        """An asynchronous checkpoint whose drain has finished makes its steps safe."""
        if self.inflight.n and self.env.now >= self.drain_end:
            self._keep(*self.inflight.take())

    def done(self) -> bool:
        return self.target is not None and self.kept_steps() >= self.target

    # ---- the trainer -------------------------------------------------------------------------------
    def trainer(self):
        while not self.done():
            kind, duration, info = self.next_phase()
            start = self.env.now
            self.phase = (kind, start, duration, info)
            try:
                yield self.env.timeout(duration)
            except simpy.Interrupt as intr:
                self.on_interrupt(kind, self.env.now - start, duration, info, intr.cause)
                continue
            self.on_complete(kind, duration, info)
        self.phase = ("idle", self.env.now, 0.0, None)

    def next_phase(self) -> tuple[str, float, object]:
        self.settle()
        if self.resume is not None:
            phase, self.resume = self.resume, None
            return phase
        if self.recovery is not None:
            return "recover", self.recovery, None
        cfg = self.cfg
        if self.need_checkpoint:
            if not cfg.asynchronous:
                return "checkpoint", cfg.checkpoint_write_s, None
            if self.env.now < self.drain_end:  # one save in flight at a time
                return "drain_wait", self.drain_end - self.env.now, None
            return "checkpoint", cfg.checkpoint_block_s, None
        if self.planned_pending:
            self.planned_pending = False
            if self.live.n or self.inflight.n:
                return "graceful", self._graceful_s(0.0), 0.0
            self.recovery = cfg.warmup_s + cfg.checkpoint_read_s
            return "recover", self.recovery, None
        n = min(cfg.interval_steps - self.live.n, MAX_SEGMENT_STEPS)
        if self.target is not None:
            n = min(n, self.target - self.kept_steps())
        bounds = self.step_bounds(n)
        return "segment", float(bounds[-1]), bounds

    def step_bounds(self, n: int) -> np.ndarray:
        """End times of the next ``n`` steps from now: stragglers slow each step; a draining asynchronous
        checkpoint slows the steps it overlaps by ``async_step_slowdown``."""
        cfg = self.cfg
        work = np.cumsum(self.step_times(n))
        overlap = self.drain_end - self.env.now
        if overlap > 0 and cfg.async_step_slowdown > 0:
            slow = 1.0 + cfg.async_step_slowdown
            return np.where(work <= overlap / slow, work * slow, overlap + (work - overlap / slow))
        return work

    def step_times(self, n: int) -> np.ndarray:
        """The next ``n`` step durations, the slowest rank's draw included. Drawn in blocks, in step order,
        so the k-th step of a run meets the same straggler whatever the checkpoint interval."""
        cfg = self.cfg
        if not cfg.straggler_jitter and not (cfg.straggler_probability and cfg.straggler_slowdown):
            return np.full(n, cfg.step_s)
        while len(self._times) - self._next < n:
            rng, block = self.rng_steps, max(STRAGGLER_BLOCK, n)
            factor = 1.0 + rng.random(block) * cfg.straggler_jitter
            if cfg.straggler_probability and cfg.straggler_slowdown:
                factor += (rng.random(block) < cfg.straggler_probability) * rng.exponential(cfg.straggler_slowdown,
                                                                                            block)
            self._times = np.concatenate([self._times[self._next:], cfg.step_s * factor])
            self._next = 0
        out = self._times[self._next:self._next + n]
        self._next += n
        return out

    def _graceful_s(self, remainder_s: float) -> float:
        """Finish the step in progress, wait for a draining save, write a checkpoint synchronously."""
        wait = max(0.0, self.drain_end - (self.env.now + remainder_s))
        return remainder_s + wait + self.cfg.checkpoint_write_s

    def on_complete(self, kind: str, duration: float, info) -> None:
        cfg, now = self.cfg, self.env.now
        if kind == "recover":
            self.acc["recovery"] += duration
            self.recovery, self.replace_pending = None, False
        elif kind == "segment":
            self.live.n += len(info)
            self.live.wall_s += duration
            self.need_checkpoint = self.live.n >= cfg.interval_steps
            self.progress.append((now, self.kept_steps()))
        elif kind == "drain_wait":
            self.acc["checkpoint"] += duration
        elif kind == "checkpoint":
            self.acc["checkpoint"] += duration
            self.checkpoints += 1
            self.need_checkpoint = False
            if cfg.asynchronous:
                self.inflight.n, self.inflight.wall_s = self.live.take()
                self.drain_end = now + cfg.checkpoint_write_s
            else:
                self._keep(*self.live.take())
        elif kind == "graceful":
            self.acc["checkpoint"] += duration - info
            self.checkpoints += 1
            self.settle()
            self._keep(*self.inflight.take())
            self._keep(*self.live.take())
            self.need_checkpoint = False
            self.recovery = cfg.warmup_s + cfg.checkpoint_read_s

    # ---- interruptions ----------------------------------------------------------------------------
    def on_interrupt(self, kind: str, elapsed: float, duration: float, info, cause: CauseRate) -> None:
        if cause.graceful:
            self.on_planned(kind, elapsed, duration, info, cause)
            return
        self.settle()
        acc = self.acc
        if kind == "segment":
            acc["lost"] += elapsed
        elif kind == "recover":
            acc["recovery"] += elapsed
        elif kind == "graceful":  # the step being finished is not finished: its rest was counted as live
            acc["checkpoint"] += max(0.0, elapsed - info)
            self.live.wall_s -= info - min(elapsed, info)
        else:
            acc["checkpoint"] += elapsed
        before = self.kept_steps() + (int(np.searchsorted(info, elapsed, "right")) if kind == "segment" else 0)
        acc["lost"] += self.live.take()[1] + self.inflight.take()[1]
        self.interruptions.append(Interruption(self.env.now, cause.name, cause.component, before - self.committed))
        self.progress += [(self.env.now, before), (self.env.now, self.committed)]
        self.drain_end, self.need_checkpoint, self.planned_pending, self.resume = -np.inf, False, False, None
        self.start_recovery(cause)

    def start_recovery(self, cause: CauseRate) -> None:
        cfg = self.cfg
        if cause.replace_node:
            if self.spares > 0:
                self.spares -= 1
                if cfg.spare_repair_s > 0:
                    self.env.process(self.repair())
            else:
                self.replace_pending = True
        self.recovery = (cfg.detection_s + (cfg.reschedule_s if self.replace_pending else 0.0)
                         + cfg.warmup_s + cfg.checkpoint_read_s)

    def repair(self):
        yield self.env.timeout(self.cfg.spare_repair_s)
        self.spares += 1

    def on_planned(self, kind: str, elapsed: float, duration: float, info, cause: CauseRate) -> None:
        """Planned maintenance: during a segment, finish the step and checkpoint; otherwise carry on and
        take the graceful stop before the next segment."""
        self.interruptions.append(Interruption(self.env.now, cause.name, cause.component, 0))
        if kind == "graceful":  # already stopping: resume the same stop
            self.acc["checkpoint"] += max(0.0, elapsed - info)
            self.resume = (kind, duration - elapsed, max(0.0, info - elapsed))
            return
        if kind != "segment":  # down already (nothing to do) or saving: stop before the next segment
            self.acc["recovery" if kind == "recover" else "checkpoint"] += elapsed
            self.resume = (kind, duration - elapsed, info)
            self.planned_pending = self.planned_pending or kind != "recover"
            return
        n_done = int(np.searchsorted(info, elapsed, "right"))
        n_keep = min(n_done + 1, len(info))
        self.live.n += n_keep
        self.live.wall_s += float(info[n_keep - 1])
        remainder = float(info[n_keep - 1]) - elapsed
        self.resume = ("graceful", self._graceful_s(remainder), remainder)

    def failures(self):
        causes = self.cfg.causes
        rates = np.array([c.rate_per_s for c in causes])
        cumulative = np.cumsum(rates) / rates.sum()
        while True:
            yield self.env.timeout(self.rng_fail.exponential(1.0 / rates.sum()))
            i = min(int(np.searchsorted(cumulative, self.rng_fail.random(), "right")), len(causes) - 1)
            if not self.proc.is_alive:
                return
            self.proc.interrupt(causes[i])

    # ---- the end -----------------------------------------------------------------------------------
    def finish(self, seed: int) -> GoodputRun:
        kind, start, _, info = self.phase
        elapsed = self.env.now - start
        if kind == "segment":  # cut by the horizon: the finished steps count, the partial one does not
            n_done = int(np.searchsorted(info, elapsed, "right"))
            self.live.n += n_done
            self.live.wall_s += float(info[n_done - 1]) if n_done else 0.0
            self.acc["unfinished"] += elapsed - (float(info[n_done - 1]) if n_done else 0.0)
        elif kind == "graceful":
            self.live.wall_s -= info - min(elapsed, info)
            self.acc["checkpoint"] += max(0.0, elapsed - info)
        elif kind != "idle":
            self.acc["recovery" if kind == "recover" else "checkpoint"] += elapsed
        self.settle()
        self._keep(*self.inflight.take())
        self._keep(*self.live.take())
        self.progress.append((self.env.now, self.committed))
        return GoodputRun(seed, self.cfg.step_s, self.env.now, self.committed, dict(self.acc),
                          tuple(self.interruptions), tuple(self.progress), self.checkpoints, self.done())


def simulate_goodput(cfg: GoodputConfig, seed: int = 0, horizon_s: float | None = None,
                     target_steps: int | None = None) -> GoodputRun:
    """Run until ``horizon_s`` of wall time or until ``target_steps`` steps are done (whichever is given;
    with both, whichever comes first). Deterministic for a given seed."""
    if horizon_s is None and target_steps is None:
        raise ValueError("goodput: give a horizon (days) or a target (tokens)")
    env = simpy.Environment()
    run = _Run(cfg, env, seed, target_steps)
    env.run(until=run.proc if horizon_s is None else min_event(env, run.proc, horizon_s))
    return run.finish(seed)


def min_event(env: simpy.Environment, proc, horizon_s: float):
    """The trainer's end or the horizon, whichever comes first."""
    return env.any_of([proc, env.timeout(horizon_s)])
