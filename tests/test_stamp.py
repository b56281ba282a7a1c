"""Templates (strategy/stamp.py): a lowering that stamps its layers out of recorded templates builds
exactly the task graph that emitting every layer one by one builds, task for task."""

from __future__ import annotations

import pytest

from simulator.scenario import scenario_from_dict
from simulator.strategy import stamp
from simulator.strategy.lower import lower


def _scenario(model: dict | None = None, microbatches: int = 6, **par) -> dict:
    p = {"tp": 2, "pp": 2, "dp": 2, "schedule": "1f1b", "recompute": "none", **par}
    gpus = p["tp"] * p["pp"] * p["dp"] * p.get("cp", 1)
    cluster = {"preset": "dgx-a100-80gb", "num_nodes": 1} if gpus >= 8 else \
        {"preset": "dgx-a100-80gb", "num_nodes": 1, "gpus_per_node": gpus}
    return {"model": model or {"preset": "gpt3-1.3b", "num_layers": 6, "seq_length": 1024},
            "cluster": cluster if gpus <= 8 else {"preset": "dgx-a100-80gb", "num_nodes": gpus // 8},
            "parallelism": p, "training": {"global_batch_size": microbatches * p["dp"], "micro_batch_size": 1}}


CASES = {
    "1f1b-full-sp": _scenario(recompute="full", sequence_parallel=True),
    "gpipe-selective": _scenario(schedule="gpipe", recompute="selective"),
    "interleaved": _scenario(schedule="interleaved-1f1b", virtual_stages=3, recompute="full", microbatches=4),
    "zero-bubble-sp": _scenario(schedule="zero-bubble", sequence_parallel=True, recompute="full"),
    "zb-v": _scenario(schedule="zb-v", virtual_stages=2, sequence_parallel=True),
    "zero3-fsdp2": _scenario(zero_stage=3, sharding="fsdp2", recompute="full"),
    "zero3-deepspeed": _scenario(zero_stage=3, sharding="deepspeed", pp=1, dp=4),  # DeepSpeed: no ZeRO-3 with PP
    "cp-ring": _scenario(cp=2, sequence_parallel=True, recompute="selective"),
    "cp-torch-allgather": _scenario(cp=2, sequence_parallel=True, recompute="full", cp_algorithm="torch-allgather"),
    "cp-a2a": _scenario(cp=2, sequence_parallel=True, recompute="selective", cp_algorithm="a2a"),
    "op-sac-tp": _scenario({"preset": "llama3-8b", "num_layers": 4, "seq_length": 1024}, pp=1, zero_stage=3,
                           sequence_parallel=True, recompute="selective-op"),
    "tp-comm-overlap": _scenario(sequence_parallel=True, tp_comm_overlap=True),
    "moe-ep": _scenario({"preset": "mixtral-8x7b", "num_layers": 4, "seq_length": 512}, tp=1, ep=2,
                        sequence_parallel=True, schedule="zero-bubble"),
}


def _without_templates(monkeypatch) -> None:
    monkeypatch.setattr(stamp.Stamper, "call",
                        lambda self, fn, rank, deps, name, meta, *args: fn(self.ctx, rank, deps, name, meta, *args))


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("full", [False, True])
def test_stamped_lowering_equals_emitting_every_layer(name, full, monkeypatch):
    scn = scenario_from_dict(CASES[name], default_name=name)
    stamped = lower(scn, full).graph
    _without_templates(monkeypatch)
    plain = lower(scn, full).graph
    assert len(stamped) == len(plain)
    assert stamped.tasks == plain.tasks
    assert stamped.streams == plain.streams


def test_templates_are_recorded_once_per_shape_and_replayed():
    """GPT-style layers: one template per (rank, chunk, phase) pass and per layer inside it; every
    other micro-batch replays them."""
    scn = scenario_from_dict(_scenario(recompute="full"), default_name="t")
    seen = []
    real = stamp.Stamper._record

    def spy(self, key, *a):
        seen.append(key)
        return real(self, key, *a)

    stamp.Stamper._record = spy
    try:
        lower(scn)
    finally:
        stamp.Stamper._record = real
    ranks, layers_per_stage = 2, 3  # symmetric mode: one rank per stage
    passes = [k for k in seen if k[0].__name__ in ("_forward_units", "_backward_units")]
    layers = [k for k in seen if k[0].__name__ in ("layer_forward", "layer_backward")]
    assert len(passes) == ranks * 2  # each rank's F and B pass, recorded at its first micro-batch
    assert len(layers) == ranks * layers_per_stage * 2  # and inside it each layer's F and B
    assert len(seen) == len(passes) + len(layers)


@pytest.mark.parametrize("name", ["1f1b-full-sp", "zb-v", "moe-ep", "zero3-fsdp2"])
def test_tasks_of_one_shape_carry_what_a_cost_model_reads(name):
    """TaskGraph.shapes: a stamped task shares its template row's shape, and tasks of one shape have
    the same kind, stream, category, work, collective, phase and layer (the same objects)."""
    graph = lower(scenario_from_dict(CASES[name], default_name=name)).graph
    assert len(graph.shapes) == len(graph)
    first: dict = {}
    for shape, t in zip(graph.shapes, graph.tasks):
        ref = first.setdefault(shape, t)
        assert (t.kind, t.stream, t.category, t.phase, t.layer) == (ref.kind, ref.stream, ref.category, ref.phase,
                                                                    ref.layer)
        assert t.work is ref.work and t.comm is ref.comm
    assert len(first) < len(graph) / 2  # most tasks are stamped


def test_asking_the_cost_once_per_shape_gives_the_same_timeline():
    from simulator.cost.model import CostModel
    from simulator.engine.sim import simulate_graph
    from simulator.hardware.topology import build_topology

    scn = scenario_from_dict(CASES["1f1b-full-sp"], default_name="t")
    plan, topo = lower(scn, True), build_topology(scn.cluster)
    asked = []

    class Counting(CostModel):
        def duration_s(self, task):
            asked.append(task.id)
            return super().duration_s(task)

    per_shape = simulate_graph(plan.graph, Counting(scn, topo), topo.capacity_Bps, by_shape=True)
    assert len(asked) == len(set(plan.graph.shapes)) < len(plan.graph)
    per_task = simulate_graph(plan.graph, CostModel(scn, topo), topo.capacity_Bps)
    assert (per_shape.start_s, per_shape.end_s) == (per_task.start_s, per_task.end_s)
    assert per_shape.trace.events == per_task.trace.events
