"""Command line: python -m simulator {presets,run,collective,validate,sweep,search,calibrate,goodput} (DESIGN.md §4.2).

Bad input of any kind ends with one line on stderr naming the key and the numbers, exit code 2; a
broken invariant of the simulator itself (tasks.InternalError) says it is a bug, exit code 1.
``--json`` prints exactly one JSON value on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import NoReturn
from pathlib import Path

from .tasks import InternalError

class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2, as for every other bad input
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="simulator", description="Discrete-event simulator of distributed LLM training.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    sub.add_parser("presets", help="models, GPUs and clusters a scenario can name").add_argument("--json", action="store_true")
    _run_and_collective_parsers(sub)
    v = sub.add_parser("validate", help="predictions against published training runs")
    v.add_argument("csv", nargs="*")
    v.add_argument("--json", action="store_true")
    v.add_argument("--out", default="results")
    _plan_parsers(sub)
    _goodput_parser(sub)
    _calibrate_parsers(sub)
    return p


def _run_and_collective_parsers(sub) -> None:
    r = sub.add_parser("run", help="simulate one scenario")
    r.add_argument("scenario")
    r.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    r.add_argument("--out", help="results folder (default results/<name>)")
    r.add_argument("--json", action="store_true")
    r.add_argument("--full", action="store_true", help="simulate every rank instead of one per stage")
    c = sub.add_parser("collective", help="one collective over all GPUs of N nodes")
    c.add_argument("--cluster", help="cluster preset (default dgx-a100-80gb)")
    c.add_argument("--hardware", help="cluster hardware TOML file, as a scenario's cluster.hardware")
    c.add_argument("--set", action="append", default=[], metavar="cluster.KEY=VALUE",
                   help="any [cluster] field of a scenario, e.g. cluster.nic_bandwidth_Gbps=200")
    c.add_argument("--nodes", type=int, default=1)
    c.add_argument("--op", required=True)
    c.add_argument("--size-bytes", type=float, default=2**30)
    c.add_argument("--algorithm")
    c.add_argument("--sweep", action="store_true", help="8 B .. 8 GiB, busbw curve PNG")
    c.add_argument("--out")
    c.add_argument("--json", action="store_true")


def _plan_parsers(sub) -> None:
    for name in ("sweep", "search"):
        s = sub.add_parser(name, help="cartesian grid of plans" if name == "sweep" else "best plan")
        s.add_argument("scenario")
        s.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
        s.add_argument("--jobs", type=int, default=0)
        s.add_argument("--backend", choices=("local", "ray"), default="local")
        s.add_argument("--ray-address", default=None)
        s.add_argument("--out")
        s.add_argument("--json", action="store_true")
        if name == "sweep":
            s.add_argument("--grid", action="append", default=[], metavar="SECTION.KEY=V1,V2", required=True)
        else:
            s.add_argument("--top", type=int, default=10)
            s.add_argument("--exhaustive", action="store_true",
                           help="simulate every plan that fits (no lower-bound pruning)")


def _goodput_parser(sub) -> None:
    g = sub.add_parser("goodput", help="a whole training run: failures, checkpoints, restarts, stragglers")
    g.add_argument("scenario")
    horizon = g.add_mutually_exclusive_group()
    horizon.add_argument("--days", type=float, help="wall-clock days to simulate (default 54)")
    horizon.add_argument("--tokens", type=float, help="run until this many tokens are trained")
    g.add_argument("--seeds", type=int, default=3, help="independent runs (seeds 0..N-1)")
    g.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    g.add_argument("--step-time-s", type=float, help="use this step time instead of simulating one step")
    g.add_argument("--no-sweep", action="store_true", help="skip the checkpoint-interval sweep")
    g.add_argument("--out")
    g.add_argument("--json", action="store_true")


def _calibrate_parsers(sub) -> None:
    cal = sub.add_parser("calibrate", help="profile kernels, import and compare real traces")
    csub = cal.add_subparsers(dest="action", required=True, parser_class=_Parser)
    pr = csub.add_parser("profile")
    pr.add_argument("--device", choices=("cuda", "cpu"))
    pr.add_argument("--out")
    pr.add_argument("--scenario", help="scenario whose kernels to profile (default: the tiny GPT)")
    pr.add_argument("--steps", type=int, default=3, help="profiled training steps of the tiny model")
    pr.add_argument("--warmup", type=int, help="unrecorded training steps before the profiled ones (default 2); "
                    "a GPU reaches its power-limited clock after ~10 s of load")
    pr.add_argument("--no-presets", action="store_true",
                    help="on a GPU, profile the scenario's own kernels only (not every preset's layers)")
    cm = csub.add_parser("compare")
    cm.add_argument("trace")
    cm.add_argument("scenario")
    cm.add_argument("--out")
    sh = csub.add_parser("show")
    sh.add_argument("trace")
    sh.add_argument("--out")
    ft = csub.add_parser("fit", help="calibration tables from your own torch.profiler traces")
    ft.add_argument("traces", nargs="+", metavar="TRACE")
    ft.add_argument("--scenario", required=True, help="the scenario the traces ran (model and plan)")
    ft.add_argument("--out", required=True, help="directory for kernels.csv, efficiencies.csv, fit.json")


def _presets(args) -> int:
    from .hardware.clusters import CLUSTER_PRESETS
    from .hardware.gpus import GPU_PRESETS
    from .model.presets import MODEL_PRESETS
    from .strategy.ub_config import bundled_configs, load_ub_config
    data = {"models": {k: {"params": m.num_params(), "layers": m.num_layers, "hidden_size": m.hidden_size}
                       for k, m in MODEL_PRESETS.items()},
            "gpus": {k: {"bf16_tflops": g.peak("bf16") / 1e12, "memory_GiB": g.memory_capacity_bytes / 2**30}
                     for k, g in GPU_PRESETS.items()},
            "clusters": {k: {"gpu": c.gpu.name, "gpus_per_node": c.gpus_per_node} for k, c in CLUSTER_PRESETS.items()},
            "tp_overlap": {k: {"source": load_ub_config(k).source} for k in bundled_configs()}}
    if args.json:
        print(json.dumps(data))
        return 0
    print("models:")
    for k, m in data["models"].items():
        print(f"  {k:22s} {m['params'] / 1e9:8.2f}B params, {m['layers']} layers, hidden {m['hidden_size']}")
    print("gpus:")
    for k, g in data["gpus"].items():
        print(f"  {k:22s} {g['bf16_tflops']:7.1f} TFLOP/s bf16, {g['memory_GiB']:.1f} GiB")
    print("clusters:")
    for k, c in data["clusters"].items():
        print(f"  {k:22s} {c['gpus_per_node']} x {c['gpu']} per node")
    print("tp_overlap (parallelism.tp_comm_overlap_cfg):")
    for k in data["tp_overlap"]:
        print(f"  {k}")
    return 0


def _run(args) -> int:
    from .analysis.report import format_summary
    from .pipeline import simulate, write_results
    from .scenario import load_scenario
    scn = load_scenario(args.scenario, args.set)
    result = simulate(scn, full=args.full)
    out = Path(args.out) if args.out else Path("results") / scn.name
    write_results(result, out)
    if not result.memory.fits:
        peak, cap = result.memory.peak["total"], result.memory.capacity_bytes
        print(f"warning: plan does not fit in GPU memory: peak {peak / 2**30:.1f} GiB > capacity "
              f"{cap / 2**30:.1f} GiB (rank {result.memory.worst_rank})", file=sys.stderr)
    if args.json:
        print(json.dumps(result.metrics))
    else:
        print(format_summary(result.metrics))
        print(f"results written to {out}/")
    return 0


def _collective(args) -> int:
    from .explore.collective_cli import collective_command
    return collective_command(args)


def _validate(args) -> int:
    from .explore.validate import validate_command
    return validate_command(args)


def _sweep(args) -> int:
    from .explore.sweep import sweep_command
    return sweep_command(args)


def _search(args) -> int:
    from .explore.search import search_command
    return search_command(args)


def _goodput(args) -> int:
    from .explore.goodput import goodput_command
    return goodput_command(args)


def _calibrate(args) -> int:
    from .calibration.cli import cmd_compare, cmd_fit, cmd_profile, cmd_show
    if args.action == "fit":
        return cmd_fit(args.traces, args.scenario, args.out)
    if args.action == "profile":
        return cmd_profile(args.device, args.out, scenario=args.scenario, steps=args.steps,
                           presets=False if args.no_presets else None, warmup=args.warmup)
    if args.action == "compare":
        return cmd_compare(args.trace, args.scenario, args.out)
    return cmd_show(args.trace, args.out)


COMMANDS = {"presets": _presets, "run": _run, "collective": _collective, "validate": _validate,
            "sweep": _sweep, "search": _search, "calibrate": _calibrate, "goodput": _goodput}


def _check_out_folder(out: str | None) -> None:
    """Every command's ``--out`` is a folder it creates: refuse one that names a file, or lies under one,
    before any work is done."""
    if not out:
        return
    path = Path(out)
    for p in (path, *path.parents):
        if p.exists() and not p.is_dir():
            raise ValueError(f"--out {out!r}: {str(p)!r} exists and is not a folder")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        _check_out_folder(getattr(args, "out", None))
        return COMMANDS[args.command](args)
    except (ValueError, OSError) as exc:  # OSError: a path the system refuses (missing, too long, no access)
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
            msg = f"{exc.strerror}: {str(exc.filename)[:120]!r}"  # the path the system refused, shortened
        print(f"error: {msg}", file=sys.stderr)
        return 2
    except InternalError as exc:  # a bug of the simulator, not the user's input: exit 1
        print(f"internal error (a bug in the simulator; please report it with the scenario and command): {exc}",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
