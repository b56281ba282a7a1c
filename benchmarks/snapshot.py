"""Exactness check for engine and trace work (issue 20): every scenario file (scenarios/, the MoE
recipes and the calibration examples included) simulated, its metrics.json and the SHA-256 of its
Chrome trace written to a folder (a file in a subfolder is named by its path, e.g.
``moe__deepseek-v3-1024xh100``); ``--compare A B`` reports any file that differs. Take a snapshot
before a change (e.g. in a ``git worktree`` of the old commit) and one after; they must be
byte-identical.

    python benchmarks/snapshot.py OUT_DIR [--only NAME ...]
    python benchmarks/snapshot.py --compare BEFORE_DIR AFTER_DIR
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

ROOT = Path.cwd()
sys.path.insert(0, str(ROOT))


def scenario_files() -> list[Path]:
    """Every scenario file: scenarios/*.toml, the MoE recipes and the calibration example (the
    hardware files under scenarios/clusters/ are not scenarios)."""
    return sorted(p for p in (ROOT / "scenarios").rglob("*.toml") if "clusters" not in p.relative_to(ROOT).parts)


def snapshot(out: Path, only: list[str]) -> None:
    from simulator.pipeline import simulate
    from simulator.scenario import load_scenario
    from simulator.trace import to_chrome_json

    out.mkdir(parents=True, exist_ok=True)
    for path in scenario_files():
        if only and path.stem not in only:
            continue
        t0 = time.perf_counter()
        res = simulate(load_scenario(path))
        wall = time.perf_counter() - t0
        name = "__".join(path.relative_to(ROOT / "scenarios").with_suffix("").parts)
        (out / f"{name}.metrics.json").write_text(json.dumps(res.metrics, indent=2) + "\n")
        data = json.dumps(to_chrome_json(res.trace), separators=(",", ":")).encode()
        (out / f"{name}.trace.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")
        print(f"{name}: {wall:.2f} s, {len(res.graph)} tasks", flush=True)


def compare(a: Path, b: Path) -> int:
    names = sorted({p.name for p in a.iterdir()} | {p.name for p in b.iterdir()})
    bad = [n for n in names if not (a / n).exists() or not (b / n).exists()
           or (a / n).read_bytes() != (b / n).read_bytes()]
    for n in bad:
        print(f"DIFFERS: {n}")
    print(f"{len(names) - len(bad)} of {len(names)} files identical")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?")
    ap.add_argument("--only", nargs="*", default=[])
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args()
    if args.compare:
        return compare(Path(args.compare[0]), Path(args.compare[1]))
    snapshot(Path(args.out), args.only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
