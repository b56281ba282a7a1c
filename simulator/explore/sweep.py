"""``simulator sweep SCENARIO.toml --grid parallelism.tp=1,2,4,8 ...``: the cartesian product of the
grid over a scenario, each point simulated (in parallel), one CSV row per point with the plan and all
metrics (streamed to results/<name>/sweep.csv), and a table on stdout.
"""

from __future__ import annotations

import itertools
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from ..scenario import Scenario, apply_overrides, check_structure, read_raw, scenario_from_dict
from ..scenario_checks import ScenarioError
from .enumerate import PLAN_FIELDS, Plan, apply_plan, plan_of
from .evaluate import RESULT_COLUMNS, CsvStream, Evaluator, flatten, progress


@dataclass(frozen=True)
class BaseScenario:
    """A scenario file as a dict (before validation), with what scenario_from_dict needs besides."""

    raw: dict
    name: str
    base_dir: Path
    source: str

    def build(self, overrides: list[str] | tuple[str, ...] = ()) -> Scenario:
        raw = apply_overrides(self.raw, list(overrides))
        return scenario_from_dict(raw, default_name=self.name, base_dir=self.base_dir, source=self.source)

    def with_plan(self, plan: Plan) -> Scenario:
        """The scenario with a plan's settings (``enumerate.apply_plan``)."""
        return scenario_from_dict(apply_plan(self.raw, plan), default_name=self.name, base_dir=self.base_dir,
                                  source=self.source)

    @property
    def display_name(self) -> str:
        return self.raw.get("name", self.name) if isinstance(self.raw.get("name"), str) else self.name


def read_base(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> BaseScenario:
    """Read a scenario file as load_scenario does, without building it (``--set`` applied)."""
    p = Path(path)
    return BaseScenario(read_raw(p, list(overrides)), p.stem, p.parent, str(p))


def split_values(text: str) -> list[str]:
    """``1,2,4`` -> ["1", "2", "4"]; commas inside [...] or quotes do not split."""
    out, cur, depth, quote = [], "", 0, ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        cur += ch
    out.append(cur.strip())
    return out


def parse_grid(items: list[str]) -> list[tuple[str, list[str]]]:
    """``["parallelism.tp=1,2"]`` -> [("parallelism.tp", ["1", "2"])]; a key given twice is an error."""
    grid: list[tuple[str, list[str]]] = []
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        vals = [v for v in split_values(values) if v]
        if not sep or "." not in key or not vals:
            raise ScenarioError(f"--grid {item!r}: expected SECTION.KEY=V1,V2,...")
        if any(k == key for k, _ in grid):
            raise ScenarioError(f"--grid {key} is given twice")
        grid.append((key, vals))
    return grid


def grid_points(grid: list[tuple[str, list[str]]]) -> list[list[str]]:
    """The cartesian product as lists of ``KEY=VALUE`` overrides, first grid key varying slowest."""
    keys = [k for k, _ in grid]
    return [[f"{k}={v}" for k, v in zip(keys, combo)] for combo in itertools.product(*(v for _, v in grid))]


def run_sweep(base: BaseScenario, grid: list[tuple[str, list[str]]], csv_path: Path, jobs: int = 0,
              backend: str = "local", address: str | None = None) -> list[dict]:
    """Simulate every grid point; rows (grid values, plan, status, metrics) in grid order. Rows are
    written to ``csv_path`` as they finish; invalid points are rows with status "invalid"."""
    keys = [k for k, _ in grid]
    columns = ("point",) + tuple(keys) + PLAN_FIELDS + RESULT_COLUMNS
    rows: dict[int, dict] = {}
    with CsvStream(csv_path, columns) as out, Evaluator(jobs, backend, address) as ev:
        todo = 0
        for i, point in enumerate(grid_points(grid)):
            row = {"point": i, **{k: o.partition("=")[2] for k, o in zip(keys, point)}}
            try:
                scn = base.build(point)
            except ScenarioError as exc:
                rows[i] = {**row, "status": "invalid", "reason": str(exc)}
                out.write(rows[i])
                continue
            rows[i] = {**row, **plan_of(scn).as_dict()}
            ev.submit(i, scn)
            todo += 1
        with progress(todo, "sweep") as bar:
            for _ in range(todo):
                i, result = ev.next_done()
                rows[i].update(flatten(result))
                out.write(rows[i])
                bar.update(1)
    return [rows[i] for i in sorted(rows)]


def format_rows(rows: list[dict], keys: list[str]) -> str:
    head = [k.partition(".")[2] for k in keys] + ["status", "time s", "tokens/s", "MFU", "mem GiB", "fits",
                                                   "compute", "tp", "pp", "dp", "bubble"]
    table = [head]
    for r in rows:
        cells = [str(r[k]) for k in keys]
        if r["status"] != "ok":
            table.append(cells + [r["status"], (r.get("reason") or "")[:70]] + [""] * (len(head) - len(cells) - 2))
            continue
        gib = r["memory_total_bytes"] / 2**30
        table.append(cells + ["ok", f"{r['iteration_time_s']:.3f}", f"{r['tokens_per_s']:,.0f}", f"{r['mfu']:.1%}",
                              f"{gib:.1f}", "yes" if r["fits_in_memory"] else "NO",
                              f"{r['time_compute_s'] + r['time_recompute_s']:.3f}", f"{r['time_comm_tp_s']:.3f}",
                              f"{r['time_comm_pp_s']:.3f}", f"{r['time_comm_dp_s']:.3f}", f"{r['time_bubble_s']:.3f}"])
    return render_table(table)


def render_table(table: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in table if i < len(row)) for i in range(len(table[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table)


def sweep_command(args) -> int:
    base = read_base(args.scenario, args.set)
    grid = parse_grid(args.grid)
    check_structure(base.raw)
    for key, values in grid:  # a misspelled key would make every point an "invalid" row
        section, _, name = key.partition(".")
        check_structure({section: {name: values[0]}}, via=f"--grid {key}: ")
    out_dir = Path(args.out) if args.out else Path("results") / base.display_name
    csv_path = out_dir / "sweep.csv"
    try:
        rows = run_sweep(base, grid, csv_path, args.jobs, args.backend, args.ray_address)
    except KeyboardInterrupt:
        print(f"interrupted: the rows simulated so far are in {csv_path}", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(rows))
    else:
        print(format_rows(rows, [k for k, _ in grid]))
        print(f"{len(rows)} points, {sum(r['status'] == 'ok' for r in rows)} simulated; CSV: {csv_path}")
    if rows and all(r["status"] == "invalid" for r in rows):  # the grid itself is bad input
        print(f"error: none of the {len(rows)} points is a valid scenario; the first: {rows[0]['reason']}",
              file=sys.stderr)
        return 2
    return 0
