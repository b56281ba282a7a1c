"""Transformer Engine's ring context parallelism (``cp_algorithm = "ring"``, strategy/cp_te): the eager
copies and merges around each step's attention kernel, counted from ``AttnFuncWithCPAndKVP2P`` (TE 1.11),
averaged over the CP ranks, carried by the lowering's steps and by the search's estimate alike."""

import pytest

from simulator.explore.estimate import estimate
from simulator.pipeline import simulate
from simulator.scenario import scenario_from_dict
from simulator.strategy import cp_te
from simulator.strategy.lower import lower
from test_lower import scn

GQA = {"num_layers": 2, "hidden_size": 256, "num_attention_heads": 8, "num_kv_heads": 2, "vocab_size": 1024,
       "seq_length": 128, "mlp": "swiglu"}
Q, O, KV = 3.0, 5.0, 7.0  # distinct weights, so each closed form checks which tensor a kernel moves


FUSED, FLASH = (False, False), (True, False)  # the half copies at micro-batch 1 (cp_te.half_copies)


def _means(cp, q=Q, o=O, kv=KV, fused=True, copies=FUSED):
    """(forward, backward) bytes of one layer, mean over the cp ranks."""
    fwd = sum(cp_te.forward_bytes(r, i, cp, q, o, kv, copies) for r in range(cp) for i in range(cp)) / cp
    bwd = sum(cp_te.backward_bytes(r, i, cp, q, o, kv, fused, copies) for r in range(cp) for i in range(cp)) / cp
    return fwd, bwd


def test_cp2_counts_as_read_off_the_code():
    """cp 2, per layer, mean of the two ranks (module doc). Fused (sbhd: the half blocks are slices).
    Forward: the K/V concatenation 2 KV, the zero-filled accumulator Q, three full merges (3 O) and one
    half (1.5 O). Backward: K/V into the ring buffer (2 KV per rank); dQ (rank 0: a half copy, then a
    half copy and a half add; rank 1: a copy, then an add); the dK/dV concatenations (2 + 2 KV, 1 + 2
    KV) and their accumulation into the ring buffer (2 + 2.5 KV, 1 + 3 KV). FlashAttention at
    micro-batch 1 (bshd): rank 1's half K/V copied in each pass (KV), no concatenation, its dQ outputs
    zero-filled (rank 0: Q / 2 + Q, rank 1: Q + Q)."""
    fwd, bwd = _means(2)
    assert fwd == pytest.approx(2 * KV + Q + 5.25 * O)
    assert bwd == pytest.approx(9.75 * KV + 4.25 * Q)
    flash_fwd, flash_bwd = _means(2, fused=False, copies=FLASH)
    assert flash_fwd == pytest.approx(fwd + 0.5 * KV)
    assert flash_bwd == pytest.approx(bwd + 0.5 * KV - 3.5 * KV + 1.75 * Q)
    _, two_sequences = _means(2, fused=False, copies=(True, True))  # rank 0's half Q, O, dO copied
    assert two_sequences == pytest.approx(flash_bwd + 0.5 * (Q + 2 * O))


@pytest.mark.parametrize("copies", [FUSED, FLASH, (True, True)])
@pytest.mark.parametrize("cp", [2, 3, 4, 8])
def test_forward_matches_its_closed_form(cp, copies):
    """Rank r: 2 KV + Q once, on each of its r full later steps the half K/V copy (where copied), on
    each of its cp-1-r half ones the half-query copy (where copied), 3 O per full merge (r + 1 of them)
    and 1.5 O per half one."""
    fwd, _ = _means(cp, copies=copies)
    mean_r = (cp - 1) / 2
    want = (2 * KV + Q + mean_r * (KV if copies[0] else 0) + (cp - 1 - mean_r) * (Q if copies[1] else 0)
            + 3 * O * (mean_r + 1) + 1.5 * O * (cp - 1 - mean_r))
    assert fwd == pytest.approx(want)


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_every_rank_writes_all_of_dq_and_moves_the_dkv_buffer_every_step(cp):
    """Each rank's backward writes every half of dQ (a copy or an add: at least 2 Q) and reads or writes
    its dK/dV ring buffer on every step (at least 2 KV each)."""
    for r in range(cp):
        total = sum(cp_te.backward_bytes(r, i, cp, Q, O, KV, True, FUSED) for i in range(cp))
        assert total >= 2 * Q + 2 * KV * cp


def test_the_lowering_carries_one_averaged_work_per_step():
    s = scn(GQA, cp=4, batch=1, cp_algorithm="ring", training={"attention": "cudnn"})
    q, o, kv = cp_te.bytes_of(s)
    assert (q, o, kv) == (32 * 256 * 2, 32 * 256 * 2, 32 * 2 * 64 * 2)  # 32 local tokens, bf16
    g = lower(s).graph
    for phase, forward in (("F", True), ("B", False)):
        first, later = cp_te.step_bytes(s, forward)
        assert first + 3 * later == pytest.approx(_means(4, q, o, kv)[0 if forward else 1])
        steps = [t for t in g.tasks if t.layer == 0 and t.phase == phase and ".core" in t.name]
        extra = [[w.bytes for w in t.work if w.name.startswith("cp_te_")] for t in steps]
        assert extra == [[first], [later], [later], [later]]


@pytest.mark.parametrize("attention", ["flash", "cudnn"])
def test_the_copies_cost_time_and_the_estimate_counts_them_below_the_simulation(attention, monkeypatch):
    """A CP 2 Llama-like step on one H100 node: without TE's copies and merges the step is shorter, and
    the search's lower bound, which takes the same step works, stays under the simulated step."""
    s = scenario_from_dict({"model": {"preset": "llama3-8b", "num_layers": 4, "seq_length": 16384},
                            "cluster": {"preset": "dgx-h100", "num_nodes": 1},
                            "parallelism": {"tp": 2, "cp": 2, "dp": 2, "sequence_parallel": True,
                                            "cp_algorithm": "ring", "zero_stage": 1},
                            "training": {"global_batch_size": 4, "micro_batch_size": 1, "attention": attention}},
                           default_name="te")
    with_copies, bound = simulate(s).metrics["iteration_time_s"], estimate(s).time_lower_bound_s
    assert bound <= with_copies
    monkeypatch.setattr(cp_te, "step_bytes", lambda scn, forward: (0.0, 0.0))
    without, bound_without = simulate(s).metrics["iteration_time_s"], estimate(s).time_lower_bound_s
    assert without < with_copies and bound_without < bound


def test_the_readme_s_llama_8b_figures():
    """README: per layer of Llama 3.1 8B at CP 2 about 0.2 GB forward and 0.3 GB backward."""
    s = scenario_from_dict({"model": {"preset": "llama3.1-8b", "seq_length": 8192},
                            "cluster": {"preset": "dgx-h100", "num_nodes": 1},
                            "parallelism": {"tp": 1, "cp": 2, "dp": 4, "cp_algorithm": "ring"},
                            "training": {"global_batch_size": 128, "micro_batch_size": 1, "attention": "cudnn"}},
                           default_name="llama8b-cp2")
    per_layer = [sum(cp_te.step_bytes(s, forward)) / 1e9 for forward in (True, False)]
    assert [round(x, 1) for x in per_layer] == [0.2, 0.3]
