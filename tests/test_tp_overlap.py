"""TP communication overlapped with its GEMMs (tp_comm_overlap): the closed forms of the two userbuffers
methods, and a step with overlap between compute alone and the unoverlapped step."""

import pytest

from simulator.cost.tp_overlap import BULK_SITES, UB_SITES, exposed_comm_s, pipelined_s, ring_exchange_s
from simulator.pipeline import simulate
from simulator.scenario import ScenarioError, scenario_from_dict
from simulator.strategy.lower import lower

LLAMA = {"num_layers": 4, "hidden_size": 2048, "num_attention_heads": 16, "num_kv_heads": 4,
         "ffn_hidden_size": 5632, "vocab_size": 8192, "seq_length": 2048, "mlp": "swiglu"}


def scenario(overlap: bool, **par):
    p = {"tp": 4, "pp": 1, "dp": 2, "sequence_parallel": True, "tp_comm_overlap": overlap, **par}
    return scenario_from_dict({"model": dict(LLAMA), "parallelism": p,
                               "cluster": {"preset": "dgx-h100", "num_nodes": 1},
                               "training": {"global_batch_size": 8}})


def test_ring_exchange_closed_form():
    # communication-bound: the tp-1 transfers plus the last chunk's GEMM
    assert ring_exchange_s(gemm_s=4.0, comm_s=9.0, tp=4) == pytest.approx(9.0 + 1.0)
    # compute-bound: the GEMM alone
    assert ring_exchange_s(gemm_s=8.0, comm_s=3.0, tp=4) == pytest.approx(8.0)
    assert ring_exchange_s(gemm_s=8.0, comm_s=3.0, tp=1) == 8.0


def test_pipelined_closed_form_charges_the_sms_the_collective_holds():
    # 4 splits, 33 of 132 SMs held: the GEMM runs at 3/4 speed; first chunk and last transfer exposed
    g = 6.0 * 132 / 99 / 4
    assert pipelined_s(6.0, 2.0, 4, 33, 132) == pytest.approx(g + 3 * max(g, 0.5) + 0.5)


@pytest.mark.parametrize("site", sorted(UB_SITES))
@pytest.mark.parametrize("gemm_s,comm_s", [(1.0, 0.01), (1.0, 0.5), (1.0, 3.0), (0.01, 1.0)])
def test_exposed_time_is_between_zero_and_the_whole_collective(site, gemm_s, comm_s):
    e = exposed_comm_s(site, gemm_s, comm_s, 8, 132)
    assert 0.0 <= e <= comm_s


def test_overlap_needs_sequence_parallelism():
    with pytest.raises(ScenarioError, match="tp_comm_overlap needs sequence_parallel"):
        scenario(True, sequence_parallel=False)


def test_overlap_tags_the_six_chunked_and_four_bulk_collectives_of_a_dense_layer():
    graph = lower(scenario(True)).graph
    sites = sorted({t.comm.overlap[0] for t in graph.tasks if t.kind == "comm" and t.comm.overlap})
    assert sites == sorted(set(UB_SITES) | set(BULK_SITES))
    assert not any(t.comm.overlap for t in lower(scenario(False)).graph.tasks if t.kind == "comm")


def test_a_step_with_overlap_lies_between_compute_alone_and_no_overlap():
    plain, over = simulate(scenario(False)).metrics, simulate(scenario(True)).metrics
    assert over["time_breakdown_s"]["comm_tp"] < plain["time_breakdown_s"]["comm_tp"]
    assert over["iteration_time_s"] < plain["iteration_time_s"]
    # never faster than the same step with every TP collective removed
    assert over["iteration_time_s"] >= plain["iteration_time_s"] - plain["time_breakdown_s"]["comm_tp"] - 1e-9
