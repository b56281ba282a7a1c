"""FlowNetwork: max-min fair sharing of links between concurrent flows, in simulated time."""

import heapq
import itertools
import random

import numpy as np
import pytest
import simpy

from simulator.cost.collectives import plan_collective
from simulator.cost.fairshare import (ARRAY_MIN_FLOWS, REL_EPS, isolated_time_s, max_min_rates,
                                       max_min_rates_arrays)
from simulator.cost.plan import CommPlan, CommStep, Flow
from simulator.engine.network import FlowNetwork, simulate_plan
from simulator.hardware.clusters import CLUSTER_PRESETS
from simulator.hardware.topology import build_topology
from simulator.tasks import Collective

CAP = {"a": 10.0, "b": 10.0, "c": 12.0, "d": 12.0}


def _run(plans_at):
    """Run (start_s, plan) pairs on one network; return each plan's finish time and the network."""
    nets: list = []
    ends = _ends(FlowNetwork, plans_at, CAP, nets)
    return ends, nets[0]


def _one(links, size, weight=1.0, latency=0.0):
    return CommPlan("test", (CommStep(latency, (Flow(tuple(links), size, weight),)),))


def test_two_equal_flows_on_one_link_each_take_twice_as_long():
    alone, _ = _run([(0.0, _one(["a"], 50.0))])
    both, _ = _run([(0.0, _one(["a"], 50.0)), (0.0, _one(["a"], 50.0))])
    assert alone[0] == pytest.approx(5.0)
    assert both[0] == both[1] == pytest.approx(10.0)


def test_a_flow_over_two_links_gets_the_max_min_rate():
    # x crosses c and d; y1, y2 share d with x; z shares c with x. d's fair share 12/3 = 4 binds
    # x, y1, y2; z takes what x leaves on c: 12 - 4 = 8.
    rates = max_min_rates([("c", "d"), ("d",), ("d",), ("c",)], [1, 1, 1, 1], CAP)
    assert rates == pytest.approx([4.0, 4.0, 4.0, 8.0])
    ends, _ = _run([(0.0, _one(["c", "d"], 8.0)), (0.0, _one(["d"], 8.0)),
                    (0.0, _one(["d"], 8.0)), (0.0, _one(["c"], 8.0))])
    assert ends[3] == pytest.approx(1.0)  # z at 8 B/s
    assert ends[0] == ends[1] == ends[2] == pytest.approx(2.0)


def test_rates_are_reshared_when_flows_end_and_start():
    # y starts at t=1 on a: 0-1 x alone (10 B/s), then 5 B/s each; y (size 5) ends at t=2,
    # x has 30 - 10 - 5 = 15 left at full rate: ends at t=3.5.
    ends, _ = _run([(0.0, _one(["a"], 30.0)), (1.0, _one(["a"], 5.0))])
    assert ends[1] == pytest.approx(2.0)
    assert ends[0] == pytest.approx(3.5)


def test_run_returns_the_elapsed_time():
    env = simpy.Environment()
    net = FlowNetwork(env, CAP)
    got = []

    def proc():
        yield env.timeout(1.0)
        got.append((yield from net.run(_one(["b"], 20.0, latency=0.5))))

    env.process(proc())
    env.run()
    assert got == [pytest.approx(2.5)] and env.now == pytest.approx(3.5)


def test_weight_stands_for_identical_flows():
    assert max_min_rates([("a",), ("a",)], [3.0, 1.0], CAP) == pytest.approx([2.5, 2.5])
    ends, net = _run([(0.0, _one(["a"], 10.0, weight=4.0))])
    assert ends[0] == pytest.approx(4.0)
    assert net.link_stats()["a"] == pytest.approx((40.0, 4.0))


def test_repeated_step_equals_its_repetitions_alone():
    step = CommStep(0.5, (Flow(("a",), 20.0), Flow(("b",), 10.0)), repeat=3)
    unrolled = CommPlan("u", (CommStep(0.5, step.flows),) * 3)
    assert simulate_plan(CommPlan("r", (step,)), CAP) == pytest.approx(3 * (0.5 + 2.0))
    assert simulate_plan(unrolled, CAP) == pytest.approx(3 * (0.5 + 2.0))
    assert isolated_time_s([20.0, 10.0], [("a",), ("b",)], [1, 1], CAP) == pytest.approx(2.0)


def test_link_stats_count_bytes_and_busy_time():
    ends, net = _run([(0.0, _one(["c", "d"], 24.0)), (3.0, _one(["c"], 12.0, latency=1.0))])
    stats = net.link_stats()
    assert stats["d"] == pytest.approx((24.0, 2.0))
    assert stats["c"] == pytest.approx((36.0, 3.0))  # busy 0-2 and 4-5
    assert ends == pytest.approx({0: 2.0, 1: 5.0})


def test_latency_only_steps_and_unknown_links():
    assert simulate_plan(CommPlan("lat", (CommStep(2e-6), CommStep(1e-6, (), repeat=3))),
                         CAP) == pytest.approx(5e-6)
    with pytest.raises(ValueError, match="'zz'"):
        simulate_plan(_one(["zz"], 1.0), CAP)


def test_dp_all_reduce_slows_a_pp_send_on_the_same_nic():
    topo = build_topology(CLUSTER_PRESETS["dgx-a100-80gb"].with_nodes(4))
    dp = plan_collective(Collective("all_reduce", 200e6, (0, 8, 16, 24), "dp"), topo, "ring")
    pp = plan_collective(Collective("send_recv", 50e6, (0, 8), "pp"), topo)
    alone = simulate_plan(pp, topo.capacity_Bps)
    env = simpy.Environment()
    net = FlowNetwork(env, topo.capacity_Bps)
    ends = {}

    def proc(name, plan):
        yield from net.run(plan)
        ends[name] = env.now

    env.process(proc("dp", dp))
    env.process(proc("pp", pp))
    env.run()
    assert ends["pp"] > 1.5 * alone  # shares nic0.0 -> leaf with the DP ring
    assert ends["dp"] > simulate_plan(dp, topo.capacity_Bps)
    busy = net.link_stats()[("nic0.0", "leaf0.0")]
    assert busy[0] == pytest.approx(2 * 3 / 4 * 200e6 + 50e6, rel=1e-9)


def test_concurrent_plans_start_together_and_the_run_waits_for_the_last():
    # the main plan waits 1 s of latency, then sends 20 B on a; its concurrent plan sends 40 B on a at once
    other = _one(["a"], 40.0)
    main = CommPlan("test", (CommStep(1.0, (Flow(("a",), 20.0),)),), (other,))
    ends, _ = _run([(0.0, main)])
    # 0-1: other alone, 10 B left of 40 -> 30; 1-5: both at 5 B/s, main done (20 B), other 10 left;
    # 5-6: other alone at 10 B/s
    assert ends[0] == pytest.approx(6.0)


class _PerFlowNetwork:
    """Reference: the network as it was before cohorts and the rate cache, one object per flow and
    max-min recomputed on every start and finish (same formulas, same tolerance)."""

    def __init__(self, env, cap):
        self.env, self.cap, self.on, self.heap, self.timer_at, self.token = env, cap, {}, [], float("inf"), 0
        self.count = itertools.count()

    def run(self, plan):
        others = [self.env.process(self.run(p)) for p in plan.concurrent]
        begin = self.env.now
        for step in plan.steps:
            if step.latency_s * step.repeat > 0:
                yield self.env.timeout(step.latency_s * step.repeat)
            flows = [f for f in step.flows if f.size_bytes > 0 and f.links]
            if flows:
                done, seeds, box = self.env.event(), set(), [len(flows)]
                for f in flows:
                    fl = {"links": f.links, "w": f.weight, "left": f.size_bytes * step.repeat, "rate": 0.0,
                          "t": self.env.now, "finish": 0.0, "live": True, "box": box, "done": done}
                    for link in f.links:
                        self.on.setdefault(link, {})[id(fl)] = fl
                        seeds.add(link)
                self.reshare(seeds)
                yield done
        if others:
            yield self.env.all_of(others)
        return self.env.now - begin

    def reshare(self, seeds):
        comp, seen, stack = {}, set(seeds), list(seeds)
        while stack:
            for k, fl in list(self.on.get(stack.pop(), {}).items()):
                if k not in comp:
                    comp[k] = fl
                    stack.extend(link for link in fl["links"] if link not in seen)
                    seen.update(fl["links"])
        flows = list(comp.values())
        now = self.env.now
        for fl, rate in zip(flows, max_min_rates([f["links"] for f in flows], [f["w"] for f in flows], self.cap)):
            fl["left"] = max(fl["left"] - fl["rate"] * (now - fl["t"]), 0.0)
            fl["t"], fl["rate"] = now, rate
            fl["finish"] = now + fl["left"] / rate
            heapq.heappush(self.heap, (fl["finish"], next(self.count), id(fl), fl))
        while self.heap and (not self.heap[0][3]["live"] or self.heap[0][0] != self.heap[0][3]["finish"]):
            heapq.heappop(self.heap)
        if self.heap and self.heap[0][0] < self.timer_at:
            self.timer_at, self.token = self.heap[0][0], self.token + 1
            token = self.token
            self.env.timeout(self.timer_at - now).callbacks.append(lambda _e: self.fire(token))

    def fire(self, token):
        if token != self.token:
            return
        self.timer_at, now, freed = float("inf"), self.env.now, set()
        while self.heap and self.heap[0][0] <= now + REL_EPS * max(now, 1e-9):
            finish, _, _, fl = heapq.heappop(self.heap)
            if fl["live"] and finish == fl["finish"]:
                fl["live"] = False
                for link in fl["links"]:
                    del self.on[link][id(fl)]
                    freed.add(link)
                fl["box"][0] -= 1
                if fl["box"][0] == 0:
                    fl["done"].succeed()
        self.reshare(freed)


def _random_plans(rng, links):
    """Start times and plans: steps of several flows, symmetric (equal sizes, like ring steps) or not,
    repeated steps, weights, concurrent plans; flows share links at random."""
    out = []
    for _ in range(rng.randint(2, 7)):
        steps = []
        for _ in range(rng.randint(1, 3)):
            size = rng.choice([10.0, 25.0, 40.0])
            flows = tuple(Flow(tuple(rng.sample(links, rng.randint(1, 3))),
                               size if rng.random() < 0.7 else rng.uniform(1.0, 50.0), rng.choice([1.0, 1.0, 3.0]))
                          for _ in range(rng.randint(1, 6)))
            steps.append(CommStep(rng.choice([0.0, 0.1, 0.5]), flows, rng.choice([1, 1, 2])))
        extra = (CommPlan("c", (CommStep(0.0, (Flow((rng.choice(links),), 15.0),)),)),) if rng.random() < 0.2 else ()
        out.append((rng.choice([0.0, 0.0, 0.3, 1.7]), CommPlan("r", tuple(steps), extra)))
    return out


def _ends(make, plans_at, cap, stats=None):
    env = simpy.Environment()
    net = make(env, cap)
    ends = {}
    if stats is not None:
        stats.append(net)

    def proc(i, start, plan):
        yield env.timeout(start)
        yield from net.run(plan)
        ends[i] = env.now

    for i, (start, plan) in enumerate(plans_at):
        env.process(proc(i, start, plan))
    env.run()
    return ends


def test_cohorts_and_the_rate_cache_match_the_per_flow_network_on_random_plans():
    rng = random.Random(20)
    links = [f"l{i}" for i in range(8)]
    cap = {link: rng.choice([5.0, 10.0, 12.5]) for link in links}
    for _ in range(150):
        plans_at = _random_plans(rng, links)
        nets = []
        cached = _ends(FlowNetwork, plans_at, cap, nets)
        moved: dict = {}
        for plan in [p for _, p in plans_at] + [c for _, p in plans_at for c in p.concurrent]:
            for step in plan.steps:
                for f in step.flows:
                    for link in f.links:
                        moved[link] = moved.get(link, 0.0) + f.size_bytes * f.weight * step.repeat
        stats = nets[0].link_stats()
        assert stats.keys() == moved.keys()
        for link, (sent, busy) in stats.items():
            assert sent == pytest.approx(moved[link], rel=1e-12) and 0 < busy <= max(cached.values())
        uncached = _ends(lambda env, c: FlowNetwork(env, c, cache_rates=False), plans_at, cap)
        reference = _ends(_PerFlowNetwork, plans_at, cap)
        assert cached == uncached
        assert cached.keys() == reference.keys()
        for i, t in reference.items():
            # cohorts re-time all their flows together and sum in another order: equal within round-off
            assert cached[i] == pytest.approx(t, rel=1e-12, abs=1e-15)


def test_a_ring_step_over_a_large_group_starts_as_one_cohort_and_its_rates_are_reused():
    topo = build_topology(CLUSTER_PRESETS["dgx-a100-80gb"].with_nodes(8))
    plan = plan_collective(Collective("all_gather", 64e6, tuple(range(64)), "dp"), topo, "ring")
    alone = simulate_plan(plan, topo.capacity_Bps)
    env = simpy.Environment()
    net = FlowNetwork(env, topo.capacity_Bps)
    known = []

    def twice():
        yield from net.run(plan)
        known.append(dict(net._rates))
        yield from net.run(plan)

    env.process(twice())
    env.run()
    assert env.now == 2 * alone
    ring = [s for s in net._shapes.values() if s.links_of]
    assert len(ring) == 1 and len(ring[0].links_of) == 512 and len(ring[0].starts) == 1
    assert net.flows_started == 2 * 512
    # NVLink hops finish before NIC hops (the cohort splits by rate); the second run computes nothing
    assert net._rates == known[0] and 1 <= len(known[0]) <= 3


def _fat_tree(rng, hosts=4, trunk_ratio=1.0):
    """Links of a small leaf/spine fabric: host i's up-link u{i} and down-link d{i} (capacity 10),
    two leaves (hosts 0-1, 2-3) whose trunks to the spine carry ``trunk_ratio`` x their hosts' sum;
    routes between hosts of one leaf skip the spine."""
    cap = {f"u{i}": 10.0 for i in range(hosts)} | {f"d{i}": 10.0 for i in range(hosts)}
    for leaf in range(2):
        cap[f"up{leaf}"] = cap[f"dn{leaf}"] = 10.0 * hosts / 2 * trunk_ratio

    def route(a, b):
        la, lb = a * 2 // hosts, b * 2 // hosts
        return (f"u{a}", f"d{b}") if la == lb else (f"u{a}", f"up{la}", f"dn{lb}", f"d{b}")

    def plans():
        out = []
        for _ in range(rng.randint(2, 6)):
            pairs = [(a, b) for a in range(hosts) for b in range(hosts) if a != b]
            flows = tuple(Flow(route(a, b), rng.choice([10.0, 30.0])) for a, b in rng.sample(pairs, rng.randint(1, 8)))
            out.append((rng.choice([0.0, 0.5, 1.3]), CommPlan("a2a", (CommStep(0.0, flows),))))
        return out
    return cap, plans


def test_spine_trunks_that_cannot_bind_are_left_out_and_the_times_match_the_per_flow_network():
    rng = random.Random(7)
    for ratio in (1.0, 0.5):
        cap, plans = _fat_tree(rng, trunk_ratio=ratio)
        for _ in range(60):
            plans_at = plans()
            nets = []
            ends = _ends(FlowNetwork, plans_at, cap, nets)
            reference = _ends(_PerFlowNetwork, plans_at, cap)
            assert ends.keys() == reference.keys()
            for i, t in reference.items():
                assert ends[i] == pytest.approx(t, rel=1e-12, abs=1e-15)
            if ratio == 1.0:  # non-blocking: every trunk used is left out
                used = {link for _, p in plans_at for f in p.steps[0].flows for link in f.links}
                assert used & {"up0", "up1", "dn0", "dn1"} <= nets[0]._bypass.free


def test_a_link_that_becomes_able_to_bind_mid_run_is_shared_from_then_on():
    cap = {"a": 10.0, "b": 10.0, "t": 15.0, "x": 10.0, "y": 10.0}
    first = CommPlan("p", (CommStep(0.0, (Flow(("a", "t", "x"), 100.0),)),))
    second = CommPlan("p", (CommStep(0.0, (Flow(("b", "t", "y"), 100.0),)),))
    nets = []
    ends = _ends(FlowNetwork, [(0.0, first), (2.0, second)], cap, nets)
    # 0-2 s: the first flow alone at 10 B/s (t, fed by a only, cannot bind); from 2 s both share t:
    # 7.5 B/s each; the first has 80 B left -> ends at 2 + 80/7.5, then the second runs at 10 B/s
    assert ends[0] == pytest.approx(2 + 80 / 7.5, rel=1e-12)
    assert ends[1] == pytest.approx(ends[0] + (100 - 7.5 * (ends[0] - 2)) / 10, rel=1e-12)
    assert ends == pytest.approx(_ends(_PerFlowNetwork, [(0.0, first), (2.0, second)], cap))
    assert "t" not in nets[0]._bypass.free


def test_the_array_form_of_progressive_filling_matches_it_within_round_off():
    rng = random.Random(3)
    worst = 0.0
    for _ in range(300):
        n_links = rng.randint(1, 30)
        cap = {k: rng.choice([5.0, 10.0, 12.5, 7.3, 40.0]) for k in range(n_links)}
        links_of = [tuple(rng.sample(range(n_links), rng.randint(1, min(4, n_links)))) for _ in range(rng.randint(1, 60))]
        weights = [rng.choice([1.0, 1.0, 3.0, 0.5]) for _ in links_of]
        flow_of = np.array([i for i, links in enumerate(links_of) for _ in links])
        link_of = np.array([k for links in links_of for k in links])
        got = max_min_rates_arrays(flow_of, link_of, np.array(weights), np.array([cap[k] for k in range(n_links)]))
        for a, b in zip(max_min_rates(links_of, weights, cap), got):
            worst = max(worst, abs(a - b) / a)
    assert worst < 1e-13


def test_a_large_all_to_all_beside_a_ring_matches_the_per_flow_network():
    topo = build_topology(CLUSTER_PRESETS["dgx-h100"].with_nodes(6))
    a2a = plan_collective(Collective("all_to_all", 256e6, tuple(range(40)), "ep"), topo, "direct")
    ring = plan_collective(Collective("all_gather", 64e6, (0, 9, 18, 27, 36, 45), "dp"), topo, "ring")
    assert sum(len(s.flows) for s in a2a.steps) >= ARRAY_MIN_FLOWS
    plans_at = [(0.0, a2a), (1e-4, ring)]
    nets = []
    ends = _ends(FlowNetwork, plans_at, topo.capacity_Bps, nets)
    reference = _ends(_PerFlowNetwork, plans_at, topo.capacity_Bps)
    for i, t in reference.items():
        assert ends[i] == pytest.approx(t, rel=1e-12)
    alone = simulate_plan(a2a, topo.capacity_Bps)
    assert ends[0] > alone  # the ring slowed it
    step = next(s for s in a2a.steps if s.flows)
    fluid = isolated_time_s([f.size_bytes for f in step.flows], [f.links for f in step.flows],
                            [f.weight for f in step.flows], topo.capacity_Bps)
    assert alone - step.latency_s == pytest.approx(fluid, rel=1e-12)
    assert alone == pytest.approx(_ends(_PerFlowNetwork, [(0.0, a2a)], topo.capacity_Bps)[0], rel=1e-12)
    assert ("leaf0.0", "spine") in nets[0]._bypass.free


def test_a_start_time_given_to_run_lands_where_a_timeout_then_the_latency_would():
    # run(plan, start_s) folds the wait for start_s and the first step's latency into one event; the
    # float times must be those of the two timeouts in turn (engine results stay byte-identical)
    rng = random.Random(7)
    for _ in range(200):
        now, start = rng.uniform(0, 1e3), rng.uniform(0, 1e3)
        start = max(start, now) + rng.choice([0.0, rng.uniform(0, 1e-3)])
        plan = CommPlan("t", (CommStep(rng.uniform(0, 1e-5), (Flow(("a",), rng.uniform(1, 1e3)),)),
                              CommStep(rng.uniform(0, 1e-5), (Flow(("b",), rng.uniform(1, 1e3)),))))
        out = {}
        for folded in (False, True):
            env = simpy.Environment()
            net = FlowNetwork(env, CAP)

            def proc(folded=folded):
                yield env.timeout(now)
                if folded:
                    elapsed = yield from net.run(plan, start)
                else:
                    if start > env.now:
                        yield env.timeout(start - env.now)
                    elapsed = yield from net.run(plan)
                out[folded] = (env.now, elapsed)
            env.process(proc())
            env.run()
        assert out[True] == out[False]


def test_a_cohort_ending_before_its_step_alone_needs_no_event_and_rejoins_the_sharing_when_joined():
    # One step: 60 B over c (12 B/s, 5 s) and 60 B over a (10 B/s, 6 s). Its second run (from 6.5)
    # starts alone with cached rates: the c part, ending before the a part, ends without an event of
    # its own (lazy), unless joined: X (6 B on c) from 8.5 shares c at 6 B/s each (X ends at 9.5; the
    # c part's 30 B left then take until 12.0); Y (24 B on c) from 12.25 finds c free: ends at 14.25.
    step = _one(["c"], 60.0).steps[0]
    plan = CommPlan("test", (CommStep(0.0, step.flows + (Flow(("a",), 60.0),)),))
    plans_at = [(0.0, plan), (6.5, plan), (8.5, _one(["c"], 6.0)), (12.25, _one(["c"], 24.0))]
    nets: list = []
    ends = _ends(FlowNetwork, plans_at, CAP, nets)
    assert ends == pytest.approx({0: 6.0, 1: 12.5, 2: 9.5, 3: 14.25}, rel=1e-12)
    assert ends == _ends(lambda env, c: FlowNetwork(env, c, cache_rates=False), plans_at, CAP)
    sent, busy = nets[0].link_stats()["c"]
    assert (sent, busy) == pytest.approx((60.0 + 60.0 + 6.0 + 24.0, 5.0 + 5.5 + 2.0), rel=1e-12)
    # without X the c part ends at 11.5 unseen, and Y still finds c free
    alone = _ends(FlowNetwork, [plans_at[0], plans_at[1], plans_at[3]], CAP)
    assert alone == pytest.approx({0: 6.0, 1: 12.5, 2: 14.25}, rel=1e-12)


def test_plans_run_again_with_cached_rates_and_lazy_cohorts_match_the_per_flow_network():
    # The same plans started again and again (a layer's collectives, micro-batch after micro-batch) take
    # the cached-rate path (_start_alone) and leave their early cohorts lazy; at random starts they meet
    # each other. Cached == uncached exactly, and both equal the per-flow reference within round-off.
    class Counting(FlowNetwork):
        lazy_ends = 0

        def _detach(self, c, now):
            Counting.lazy_ends += c.lazy  # only _retire ends a cohort that is still lazy
            super()._detach(c, now)

    def ring_like(rng, links):  # steps of equal-size flows over links of unequal capacity, as a ring's
        return CommPlan("r", tuple(
            CommStep(rng.choice([0.0, 0.2]), tuple(Flow(tuple(rng.sample(links, rng.randint(1, 2))), size)
                                                   for _ in range(rng.randint(2, 5))), rng.choice([1, 2]))
            for size in [rng.choice([10.0, 25.0, 40.0]) for _ in range(rng.randint(1, 3))]))

    rng = random.Random(7)
    links = [f"l{i}" for i in range(8)]
    cap = {link: rng.choice([5.0, 10.0, 12.5, 40.0]) for link in links}
    for _ in range(60):
        plans = [ring_like(rng, links) for _ in range(rng.randint(2, 4))]
        plans_at = [(round(rng.uniform(0.0, 400.0), 1), p) for p in plans for _ in range(5)]  # mostly apart
        cached = _ends(Counting, plans_at, cap)
        assert cached == _ends(lambda env, c: FlowNetwork(env, c, cache_rates=False), plans_at, cap)
        reference = _ends(_PerFlowNetwork, plans_at, cap)
        for i, t in reference.items():
            assert cached[i] == pytest.approx(t, rel=1e-12, abs=1e-15)
    assert Counting.lazy_ends > 50  # the lazy path ran
