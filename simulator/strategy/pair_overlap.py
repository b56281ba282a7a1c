"""DualPipe's overlapped forward-backward pairs (DeepSeek-V3 technical report §3.2.1, fig. 4).

DualPipe runs the forward of one micro-batch and the backward of another as one pair
(``_forward_backward_chunk`` of the DualPipe repository, with the model's
``overlapped_forward_backward``): their components alternate on the GPU so that each one's
expert-parallel all-to-all (dispatch, combine) runs while the other computes. The lowering emits
the pair's F, then its B, as usual; ``interleave`` then re-orders the rank's streams in the pair:
each pass is cut into segments that end at its all-to-alls, and the segments alternate, the
forward's first (F0 B0 F1 B1 ...), on every stream, so each all-to-all is issued before the other
pass's next segment and the compute stream runs that segment while it is in flight. Within a pass
the order is unchanged, so its dependencies hold; the two passes share nothing but the streams.

Memory: the forward's activations are charged at the pair's start (its first task allocates all of
them), then the backward frees as it goes. This is the peak of running F then B, the rule the static
memory estimates apply to every schedule (``stage_units``), and an upper bound of the interleaved
pair's own peak.
"""

from __future__ import annotations

from ..tasks import Task, TaskGraphBuilder


def is_boundary(task: Task) -> bool:
    """An expert-parallel all-to-all (a dispatch or combine, either direction) ends a segment."""
    return task.category == "comm_ep" and task.comm is not None and task.comm.op == "all_to_all"


def segment_keys(builder: TaskGraphBuilder, rank: int, f_start: int, b_start: int) -> dict[int, tuple]:
    """Task id -> (segment, pass) for the pair's tasks of ``rank``: the forward's are ids [f_start,
    b_start), the backward's from b_start on; a segment ends with a boundary all-to-all."""
    keys: dict[int, tuple] = {}
    for start, end, side in ((f_start, b_start, 0), (b_start, len(builder), 1)):
        seg = 0
        for tid in range(start, end):
            t = builder.task(tid)
            if t.rank == rank:
                keys[tid] = (seg, side)
                seg += is_boundary(t)
    return keys


def interleave(builder: TaskGraphBuilder, rank: int, f_start: int, b_start: int) -> None:
    """Overlap the pair whose forward was emitted from id ``f_start`` and backward from ``b_start``
    up to now, on ``rank`` (see the module doc)."""
    keys = segment_keys(builder, rank, f_start, b_start)
    builder.reorder_tail(rank, f_start, keys.__getitem__)
    # the forward's activations (tasks of phase F; the parameters ZeRO-3 gathers are buffers, left be)
    forward = [tid for tid, k in keys.items() if k[1] == 0 and builder.task(tid).phase == "F"]
    if not forward:
        return
    allocs = [tid for tid in forward if builder.task(tid).mem_delta_bytes > 0]
    allocated = sum(builder.task(tid).mem_delta_bytes for tid in allocs)
    for tid in allocs:
        builder.set_mem(tid, 0.0)
    first = forward[0]  # created first: in segment 0, first in program order on its stream
    builder.set_mem(first, builder.task(first).mem_delta_bytes + allocated)
