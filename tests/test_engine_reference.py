"""The engine against a naive reference on random graphs: one simpy process per task, which waits
for its dependencies and its stream predecessor, meets its barrier partners, then runs (a timeout,
or its transfer through the same flow network). The lazy-clock engine must give the same start and
end for every task."""

from __future__ import annotations

import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cost.plan import CommPlan, CommStep, Flow
from simulator.engine.network import FlowNetwork
from simulator.engine.sim import simulate_graph
from simulator.tasks import Collective, OpWork, TaskGraphBuilder

STREAMS = ("compute", "comm_a", "comm_b")
LINKS = {("x", "y"): 10.0, ("y", "z"): 5.0}


class RandomCost:
    """Static seconds per task id; tasks named 'net*' run a flow over the shared links."""

    def __init__(self, seconds: list[float], sizes: list[float]) -> None:
        self.s, self.size = seconds, sizes

    def duration_s(self, task):
        return None if task.name.startswith("net") else self.s[task.id]

    def comm_plan(self, task):  # the participants of one collective share its plan
        key = task.sync_key if task.sync_key >= 0 else task.id
        links = (("x", "y"),) if key % 2 else (("x", "y"), ("y", "z"))
        return CommPlan("rand", (CommStep(self.s[task.id] * 0.1, (Flow(links, self.size[task.id]),)),))

    def isolated_s(self, task):
        return 0.0


def reference(graph, cost) -> tuple[list[float], list[float]]:
    env = simpy.Environment()
    net = FlowNetwork(env, LINKS)
    n = len(graph.tasks)
    done = [env.event() for _ in range(n)]
    start, end = [0.0] * n, [0.0] * n
    prev = {}
    for ids in graph.streams.values():
        for a, b in zip(ids, ids[1:]):
            prev[b] = a
    groups: dict[int, list[int]] = {}
    for t in graph.tasks:
        if t.sync_key >= 0:
            groups.setdefault(t.sync_key, []).append(t.id)
    arrived = {k: env.event() for k in groups}
    count = {k: 0 for k in groups}
    shared: dict[int, tuple[float, float]] = {}

    def run(t):
        dur = cost.duration_s(t)
        if dur is not None:
            yield env.timeout(dur)
        else:
            yield from net.run(cost.comm_plan(t))

    def proc(t):
        waits = [done[d] for d in t.deps] + ([done[prev[t.id]]] if t.id in prev else [])
        if waits:
            yield env.all_of(waits)
        key = t.sync_key if t.sync_key >= 0 and len(groups[t.sync_key]) > 1 else None
        if key is None:
            start[t.id] = env.now
            yield from run(t)
            end[t.id] = env.now
        else:
            count[key] += 1
            if count[key] < len(groups[key]):
                yield arrived[key]
            else:
                begin = env.now
                yield from run(t)
                shared[key] = (begin, env.now)
                arrived[key].succeed()
            start[t.id], end[t.id] = shared[key]
        done[t.id].succeed()

    for t in graph.tasks:
        env.process(proc(t))
    env.run()
    return start, end


@st.composite
def graphs(draw):
    n = draw(st.integers(1, 30))
    ranks = draw(st.integers(1, 3))
    b = TaskGraphBuilder()
    seconds, sizes = [], []
    keys = 0
    for i in range(n):
        rank = draw(st.integers(0, ranks - 1))
        stream = draw(st.sampled_from(STREAMS))
        deps = tuple(sorted(set(draw(st.lists(st.integers(0, i - 1), max_size=3))))) if i else ()
        net = stream != "compute" and draw(st.booleans())
        seconds.append(draw(st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.25])))
        sizes.append(draw(st.sampled_from([1.0, 4.0, 10.0])))
        if stream == "comm_b" and ranks > 1 and draw(st.booleans()):
            # a collective on every rank (full mode): one task per rank, same sync key
            for r in range(ranks):
                b.add("net" if net else "ar", "comm", r, "comm_b", "comm_dp", deps if r == rank else (),
                      comm=Collective("all_reduce", 1.0, tuple(range(ranks)), "dp"), sync_key=keys)
                if r:
                    seconds.append(seconds[-1])
                    sizes.append(sizes[-1])
            keys += 1
            continue
        kind = "comm" if stream != "compute" else "compute"
        b.add(("net" if net else "t") + str(i), kind, rank, stream, "compute" if kind == "compute" else "comm_tp",
              deps, work=(OpWork("w", "gemm", 1.0, 0.0),) if kind == "compute" else (),
              comm=None if kind == "compute" else Collective("all_reduce", 1.0, (rank,), "tp"))
    g = b.build(tuple(range(ranks)), True)
    return g, RandomCost(seconds, sizes)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(graphs())
def test_engine_equals_one_process_per_task_reference(case):
    graph, cost = case
    graph.validate()
    res = simulate_graph(graph, cost, LINKS)
    start, end = reference(graph, cost)
    for i in range(len(graph.tasks)):
        assert abs(res.start_s[i] - start[i]) <= 1e-9 * max(1.0, start[i]), graph.tasks[i]
        assert abs(res.end_s[i] - end[i]) <= 1e-9 * max(1.0, end[i]), graph.tasks[i]
