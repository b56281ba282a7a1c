"""Calibrated compute cost: measured kernel tables (CSV with a provenance header) and a log-space
interpolator between measured shapes, falling back to another cost model for what is missing.

The table format is the seam between ``calibration/`` (torch, writes the tables) and ``cost/``
(torch-free, reads them): see ``scenarios/calibration/README.md``.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..model.opgraph import OP_KINDS, attention_flops, gemm_flops
from ..tasks import COLLECTIVE_OPS, OpWork

KERNEL_TABLE = "kernels.csv"
COLLECTIVE_TABLE = "collectives.csv"
# Per kernel class achieved rates (``calibrate fit``): FLOP/s of compute-bound kinds, bytes/s of the
# others, per pass; they price the work the measured rows do not cover (other shapes, other plans).
RATE_TABLE = "efficiencies.csv"
RATE_COLUMNS = ("kind", "pass", "dtype", "rate", "unit", "fraction_of_peak", "instances")
KERNEL_COLUMNS = ("kind", "name", "pass", "dtype", "shape", "flops", "bytes", "time_s", "samples")
COLLECTIVE_COLUMNS = ("op", "num_ranks", "size_bytes", "time_s", "algbw_Bps", "busbw_Bps", "samples")
# Kinds whose time is set by FLOPs (interpolated as a FLOP rate over the shape); every other kind is
# memory-bound and interpolated as time over its element count.
COMPUTE_KINDS = {"gemm": 3, "attention": 5}  # kind -> length of its shape tuple (tasks.OpWork)


@dataclass(frozen=True, slots=True)
class KernelRow:
    kind: str
    name: str
    pass_: str  # "fwd" | "bwd" (input and weight gradients together) | ...
    dtype: str
    shape: tuple[int, ...]
    flops: float
    bytes: float
    time_s: float
    samples: int


@dataclass(frozen=True, slots=True)
class RateRow:
    """A kernel class's achieved rate: time = FLOPs / rate ("FLOP/s") or bytes / rate ("B/s")."""

    kind: str
    pass_: str  # fwd | bwd | step
    dtype: str
    rate: float
    unit: str
    fraction_of_peak: float  # of the fitted scenario GPU's peak / HBM bandwidth (information)
    instances: int


@dataclass(frozen=True, slots=True)
class CollectiveRow:
    op: str
    num_ranks: int
    size_bytes: float
    time_s: float
    algbw_Bps: float
    busbw_Bps: float
    samples: int


# ---- the file format ------------------------------------------------------------------------
def format_shape(shape: tuple[int, ...]) -> str:
    return "x".join(str(int(d)) for d in shape)


def write_table(path: str | Path, columns: tuple[str, ...], rows: list[tuple], provenance: dict) -> Path:
    """CSV with ``# key: value`` provenance lines above the header row."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    buf.write("# simulator calibration table v1\n")
    for key, value in provenance.items():
        buf.write(f"# {key}: {' '.join(str(value).split())}\n")
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for r in rows:
        w.writerow([format_shape(v) if isinstance(v, tuple) else (repr(v) if isinstance(v, float) else v)
                    for v in r])
    path.write_text(buf.getvalue())
    return path


def read_table(path: Path, columns: tuple[str, ...]) -> tuple[dict, list[tuple[int, dict]]]:
    """(provenance, [(line number, row dict)]); ValueError naming the file and line on bad input."""
    provenance: dict = {}
    lines = path.read_text().splitlines()
    body_start = 0
    for i, line in enumerate(lines):
        if not line.startswith("#"):
            body_start = i
            break
        key, sep, value = line[1:].partition(":")
        if sep:
            provenance[key.strip()] = value.strip()
    else:
        body_start = len(lines)
    reader = csv.reader(lines[body_start:])
    header = next(reader, None)
    if header is None or tuple(h.strip() for h in header) != columns:
        raise ValueError(f"{path}: header must be {','.join(columns)}, got {','.join(header or [])!r}")
    rows = []
    for n, rec in enumerate(reader, start=body_start + 2):
        if not rec:
            continue
        if len(rec) != len(columns):
            raise ValueError(f"{path}:{n}: {len(rec)} fields, expected {len(columns)}")
        rows.append((n, dict(zip(columns, (v.strip() for v in rec)))))
    return provenance, rows


def _number(path: Path, line: int, rec: dict, key: str, kind=float, positive: bool = True):
    try:
        v = kind(rec[key])
    except ValueError:
        raise ValueError(f"{path}:{line}: {key} = {rec[key]!r} is not a number") from None
    if not math.isfinite(v) or v < 0 or (positive and v == 0):
        raise ValueError(f"{path}:{line}: {key} = {rec[key]} must be {'positive' if positive else '>= 0'}")
    return v


# what an OpWork's kind and a table's pass can be (the lowering's works; calibration/profile's passes)
WORK_KINDS = OP_KINDS + ("optimizer", "memcpy", "host")
PASSES = ("fwd", "bwd", "bwd_input", "bwd_weight", "step", "h2d", "d2h")


def _known(path: Path, line: int, rec: dict, key: str, known: tuple[str, ...]) -> str:
    """A cell that must name one of ``known`` (an unknown one would silently match nothing)."""
    if rec[key] not in known:
        raise ValueError(f"{path}:{line}: {key} = {rec[key]!r} is unknown; known: {', '.join(known)}")
    return rec[key]


def _kernel_row(path: Path, line: int, rec: dict) -> KernelRow:
    _known(path, line, rec, "kind", WORK_KINDS)
    _known(path, line, rec, "pass", PASSES)
    try:
        shape = tuple(int(d) for d in rec["shape"].split("x")) if rec["shape"] else ()
    except ValueError:
        raise ValueError(f"{path}:{line}: shape = {rec['shape']!r} is not like 2048x4096x1024") from None
    if any(d <= 0 for d in shape):
        raise ValueError(f"{path}:{line}: shape = {rec['shape']} has a non-positive dimension")
    want = COMPUTE_KINDS.get(rec["kind"])
    if want is not None and len(shape) != want:
        raise ValueError(f"{path}:{line}: a {rec['kind']} shape has {want} dimensions, got {rec['shape']!r}")
    return KernelRow(rec["kind"], rec["name"], rec["pass"], rec["dtype"], shape,
                     _number(path, line, rec, "flops", positive=False),
                     _number(path, line, rec, "bytes", positive=False),
                     _number(path, line, rec, "time_s"), _number(path, line, rec, "samples", int))


def _collective_row(path: Path, line: int, rec: dict) -> CollectiveRow:
    return CollectiveRow(_known(path, line, rec, "op", COLLECTIVE_OPS), _number(path, line, rec, "num_ranks", int),
                         _number(path, line, rec, "size_bytes"), _number(path, line, rec, "time_s"),
                         _number(path, line, rec, "algbw_Bps", positive=False),
                         _number(path, line, rec, "busbw_Bps", positive=False),
                         _number(path, line, rec, "samples", int))


def _rate_row(path: Path, line: int, rec: dict) -> RateRow:
    _known(path, line, rec, "kind", WORK_KINDS)
    _known(path, line, rec, "pass", PASSES)
    if rec["unit"] not in ("FLOP/s", "B/s"):
        raise ValueError(f"{path}:{line}: unit = {rec['unit']!r} must be FLOP/s or B/s")
    return RateRow(rec["kind"], rec["pass"], rec["dtype"], _number(path, line, rec, "rate"), rec["unit"],
                   _number(path, line, rec, "fraction_of_peak", positive=False),
                   _number(path, line, rec, "instances", int))


def work_pass(work: OpWork) -> str:
    """The pass a rate row is kept under: the optimizer's step, else backward or forward work."""
    return "step" if work.kind == "optimizer" else ("bwd" if work.backward else "fwd")


# ---- interpolation --------------------------------------------------------------------------
def interp_loglog(x: float, xs: list[float], ys: list[float]) -> float:
    """Piecewise-linear interpolation of log(y) over log(x) between sorted points; outside the range
    the nearest end point is returned (callers decide how to extend it)."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    j = int(np.searchsorted(xs, x))
    x0, x1, y0, y1 = xs[j - 1], xs[j], ys[j - 1], ys[j]
    f = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return math.exp((1 - f) * math.log(y0) + f * math.log(y1))


def idw_log(point: tuple[float, ...], points: np.ndarray, values: np.ndarray, k: int) -> float:
    """Inverse-distance-weighted mean of log(values) in log-shape space over the k nearest points
    (Shepard 1968, "A two-dimensional interpolation function for irregularly-spaced data", with
    power 2 and a nearest-neighbour cut). Exact at a measured point."""
    lp = np.log(np.asarray(point, dtype=float))
    d = np.sqrt(((np.log(points) - lp) ** 2).sum(axis=1))
    if d.min() == 0.0:
        return float(np.exp(np.log(values[d == 0.0]).mean()))
    near = np.argsort(d, kind="stable")[:k]
    w = 1.0 / d[near] ** 2
    return float(np.exp((w * np.log(values[near])).sum() / w.sum()))


def _canonical_flops(kind: str, shape: tuple[int, ...]) -> float:
    """Forward FLOPs of one kernel of that shape, with the op graph's formulas."""
    return gemm_flops(*shape) if kind == "gemm" else attention_flops(*shape)


def _nearest_group(groups: dict[float, list[KernelRow]], signature: float) -> tuple[float, list[KernelRow]]:
    key = min(groups, key=lambda s: (abs(math.log(s / signature)), s))
    return key, groups[key]


class CalibrationTables:
    """Measured kernel (and collective) times read once from a directory; lookups never mutate it."""

    def __init__(self, kernels: tuple[KernelRow, ...], collectives: tuple[CollectiveRow, ...] = (),
                 provenance: dict | None = None, directory: str = "", rates: tuple[RateRow, ...] = ()) -> None:
        self.kernels = kernels
        self.collectives = collectives
        self.rates = {(r.kind, r.pass_, r.dtype): r for r in rates}
        self.provenance = dict(provenance or {})
        self.directory = directory
        by: dict[tuple[str, str], list[KernelRow]] = {}
        for r in kernels:
            by.setdefault((r.kind, r.dtype), []).append(r)
        self._by_kind = {k: tuple(v) for k, v in by.items()}

    @classmethod
    def load(cls, directory: str | Path) -> "CalibrationTables":
        d = Path(directory)
        kpath = d / KERNEL_TABLE
        if not kpath.is_file():
            raise ValueError(f"calibration tables {str(d)!r}: no {KERNEL_TABLE} (run `python -m simulator "
                             f"calibrate profile --out {d}`)")
        prov, recs = read_table(kpath, KERNEL_COLUMNS)
        kernels = tuple(_kernel_row(kpath, n, r) for n, r in recs)
        if not kernels:
            raise ValueError(f"{kpath}: no rows")
        colls: tuple[CollectiveRow, ...] = ()
        cpath = d / COLLECTIVE_TABLE
        if cpath.is_file():
            cprov, crecs = read_table(cpath, COLLECTIVE_COLUMNS)
            colls = tuple(_collective_row(cpath, n, r) for n, r in crecs)
            prov = dict(prov, collectives=cprov)
        rates: tuple[RateRow, ...] = ()
        rpath = d / RATE_TABLE
        if rpath.is_file():
            _, rrecs = read_table(rpath, RATE_COLUMNS)
            rates = tuple(_rate_row(rpath, n, r) for n, r in rrecs)
        return cls(kernels, colls, prov, str(d), rates)

    def dtypes(self) -> set[str]:
        return {r.dtype for r in self.kernels}

    def lookup_s(self, work: OpWork, dtype: str) -> float | None:
        """Seconds for ``work`` from the measured rows of its kind and dtype, None when not covered.

        Compute-bound kinds (gemm, attention): rows are grouped by their FLOPs per canonical forward
        FLOPs of their shape (1 = forward, 2 = input + weight gradients, ...); in the group nearest to
        the work's, the achieved FLOP rate is taken at the same shape or interpolated in log space
        between measured shapes, and time = work FLOPs / rate. Shapes outside the measured range in
        any dimension are not extrapolated (None).
        Memory-bound kinds: rows grouped by bytes per element (which tells forward from backward and
        one variant from another); time is interpolated in log-log over the element count, scaled by
        the ratio of bytes per element to the group's; below the smallest measured size the smallest
        kernel's time is a floor (launch latency), above the largest time grows linearly (bandwidth).
        With fitted class rates (``efficiencies.csv``), work outside the measured shapes is priced at its
        kind's and pass's achieved rate instead (the memory-bound rows are then not extended).
        """
        rows = self._by_kind.get((work.kind, dtype))
        t = None
        if rows and work.kind in COMPUTE_KINDS and work.flops > 0:
            t = self._compute_s(work, rows)
        elif rows:
            t = self._memory_s(work, rows, extend=not self.rates)
        return self._rate_s(work, dtype) if t is None and self.rates else t

    def _rate_s(self, work: OpWork, dtype: str) -> float | None:
        r = self.rates.get((work.kind, work_pass(work), dtype))
        if r is None:
            r = next((x for (k, _, dt), x in sorted(self.rates.items()) if k == work.kind and dt == dtype), None)
        if r is None:
            return None
        amount = work.flops if r.unit == "FLOP/s" else work.bytes
        return amount / r.rate if amount > 0 else None

    def _compute_s(self, work: OpWork, rows: tuple[KernelRow, ...]) -> float | None:
        shape = tuple(work.shape)
        if len(shape) != COMPUTE_KINDS[work.kind] or min(shape) <= 0:
            return None
        groups: dict[float, list[KernelRow]] = {}
        for r in rows:
            if r.flops > 0:
                groups.setdefault(round(r.flops / _canonical_flops(r.kind, r.shape), 6), []).append(r)
        if not groups:
            return None
        _, group = _nearest_group(groups, work.flops / _canonical_flops(work.kind, shape))
        pts = np.array([r.shape for r in group], dtype=float)
        lo, hi = pts.min(axis=0), pts.max(axis=0)
        if np.any(np.array(shape) < lo) or np.any(np.array(shape) > hi):
            return None
        rates = np.array([r.flops / r.time_s for r in group])
        rate = idw_log(shape, pts, rates, k=2 * len(shape))
        return work.flops / rate

    def _memory_s(self, work: OpWork, rows: tuple[KernelRow, ...], extend: bool = True) -> float | None:
        elems = float(np.prod(work.shape)) if work.shape else 0.0
        if elems <= 0:
            return None
        groups: dict[float, list[KernelRow]] = {}
        for r in rows:
            if r.shape and r.bytes > 0:
                groups.setdefault(round(r.bytes / float(np.prod(r.shape)), 6), []).append(r)
        if not groups:
            return None
        per_elem = work.bytes / elems
        sig, group = (_nearest_group(groups, per_elem) if per_elem > 0
                      else max(groups.items(), key=lambda kv: len(kv[1])))
        by_size: dict[float, list[float]] = {}
        for r in group:
            by_size.setdefault(float(np.prod(r.shape)), []).append(r.time_s)
        xs = sorted(by_size)
        if not extend and not xs[0] <= elems <= xs[-1]:
            return None
        ys = [float(np.median(by_size[x])) for x in xs]
        t = interp_loglog(elems, xs, ys)
        if elems > xs[-1]:
            t *= elems / xs[-1]
        return t * (per_elem / sig if per_elem > 0 else 1.0)

    def collective_time_s(self, op: str, size_bytes: float, num_ranks: int) -> float | None:
        """Measured collective time at that size (log-log interpolation), None outside the range."""
        pts = sorted((r.size_bytes, r.time_s) for r in self.collectives
                     if r.op == op and r.num_ranks == num_ranks)
        if not pts or not pts[0][0] <= size_bytes <= pts[-1][0]:
            return None
        return interp_loglog(size_bytes, [p[0] for p in pts], [p[1] for p in pts])
