"""Human-readable results: the console summary of ``run`` and the markdown report (report.md).

Both read the metrics dict of DESIGN.md §4.3 only; missing keys print as "n/a" and unknown keys
are ignored, so measured runs and older metrics files render too.
"""

from __future__ import annotations

import os
from typing import Any
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..units import GiB, MS

# metrics.json as simulated (analysis.metrics.Metrics) or as read back from a file
MetricsLike = Mapping[str, Any]

# The busiest rank's breakdown is shown too when its idle time is shorter than the slowest rank's by
# more than this share of the iteration (a pipeline whose stages differ: the last-ending rank waits).
BUSIEST_SHOWN_ABOVE = 0.05
# Order of DESIGN.md §4.3 time_breakdown_s and memory_bytes.
BREAKDOWN_KEYS = ("compute", "recompute", "comm_tp", "comm_cp", "comm_ep", "comm_pp", "comm_dp",
                  "bubble", "optimizer", "offload", "other")
MEMORY_KEYS = ("params", "grads", "optimizer", "activations", "buffers")
NA = "n/a"


def _num(metrics: MetricsLike, key: str) -> float | None:
    value = metrics.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def fmt_seconds(seconds: float | None) -> str:
    if seconds is None:
        return NA
    if abs(seconds) >= 1.0 or seconds == 0.0:
        return f"{seconds:.3f} s"
    return f"{seconds / MS:.2f} ms"


def fmt_pct(fraction: float | None) -> str:
    return NA if fraction is None else f"{100.0 * fraction:.1f}%"


def fmt_gib(size_bytes: float | None) -> str:
    return NA if size_bytes is None else f"{size_bytes / GiB:.2f} GiB"


def fmt_tflops(tflops_per_s: float | None) -> str:
    """The *_tflops_per_gpu metrics are in TFLOP/s, as their names say (DESIGN.md §4.3)."""
    return NA if tflops_per_s is None else f"{tflops_per_s:.1f}"


def fits_verdict(metrics: MetricsLike) -> str:
    fits = metrics.get("fits_in_memory")
    if fits is None:
        return NA
    return "fits" if fits else "DOES NOT FIT (out of memory)"


def _memory_line(metrics: MetricsLike) -> str:
    total = _num(metrics.get("memory_bytes") or {}, "total")
    cap = _num(metrics, "memory_capacity_bytes")
    share = f" ({fmt_pct(total / cap)})" if total is not None and cap else ""
    return f"{fmt_gib(total)} of {fmt_gib(cap)}{share}, {fits_verdict(metrics)}"


def summary_rows(metrics: MetricsLike) -> list[tuple[str, str]]:
    """(label, value) pairs shared by the console summary and the report's summary table."""
    tokens = _num(metrics, "tokens_per_s")
    return [
        ("GPUs", str(metrics.get("num_gpus", NA))),
        ("iteration time", fmt_seconds(_num(metrics, "iteration_time_s"))),
        ("tokens/s", NA if tokens is None else f"{tokens:,.0f}"),
        ("MFU", fmt_pct(_num(metrics, "mfu"))),
        ("HFU", fmt_pct(_num(metrics, "hfu"))),
        ("model TFLOP/s per GPU", fmt_tflops(_num(metrics, "model_tflops_per_gpu"))),
        ("hardware TFLOP/s per GPU", fmt_tflops(_num(metrics, "hardware_tflops_per_gpu"))),
        ("pipeline bubble", fmt_pct(_num(metrics, "bubble_fraction"))),
        ("memory peak per GPU", _memory_line(metrics)),
    ] + _slowest_gpu_row(metrics) + _sm_contention_row(metrics)


def _slowest_gpu_row(metrics: MetricsLike) -> list[tuple[str, str]]:
    """The pace the job's slowest GPU sets (cost/clocks.slowest_speed_ratio), when below the median's."""
    ratio = _num(metrics, "slowest_gpu_speed_ratio")
    if ratio is None or ratio >= 1.0:
        return []
    return [("slowest GPU", f"{fmt_pct(ratio)} of the median GPU's tensor-core speed (the step waits for it)")]


def _sm_contention_row(metrics: MetricsLike) -> list[tuple[str, str]]:
    """The compute time the busiest rank lost to collectives' SMs, when there is any (cost/sm_share)."""
    s = _num(metrics, "sm_contention_s")
    if not s:
        return []
    return [("SM contention", f"+{fmt_seconds(s)} of compute on the bottleneck rank (SMs collectives held)")]


def breakdown_rows(metrics: MetricsLike, breakdown: dict | None = None) -> list[tuple[str, float, float | None]]:
    """(category, seconds, fraction of the iteration) for every category of ``breakdown`` (by default
    time_breakdown_s)."""
    breakdown = breakdown if breakdown is not None else metrics.get("time_breakdown_s") or {}
    iteration = _num(metrics, "iteration_time_s")
    keys = [k for k in BREAKDOWN_KEYS if k in breakdown]
    keys += sorted(k for k in breakdown if k not in BREAKDOWN_KEYS)
    return [(k, float(breakdown[k]), float(breakdown[k]) / iteration if iteration else None)
            for k in keys]


def format_summary(metrics: MetricsLike) -> str:
    """The console summary ``python -m simulator run`` prints (no trailing newline)."""
    lines = [f"scenario: {metrics.get('scenario', NA)}"]
    rows = summary_rows(metrics)
    width = max(len(label) for label, _ in rows)
    lines += [f"  {label:<{width}}  {value}" for label, value in rows]
    lines += _breakdown_lines("time breakdown (exposed, slowest rank):", breakdown_rows(metrics))
    busiest = busiest_breakdown(metrics)
    if busiest is not None:
        lines += _breakdown_lines(f"busiest rank {busiest[0]} (idle the least: the pipeline's bottleneck stage):",
                                  busiest[1])
    return "\n".join(lines)


def busiest_breakdown(metrics: MetricsLike) -> tuple[int, list[tuple[str, float, float | None]]] | None:
    """(rank, rows) of the busiest rank's breakdown when it tells another story than the slowest
    rank's: its idle time is shorter by more than BUSIEST_SHOWN_ABOVE of the iteration."""
    busiest = metrics.get("busiest_rank") or {}
    b, main = busiest.get("time_breakdown_s") or {}, metrics.get("time_breakdown_s") or {}
    t = _num(metrics, "iteration_time_s")
    rank = busiest.get("rank")
    if rank is None or not b or not t or main.get("bubble", 0.0) - b.get("bubble", 0.0) <= BUSIEST_SHOWN_ABOVE * t:
        return None
    return int(rank), breakdown_rows(metrics, b)


def _breakdown_lines(title: str, rows) -> list[str]:
    parts = [(k, s, f) for k, s, f in rows if s > 0.0]
    if not parts:
        return []
    cat_w = max(len(k) for k, _, _ in parts)
    return [f"  {title}"] + [f"    {k:<{cat_w}}  {fmt_seconds(s):>11}  {fmt_pct(f):>6}" for k, s, f in parts]


def _table(header: tuple[str, ...], rows) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def _image_link(image: str, out_dir: Path) -> str:
    """A link relative to the report: images inside out_dir keep their relative name."""
    p = Path(image)
    if not p.is_absolute() and (out_dir / p).exists():
        rel = p
    elif p.is_absolute() or p.exists():
        rel = Path(os.path.relpath(p.resolve(), out_dir.resolve()))
    else:
        rel = p
    return rel.as_posix()


def write_report(out_dir, metrics: MetricsLike, images: list[str],
                 sections: Sequence[tuple[str, str]] = ()) -> Path:
    """Write ``out_dir/report.md``: summary, time and memory breakdowns, extra sections, images."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md = [f"# Training-iteration report: {metrics.get('scenario', 'unnamed scenario')}", ""]
    md += ["## Summary", "", _table(("metric", "value"), summary_rows(metrics)), ""]

    rows = breakdown_rows(metrics)
    if rows:
        total = sum(s for _, s, _ in rows)
        iteration = _num(metrics, "iteration_time_s")
        table = [(k, f"{s:.6f}", fmt_pct(f)) for k, s, f in rows]
        table.append(("**total**", f"{total:.6f}", fmt_pct(total / iteration if iteration else None)))
        md += ["## Time breakdown", "",
               "Exposed time on the slowest rank, in seconds and as a share of the iteration.", "",
               _table(("category", "seconds", "% of iteration"), table), ""]
    busiest = busiest_breakdown(metrics)
    if busiest is not None:
        md += [f"Busiest rank {busiest[0]} (idle the least: the pipeline's bottleneck stage, which the slowest "
               "rank waits for):", "",
               _table(("category", "seconds", "% of iteration"),
                      [(k, f"{s:.6f}", fmt_pct(f)) for k, s, f in busiest[1]]), ""]

    memory = metrics.get("memory_bytes") or {}
    if memory:
        mem_total = _num(memory, "total")
        keys = [k for k in MEMORY_KEYS if k in memory]
        keys += sorted(k for k in memory if k not in MEMORY_KEYS and k != "total")
        table = [(k, f"{float(memory[k]) / GiB:.2f}",
                  fmt_pct(float(memory[k]) / mem_total if mem_total else None)) for k in keys]
        if mem_total is not None:
            table.append(("**total**", f"{mem_total / GiB:.2f}", fmt_pct(1.0)))
        md += ["## Memory (peak per GPU, worst rank)", "",
               _table(("component", "GiB", "% of total"), table), "",
               f"Peak {_memory_line(metrics)}.", ""]

    for heading, body in sections:
        md += [f"## {heading}", "", body.rstrip(), ""]

    if images:
        md += ["## Figures", ""]
        for image in images:
            link = _image_link(image, out_dir)
            md += [f"![{Path(link).stem}]({link})", ""]

    path = out_dir / "report.md"
    path.write_text("\n".join(md).rstrip() + "\n", encoding="utf-8")
    return path
