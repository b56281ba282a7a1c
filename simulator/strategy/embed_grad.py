"""The embedding table's dense weight gradient: what a backward moves besides the looked-up rows.

The op graph's embedding backward (``model/opgraph._embed_ops``) scatter-adds the tokens' rows. Around
that, per micro-batch and per parameter of the rank's table:

- PyTorch's dense embedding backward (``embedding_dense_backward``; the indexing backward of
  Megatron-Core's deterministic mode alike) zero-fills the whole table's gradient before it accumulates
  the rows: d bytes, in every framework (d: the table's dtype).
- With Megatron-Core's gradient buffers (sharding "megatron-distopt"), the DDP hook adds that gradient
  into the main_grad buffer every micro-batch (distributed_data_parallel.py
  ``_make_backward_post_hook``; gradient-accumulation fusion covers the Linear layers' weight
  gradients only): read d, read and write the buffer, d + 2g (g: the gradient dtype).
- When the table is tied to the output layer on the same stage (pp = 1), the output layer's fused
  weight gradient hands autograd a zero-filled dummy (``zero_out_wgrad``, which language_module.py sets
  for exactly that case), which autograd sums with the lookup's gradient before the hook: write d, then
  read 2d and write d, 4d.

A weight gradient, it runs in the embedding's W (zero-bubble schedules defer it with the others).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..model.opgraph import OpGraph
from ..tasks import OpWork
from .sharding import embedding_params_per_rank, grad_accumulation_bytes_per_param

if TYPE_CHECKING:  # scenario is this layer's reader and imports strategy: a type-only import
    from ..scenario import Scenario


def embedding_grad_bytes_per_param(dtype_bytes: int, grad_dtype_bytes: int, main_grad: bool,
                                   tied_on_one_stage: bool) -> float:
    """HBM bytes per table parameter and micro-batch (module doc)."""
    out = float(dtype_bytes)
    if main_grad:
        out += dtype_bytes + 2 * grad_dtype_bytes + (4 * dtype_bytes if tied_on_one_stage else 0)
    return out


def weight_grad_bytes(scn: Scenario) -> tuple[float, float]:
    """(the Linear layers' unfused gradient accumulation, ``sharding.grad_accumulation_bytes_per_param``;
    the embedding table's dense gradient, ``embedding_grad_bytes_per_param``) of a scenario, in bytes
    per parameter and micro-batch: the rule the lowering and the estimate share."""
    t, p = scn.training, scn.parallel
    return (grad_accumulation_bytes_per_param(t.grad_accumulation_fusion, t.grad_dtype_bytes, t.dtype_bytes),
            embedding_grad_bytes_per_param(t.dtype_bytes, t.grad_dtype_bytes, p.sharding == "megatron-distopt",
                                           bool(scn.model.tie_embeddings) and p.pp == 1))


def embedding_grad_work(graph: OpGraph, tp: int, bytes_per_param: float) -> tuple[OpWork, ...]:
    """The kernels of the module doc on one rank, as one memory-bound work ``embed_grad`` (none without
    a table): fills and adds over the whole table, elementwise kernels (calibrated tables price them by
    their elementwise rows, not by the embedding's per-token gather and scatter-add)."""
    params = embedding_params_per_rank(graph, tp) if graph.embed else 0
    if not params or not bytes_per_param:
        return ()
    return (OpWork("embed_grad", "elementwise", 0.0, params * bytes_per_param, (params, 1), backward=True),)
