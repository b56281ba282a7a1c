"""TP communication overlapped with its GEMMs (tp_comm_overlap): the closed forms of the two userbuffers
methods, and a step with overlap between compute alone and the unoverlapped step."""

import dataclasses

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
    # what overlaps leaves the busiest rank: here the chunks' transfers outlast their GEMM chunks, so
    # the GEMM hides behind the transfers (compute shrinks) rather than the transfers behind the GEMM
    exposed = [m["time_breakdown_s"]["compute"] + m["time_breakdown_s"]["comm_tp"] for m in (plain, over)]
    assert over["time_breakdown_s"]["comm_tp"] <= plain["time_breakdown_s"]["comm_tp"] + 1e-12
    assert exposed[1] < exposed[0]
    assert over["iteration_time_s"] < plain["iteration_time_s"]
    # never faster than the same step with every TP collective removed
    assert over["iteration_time_s"] >= plain["iteration_time_s"] - plain["time_breakdown_s"]["comm_tp"] - 1e-9


def test_chunked_closed_forms_take_the_chunks_own_time():
    # ring exchange with a chunk 1.5x its share (its own waves): 3 waits on max(chunk, transfer), then the chunk
    assert ring_exchange_s(8.0, 3.0, 4, chunk_s=3.0) == pytest.approx(3 * 3.0 + 3.0)
    assert ring_exchange_s(8.0, 3.0, 4) == pytest.approx(8.0)  # default: gemm / tp, compute-bound
    assert pipelined_s(6.0, 2.0, 4, 33, 132, chunk_s=2.5) == pytest.approx(2.5 + 3 * 2.5 + 0.5)


def test_a_ring_exchange_site_charges_its_chunks_waves():
    """TE splits the all-gathered GEMM along the sequence into tp chunks (userbuffers ring exchange):
    each chunk is a GEMM of m/tp rows with its own wave quantization, so the overlapped pair costs the
    chunks' time, not the whole GEMM's share; the collective task carries the difference."""
    from simulator.cost.compute import gemm_shape
    from simulator.cost.model import CostModel
    from simulator.cost.tp_overlap import overlapped_s
    from simulator.hardware.topology import build_topology
    scn = scenario(True)
    plan = lower(scn)
    cost = CostModel(scn, build_topology(scn.cluster))
    task = next(t for t in plan.graph.tasks if t.kind == "comm" and t.comm.overlap
                and t.comm.overlap[0] == "qkv_fprop")
    site, gemm = task.comm.overlap
    m, n, k = gemm_shape(gemm)
    chunk = dataclasses.replace(gemm, flops=gemm.flops / 4, bytes=gemm.bytes / 4, shape=(m // 4, n, k))
    gemm_s = cost.roofline.op_time_s(gemm)
    chunk_s = cost.roofline.op_time_s(chunk)
    assert chunk_s > gemm_s / 4  # fewer tiles per wave: the chunk runs below the whole GEMM's rate
    comm_s = cost.isolated_s(task._replace(comm=dataclasses.replace(task.comm, overlap=())))
    exposed = min(comm_s, overlapped_s(site, gemm_s, comm_s, 4, 132, chunk_s) - gemm_s)
    assert cost.duration_s(task) == pytest.approx(max(0.0, exposed), rel=1e-12)
