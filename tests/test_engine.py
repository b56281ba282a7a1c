"""The engine as a specification: exact (name, start, end) timelines of tiny task graphs."""

import pytest

from simulator.cost.plan import CommPlan, CommStep
from simulator.engine.sim import simulate_graph
from simulator.tasks import Collective, OpWork, TaskGraphBuilder


class StubCost:
    """Durations by task name; comm tasks named 'net*' go through the network as a pure latency."""

    def __init__(self, durations: dict[str, float]) -> None:
        self.d = durations

    def duration_s(self, task):
        return None if task.name.startswith("net") else self.d[task.name]

    def comm_plan(self, task):
        return CommPlan("stub", (CommStep(self.d[task.name]),))

    def isolated_s(self, task):
        return self.d[task.name]


def W(name="w"):
    return (OpWork(name, "gemm", 1.0, 0.0),)


def timeline(res):
    return sorted((e.name, e.start_s, e.end_s) for e in res.trace.events)


def test_one_stream_runs_in_program_order():
    b = TaskGraphBuilder()
    b.add("a", "compute", 0, "compute", "compute", work=W())
    b.add("b", "compute", 0, "compute", "compute", work=W())
    b.add("c", "compute", 0, "compute", "compute", work=W())
    g = b.build((0,), True)
    g.validate()
    res = simulate_graph(g, StubCost({"a": 1.0, "b": 2.0, "c": 0.5}))
    assert timeline(res) == [("a", 0.0, 1.0), ("b", 1.0, 3.0), ("c", 3.0, 3.5)]
    assert res.makespan_s == 3.5


def test_cross_stream_dependency_and_overlap():
    # compute a -> comm x (overlaps b) -> compute c waits for x
    b = TaskGraphBuilder()
    a = b.add("a", "compute", 0, "compute", "compute", work=W())
    x = b.add("x", "comm", 0, "comm_dp", "comm_dp", (a,), comm=Collective("all_reduce", 8.0, (0, 1), "dp"))
    b.add("b", "compute", 0, "compute", "compute", work=W())
    b.add("c", "compute", 0, "compute", "compute", (x,), work=W())
    res = simulate_graph(b.build((0,), True), StubCost({"a": 1.0, "x": 3.0, "b": 1.0, "c": 1.0}))
    assert timeline(res) == [("a", 0.0, 1.0), ("b", 1.0, 2.0), ("c", 4.0, 5.0), ("x", 1.0, 4.0)]


def test_two_ranks_pipeline_send():
    b = TaskGraphBuilder()
    f0 = b.add("f0", "compute", 0, "compute", "compute", work=W())
    s = b.add("net_send", "comm", 0, "comm_pp", "comm_pp", (f0,), comm=Collective("send_recv", 1.0, (0, 1), "pp"))
    b.add("f1", "compute", 1, "compute", "compute", (s,), work=W())
    b.add("g0", "compute", 0, "compute", "compute", work=W())
    res = simulate_graph(b.build((0, 1), True), StubCost({"f0": 2.0, "net_send": 0.5, "f1": 1.0, "g0": 1.0}))
    assert timeline(res) == [("f0", 0.0, 2.0), ("f1", 2.5, 3.5), ("g0", 2.0, 3.0), ("net_send", 2.0, 2.5)]


def test_collective_barrier_in_full_mode():
    # rank 1 arrives late; the all-reduce starts when both have arrived and ends together
    b = TaskGraphBuilder()
    b.add("a0", "compute", 0, "compute", "compute", work=W())
    b.add("ar", "comm", 0, "compute", "comm_tp", comm=Collective("all_reduce", 1.0, (0, 1), "tp"), sync_key=7)
    b.add("a1", "compute", 1, "compute", "compute", work=W("v"))
    b.add("ar", "comm", 1, "compute", "comm_tp", comm=Collective("all_reduce", 1.0, (0, 1), "tp"), sync_key=7)
    res = simulate_graph(b.build((0, 1), True), StubCost({"a0": 1.0, "a1": 3.0, "ar": 0.5}))
    ev = sorted((e.rank, e.name, e.start_s, e.end_s) for e in res.trace.events)
    assert ev == [(0, "a0", 0.0, 1.0), (0, "ar", 3.0, 3.5), (1, "a1", 0.0, 3.0), (1, "ar", 3.0, 3.5)]


def test_network_task_starts_at_its_lazy_clock():
    # after 2 s of static compute on the same stream, the network transfer starts at t=2 exactly
    b = TaskGraphBuilder()
    b.add("a", "compute", 0, "compute", "compute", work=W())
    b.add("net", "comm", 0, "compute", "comm_ep", comm=Collective("all_to_all", 1.0, (0, 1), "ep"))
    b.add("c", "compute", 0, "compute", "compute", work=W())
    res = simulate_graph(b.build((0,), True), StubCost({"a": 2.0, "net": 0.25, "c": 1.0}))
    assert timeline(res) == [("a", 0.0, 2.0), ("c", 2.25, 3.25), ("net", 2.0, 2.25)]


def test_validate_rejects_cycles_and_dangling_deps():
    b = TaskGraphBuilder()
    b.add("a", "compute", 0, "compute", "compute", (1,), work=W())
    b.add("b", "compute", 0, "compute", "compute", work=W())
    with pytest.raises(ValueError, match="cycle"):
        b.build((0,), True).validate()
    b = TaskGraphBuilder()
    b.add("a", "compute", 0, "compute", "compute", (5,), work=W())
    with pytest.raises(ValueError, match="unknown task"):
        b.build((0,), True).validate()


def test_cycle_between_static_lanes_of_one_rank_is_a_deadlock_not_a_spin():
    # a (compute) waits for x (a static comm lane of the same rank), x waits for a: before, the
    # rank's list scheduler waited on env.any_of([]), which fires at once, forever
    from simulator.tasks import InternalError
    b = TaskGraphBuilder()
    b.add("a", "compute", 0, "compute", "compute", (1,), work=W())
    b.add("x", "comm", 0, "comm_dp", "comm_dp", (0,), comm=Collective("all_reduce", 8.0, (0, 1), "dp"))
    with pytest.raises(InternalError, match="cycle among the streams of rank 0: 'a' .* waits for 'x'"):
        simulate_graph(b.build((0,), True), StubCost({"a": 1.0, "x": 1.0}))


def test_cycle_through_a_network_stream_is_a_deadlock():
    from simulator.tasks import InternalError
    b = TaskGraphBuilder()
    b.add("a", "compute", 0, "compute", "compute", (1,), work=W())
    b.add("net", "comm", 0, "comm_dp", "comm_dp", (0,), comm=Collective("all_reduce", 8.0, (0, 1), "dp"))
    with pytest.raises(InternalError, match="2 tasks never ran"):
        simulate_graph(b.build((0,), True), StubCost({"a": 1.0, "net": 1.0}))


def test_the_pipeline_asks_the_cost_model_once_per_distinct_collective():
    from simulator.cost.collectives import plan_collective
    from simulator.hardware.clusters import CLUSTER_PRESETS
    from simulator.hardware.topology import build_topology
    from simulator.pipeline import PerCollective
    from simulator.tasks import Collective, TaskGraphBuilder

    topo = build_topology(CLUSTER_PRESETS["dgx-a100-80gb"].with_nodes(2))
    asked = []

    class Counting:
        def duration_s(self, task):
            return None

        def comm_plan(self, task):
            asked.append(("plan", task.comm))
            return plan_collective(task.comm, topo)

        def isolated_s(self, task):
            asked.append(("alone", task.comm))
            return 0.0

    b = TaskGraphBuilder()
    for k in range(3):  # the same all-reduce three times (equal, not identical objects), then another
        b.add(f"net{k}", "comm", 0, "comm_dp", "comm_dp", comm=Collective("all_reduce", 1e6, (0, 8), "dp"))
    b.add("net3", "comm", 0, "comm_dp", "comm_dp", comm=Collective("all_reduce", 2e6, (0, 8), "dp"))
    graph = b.build((0,), False, {})
    cached = simulate_graph(graph, PerCollective(Counting()), topo.capacity_Bps)
    assert sorted((kind, c.size_bytes) for kind, c in asked) == [("alone", 1e6), ("alone", 2e6), ("plan", 1e6),
                                                                  ("plan", 2e6)]
    plain = simulate_graph(graph, Counting(), topo.capacity_Bps)
    assert (cached.start_s, cached.end_s) == (plain.start_s, plain.end_s)
