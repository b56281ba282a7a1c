"""TP communication overlapped with its GEMMs (tp_comm_overlap): the closed forms of the two userbuffers
methods, and a step with overlap between compute alone and the unoverlapped step."""

import dataclasses

import pytest

from simulator.cost.tp_overlap import (aggregated_ring_exchange_s, exposed_comm_s, pipelined_s, ring_exchange_s,
                                       scattered_ring_exchange_s)
from simulator.pipeline import simulate
from simulator.scenario import ScenarioError, scenario_from_dict
from simulator.strategy.lower import lower
from simulator.strategy.ub_config import SITES, load_ub_config

NEMO_70B = "userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192"

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


def test_pipelined_closed_form_exposes_the_first_chunk_and_the_last_transfer():
    # 4 splits of a 2.0 s reduce-scatter under 2.0 s chunks (the GEMM on the SMs the kernel leaves)
    assert pipelined_s(2.0, 4, chunk_s=2.0) == pytest.approx(2.0 + 3 * 2.0 + 0.5)
    assert pipelined_s(12.0, 4, chunk_s=1.0) == pytest.approx(1.0 + 3 * 3.0 + 3.0)  # transfer-bound


def test_aggregated_ring_exchange_closed_form():
    # tp 8: one exposed transfer (1/7 of the collective), then 4 steps of two-chunk GEMMs (1/4 each)
    # waiting on two-chunk transfers
    assert aggregated_ring_exchange_s(8.0, 7.0, 8) == pytest.approx(1.0 + 3 * max(2.0, 2.0) + 2.0)
    assert aggregated_ring_exchange_s(8.0, 14.0, 8) == pytest.approx(2.0 + 3 * 4.0 + 2.0)
    assert aggregated_ring_exchange_s(4.0, 1.0, 2) == pytest.approx(1.0 + 4.0)  # tp 2: swap, then the GEMM
    assert aggregated_ring_exchange_s(4.0, 1.0, 1) == 4.0


def test_scattered_ring_exchange_closed_form():
    # tp 4: the first chunk, then three chunks each beside the previous chunk's transfer, then the sum
    assert scattered_ring_exchange_s(8.0, 3.0, 4, reduce_s=0.25) == pytest.approx(2.0 + 3 * 2.0 + 0.25)
    assert scattered_ring_exchange_s(8.0, 9.0, 4) == pytest.approx(2.0 + 3 * 3.0)
    assert scattered_ring_exchange_s(8.0, 9.0, 1) == 8.0


@pytest.mark.parametrize("config", ["te1-default", "te2-default", NEMO_70B])
@pytest.mark.parametrize("site", SITES[:6])
@pytest.mark.parametrize("gemm_s,comm_s", [(1.0, 0.01), (1.0, 0.5), (1.0, 3.0), (0.01, 1.0)])
def test_exposed_time_is_between_zero_and_the_whole_collective(config, site, gemm_s, comm_s):
    s = load_ub_config(config).site(site)
    for chunk_s in (gemm_s / 8, gemm_s / 4, gemm_s):
        e = exposed_comm_s(site, s, gemm_s, comm_s, 8, chunk_s, reduce_s=0.1 * comm_s)
        assert 0.0 <= e <= comm_s


def test_overlap_needs_sequence_parallelism():
    with pytest.raises(ScenarioError, match="tp_comm_overlap needs sequence_parallel"):
        scenario(True, sequence_parallel=False)


def test_overlap_tags_the_six_chunked_and_four_bulk_collectives_of_a_dense_layer():
    graph = lower(scenario(True)).graph
    sites = sorted({t.comm.overlap[0] for t in graph.tasks if t.kind == "comm" and t.comm.overlap})
    assert sites == sorted(SITES)
    assert not any(t.comm.overlap for t in lower(scenario(False)).graph.tasks if t.kind == "comm")


def test_a_step_with_overlap_lies_between_compute_alone_and_no_overlap():
    """With a tuned configuration (NeMo's, whose recipes enable overlap where it pays)."""
    plain, over = simulate(scenario(False)).metrics, simulate(scenario(True, tp_comm_overlap_cfg=NEMO_70B)).metrics
    # what overlaps leaves the busiest rank: here the chunks' transfers outlast their GEMM chunks, so
    # the GEMM hides behind the transfers (compute shrinks) rather than the transfers behind the GEMM
    exposed = [m["time_breakdown_s"]["compute"] + m["time_breakdown_s"]["comm_tp"] for m in (plain, over)]
    assert over["time_breakdown_s"]["comm_tp"] <= plain["time_breakdown_s"]["comm_tp"] + 1e-12
    assert exposed[1] < exposed[0]
    assert over["iteration_time_s"] < plain["iteration_time_s"]
    # never faster than the same step with every TP collective removed
    assert over["iteration_time_s"] >= plain["iteration_time_s"] - plain["time_breakdown_s"]["comm_tp"] - 1e-9


@pytest.mark.parametrize("defaults", ["te1-default", "te2-default"])
def test_te_defaults_hold_their_sms_and_can_cost_a_small_model_more_than_they_hide(defaults):
    """TE's untuned defaults hold 16 SMs at every bulk and pipeline site (TE 1.x: the pipeline's GEMM chunks
    chosen for the whole GPU, TE 2.x: for the 116 SMs left): on this small model's GEMMs that costs more
    than the overlap hides, and the step is slower than without overlap, yet never faster than compute alone."""
    plain, te = simulate(scenario(False)).metrics, simulate(scenario(True, tp_comm_overlap_cfg=defaults)).metrics
    nemo = simulate(scenario(True, tp_comm_overlap_cfg=NEMO_70B)).metrics
    assert nemo["iteration_time_s"] < plain["iteration_time_s"] < te["iteration_time_s"]
    assert te["time_breakdown_s"]["compute"] > nemo["time_breakdown_s"]["compute"]
    assert te["iteration_time_s"] >= plain["iteration_time_s"] - plain["time_breakdown_s"]["comm_tp"] - 1e-9


def test_chunked_closed_forms_take_the_chunks_own_time():
    # ring exchange with a chunk 1.5x its share (its own waves): 3 waits on max(chunk, transfer), then the chunk
    assert ring_exchange_s(8.0, 3.0, 4, chunk_s=3.0) == pytest.approx(3 * 3.0 + 3.0)
    assert ring_exchange_s(8.0, 3.0, 4) == pytest.approx(8.0)  # default: gemm / tp, compute-bound
    assert pipelined_s(2.0, 4, chunk_s=2.5) == pytest.approx(2.5 + 3 * 2.5 + 0.5)


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
    s = load_ub_config(scn.parallel.tp_comm_overlap_cfg).site(site)
    exposed = min(comm_s, overlapped_s(site, s, gemm_s, comm_s, 4, chunk_s) - gemm_s)
    assert cost.duration_s(task) == pytest.approx(max(0.0, exposed), rel=1e-12)


# Llama 3.1 70B's layer shape at sequence 8192: GEMMs long enough to hide their TP collectives
BIG = {"num_layers": 1, "hidden_size": 8192, "num_attention_heads": 64, "num_kv_heads": 8,
       "ffn_hidden_size": 28672, "vocab_size": 8192, "seq_length": 8192, "mlp": "swiglu"}


def big(**par):
    return scenario_from_dict({"model": dict(BIG), "cluster": {"preset": "dgx-h100", "num_nodes": 1},
                               "parallelism": {"tp": 4, "pp": 1, "dp": 2, "sequence_parallel": True,
                                               "tp_comm_overlap": True, **par},
                               "training": {"global_batch_size": 2}})


def _site_task(scn, site):
    from simulator.cost.model import CostModel
    from simulator.hardware.topology import build_topology
    plan = lower(scn)
    cost = CostModel(scn, build_topology(scn.cluster))
    task = next(t for t in plan.graph.tasks if t.kind == "comm" and t.comm.overlap and t.comm.overlap[0] == site)
    comm_s = cost.isolated_s(task._replace(comm=dataclasses.replace(task.comm, overlap=())))
    return cost, task, comm_s


def _chunk(gemm, parts):
    from simulator.cost.compute import gemm_shape
    m, n, k = gemm_shape(gemm)
    return dataclasses.replace(gemm, flops=gemm.flops / parts, bytes=gemm.bytes / parts, shape=(-(-m // parts), n, k))


def _table(tmp_path, text):
    path = tmp_path / "ub.toml"
    path.write_text(text)
    return str(path)


def test_an_aggregated_ring_exchange_runs_tp_half_steps_of_two_chunk_gemms(tmp_path):
    cfg = _table(tmp_path, '[qkv_fprop]\nmethod = "ring_exchange"\naggregate = true\n')
    cost, task, comm_s = _site_task(big(tp_comm_overlap_cfg=cfg), "qkv_fprop")
    gemm = task.comm.overlap[1]
    gemm_s, chunk_s = cost.roofline.op_time_s(gemm), cost.roofline.op_time_s(_chunk(gemm, 2))  # tp 4: 2 steps
    expected = aggregated_ring_exchange_s(gemm_s, comm_s, 4, chunk_s) - gemm_s
    assert 0 < expected < comm_s  # neither bound decides: the closed form does
    assert cost.duration_s(task) == pytest.approx(expected, rel=1e-12)


def test_a_ring_exchange_reduce_scatter_pays_the_sum_of_the_received_chunks(tmp_path):
    from simulator.tasks import OpWork
    cfg = _table(tmp_path, '[proj_fprop]\nmethod = "ring_exchange"\nnum_sm = 1\nset_sm_margin = true\n')
    cost, task, comm_s = _site_task(big(tp_comm_overlap_cfg=cfg), "proj_fprop")
    gemm, size = task.comm.overlap[1], task.comm.size_bytes
    gemm_s = cost.roofline.op_time_s(gemm)
    chunk_s = cost.roofline.on_sms(131, chosen_for_them=True).op_time_s(_chunk(gemm, 4))  # one SM of margin
    sum_s = cost.roofline.op_time_s(OpWork("s", "elementwise", 0.0, size * 5 / 4, (int(size * 5 / 4), 1)))
    assert sum_s > 0
    expected = scattered_ring_exchange_s(gemm_s, comm_s, 4, chunk_s, sum_s) - gemm_s
    assert 0 < expected < comm_s and sum_s < expected
    assert cost.duration_s(task) == pytest.approx(expected, rel=1e-12)


def test_a_pipeline_without_sm_margin_runs_a_whole_gpu_kernel_on_the_sms_left():
    """set_sm_margin tells cuBLAS the SMs left (TE 2.x's default); without it (TE 1.x) the chunk's kernel is
    chosen for all 132 SMs and its waves spill onto the 116 the pipeline's kernel leaves: here that costs
    more than the collective it hides, and the site is charged the collective (the cap)."""
    times = {}
    for margin, name in ((True, "te2-default"), (False, "te1-default")):
        cost, task, comm_s = _site_task(big(tp_comm_overlap_cfg=name), "fc2_fprop")
        gemm = task.comm.overlap[1]
        chunk_s = cost.roofline.on_sms(116, chosen_for_them=margin).op_time_s(_chunk(gemm, 4))
        times[margin] = pipelined_s(comm_s, 4, chunk_s) - cost.roofline.op_time_s(gemm)
        assert cost.duration_s(task) == pytest.approx(min(comm_s, times[margin]), rel=1e-12)
    assert 0 < times[True] < comm_s < times[False]


def test_a_bulk_site_holds_its_sms_or_nccls_channels(tmp_path):
    te = _site_task(scenario(True, tp_comm_overlap_cfg="te1-default"), "qkv_wgrad")
    assert te[0].kernel_ctas(te[1]) == 16
    cfg = _table(tmp_path, '[qkv_wgrad]\nmethod = "nccl"\n')
    cost, task, _ = _site_task(scenario(True, tp_comm_overlap_cfg=cfg), "qkv_wgrad")
    assert cost.kernel_ctas(task) == cost._collective_ctas(task) > 0  # NCCL's CTAs, as an unoverlapped collective
    chunked = _site_task(scenario(True), "qkv_fprop")
    assert chunked[0].kernel_ctas(chunked[1]) == 0  # charged inside the overlapped pair
