"""NCCL collective profiling over all local GPUs (one process per GPU, torch.distributed), reported with
nccl-tests' conventions so that the table compares directly with ``python -m simulator collective``.

Sizes follow ``tasks.Collective``: the per-rank buffer for all_reduce, the gathered output for
all_gather, the input for reduce_scatter, the send buffer for all_to_all. torch is imported lazily.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

from ..cost.calibrated import CollectiveRow
from ..cost.collectives import busbw_factor
from .profile import cuda_event_times

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
SIZES_BYTES = tuple(2 ** e for e in range(16, 31, 2))  # 64 KiB .. 1 GiB, as nccl-tests -b 64K -e 1G -f 4
WARMUP = 5  # nccl-tests default warm-up iterations (-w 5)
ITERS = 20  # nccl-tests default timed iterations (-n 20)


def _worker(rank: int, world: int, init_file: str, out_file: str, sizes: tuple[int, ...]) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world)
    dt = torch.bfloat16
    results = []
    for op in OPS:
        for size in sizes:
            elems = (size // 2) // world * world
            fn = _collective_call(op, elems, world, dt)
            for _ in range(WARMUP):
                fn()
            torch.cuda.synchronize()
            dist.barrier()
            times = cuda_event_times(fn, ITERS)
            t = torch.tensor([times[len(times) // 2]], device="cuda", dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank finishes the collective
            results.append({"op": op, "num_ranks": world, "size_bytes": elems * 2, "time_s": float(t.item()),
                            "samples": ITERS})
    if rank == 0:
        Path(out_file).write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


def _collective_call(op: str, elems: int, world: int, dt) -> Callable[[], object]:
    """One call of collective ``op`` on its buffers (sizes as ``tasks.Collective`` counts them)."""
    import torch
    import torch.distributed as dist

    def buffers(out_elems: int, in_elems: int):
        return torch.empty(out_elems, device="cuda", dtype=dt), torch.ones(in_elems, device="cuda", dtype=dt)

    if op == "all_reduce":
        buf = torch.ones(elems, device="cuda", dtype=dt)
        return lambda: dist.all_reduce(buf)
    if op == "all_gather":
        out, inp = buffers(elems, elems // world)
        return lambda: dist.all_gather_into_tensor(out, inp)
    if op == "reduce_scatter":
        out, inp = buffers(elems // world, elems)
        return lambda: dist.reduce_scatter_tensor(out, inp)
    out, inp = buffers(elems, elems)
    return lambda: dist.all_to_all_single(out, inp)


def profile_collectives(world: int, sizes: tuple[int, ...] = SIZES_BYTES) -> list[CollectiveRow]:
    """Time every op and size over ``world`` local GPUs (needs >= 2 CUDA devices)."""
    import torch.multiprocessing as mp

    if world < 2:
        raise ValueError(f"collectives need at least 2 GPUs, got {world}")
    with tempfile.TemporaryDirectory() as tmp:
        init, out = str(Path(tmp) / "init"), str(Path(tmp) / "out.json")
        mp.spawn(_worker, args=(world, init, out, sizes), nprocs=world, join=True)
        raw = json.loads(Path(out).read_text())
    rows = []
    for r in raw:
        algbw = r["size_bytes"] / r["time_s"]
        rows.append(CollectiveRow(r["op"], r["num_ranks"], float(r["size_bytes"]), r["time_s"], algbw,
                                  algbw * busbw_factor(r["op"], r["num_ranks"]), r["samples"]))
    return rows


def collective_rows(rows: list[CollectiveRow]) -> list[tuple]:
    return [(r.op, r.num_ranks, r.size_bytes, r.time_s, r.algbw_Bps, r.busbw_Bps, r.samples) for r in rows]
