"""PyTorch FSDP1 (``FullyShardedDataParallel``): the kernels it runs around its collectives, per unit.

Read from torch 2.1.0's torch/distributed/fsdp (the version llm-foundry pinned in Jan 2024,
``torch>=2.1,<2.1.1``; the FSDP1 code paths below are unchanged from 2.0 to 2.3). One FSDP unit holds
its parameters in one flat parameter; the module's parameters are views of it (``flat_param.py``
``FlatParamHandle._get_unflat_views_unaligned``: ``torch.split`` of the flat parameter, then ``view``).

Per unit and micro-batch, once the unit's backward has produced every gradient:

- flatten: autograd's backward of that ``split`` (``split_with_sizes_backward``, a ``cat``) copies
  the views' gradients into one unsharded flat gradient in the parameter dtype, on the compute
  stream, before ``AccumulateGrad`` runs FSDP's post-backward hook (read + write, dtype bytes each).
- ``_runtime_utils._post_backward_hook``: when the gradient's dtype is not
  ``MixedPrecision.reduce_dtype`` it is cast (``flat_param.grad.to(handle._reduce_dtype)``: Composer's
  mixed precision DEFAULT reduces in fp32 from bf16 parameters, PURE in bf16);
- ``_reduce_grad``: ``_div_if_needed(padded_unsharded_grad, gradient_predivide_factor)``, an in-place
  ``div_`` of the whole unsharded gradient when the factor exceeds 1
  (``gradient_predivide_factor``), then ``reduce_scatter_tensor``, then the same ``div_`` of the
  reduced shard by the postdivide factor; ``_accumulate_sharded_grad`` casts the shard to the
  (fp32) parameter dtype when the reduction ran in another (``_cast_grad_to_param_dtype``) and adds it
  to the shard kept from earlier micro-batches (``flat_param._saved_grad_shard += sharded_grad``).
  ``F.pad`` copies the gradient first only when the unit's size is not a multiple of the world size;
  Composer's default ``use_orig_params=True`` pads the flat parameter to one at construction
  (``flat_param.py``: "Pad to be divisible by world size to avoid a copy for the post-backward
  reduce-scatter"), so that copy is not charged.

These run on FSDP's post-backward stream (all but the flatten). Each is an elementwise kernel that
fills every SM with blocks, as do the backward GEMMs issued beside it on the compute stream, whose
CTAs leave no room on an SM for another kernel's (a tensor-core tile's shared memory), so the two
streams take turns on the SMs: the lowering charges them in sequence on the compute stream, before the
unit's reduce-scatter (``grad_sync.zero3_reduce``); the shard-sized ones after the collective in the
real program are charged there too (1/world_size of the unsharded traffic).

Before each all-gather, ``FlatParamHandle.pre_unshard`` casts the fp32 shard to the parameter dtype
(``_use_low_precision_shard``: ``_mp_shard.copy_(_local_shard)``) on the unshard stream, every unshard
(``_free_low_precision_sharded_param`` frees it after the gather): ``unshard_work``.

All collectives of one process group run in issue order on ProcessGroupNCCL's one NCCL stream per
device (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, ``ncclStreams_`` keyed by the device), and
FSDP1 issues its all-gathers and reduce-scatters on ``state.process_group``: they share one stream.
"""

from __future__ import annotations

from ..tasks import OpWork
from ..units import DTYPE_BYTES

MASTER_BYTES = DTYPE_BYTES["fp32"]  # FSDP1 keeps the sharded flat parameter in fp32 with mixed precision


def gradient_predivide_factor(world_size: int) -> int:
    """torch.distributed.algorithms._comm_hooks.default_hooks.DefaultState._get_gradient_predivide_factor
    (used by fsdp/_init_utils for the data-parallel world size): the largest power of two f dividing
    the world size with f <= world_size / f, so that the sum is divided in two halves (pre and post)."""
    factor = 1
    while world_size % factor == 0 and world_size / factor > factor:
        factor *= 2
    return factor


def post_backward_work(params: float, shard_ranks: int, dtype_bytes: int, reduce_bytes: int,
                       accumulate: bool, dp_ranks: int = 0) -> tuple[OpWork, ...]:
    """The elementwise kernels FSDP1 runs for one unit's gradient of ``params`` elements (the unit's
    unsharded size on this rank) reduce-scattered over ``shard_ranks`` ranks in ``reduce_bytes`` per
    element, from parameters of ``dtype_bytes``; ``accumulate``: a shard from an earlier micro-batch
    of this step exists. The divide factors follow the data-parallel world size ``dp_ranks`` (HSDP:
    shard group x replicas; 0: the shard group). Bytes are read + written per kernel (module
    docstring)."""
    if params <= 0:
        return ()
    n, shard = int(params), params / shard_ranks
    world = dp_ranks or shard_ranks
    pre = gradient_predivide_factor(world)
    post = world / pre
    work = [OpWork("fsdp1_grad_flatten", "elementwise", 0.0, 2 * dtype_bytes * params, (n, 1))]
    if reduce_bytes != dtype_bytes:
        work.append(OpWork("fsdp1_grad_cast", "elementwise", 0.0, (dtype_bytes + reduce_bytes) * params, (n, 1)))
    if pre > 1:
        work.append(OpWork("fsdp1_grad_predivide", "elementwise", 0.0, 2 * reduce_bytes * params, (n, 1)))
    if post > 1:
        work.append(OpWork("fsdp1_grad_postdivide", "elementwise", 0.0, 2 * reduce_bytes * shard, (int(shard), 1)))
    if reduce_bytes != MASTER_BYTES:
        work.append(OpWork("fsdp1_grad_shard_cast", "elementwise", 0.0, (reduce_bytes + MASTER_BYTES) * shard,
                           (int(shard), 1)))
    if accumulate:
        work.append(OpWork("fsdp1_grad_accumulate", "elementwise", 0.0, 3 * MASTER_BYTES * shard, (int(shard), 1)))
    return tuple(work)


def unshard_work(params: float, world_size: int, dtype_bytes: int) -> tuple[OpWork, ...]:
    """The cast of this rank's fp32 shard of a unit of ``params`` elements to the ``dtype_bytes``
    parameter dtype before its all-gather (``_use_low_precision_shard``); none without mixed precision."""
    if params <= 0 or dtype_bytes == MASTER_BYTES:
        return ()
    shard = params / world_size
    return (OpWork("fsdp1_shard_cast", "elementwise", 0.0, (MASTER_BYTES + dtype_bytes) * shard, (int(shard), 1)),)
