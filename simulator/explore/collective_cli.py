"""`python -m simulator collective`: one collective over all GPUs of N nodes, or a busbw sweep.

Figures follow nccl-tests (doc/PERFORMANCE.md): algbw = S / t; busbw = algbw x 2(n-1)/n for
all_reduce, x (n-1)/n for all_gather / reduce_scatter / all_to_all, x 1 for send_recv.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from ..hardware.clusters import CLUSTER_PRESETS
from ..tasks import COLLECTIVE_OPS

CLI_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


def _cluster(name: str, nodes: int):
    if name not in CLUSTER_PRESETS:
        raise ValueError(f"--cluster {name!r} is unknown; known: {', '.join(CLUSTER_PRESETS)}")
    if nodes < 1:
        raise ValueError(f"--nodes must be positive, got {nodes}")
    return replace(CLUSTER_PRESETS[name], num_nodes=nodes)


def collective_command(args) -> int:
    from .collective import run_collective, sweep_collective
    cluster = _cluster(args.cluster, args.nodes)
    if args.op not in CLI_OPS or args.op not in COLLECTIVE_OPS:
        raise ValueError(f"--op {args.op!r} is unknown; known: {', '.join(CLI_OPS)}")
    if args.size_bytes <= 0:
        raise ValueError(f"--size-bytes must be positive, got {args.size_bytes:g}")
    if args.sweep:
        rows = sweep_collective(cluster, args.op, algorithm=args.algorithm)
        out = Path(args.out) if args.out else Path("results") / f"collective-{args.op}-{args.cluster}-{args.nodes}n"
        out.mkdir(parents=True, exist_ok=True)
        from ..analysis.links import plot_busbw_sweep
        plot_busbw_sweep(rows, out / "busbw.png")
        if args.json:
            print(json.dumps(rows))
            return 0
        print(f"{args.op} over {cluster.num_gpus} GPUs ({args.nodes} x {cluster.name})")
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
        print(f"{row['op']} of {row['size_bytes']:.0f} B over {row['num_gpus']} GPUs ({args.nodes} x {cluster.name}), "
              f"{row['algorithm']}: {row['time_s'] * 1e3:.3f} ms, algbw {row['algbw_GBps']:.1f} GB/s, "
              f"busbw {row['busbw_GBps']:.1f} GB/s")
    return 0
