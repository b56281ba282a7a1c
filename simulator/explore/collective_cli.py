"""`python -m simulator collective`: one collective over all GPUs of N nodes, or a busbw sweep.

The cluster is described as in a scenario: ``--cluster PRESET`` or ``--hardware FILE.toml`` and any
``--set cluster.KEY=VALUE`` (NICs, fabric, NVLink, topology, a GPU table ...).

Figures follow nccl-tests (doc/PERFORMANCE.md): algbw = S / t; busbw = algbw x 2(n-1)/n for
all_reduce, x (n-1)/n for all_gather / reduce_scatter / all_to_all, x 1 for send_recv.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..hardware.clusters import CLUSTER_PRESETS
from ..scenario import apply_overrides, cluster_spec
from ..scenario_checks import check_cluster_size
from ..tasks import COLLECTIVE_OPS

CLI_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


def cluster_of(preset: str | None, hardware: str | None, nodes: int, sets: list[str] | tuple[str, ...] = ()):
    """The cluster a ``collective`` call describes: a preset or a hardware file, ``--nodes``, and
    ``cluster.KEY=VALUE`` overrides, read by the same code as a scenario's [cluster] table."""
    if nodes < 1:
        raise ValueError(f"--nodes must be positive, got {nodes}")
    if preset and hardware:
        raise ValueError("--cluster and --hardware both given; a hardware file replaces the preset")
    bad = [item for item in sets if not item.strip().startswith("cluster.")]
    if bad:
        raise ValueError(f"--set {bad[0]!r}: collective takes cluster.KEY=VALUE only")
    if preset and preset not in CLUSTER_PRESETS:
        raise ValueError(f"--cluster {preset!r} is unknown; known: {', '.join(CLUSTER_PRESETS)}")
    table: dict = {"hardware": str(Path(hardware).resolve())} if hardware else {"preset": preset} if preset else {}
    table["num_nodes"] = nodes
    table = apply_overrides({"cluster": table}, list(sets))["cluster"]
    if "preset" not in table and "hardware" not in table:  # neither flags nor --set name the machine
        table["preset"] = "dgx-a100-80gb"
    return cluster_spec(table, Path("."))


def collective_command(args) -> int:
    from .collective import run_collective, sweep_collective
    cluster = cluster_of(args.cluster, args.hardware, args.nodes, args.set)
    check_cluster_size(cluster.num_gpus, f"--nodes {cluster.num_nodes} x {cluster.gpus_per_node} GPUs")
    if args.op not in CLI_OPS or args.op not in COLLECTIVE_OPS:
        raise ValueError(f"--op {args.op!r} is unknown; known: {', '.join(CLI_OPS)}")
    if not 1 <= args.size_bytes < float("inf"):  # nan fails both comparisons
        raise ValueError(f"--size-bytes must be a finite number of bytes >= 1, got {args.size_bytes:g}")
    if args.sweep:
        rows = sweep_collective(cluster, args.op, algorithm=args.algorithm)
        name = f"collective-{args.op}-{cluster.name}-{cluster.num_nodes}n"
        out = Path(args.out) if args.out else Path("results") / name
        out.mkdir(parents=True, exist_ok=True)
        from ..analysis.links import plot_busbw_sweep
        plot_busbw_sweep(rows, out / "busbw.png")
        if args.json:
            print(json.dumps(rows))
            return 0
        print(f"{args.op} over {cluster.num_gpus} GPUs ({cluster.num_nodes} x {cluster.name})")
        print(f"{'size':>12} {'time us':>12} {'algbw GB/s':>11} {'busbw GB/s':>11}  algorithm")
        for r in rows:
            print(f"{int(r['size_bytes']):>12} {r['time_s'] * 1e6:>12.1f} {r['algbw_GBps']:>11.2f} "
                  f"{r['busbw_GBps']:>11.2f}  {r['algorithm']}")
        print(f"busbw curve written to {out / 'busbw.png'}")
        return 0
    row = run_collective(cluster, args.op, args.size_bytes, algorithm=args.algorithm)
    if args.json:
        print(json.dumps(row))
    else:
        print(f"{row['op']} of {row['size_bytes']:.0f} B over {row['num_gpus']} GPUs "
              f"({cluster.num_nodes} x {cluster.name}), "
              f"{row['algorithm']}: {row['time_s'] * 1e3:.3f} ms, algbw {row['algbw_GBps']:.1f} GB/s, "
              f"busbw {row['busbw_GBps']:.1f} GB/s")
    return 0
