"""The embedding table's dense weight gradient (strategy/embed_grad): PyTorch's dense embedding backward
zero-fills the rank's whole table gradient (every framework); Megatron-Core's DDP hook adds it into the
main_grad every micro-batch; tied to the output layer on one stage, the output layer's zero dummy wgrad
joins it first. Closed forms per rank and micro-batch."""

import pytest

from simulator.scenario import scenario_from_dict
from simulator.strategy.embed_grad import embedding_grad_bytes_per_param, weight_grad_bytes
from simulator.strategy.lower import lower

MODEL = {"num_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 1000, "seq_length": 128}
V, H, S = 1000, 256, 128


def _scn(model=MODEL, **par):
    p = {"tp": 2, "dp": 2, **par}
    return scenario_from_dict({"model": dict(model), "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1,
                                                                 "gpus_per_node": p["tp"] * p["dp"] * p.get("pp", 1)},
                               "parallelism": p, "training": {"global_batch_size": 4, "micro_batch_size": 1}})


def _dense_grad(scn):
    tasks = [t for t in lower(scn).graph.tasks if t.rank == 0 and t.name.endswith("embed")]
    works = [w for t in tasks for w in t.work if w.name == "embed_grad"]
    return works


def test_the_bytes_per_parameter_by_framework():
    d, g = 2, 4
    assert embedding_grad_bytes_per_param(d, g, main_grad=False, tied_on_one_stage=True) == d  # zero-fill only
    assert embedding_grad_bytes_per_param(d, g, main_grad=True, tied_on_one_stage=False) == d + d + 2 * g
    assert embedding_grad_bytes_per_param(d, g, main_grad=True, tied_on_one_stage=True) == d + d + 2 * g + 4 * d


@pytest.mark.parametrize("par, per_param", [
    ({}, 2 + 2 + 2 * 4 + 4 * 2),  # Megatron-Core (ZeRO-1 default), GPT-style tied table, pp 1, fp32 main_grad
    ({"pp": 2, "dp": 1}, 2 + 2 + 2 * 4),  # the pipeline's first stage holds its own copy of the table
    ({"zero_stage": 3, "sharding": "fsdp2"}, 2),  # FSDP: the zero-fill; the gradient is reduce-scattered
])
def test_each_micro_batch_pays_the_rank_s_table(par, per_param):
    scn = _scn(**par)
    assert weight_grad_bytes(scn)[1] == per_param
    works = _dense_grad(scn)
    assert len(works) == 4 // scn.parallel.dp  # one per micro-batch of rank 0 (the first stage)
    table = (V // 2) * H + S * H  # VocabParallelEmbedding's half of the vocabulary, the learned position table whole
    assert {w.bytes for w in works} == {table * per_param}
    assert all(w.backward and w.kind == "elementwise" for w in works)
