"""PyTorch's context parallelism as torchtitan runs it (``cp_algorithm = "torch-allgather"``,
strategy/cp_torch): K/V repeated to every query head and all-gathered once per pass beside step 0, the
fp32 dK/dV accumulators one hop round the ring after every backward step, and the bytes of the merge
and accumulate kernels around the SDPA calls."""

from simulator.pipeline import simulate
from simulator.strategy.cp_torch import step_bytes
from simulator.strategy.lower import lower
from test_lower import comms, scn

# GQA: 8 query heads, 2 K/V heads of 32 (torchtitan repeats K/V 4x before SDPA)
GQA = {"num_layers": 2, "hidden_size": 256, "num_attention_heads": 8, "num_kv_heads": 2, "vocab_size": 1024,
       "seq_length": 128, "mlp": "swiglu"}
CP = 4
N = (128 // CP) * 256  # elements of one rank's K block with every query head


def _graph():
    return lower(scn(GQA, cp=CP, batch=1, cp_algorithm="torch-allgather")).graph


def _steps(g, phase):
    return [t for t in g.tasks if t.layer == 0 and t.phase == phase and ".core" in t.name]


def test_kv_is_gathered_repeated_to_every_query_head_beside_step_zero():
    g = _graph()
    gathers = [t for t in comms(g, "all_gather", "cp") if t.layer == 0]
    assert [t.phase for t in gathers] == ["F", "B"]
    assert {t.comm.size_bytes for t in gathers} == {2 * N * 2 * CP}  # K and V, bf16, the whole sequence
    assert {t.stream for t in gathers} == {"comm_cp"}
    for gather in gathers:
        steps = _steps(g, gather.phase)
        assert len(steps) == CP
        assert gather.id not in steps[0].deps and set(gather.deps) == set(steps[0].deps)  # concurrent
        assert gather.id in steps[1].deps  # the later steps read the gathered buffer


def test_the_backward_passes_the_fp32_dkv_accumulators_round_the_ring():
    g = _graph()
    by_id = {t.id: t for t in g.tasks}
    hops = [t for t in comms(g, "send_recv", "cp", "B") if t.layer == 0]
    assert len(hops) == CP and {t.comm.size_bytes for t in hops} == {8 * N}
    assert {t.comm.group for t in hops} == {(CP - 1, 0)}  # rank 0's task: the hop it receives from the last
    steps = _steps(g, "B")
    for j in range(1, CP):  # step j's accumulate waits for the hop of step j - 1, its SDPA does not
        wait = by_id[hops[j].deps[0]]
        assert set(wait.deps) == {steps[j].id, hops[j - 1].id}
    last = [t for t in g.tasks if t.layer == 0 and t.name.endswith(".cp_dkv_wait")]
    assert len(last) == 1 and hops[-1].id in last[0].deps
    assert not comms(g, "reduce_scatter", "cp")  # no reduce-scatter: the ring carries the gradients


def test_each_step_carries_its_merge_or_accumulate_bytes():
    """Per element N of the local repeated K block (cp_torch module doc): forward 14 + 26.5 per later
    step + 8 per K/V copy of all but the last step + 6 at the end; backward 66 + 50.5 + 8, + 18."""
    assert sum(step_bytes(j, CP, True) for j in range(CP)) == 14 + 3 * 26.5 + 2 * 8 + 6
    assert sum(step_bytes(j, CP, False) for j in range(CP)) == 66 + 3 * 50.5 + 2 * 8 + 18
    g = _graph()
    for phase, forward in (("F", True), ("B", False)):
        for j, t in enumerate(_steps(g, phase)):
            extra = [w for w in t.work if w.name in ("cp_merge", "cp_grad_accumulate")]
            assert len(extra) == 1 and extra[0].bytes == step_bytes(j, CP, forward) * N


def test_the_step_costs_at_least_the_all_gather_variant_s_kernels():
    """Same compute (the attention split in cp equal steps), more bytes moved and more kernels: never
    faster than Llama 3's blocking all-gather of the un-repeated K/V on one NVLink node."""
    t = {alg: simulate(scn(GQA, cp=CP, batch=1, cp_algorithm=alg)).metrics["iteration_time_s"]
         for alg in ("all-gather", "torch-allgather")}
    assert t["torch-allgather"] > t["all-gather"]
