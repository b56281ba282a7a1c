"""PyTorch's context parallelism as torchtitan runs it (``parallelism.cp_algorithm = "torch-allgather"``).

torch.distributed.tensor.experimental._attention (the December 2024 code torchtitan 9dec370 ran:
``_templated_ring_attention`` and its backward, ``set_rotate_method("allgather")``, torchtitan's
default, with round-robin load balancing) runs each CP rank's attention as cp SDPA steps of equal work
(step 0 the causal diagonal block, the others non-causal halves: ``blocks.later_step_work``), and:

- takes K and V as torchtitan's Attention hands them to SDPA, repeated to every query head
  (``repeat_kv`` before ``scaled_dot_product_attention``, models/llama/model.py at 9dec370): heads/tp
  heads per rank, not kv_heads/tp (``kv_bytes``);
- forward: all-gathers K and V once, asynchronously, beside step 0, which needs only the local block;
  the later steps read the gathered buffer; each step merges its output into an fp32 accumulator
  (``_SDPAMerger``);
- backward: all-gathers K and V again beside step 0's SDPA backward; each step adds its dK, dV into
  fp32 accumulators of the local block's size, which travel one hop round the ring after every step
  (``_RotateMethod.ALL_TO_ALL``, a send to the next rank and a receive from the previous one); a step
  waits for the previous hop into its rank before it adds, and the backward ends waiting for the last.

The HBM traffic of the eager kernels around the SDPA calls, per element of the local block's
repeated K (N = b (s/cp) heads/tp head_dim), counted from those functions' tensor ops: forward, step 0
copies K and V into one buffer for the gather (8N bytes) and casts the output to fp32 (6N); each later
step copies K and V again but the last (8N) and merges (``out - sigmoid(lse_b - lse) * (out - out_b)``
on fp32 out: 30N on the whole block, 15N on half plus an 8N fp32 concatenation on the ranks whose step
is partial: 26.5N on average); the end casts back (6N). Backward, step 0 zero-fills three fp32
accumulators (12N), copies K and V (8N), adds dK, dV, dQ in fp32 (30N) and concatenates dK, dV for the
hop (16N); each later step copies K and V but the last (8N), adds dK, dV (23N on average over the
full and partial cases), dQ (11.5N) and concatenates them (16N); the end casts dQ, dK, dV back (18N).
"""

from __future__ import annotations

from ..tasks import InternalError, OpWork
from .blocks import Work, ring_steps
from .context import LowerCtx

FWD_FIRST_BYTES_PER_N = 8 + 6
FWD_STEP_BYTES_PER_N = 26.5  # the merge; + 8 for the K/V copy on every step but the last
FWD_END_BYTES_PER_N = 6
BWD_FIRST_BYTES_PER_N = 12 + 8 + 30 + 16
BWD_STEP_BYTES_PER_N = 23 + 11.5 + 16  # + 8 for the K/V copy on every step but the last
BWD_END_BYTES_PER_N = 18
KV_COPY_BYTES_PER_N = 8
DKV_HOP_BYTES_PER_N = 8  # dK and dV accumulators in fp32


def repeated_elements(ctx: LowerCtx) -> float:
    """N: elements of one CP rank's K block with K repeated to every query head of its TP shard."""
    return ctx.cp_tokens * ctx.scn.model.q_size / ctx.par.tp


def kv_bytes(ctx: LowerCtx) -> float:
    """K and V of one CP rank's block, repeated to every query head, in the training dtype."""
    return 2 * repeated_elements(ctx) * ctx.dtype_bytes


def step_bytes(j: int, cp: int, forward: bool) -> float:
    """HBM bytes per N of step ``j``'s eager kernels around its SDPA call (module doc)."""
    first, step, end = ((FWD_FIRST_BYTES_PER_N, FWD_STEP_BYTES_PER_N, FWD_END_BYTES_PER_N) if forward else
                        (BWD_FIRST_BYTES_PER_N, BWD_STEP_BYTES_PER_N, BWD_END_BYTES_PER_N))
    out = first if j == 0 else step + (KV_COPY_BYTES_PER_N if j < cp - 1 else 0.0)
    return out + (end if j == cp - 1 else 0.0)


def _step_work(ctx: LowerCtx, layer: int, part: str, j: int) -> Work:
    """Step ``j``'s SDPA work with its merge/accumulate kernels, one tuple per (layer template, part,
    step) since the cost model caches work by identity."""
    b = ctx.layer_blocks(layer)
    cp = ctx.par.cp

    def build() -> Work:
        n = repeated_elements(ctx)
        extra = OpWork("cp_merge" if part == "F" else "cp_grad_accumulate", "elementwise", 0.0,
                       step_bytes(j, cp, part == "F") * n)
        return tuple(ring_steps(b)[1 if j else 0][part]) + (extra,)
    return b.memo(("torch-allgather", part, j), build)


def emit_core(ctx: LowerCtx, rank: int, part: str, dep: int | None, name: str, meta: dict,
              category: str) -> int:
    """The attention core of one layer and pass on one CP rank (module doc); returns its last task."""
    d = () if dep is None else (dep,)
    group = ctx.group("cp", rank)
    cp = len(group)
    gather = ctx.comm(rank, "comm_cp", f"{name}.cp_all_gather", "all_gather", kv_bytes(ctx) * cp, group, "cp",
                      "comm_cp", d, **meta)
    x = ctx.compute(rank, f"{name}.core0", _step_work(ctx, meta["layer"], part, 0), d, category, **meta)
    if part == "F":
        for j in range(1, cp):
            deps = (x, gather) if j == 1 else (x,)
            x = ctx.compute(rank, f"{name}.core{j}", _step_work(ctx, meta["layer"], part, j), deps, category, **meta)
        return x
    prv = group[(group.index(rank) - 1) % cp]  # a rank's task is the hop it receives (layer_emit._core)
    hop_bytes = DKV_HOP_BYTES_PER_N * repeated_elements(ctx)
    hop = None
    for j in range(cp):
        if j:
            deps = (x, gather) if j == 1 else (x,)
            x = ctx.compute(rank, f"{name}.core{j}", _step_work(ctx, meta["layer"], part, j), deps, category, **meta)
        if hop is not None:  # the previous step's accumulators must have arrived before this step adds
            x = _wait(ctx, rank, f"{name}.cp_dkv_wait{j}", (x, hop), meta)
        hop = ctx.comm(rank, "comm_cp", f"{name}.cp_dkv{j}", "send_recv", hop_bytes, (prv, rank), "cp", "comm_cp",
                       (x,), **meta)
    return _wait(ctx, rank, f"{name}.cp_dkv_wait", (x, hop), meta)


def _wait(ctx: LowerCtx, rank: int, name: str, deps: tuple[int | None, ...], meta: dict) -> int:
    """A zero-work task on the compute stream after both ``deps``."""
    x = ctx.join(rank, name, deps, **meta)
    if x is None:
        raise InternalError(f"rank {rank}: {name} joined no task")
    return x
