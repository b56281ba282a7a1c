"""DualPipe's overlapped forward-backward pairs (DeepSeek-V3 technical report §3.2.1, fig. 4; DeepSeek-AI
DualPipe repository, ``_forward_backward_chunk``): which pairs the schedules overlap, how the lowering
interleaves a pair at its all-to-alls, and what that does to the exposed expert-parallel time."""

from __future__ import annotations

import pytest

from simulator.pipeline import simulate
from simulator.scenario import scenario_from_dict
from simulator.strategy.lower import lower
from simulator.strategy.pair_overlap import is_boundary
from simulator.strategy.schedules import overlapped_pairs, schedule_actions


def reference_pairs(p: int, m: int, h: int, hr: int, exception: bool) -> int:
    """``_forward_backward_chunk`` calls of DualPipeV.step / DualPipe.step on one rank: two per step-4
    iteration (m - 2h + hr + 1 of them) but the first one's on the V's last (DualPipe: middle) rank,
    one per step-5 iteration (h - hr - 1)."""
    return 2 * (m - 2 * h + hr + 1) - exception + (h - hr - 1)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 11), (8, 16)])
def test_dualpipe_v_pairs_are_the_reference_forward_backward_chunks(p, m):
    pairs = overlapped_pairs("dualpipe-v", p, m, 2)
    assert len(pairs) == sum(reference_pairs(p, m, p, r, r == p - 1) for r in range(p))
    # the V's last rank (stages p - 1 and p) does not overlap its first step-4 pair: steps 1-2 ran its
    # chunk-0 forwards of micro-batches 0 .. p - 1, so micro-batch p's runs alone, p + 1's opens a pair
    assert (p - 1, p) not in pairs and (p - 1, p + 1) in pairs


@pytest.mark.parametrize("p,m", [(4, 8), (8, 16), (4, 12)])
def test_dualpipe_pairs_are_the_reference_forward_backward_chunks(p, m):
    h = p // 2
    expected = sum(reference_pairs(p, m // 2, h, min(r, p - 1 - r), min(r, p - 1 - r) == h - 1) for r in range(p))
    assert len(overlapped_pairs("dualpipe", p, m, 2)) == expected


@pytest.mark.parametrize("name", ["dualpipe-v", "dualpipe"])
def test_every_paired_forward_is_followed_by_a_backward_on_its_rank(name):
    pairs = overlapped_pairs(name, 4, 8, 2)
    seen = 0
    for row in schedule_actions(name, 4, 8, 2):
        for a, nxt in zip(row, row[1:]):
            if a.phase == "F" and (a.stage, a.microbatch) in pairs:
                assert nxt.phase == "B"
                seen += 1
    assert seen == len(pairs)


def test_other_schedules_overlap_no_pairs():
    assert all(not overlapped_pairs(s, 4, 8, 2 if s in ("zb-v", "interleaved-1f1b") else 1)
               for s in ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble", "zb-h2", "zb-v"))


def moe(schedule: str):
    return scenario_from_dict({
        "name": schedule,
        "model": {"num_layers": 4, "hidden_size": 1024, "num_attention_heads": 8, "num_kv_heads": 8,
                  "vocab_size": 1024, "seq_length": 1024, "mlp": "swiglu", "num_experts": 16, "moe_top_k": 4},
        "cluster": {"preset": "dgx-h100", "num_nodes": 4},
        "parallelism": {"tp": 1, "pp": 2, "dp": 16, "ep": 16, "schedule": schedule, "virtual_stages": 2,
                        "zero_stage": 1},
        "training": {"global_batch_size": 128, "micro_batch_size": 1}})


def test_a_pair_runs_the_other_pass_while_its_all_to_all_is_in_flight():
    scn = moe("dualpipe-v")
    plan = lower(scn)
    g = plan.graph
    g.validate()  # the re-ordered streams still form an acyclic graph
    rank = g.ranks[0]
    compute = g.streams[(rank, "compute")]
    pos = {tid: k for k, tid in enumerate(compute)}
    interleaved = 0
    for t in g.tasks:
        if t.rank != rank or not is_boundary(t) or t.phase != "F":
            continue
        # the forward compute that waits for this all-to-all, and the compute-stream tasks before it
        waiting = [u for u in g.tasks if u.rank == rank and t.id in u.deps and u.id in pos]
        if not waiting:
            continue
        k = pos[waiting[0].id]
        just_before = g.tasks[compute[k - 1]]
        interleaved += just_before.microbatch != t.microbatch and just_before.phase == "B"
    assert interleaved > 0


def test_dualpipe_v_exposes_less_all_to_all_than_zb_v():
    ep = {s: simulate(moe(s)).metrics["busiest_rank"]["time_breakdown_s"]["comm_ep"] for s in ("zb-v", "dualpipe-v")}
    assert ep["dualpipe-v"] < 0.75 * ep["zb-v"]


def test_reorder_tail_sorts_only_the_ranks_tasks_since_the_given_id_stably():
    from simulator.tasks import TaskGraphBuilder

    b = TaskGraphBuilder()
    early = b.add("early", "compute", 0, "compute", "compute")
    f1 = b.add("f1", "compute", 0, "compute", "compute", (early,))
    other = b.add("other", "compute", 1, "compute", "compute")
    f2 = b.add("f2", "compute", 0, "compute", "compute", (f1,))
    b1 = b.add("b1", "compute", 0, "compute", "compute")
    b2 = b.add("b2", "compute", 0, "compute", "compute", (b1,))
    key = {f1: (0, 0), f2: (1, 0), b1: (0, 1), b2: (1, 1)}
    b.reorder_tail(0, f1, key.__getitem__)
    assert b.stream_ids(0, "compute") == (early, f1, b1, f2, b2)  # F0 B0 F1 B1, "early" untouched
    assert b.stream_ids(1, "compute") == (other,)  # another rank's stream untouched
    g = b.build((0, 1), True)
    g.validate()


def test_one_stage_runs_1f1b_without_pairs_whatever_schedule_the_scenario_names():
    """pp = 1 runs plain 1F1B (stage_units.stage_layout): DualPipeV's pairs do not apply, and the
    lowered streams are 1F1B's (a pair there would run a backward before its own forward)."""
    def streams(schedule: str, v: int):
        raw = {"model": {"num_layers": 4, "hidden_size": 1024, "num_attention_heads": 8, "vocab_size": 1024,
                         "seq_length": 1024, "mlp": "swiglu", "num_experts": 8, "moe_top_k": 2},
               "cluster": {"preset": "dgx-h100", "num_nodes": 1},
               "parallelism": {"tp": 1, "pp": 1, "dp": 8, "ep": 8, "schedule": schedule, "virtual_stages": v},
               "training": {"global_batch_size": 64, "micro_batch_size": 1}}
        g = lower(scenario_from_dict(raw)).graph
        return {k: [g.tasks[i].name for i in ids] for k, ids in g.streams.items()}
    assert streams("dualpipe-v", 2) == streams("1f1b", 1)
