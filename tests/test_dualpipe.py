"""DualPipe (DeepSeek-V3 technical report sec. 3.2.1, fig. 5 and table 2; DeepSeek-AI DualPipe repository
``dualpipe.py``): the exact action grid, its mirror symmetry and cut-in-half relation to DualPipeV, the
table's bubble with F, B, W of a tiny model, the simulated timeline (a dense model's overlapped pairs
run F then B on the compute stream; MoE pairs interleave, tests/test_pair_overlap.py), 2x parameters
and PP + 1 activations, the copies' gradient all-reduce, and the refusals (even pp, even micro-batches,
at least 2 pp)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections import defaultdict
from fractions import Fraction
from pathlib import Path

import pytest

from simulator.analysis.bubbles import compute_events, idle_intervals
from simulator.pipeline import simulate
from simulator.scenario import ScenarioError, scenario_from_dict
from simulator.strategy.schedules import (Action, StageMap, ideal_bubble_fraction, max_in_flight,
                                          schedule_actions, stage_map)
from simulator.strategy.stage_units import rank_param_counts, stage_layout

ROOT = Path(__file__).resolve().parents[1]
FBW = {"F": Fraction(1), "B": Fraction(1), "W": Fraction(1)}
DURATIONS = [FBW, {"F": Fraction(2), "B": Fraction(1), "W": Fraction(1)},
             {"F": Fraction(1), "B": Fraction(2), "W": Fraction(1)},
             {"F": Fraction(1), "B": Fraction(3, 2), "W": Fraction(1, 2)},
             {"F": Fraction(1), "B": Fraction(1), "W": Fraction(2)}]


def grid(rows: list[str]) -> list[list[Action]]:
    return [[Action.parse(t) for t in row.split()] for row in rows]


def run_list(actions, smap: StageMap, nv: int, dur, hop=0) -> tuple:
    """Each rank's list in program order, each action as soon as its rank is free and its inputs exist
    (F after the copy's previous stage's F, B after its own F and the next stage's B, W after B), an
    input from another rank ``hop`` later. ``dur[phase]`` or ``dur[(virtual stage, phase)]``.
    Returns (makespan, busy time per rank)."""
    time = (lambda a: dur[a.phase]) if "F" in dur else (lambda a: dur[a.stage, a.phase])  # noqa: E731
    end: dict = {}
    pos, free = [0] * len(actions), [0 * hop] * len(actions)
    left = sum(map(len, actions))
    while left:
        moved = False
        for r, row in enumerate(actions):
            while pos[r] < len(row):
                a = row[pos[r]]
                before, after = smap.prev(a.stage), smap.next(a.stage, nv)
                deps = {"F": [(before, "F")] if before is not None else [],
                        "B": [(a.stage, "F")] + ([(after, "B")] if after is not None else []),
                        "W": [(a.stage, "B")]}[a.phase]
                keys = [(s, ph, a.microbatch) for s, ph in deps]
                if any(k not in end for k in keys):
                    break
                start = max([free[r]] + [end[k] + (hop if smap.rank(k[0]) != r else 0) for k in keys])
                free[r] = end[a.stage, a.phase, a.microbatch] = start + time(a)
                pos[r] += 1
                left -= 1
                moved = True
        assert moved, "deadlock"
    return max(free), [sum(time(a) for a in row) for row in actions]


def idle(name: str, p: int, m: int, dur) -> list:
    makespan, busy = run_list(schedule_actions(name, p, m, 2), stage_map(name, p), 2 * p, dur)
    return [makespan - b for b in busy]


def tiny(schedule: str, pp: int = 4, **extra):
    return scenario_from_dict({
        "name": "t", "model": {"num_layers": 8, "hidden_size": 1024, "num_attention_heads": 8, "vocab_size": 256,
                               "seq_length": 512, "mlp": "gelu"},
        "cluster": {"preset": "dgx-h100", "num_nodes": 1},
        "parallelism": {"tp": 1, "pp": pp, "dp": 8 // pp, "schedule": schedule, **extra},
        "training": {"global_batch_size": 8 * (8 // pp)}})


# ---- the schedule -------------------------------------------------------------------------------

def test_grid_p4_m8_from_the_steps_of_dualpipe_py():
    # rank 0 holds copy A's stage 0 (virtual stage 0, micro-batches 0-3 enter here) and copy B's stage
    # 3 (virtual stage 7, micro-batches 4-7 leave here). DualPipe.step on half_rank 0 of 2: step 1
    # (2 F0), step 2 (F0 F1), step 3 (B1 split, the oldest W, F1), step 4 (F0 & B1, F1 & B0, each B
    # full), step 5 (B1, F1 & B0), step 6 (B1 full, B0 split), step 7 (W, B0 split), step 8 (W).
    # Ranks 2 and 3 mirror ranks 1 and 0: their phase 0 is copy B, entering on their side.
    assert schedule_actions("dualpipe", 4, 8, 2) == grid([
        "0F0 0F1 0F2 7F4 7B4 7W4 7F5 0F3 7B5 7W5 7F6 0B0 0W0 7B6 7W6 7F7 0B1 0W1 7B7 7W7 0B2 0W2 0B3 0W3",
        "1F0 6F4 1F1 6F5 1F2 6B4 6W4 6F6 1B0 1W0 1F3 6B5 6W5 6F7 1B1 1W1 6B6 6W6 1B2 1W2 6B7 1B3 6W7 1W3",
        "5F4 2F0 5F5 2F1 5F6 2B0 2W0 2F2 5B4 5W4 5F7 2B1 2W1 2F3 5B5 5W5 2B2 2W2 5B6 5W6 2B3 5B7 2W3 5W7",
        "4F4 4F5 4F6 3F0 3B0 3W0 3F1 4F7 3B1 3W1 3F2 4B4 4W4 3B2 3W2 3F3 4B5 4W5 3B3 3W3 4B6 4W6 4B7 4W7",
    ])


def test_dual_map_two_copies_from_both_ends():
    smap = stage_map("dualpipe", 4)
    assert [smap.rank(s) for s in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert [smap.prev(s) for s in range(8)] == [None, 0, 1, 2, None, 4, 5, 6]
    assert [smap.next(s, 8) for s in range(8)] == [1, 2, 3, None, 5, 6, 7, None]
    layout = stage_layout(tiny("dualpipe").parallel)
    assert layout.chunks[:4] == layout.chunks[4:] == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert [layout.units(vs)[0] == "embed" for vs in range(8)] == [True, False, False, False] * 2
    assert [layout.units(vs)[-1] == "head" for vs in range(8)] == [False, False, False, True] * 2
    assert [layout.copy_peer(s) for s in range(4)] == [3, 2, 1, 0]


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 12), (6, 12), (8, 16), (8, 22)])
def test_rank_p_minus_1_minus_r_mirrors_rank_r(p, m):
    rows = schedule_actions("dualpipe", p, m, 2)
    swap = lambda a: Action((a.stage + p) % (2 * p), a.phase, (a.microbatch + m // 2) % m)  # noqa: E731
    for r in range(p):
        assert rows[p - 1 - r] == [swap(a) for a in rows[r]]
        assert {a.microbatch for a in rows[r] if a.stage == r} == set(range(m // 2))  # copy A: the first half


@pytest.mark.parametrize("p,m", [(4, 8), (4, 16), (6, 12), (8, 16), (8, 32)])
@pytest.mark.parametrize("dur", DURATIONS)
def test_cut_in_half_dualpipe_idles_as_dualpipe_v_on_half_the_ranks(p, m, dur):
    # DualPipeV is DualPipe cut in half (DualPipe README; Sea AI Lab's "Cut-in-half"): p ranks with
    # two copies of p stages idle exactly as p/2 ranks with one model of p chunks, m/2 micro-batches.
    assert idle("dualpipe", p, m, dur) == [idle("dualpipe-v", p // 2, m // 2, dur)[0]] * p


def stage_times(scn, res) -> dict:
    """(virtual stage, phase) -> seconds of micro-batch 0 of its copy, off the simulated compute stream."""
    smap, mesh, half = stage_map(scn.parallel.schedule, scn.parallel.pp), res.plan.mesh, scn.num_microbatches // 2
    out: dict = defaultdict(float)
    for r, events in compute_events(res.trace).items():
        for e in events:
            vs = smap.stage(mesh.stage_of(r), e.chunk) if e.chunk >= 0 else -1
            if e.phase in ("F", "B", "W", "R") and e.microbatch == (vs // scn.parallel.pp) * half:
                out[vs, "B" if e.phase == "R" else e.phase] += e.end_s - e.start_s
    return dict(out)


@pytest.mark.parametrize("p,m", [(4, 8), (4, 16), (8, 16), (8, 32)])
def test_bubble_within_deepseek_table_2_with_a_tiny_models_f_b_w(p, m):
    # Table 2: DualPipe's bubble (PP/2 - 1)(F&B + B - 3W), PP = p, B the full backward (B + W here).
    # The simulator runs an overlapped pair's compute in sequence, F&B = F + B_full: the idle then lies
    # between the start-up (p/2 - 1) F and the table's value; F, B, W of a middle stage of a tiny model.
    t = stage_times(tiny("dualpipe"), simulate(tiny("dualpipe")))
    dur = {ph: Fraction(t[1, ph]) for ph in "FBW"}
    full = dur["B"] + dur["W"]
    table = (p // 2 - 1) * ((dur["F"] + full) + full - 3 * dur["W"])
    assert all((p // 2 - 1) * dur["F"] <= x <= table for x in idle("dualpipe", p, m, dur))
    # at F = B = W the pair's forward hides in the overlap (F&B = B_full = 2): the table's p/2 - 1 exactly
    assert idle("dualpipe", p, m, FBW) == [Fraction(p // 2 - 1)] * p
    expected = Fraction(p // 2 - 1, 3 * m + p // 2 - 1)
    assert ideal_bubble_fraction("dualpipe", p, m, 2) == pytest.approx(float(expected), abs=1e-15)


def test_simulated_timeline_is_the_schedule_with_each_pair_in_sequence():
    # The simulated compute streams are the list schedule of the action grid with the tiny model's
    # per-stage F, B, W and one P2P send per hop between ranks: each overlapped pair F & B runs in
    # sequence on the compute stream, only communication overlaps it (as DualPipeV is simulated).
    # The schedule alone: P2P kernels take no SMs from the compute beside them (cost.sm_contention off).
    scn = tiny("dualpipe")
    scn = dataclasses.replace(scn, cost=dataclasses.replace(scn.cost, sm_contention=False))
    res = simulate(scn)
    sends = {round(e.end_s - e.start_s, 15) for e in res.trace.events if e.category == "comm_pp"}
    assert len(sends) == 1
    makespan, busy = run_list(schedule_actions("dualpipe", 4, scn.num_microbatches, 2), stage_map("dualpipe", 4), 8,
                              stage_times(scn, res), hop=sends.pop())
    acts = {r: [e for e in ev if e.phase in ("F", "B", "W", "R")] for r, ev in compute_events(res.trace).items()}
    t0 = min(e.start_s for ev in acts.values() for e in ev)
    t1 = max(e.end_s for ev in acts.values() for e in ev)
    assert t1 - t0 == pytest.approx(makespan, rel=1e-9)
    for r, ev in acts.items():
        gaps = sum(b - a for a, b in idle_intervals(ev, t0, t1))
        assert gaps == pytest.approx(makespan - busy[res.plan.mesh.stage_of(r)], rel=1e-9)


# ---- memory and the copies' gradients ------------------------------------------------------------

@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (6, 12), (8, 16)])
def test_activations_pp_plus_one_stages(p, m):
    # DeepSeek-V3 table 2, "Activation per device": PP + 1 (stage-sized sets of one micro-batch)
    assert [max_in_flight(row) for row in schedule_actions("dualpipe", p, m, 2)] == [p + 1] * p


def test_each_rank_stores_both_copies_parameters_gradients_and_optimizer_state():
    # Table 2, "Parameter per device": 2x. Rank r holds 1F1B's stage r and stage p - 1 - r; with tied
    # embeddings an end rank's embedding (one copy) and head (the other) share one tensor, where 1F1B's
    # last stage keeps its own copy of the word embedding.
    dual, base = tiny("dualpipe"), tiny("1f1b")
    assert dual.model.tie_embeddings
    counts = [rank_param_counts(dual.model, dual.parallel, s) for s in range(4)]
    single = [rank_param_counts(base.model, base.parallel, s) for s in range(4)]
    word = dual.model.vocab_size * dual.model.hidden_size
    assert counts == [{"dense": single[s]["dense"] + single[3 - s]["dense"] - word * (s in (0, 3)), "expert": 0}
                      for s in range(4)]
    assert counts[1] == {k: 2 * x for k, x in single[1].items()}  # a middle rank, equal stages: exactly 2x
    mem_dual, mem_base = simulate(dual).memory.per_rank, simulate(base).memory.per_rank
    for r in (2, 4):  # the representatives of the middle stages (dp = 2)
        for key in ("params", "grads", "optimizer"):
            assert mem_dual[r][key] == pytest.approx(2 * mem_base[r][key], rel=1e-12)


def test_copies_gradients_all_reduced_over_rank_and_its_mirror():
    scn = tiny("dualpipe")
    res = simulate(scn)
    mesh = res.plan.mesh
    syncs = [t for t in res.graph.tasks if t.name.endswith("copy_grad_all_reduce")]
    assert len(syncs) == len(mesh.representatives) == 4
    for t in syncs:
        a, b = t.comm.group
        assert mesh.stage_of(a) + mesh.stage_of(b) == 3 and t.comm.op == "all_reduce"
        counts = res.plan.stage_params[t.rank]
        assert t.comm.size_bytes == (counts["dense"] + counts["expert"]) * scn.training.grad_dtype_bytes
    assert not any(t.name.endswith("copy_grad_all_reduce") for t in simulate(tiny("dualpipe-v", virtual_stages=2))
                   .graph.tasks)


# ---- refusals ------------------------------------------------------------------------------------

@pytest.mark.parametrize("p,m,match", [
    (3, 6, "even pp and an even number of micro-batches .* got pp = 3, micro-batches = 6"),
    (4, 9, "even pp and an even number of micro-batches .* got pp = 4, micro-batches = 9"),
    (4, 6, "dualpipe needs at least 8 micro-batches with pp = 4, got 6"),
])
def test_refuses_odd_pp_odd_or_too_few_microbatches(p, m, match):
    with pytest.raises(ValueError, match=match):
        schedule_actions("dualpipe", p, m, 2)


def test_scenario_refuses_odd_pp_with_the_numbers():
    raw = {"name": "t", "model": {"preset": "gpt3-1.3b"},
           "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1, "gpus_per_node": 6},
           "parallelism": {"tp": 1, "pp": 3, "dp": 2, "schedule": "dualpipe"}, "training": {"global_batch_size": 24}}
    with pytest.raises(ScenarioError, match="got pp = 3, micro-batches = 12"):
        scenario_from_dict(raw)


@pytest.mark.parametrize("batch,fragment", [(20, "got pp = 2, micro-batches = 5"),
                                            (8, "at least 4 micro-batches with pp = 2, got 2")])
def test_cli_refusal_is_one_line_exit_2(batch, fragment):
    out = subprocess.run([sys.executable, "-m", "simulator", "run", "scenarios/gpt3-1.3b-8xa100.toml", "--json",
                          "--set", "parallelism.schedule=dualpipe", "--set", f"training.global_batch_size={batch}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr
    assert fragment in lines[0] and "parallelism.schedule = 'dualpipe'" in lines[0]
