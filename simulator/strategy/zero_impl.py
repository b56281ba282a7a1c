"""How each framework runs ZeRO-3 / FSDP sharding: what it all-gathers, how often, in what buckets.

``parallelism.sharding`` names the implementation; the same ``zero_stage`` is a different pattern of
collectives in each (one rule per framework, used by the lowering, the static estimate and the tests):

- "deepspeed" (DeepSpeed ZeRO-3, ``PartitionedParameterCoordinator``): parameters are fetched per
  submodule (each Linear) just before its forward or backward, the next submodules' parameters
  prefetched in one coalesced all-gather of at least ``stage3_prefetch_bucket_size`` elements, and
  only while fewer than ``stage3_max_live_parameters`` are gathered; a parameter smaller than
  ``stage3_param_persistence_threshold`` is never partitioned; one whose next use comes within
  ``stage3_max_reuse_distance`` elements is not released. Activation checkpointing re-runs the
  forward inside the backward, whose pre-forward hooks fetch the parameters again: with full
  recompute a layer is gathered in the forward, in the recompute and (what the reuse rule does not
  keep) again for its backward (Rajbhandari et al. 2021, ZeRO-Infinity §5; DeepSpeed stage3.py).
- "fsdp1" / "fsdp2" (PyTorch FSDP, Zhao et al. 2023 §3-4): one flat all-gather per wrapped unit (a
  transformer block; embedding and head in the root unit, gathered once per micro-batch and kept for
  the backward); FULL_SHARD (zero_stage 3) reshards after the forward and gathers again in the
  backward, SHARD_GRAD_OP (zero_stage 2) keeps the forward's gathered parameters until the unit's
  backward ends. Activation checkpointing wraps the block inside its FSDP unit, so the recompute
  runs on the parameters the backward pre-hook gathered: no extra all-gather. Gradients are
  reduce-scattered per unit per micro-batch in ``grad_dtype`` (MixedPrecision.reduce_dtype). Every
  unit's all-gather is in flight at most one unit ahead: backward_prefetch (BACKWARD_PRE or, with
  the CPU running ahead of the GPU, BACKWARD_POST) and the forward's CPU run-ahead issue the next
  unit's gather while this one computes, and limit_all_gathers keeps no more than two in flight. HSDP
  (``shard_group_size``) shards inside a group of ranks and all-reduces the reduced shard across
  the groups. FSDP2 (per-parameter DTensor sharding) copies the gathered buffer out into the
  parameters (``foreach_all_gather_copy_out``) and the gradients into the reduce-scatter input
  (``torch._chunk_cat``): two extra HBM passes over the unit's bytes each.
- "deepspeed-2021": the same coordinator as DeepSpeed released it in 2021 (v0.3.13-v0.5, the engine
  of the ZeRO-3 runs in Narayanan et al. 2021), whose per-parameter collectives cost host time that
  grows with the group (``list_collective_host_work``): each prefetched parameter is gathered alone
  (``_allgather_param``: a zero-filled full-size buffer, ``torch.cuda.synchronize()``, a Python loop
  over the ranks narrowing one view per rank, ``torch.distributed.all_gather`` of that list, whose
  ProcessGroupNCCL copies the gathered buffer out into the ``world_size`` views one ``copy_`` at a
  time); every submodule's fetch synchronizes the device (``_synchronize_communication``:
  ``torch.cuda.synchronize()``, all streams). The host work runs while the GPU waits for the next
  kernels, so it is charged on the compute stream; its cost per all-gather is proportional to the
  group size. Gradients: ZeRO-3's default ``contiguous_gradients = false`` (constants.py v0.3.13 to
  v0.4.0) sends reduce_ipg_grads to buffered_reduce_fallback, an all-reduce of each flattened
  ``reduce_bucket_size`` bucket, after ``reduction_stream.synchronize()`` (the host waits for the
  previous bucket): 2x the bytes of a reduce-scatter, and the backward stalls behind each bucket.
  After the optimizer step (``_post_step``) the persistent parameters (below the threshold: biases,
  norms) are gathered again in one list all-gather whose copy-out loops in Python over every
  (tensor, rank) pair (``persistent_gather_work``): its host time grows with the group, too.
- "megatron-distopt": Megatron-core's distributed optimizer (ZeRO-1; see ``grad_sync``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..tasks import OpWork

if TYPE_CHECKING:
    from ..scenario import ParallelSpec

IMPLEMENTATIONS = ("megatron-distopt", "deepspeed", "deepspeed-2021", "fsdp1", "fsdp2")
FSDP = ("fsdp1", "fsdp2")
DEEPSPEED = ("deepspeed", "deepspeed-2021")

# DeepSpeed ZeRO-3 defaults, deepspeed/runtime/zero/constants.py (v0.3.13, March 2021, unchanged in
# later releases' zero/config.py): ZERO_OPTIMIZATION_PREFETCH_BUCKET_SIZE_DEFAULT = 50000000,
# ..._MAX_LIVE_PARAMETERS_DEFAULT = 1000000000, ..._MAX_REUSE_DISTANCE_DEFAULT = 1000000000,
# ..._PARAM_PERSISTENCE_THRESHOLD_DEFAULT = 100000 (elements).
DS_PREFETCH_BUCKET = 50_000_000
DS_MAX_LIVE = 1_000_000_000
DS_MAX_REUSE_DISTANCE = 1_000_000_000
DS_PERSISTENCE_THRESHOLD = 100_000
# FSDP2 copy kernels: copy-out reads the gathered buffer and writes the parameters, chunk_cat reads
# the gradients and writes the reduce-scatter input (torch/distributed/_composable/fsdp/
# _fsdp_collectives.py, foreach_all_gather_copy_out / foreach_reduce): 2 bytes moved per byte.
FSDP2_COPY_PASSES = 2
# DeepSpeed 2021 list all-gathers: per rank of the group, one Python-level view op (``narrow``) in the
# engine's loop and one ``copy_`` kernel that ProcessGroupNCCL issues out of the flat NCCL buffer
# (torch/lib/c10d/ProcessGroupNCCL.cpp in PyTorch 1.8: allgather of a tensor list through
# flatten_for_scatter_gather, one copy_ per list entry). Together they cost the host what one eager
# kernel op issued from Python costs (a view op's Python dispatch + a kernel's launch): the host-side
# floor of cost/compute (EAGER_KERNEL_HOST_S per kernel) charges it, once per copy kernel.
# DeepSpeed 2021 _allgather_params copies each gathered tensor out of each rank's shard from Python with
# three view ops before the copy_ (partition_parameters.py v0.3.13-v0.4.0; see persistent_copy_host_work).
PERSISTENT_COPY_VIEW_OPS = 3


def pipelined_fsdp2(par: ParallelSpec) -> bool:
    """FSDP2 under torch.distributed.pipelining (pp > 1): the pipeline stage runs every backward with
    ``set_requires_gradient_sync(False)`` and ``set_reshard_after_backward(False)`` and calls every
    unit's post-backward only after its last one (torch/distributed/pipelining/stage.py,
    ``backward_maybe_with_nosync``, torch 2.6): gradients accumulate unsharded in the reduce dtype,
    gathered parameters stay gathered, and each unit is reduce-scattered once per step, after the
    stage's last backward. Parameters are gathered once, at each chunk's first forward: torchtitan sets
    reshard_after_forward False under PP (parallelize_llama.apply_fsdp); ZeRO-3 with a pipeline is
    taken to run the same."""
    return par.sharding == "fsdp2" and par.pp > 1 and par.zero_stage >= 2 and par.dp * par.cp > 1


def state_zero_stage(par: ParallelSpec) -> int:
    """The ZeRO stage whose sharding the model state follows at its peak: ZeRO-1's (parameters and
    gradients whole, optimizer state sharded) for ``pipelined_fsdp2``, else ``zero_stage``."""
    return 1 if pipelined_fsdp2(par) else par.zero_stage


@dataclass(frozen=True)
class Fetch:
    """One all-gather: the units that wait for it, the elements it gathers, and whether it may be
    prefetched while the unit before runs (else it is issued when its first unit starts)."""

    units: tuple[int, ...]
    params: float
    prefetch: bool = True
    # submodules gathered: DeepSpeed 2021 issues one all-gather per parameter tensor, one per submodule
    # here (a bias joins its weight's gather only at or above stage3_param_persistence_threshold)
    tensors: int = 1


def submodule_params(linears: Sequence[tuple[float, float]]) -> list[float]:
    """Elements DeepSpeed gathers per submodule: each (weight, bias) pair's parameters at or above
    the persistence threshold (smaller ones, biases and norms, stay whole on every rank)."""
    return [sum(p for p in pair if p >= DS_PERSISTENCE_THRESHOLD) for pair in linears]


def coalesce(sizes: list[float], owners: list[int], bucket: float = DS_PREFETCH_BUCKET) -> list[Fetch]:
    """DeepSpeed's prefetch rule (get_params_to_prefetch): consecutive submodules' parameters join one
    all-gather until it holds at least ``bucket`` elements. ``owners`` maps each submodule to the unit
    (layer) it belongs to; empty submodules are skipped. A fetch is prefetched only if the one before
    it (the parameters live while it would be issued, the earlier ones released) holds fewer than
    stage3_max_live_parameters (``deepspeed_prefetch_allowed``)."""
    out: list[Fetch] = []
    units: list[int] = []
    total, tensors = 0.0, 0

    def close() -> None:
        out.append(Fetch(tuple(units), total, not out or deepspeed_prefetch_allowed(out[-1].params), tensors))

    for size, unit in zip(sizes, owners):
        if size <= 0:
            continue
        if not units or units[-1] != unit:
            units.append(unit)
        total += size
        tensors += 1
        if total >= bucket:
            close()
            units, total, tensors = [], 0.0, 0
    if units:
        close()
    return out


@functools.lru_cache(maxsize=256)
def rank_copies(ranks: int, full_bytes: float) -> tuple[OpWork, ...]:
    """A 2021 list all-gather's per-rank host work: ``ranks`` copy kernels of one rank's chunk (read +
    write) out of the flat NCCL buffer, each with its rank's view op; the host issues them at the
    eager floor (cost/compute.with_host_floor_s), so 1,536 ranks cost 1,536 x ~7.4 us."""
    return (OpWork("ds2021_rank_copy", "memcpy", 0.0, 2 * full_bytes / ranks, (1, 1)),) * ranks


@functools.lru_cache(maxsize=256)
def list_all_gather_host_work(ranks: int, full_bytes: float) -> tuple[OpWork, ...]:
    """The work DeepSpeed 2021 puts on the issuing thread for one parameter's all-gather over ``ranks``
    ranks: the torch.zeros full-size output buffer and the ``rank_copies``. One tuple per (ranks,
    bytes), shared by every gather of that size (the cost model caches a task's time by its work's
    identity)."""
    return (OpWork("ds2021_zero_fill", "memcpy", 0.0, full_bytes, (1, 1)), *rank_copies(ranks, full_bytes))


def persistent_sizes(tensors: Sequence[int]) -> tuple[int, ...]:
    """The tensors (elements) DeepSpeed never partitions away: those below
    stage3_param_persistence_threshold (biases, norms), kept gathered through the step."""
    return tuple(t for t in tensors if 0 < t < DS_PERSISTENCE_THRESHOLD)


def shard_elements(elements: int, ranks: int) -> int:
    """One rank's shard of a tensor: DeepSpeed pads the tensor to a multiple of the group
    (``_aligned_size``), so every shard holds ceil(elements / ranks)."""
    return -(-elements // ranks)


@functools.lru_cache(maxsize=256)
def persistent_copy_host_work(ranks: int, sizes: tuple[int, ...], dtype_bytes: int) -> tuple[OpWork, ...]:
    """DeepSpeed 2021's copy-out of gathered persistent tensors of ``sizes`` elements (``_allgather_params``
    after its list all-gather): per tensor and per rank whose shard holds part of it, three Python
    view ops (``partitions[i].narrow``, ``replicated_tensor.view(-1)``, ``.narrow``) and a ``copy_``
    of the shard, issued from Python (the view ops at EAGER_OP_HOST_S, the copy at the eager floor)."""
    views = OpWork("ds2021_persistent_views", "host", 0.0, 0.0, (PERSISTENT_COPY_VIEW_OPS,))
    out: list[OpWork] = []
    for n in sizes:
        part = shard_elements(n, ranks)
        copy = OpWork("ds2021_persistent_copy", "memcpy", 0.0, 2.0 * part * dtype_bytes, (1, 1))
        out += [views, copy] * -(-n // part)
    return tuple(out)


def persistent_gather_work(ranks: int, sizes: tuple[int, ...], dtype_bytes: int) -> tuple[tuple[OpWork, ...], float]:
    """(host work before the collective, bytes all-gathered) of DeepSpeed 2021's post-step gather of
    the persistent tensors of ``sizes`` elements (stage3 ``_post_step``: ``all_gather`` of the list,
    async_op=False, so ``_allgather_params``): each tensor's own shard copied into the flat buffer (a
    view op and a copy each), then the ``rank_copies`` of the list all-gather; each rank sends its
    padded shards of every tensor."""
    own = sum(shard_elements(n, ranks) for n in sizes) * dtype_bytes
    shards = (OpWork("ds2021_own_shard_view", "host", 0.0, 0.0, (len(sizes),)),
              *(OpWork("ds2021_own_shard_copy", "memcpy", 0.0, 2.0 * own / len(sizes), (1, 1)),) * len(sizes))
    return shards + rank_copies(ranks, own * ranks), own * ranks


def deepspeed_live_params(layer_subs: Sequence[float]) -> tuple[float, float]:
    """(most parameter elements gathered at once, largest single fetch) of a run of layers with
    submodules ``layer_subs``, under DeepSpeed's prefetch rule: a fetch, and the next one while it may be
    prefetched (``coalesce`` over two consecutive layers, ``deepspeed_prefetch_allowed``)."""
    n = len(layer_subs)
    fetches = coalesce(list(layer_subs) * 2, [0] * n + [1] * n)
    nxt = fetches[1:] + [Fetch((), 0.0)]
    return (max((f.params + (g.params if g.prefetch else 0.0) for f, g in zip(fetches, nxt)), default=0.0),
            max((f.params for f in fetches), default=0.0))


def deepspeed_prefetch_allowed(live_params: float) -> bool:
    """prefetch_next_sub_modules issues a prefetch only while fewer than stage3_max_live_parameters
    elements are gathered."""
    return live_params < DS_MAX_LIVE


def fsdp_gathers_per_microbatch(zero_stage: int) -> int:
    """All-gathers of one FSDP unit per micro-batch: FULL_SHARD forward + backward, SHARD_GRAD_OP the
    forward only (its parameters stay gathered until the unit's backward)."""
    return 2 if zero_stage == 3 else 1


def hsdp_groups(group: tuple[int, ...], rank: int, shard: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(shard group, replicate group) of ``rank`` in a data-parallel ``group`` cut into consecutive
    blocks of ``shard`` ranks (HSDP's 2-D device mesh: shard on the inner dimension, replicate on
    the outer); ``shard`` = len(group) or 0 is plain FSDP."""
    if not shard or shard >= len(group):
        return group, (rank,)
    i = group.index(rank)
    first = i - i % shard
    return group[first:first + shard], tuple(group[i % shard::shard])


def pass_fetches(impl: str, zero_stage: int, unit_subs: list[list[float]], recomputed: set[int],
                 kept: set[int]) -> dict[str, list[Fetch]]:
    """The all-gathers of one micro-batch, per pass ("F" forward, "B" backward with its recompute), in
    the order they are issued. ``unit_subs``: per unit (forward order) the elements of each submodule
    it gathers; ``recomputed``: units whose forward the backward re-runs; ``kept``: units FSDP keeps
    gathered from forward to backward (the root unit, not resharded after its forward).

    FSDP: one all-gather per unit and pass (``fsdp_gathers_per_microbatch``). DeepSpeed: the forward's
    submodules coalesced (``coalesce``); the backward of each unit in reverse order re-gathers a
    recomputed unit's submodules for the recompute, then every submodule whose reuse distance (the
    elements used between its last forward-side use and its backward) reaches
    stage3_max_reuse_distance: the rest of the chunk after it without recompute, the rest of its own
    layer twice (recompute, then backward) with it."""
    n = len(unit_subs)
    totals = [sum(s) for s in unit_subs]
    if impl in FSDP:
        fwd = [Fetch((i,), totals[i]) for i in range(n) if totals[i] > 0]
        bwd = [Fetch((i,), totals[i]) for i in range(n - 1, -1, -1)
               if totals[i] > 0 and zero_stage == 3 and i not in kept]
        return {"F": fwd, "B": bwd}
    if impl not in DEEPSPEED:
        raise ValueError(f"pass_fetches: sharding {impl!r} has no per-unit parameter gathers")
    fwd = coalesce([s for sub in unit_subs for s in sub], [i for i, sub in enumerate(unit_subs) for _ in sub])
    sizes, owners = [], []
    for i in range(n - 1, -1, -1):
        sub = unit_subs[i]
        if i in recomputed:
            sizes += sub
            owners += [i] * len(sub)
        for j in range(len(sub) - 1, -1, -1):
            after = sum(sub[j + 1:]) + (0.0 if i in recomputed else sum(totals[i + 1:]))
            sizes.append(sub[j] if 2 * after >= DS_MAX_REUSE_DISTANCE else 0.0)
            owners.append(i)
    return {"F": fwd, "B": coalesce(sizes, owners)}


def chunk_fetches(sharding: str, zero_stage: int, recomputed: frozenset[int], units: list[str],
                  unit_dense: list[float], layer_subs: Sequence[list[float]]) -> dict[str, list[Fetch]]:
    """``pass_fetches`` of one model chunk: ``units`` its units in forward order ("embed", layer
    indices, "head"), ``unit_dense`` their dense parameters on the rank, ``layer_subs`` every layer's
    DeepSpeed submodule sizes by global index (``layer_submodules``), ``recomputed`` the layers whose
    forward the backward re-runs (``recompute.recomputed_layers``). One rule for the lowering and
    the estimate."""
    ds = sharding in DEEPSPEED
    layers = {i for i, u in enumerate(units) if u not in ("embed", "head")}
    subs = [layer_subs[int(units[i])] if ds and i in layers else submodule_params([(unit_dense[i], 0.0)]) if ds
            else [unit_dense[i]] for i in range(len(units))]
    return pass_fetches(sharding, zero_stage, subs, {i for i in layers if int(units[i]) in recomputed},
                        set(range(len(units))) - layers)


def step_gather_count(fetches: dict[str, list[Fetch]], microbatches: int) -> int:
    """All-gathers one rank issues per step: its passes' fetches, every micro-batch."""
    return microbatches * sum(len(v) for v in fetches.values())


def step_bytes_per_rank(impl: str, zero_stage: int, params: float, dp: int, dtype_bytes: int,
                        grad_bytes: int, microbatches: int = 1, root_params: float = 0.0) -> dict:
    """Bytes one rank sends per step for ``params`` parameters over ``dp`` ranks, by collective kind,
    in nccl-tests terms (a ring all-gather or reduce-scatter sends (dp-1)/dp of the buffer, an
    all-reduce twice that). ZeRO paper (Rajbhandari et al. 2020 §7): DDP all-reduces 2 Phi, ZeRO-3
    moves 3 Phi: an all-gather in the forward and in the backward, a reduce-scatter. FSDP's root unit
    (``root_params``: embedding, final norm, head) is gathered once per micro-batch; SHARD_GRAD_OP
    gathers once per micro-batch; the distributed optimizer (ZeRO-1/2) once per step after the update."""
    f = (dp - 1) / dp
    w, g = dtype_bytes * f, grad_bytes * f
    if zero_stage == 0:
        return {"all_gather": 0.0, "reduce_scatter": 0.0, "all_reduce": 2 * params * g}
    if zero_stage == 3 and impl in DEEPSPEED:
        raise ValueError(f"step_bytes_per_rank: {impl!r} ZeRO-3 gathers depend on recompute and the reuse "
                         f"distance; count them with chunk_fetches")
    if zero_stage == 3 or (zero_stage == 2 and impl in FSDP):
        gathered = params + (params - root_params if zero_stage == 3 else 0.0)
        return {"all_gather": gathered * w * microbatches, "reduce_scatter": params * g * microbatches,
                "all_reduce": 0.0}
    return {"all_gather": params * w, "reduce_scatter": params * g * (microbatches if zero_stage == 2 else 1),
            "all_reduce": 0.0}
