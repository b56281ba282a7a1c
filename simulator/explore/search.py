"""``simulator search SCENARIO.toml``: the fastest parallelism plan that fits, for the scenario's model,
cluster and global batch.

1. Enumerate every plan (``enumerate``); the scenario rules reject invalid ones.
2. Static memory estimate (``estimate``, the accounting of ``analysis.memory``) rejects those that do
   not fit, and the dominance rules of ``enumerate`` drop choices that cannot be faster: per plan only
   the least recompute that fits (where that is full recompute, the fewest layers per chunk that fit);
   ZeRO-3 only where no lower ZeRO stage fits.
3. Branch and bound: plans are simulated in order of their time lower bound; a plan whose bound is not
   below the K-th best simulated time (ranking is by tokens/s, i.e. by time at a fixed batch) cannot
   enter the top K and is skipped, and so is every later one. With ``per_tp`` the lowest-bound plan of
   every TP degree is simulated too, which shows what each TP degree costs (exposed TP communication).
   The top K is exact as long as the bound holds (tests check it against the simulator).
4. Rows stream to results/<name>/search.csv; the top K, the best plan per TP degree and a Pareto
   chart (tokens/s against peak memory) follow.
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from itertools import chain
from pathlib import Path

from ..hardware.clusters import CLUSTER_PRESETS
from ..scenario import Scenario, check_structure
from ..scenario_checks import ScenarioError
from ..units import GiB
from .enumerate import PLAN_FIELDS, RECOMPUTE_ORDER, Plan, SearchSpace, enumerate_plans, valid_plans
from .estimate import EstimateCache, estimate
from .evaluate import RESULT_COLUMNS, CsvStream, Evaluator, default_jobs, flatten, progress
from .sweep import BaseScenario, read_base, render_table

ESTIMATE_COLUMNS = ("estimated_memory_bytes", "time_lower_bound_s", "tp_comm_bound_s")
CSV_COLUMNS = ("label",) + PLAN_FIELDS + ESTIMATE_COLUMNS + RESULT_COLUMNS


@dataclass
class Candidate:
    plan: Plan
    scn: Scenario
    memory_bytes: float
    bound_s: float
    tp_bound_s: float

    def row(self) -> dict:
        return {"label": self.plan.label(), **self.plan.as_dict(), "estimated_memory_bytes": self.memory_bytes,
                "time_lower_bound_s": self.bound_s, "tp_comm_bound_s": self.tp_bound_s}


@dataclass
class SearchResult:
    ranked: list[dict]  # simulated plans that fit, fastest first
    rows: list[dict]  # every simulated plan
    per_tp: dict  # tp -> best simulated row, or the best bound that was pruned
    counts: dict
    wall_s: float
    csv_path: Path
    capacity_bytes: float
    estimate_s: float = 0.0  # enumeration, validation and static estimates

    @property
    def plans_per_s(self) -> float:
        """Plans simulated per second of the simulation phase."""
        return self.counts["simulated"] / max(self.wall_s - self.estimate_s, 1e-9)


def _probe(base: BaseScenario) -> Scenario:
    """A scenario of the base file to read the model, cluster and batch from: its own plan, or else
    pure data parallelism with one sample per GPU (so that a base plan that does not divide is no error)."""
    try:
        return base.build()
    except ScenarioError as first:
        cluster = base.raw.get("cluster", {})
        preset = CLUSTER_PRESETS.get(cluster.get("preset", "dgx-a100-80gb"))
        per_node = cluster.get("gpus_per_node", preset.gpus_per_node if preset else 0)
        gpus = cluster.get("num_nodes", 1) * per_node
        training = dict(base.raw.get("training", {}), global_batch_size=gpus, micro_batch_size=1)
        try:
            return replace(base, raw=dict(base.raw, parallelism={"dp": gpus}, training=training)).build()
        except (ScenarioError, TypeError):
            raise first from None


def candidates(base: BaseScenario, space: SearchSpace, cache: EstimateCache, counts: dict,
               pruned: list | None = None, jobs: int = 1) -> list[Candidate]:
    """Valid plans that fit, after the dominance rules, each with its estimates, in bound order; the
    plans that do not fit are appended to ``pruned`` as CSV rows. With ``jobs`` > 1 the groups of
    plans are estimated in that many worker processes (``_shards``), with the same result."""
    scn0 = _probe(base)
    batch = base.raw.get("training", {}).get("global_batch_size", scn0.training.global_batch_size)
    lps = scn0.parallel.layers_per_stage if "layers_per_stage" in base.raw.get("parallelism", {}) else None
    groups: dict = {}
    for plan in enumerate_plans(scn0.model, scn0.num_gpus, batch, space, lps, scn0.cluster, scn0.training.dtype,
                                scn0.parallel.cp_algorithm):
        counts["enumerated"] += 1
        groups.setdefault(replace(plan, zero_stage=0, recompute=""), []).append(plan)
    plans = list(groups.values())
    if jobs > 1 and len(plans) > 1:
        shards = _shards(plans, jobs)
        with ProcessPoolExecutor(max_workers=len(shards)) as pool:
            done = pool.map(_estimate_shard, [base] * len(shards), [space] * len(shards),
                            [[plans[k] for k in shard] for shard in shards])
            per_group = dict(zip(chain.from_iterable(shards), chain.from_iterable(done)))
    else:
        per_group = {k: _estimate_group(base, space, group, cache) for k, group in enumerate(plans)}
    out = []
    for k in range(len(plans)):  # in enumeration order: the CSV rows come out as from one process
        delta, kept, rows = per_group[k]
        for key, n in delta.items():
            counts[key] += n
        out += kept
        if pruned is not None:
            pruned += rows
    out.sort(key=lambda c: (c.bound_s, c.plan))
    return out


def _shards(groups: list[list[Plan]], jobs: int) -> list[list[int]]:
    """Group indices split into ``jobs`` shards of about equal plan counts, keeping groups of one
    pipeline shape (pp, schedule, virtual stages, micro-batch size: the estimate's costliest cached
    sub-results, its action lists and rank profiles) in one shard."""
    shapes: dict = {}
    for k, g in enumerate(groups):
        p = g[0]
        shapes.setdefault((p.pp, p.schedule, p.virtual_stages, p.micro_batch_size), []).append(k)
    shards: list[list[int]] = [[] for _ in range(jobs)]
    load = [0] * jobs
    for ks in sorted(shapes.values(), key=lambda ks: -sum(len(groups[k]) for k in ks)):
        i = load.index(min(load))
        shards[i] += ks
        load[i] += sum(len(groups[k]) for k in ks)
    return [sorted(s) for s in shards if s]


def _estimate_shard(base: BaseScenario, space: SearchSpace, groups: list[list[Plan]]) -> list[tuple]:
    """``_estimate_group`` of every group, in a worker process with its own estimate cache."""
    cache = EstimateCache()
    return [_estimate_group(base, space, g, cache) for g in groups]


def _estimate_group(base: BaseScenario, space: SearchSpace, plans: list[Plan],
                    cache: EstimateCache) -> tuple[dict, list[Candidate], list[dict]]:
    """Plans that differ only in ZeRO stage and recompute: (count increments, candidates that fit
    after the dominance rules, CSV rows of those that do not fit)."""
    delta = dict.fromkeys(("invalid", "pruned_memory", "dominated"), 0)
    rows, out = [], []
    fits: dict = {}
    for plan, scn, _reason in valid_plans(plans, base.with_plan):
        if scn is None:
            delta["invalid"] += 1
            continue
        try:
            est = estimate(scn, cache, with_time=False)
        except ValueError:  # a combination the scenario rules accept but the lowering cannot split
            delta["invalid"] += 1
            continue
        fits[plan.zero_stage, plan.recompute] = (plan, scn, est) if est.fits else None
        if not est.fits:
            delta["pruned_memory"] += 1
            rows.append({"label": plan.label(), **plan.as_dict(), "estimated_memory_bytes": est.total_bytes,
                         "status": "pruned-memory", "reason": f"estimated peak {est.total_bytes / GiB:.1f} "
                         f"GiB > capacity {est.capacity_bytes / GiB:.1f} GiB (stage {est.worst_stage})"})
    entries = []
    for (zero, rc), entry in sorted(fits.items(), key=lambda kv: (kv[0][0], RECOMPUTE_ORDER.index(kv[0][1]))):
        if entry is None:
            continue
        lesser = any(fits.get((zero, r)) for r in RECOMPUTE_ORDER[:RECOMPUTE_ORDER.index(rc)])
        below = zero == 3 and any(v for (z, _), v in fits.items() if z < 3)
        if space.prune_dominated and (lesser or below):
            delta["dominated"] += 1
            continue
        block = least_block(base, entry[0], entry[1], cache) if space.partial_recompute and rc == "full" else None
        if block is not None and space.prune_dominated:  # fewer layers recompute: never slower, it fits
            delta["dominated"] += 1
            entry = block
        elif block is not None:
            entries.append(block)
        entries.append(entry)
    for plan, scn, est in entries:
        try:
            full = estimate(scn, cache)
        except ValueError:  # the sharding of the layer's ops rejects it (see above)
            delta["invalid"] += 1
            continue
        out.append(Candidate(plan, scn, full.total_bytes, full.time_lower_bound_s, full.tp_comm_bound_s))
    return delta, out, rows


def run_search(base: BaseScenario, csv_path: Path, top: int = 10, jobs: int = 0, backend: str = "local",
               address: str | None = None, space: SearchSpace | None = None, bound: bool = True,
               per_tp: bool = True, limit: int | None = None) -> SearchResult:
    """``limit``: simulate at most this many plans (in bound order), the rest are "skipped-limit"."""
    t0 = time.perf_counter()
    space = space or SearchSpace()
    if top < 1:
        raise ValueError(f"--top must be >= 1, got {top}")
    counts = dict.fromkeys(("enumerated", "invalid", "pruned_memory", "dominated", "pruned_bound", "simulated",
                            "cache_hits", "failed", "skipped_limit"), 0)
    pruned: list[dict] = []
    parallel = backend == "local" and (jobs or default_jobs()) > 1
    cands = candidates(base, space, EstimateCache(), counts, pruned, (jobs or default_jobs()) if parallel else 1)
    estimate_s = time.perf_counter() - t0
    best: list[float] = []  # sorted times of fitting simulated plans (the top-K threshold)
    rows: list[dict] = []
    per: dict = {}
    probed: set[int] = set()
    submitted = [0]  # plans handed to the evaluator
    with CsvStream(csv_path, CSV_COLUMNS) as out, Evaluator(jobs, backend, address) as ev:
        window = 2 * ev.jobs
        for row in pruned:
            out.write(row)

        def collect() -> None:
            cand, result = ev.next_done()
            row = {**cand.row(), **flatten(result)}
            out.write(row)
            rows.append(row)
            bar.update(1)
            if row["status"] == "ok" and row["fits_in_memory"]:
                t = row["iteration_time_s"]
                best.insert(sum(1 for x in best if x <= t), t)

        def needed(c: Candidate) -> bool:
            if per_tp and c.plan.tp not in probed:  # the lowest-bound plan of every TP degree
                probed.add(c.plan.tp)
                return True
            return c.bound_s < (best[top - 1] if len(best) >= top else float("inf"))

        with progress(len(cands), "search") as bar:
            for c in cands:
                while ev.pending >= window:
                    collect()
                status = ("skipped-limit" if limit is not None and submitted[0] >= limit else
                          "pruned-bound" if bound and not needed(c) else "")
                if status:
                    counts[status.replace("-", "_")] += 1
                    out.write({**c.row(), "status": status, "reason": _SKIP_REASONS[status]})
                    if status == "pruned-bound" and c.plan.tp not in per:
                        per[c.plan.tp] = {**c.row(), "status": "pruned-bound"}
                    continue
                ev.submit(c, c.scn)
                submitted[0] += 1
            while ev.pending:
                collect()
        counts["simulated"], counts["cache_hits"] = ev.simulated, ev.cache_hits
    capacity = cands[0].scn.cluster.gpu.memory_capacity_bytes if cands else 0.0
    return _result(rows, per, counts, time.perf_counter() - t0, csv_path, float(capacity), estimate_s)


def _result(rows: list[dict], per: dict, counts: dict, wall_s: float, csv_path: Path, capacity: float,
            estimate_s: float) -> SearchResult:
    counts["failed"] = sum(r["status"] != "ok" for r in rows)
    ranked = rank([r for r in rows if r["status"] == "ok" and r["fits_in_memory"]])
    for r in ranked:  # fastest simulated plan per TP degree replaces the bound-only entry
        if per.get(r["tp"], {}).get("status") != "ok":
            per[r["tp"]] = r
    return SearchResult(ranked, rows, dict(sorted(per.items())), counts, wall_s, csv_path, capacity, estimate_s)


_SKIP_REASONS = {"skipped-limit": "not simulated: the --limit of plans to simulate was reached",
                 "pruned-bound": "time lower bound >= the simulated times it would have to beat"}


def least_block(base: BaseScenario, plan: Plan, scn: Scenario, cache: EstimateCache) -> tuple | None:
    """(plan, scenario, memory estimate) of the full-recompute ``plan`` with the fewest layers of each
    model chunk recomputed (recompute_method "block") that fits; None when only every layer fits. Each
    layer moved to recompute stores less, so the peak falls as N grows: N is bisected in
    [1, the longest chunk's layers), every layer being the plan that fits."""
    longest = max(sum(1 for i in c if i < scn.model.num_layers) for c in cache.layout(scn).chunks)
    lo, hi, best = 1, longest, None
    while lo < hi:
        mid = (lo + hi) // 2
        trial = replace(plan, recompute_num_layers=mid)
        t_scn = base.with_plan(trial)
        est = estimate(t_scn, cache, with_time=False)
        if est.fits:
            best, hi = (trial, t_scn, est), mid
        else:
            lo = mid + 1
    return best


def rank(rows: list[dict]) -> list[dict]:
    """Fastest first: tokens/s descending, ties broken by the plan's fields (deterministic)."""
    return sorted(rows, key=lambda r: (-r["tokens_per_s"], tuple(r[k] for k in PLAN_FIELDS)))


def explain_tp(result: SearchResult, gpus_per_node: int) -> list[str]:
    """Why the best plans keep TP inside a node: the blocking TP communication of larger degrees."""
    if not result.ranked:
        return []
    top = result.ranked[0]
    lines = []
    for tp, r in result.per_tp.items():
        if tp <= top["tp"]:
            continue
        where = f"spans {tp // gpus_per_node} nodes" if tp > gpus_per_node else "inside a node"
        if r["status"] == "ok":
            slow = r["iteration_time_s"] / top["iteration_time_s"] - 1
            lines.append(f"TP={tp} ({where}): best simulated plan {slow:+.0%} slower; exposed TP communication "
                         f"{r['time_comm_tp_s']:.3g} s vs {top['time_comm_tp_s']:.3g} s at TP={top['tp']}")
        else:
            lines.append(f"TP={tp} ({where}): not simulated, its lower bound {r['time_lower_bound_s']:.2f} s "
                         f"(of which {r['tp_comm_bound_s']:.2f} s blocking TP communication) already exceeds "
                         f"{top['iteration_time_s']:.2f} s")
    return lines


def _secs(x: float, scale: float) -> str:
    return f"{x:.3f}" if scale < 10 else f"{x:.2f}"


def format_ranked(rows: list[dict]) -> str:
    head = ["#", "plan", "time s", "tokens/s", "MFU", "mem GiB", "compute", "recomp", "tp", "pp", "dp", "bubble",
            "other"]
    table = [head]
    named = ("time_compute_s", "time_recompute_s", "time_comm_tp_s", "time_comm_pp_s", "time_comm_dp_s",
             "time_bubble_s")
    for i, r in enumerate(rows, 1):
        t = r["iteration_time_s"]
        other = t - sum(r[k] for k in named)
        table.append([str(i), r["label"], f"{t:.3f}", f"{r['tokens_per_s']:,.0f}", f"{r['mfu']:.1%}",
                      f"{r['memory_total_bytes'] / GiB:.1f}"] + [_secs(r[k], t) for k in named] + [_secs(other, t)])
    return render_table(table)


def search_command(args) -> int:
    base = read_base(args.scenario, args.set)
    check_structure(base.raw)
    out_dir = Path(args.out) if args.out else Path("results") / base.display_name
    csv_path = out_dir / "search.csv"
    try:
        result = run_search(base, csv_path, args.top, args.jobs, args.backend, args.ray_address,
                            bound=not getattr(args, "exhaustive", False))
    except KeyboardInterrupt:
        print(f"interrupted: the plans simulated so far are in {csv_path}", file=sys.stderr)
        return 130
    scn0 = _probe(base)
    notes = explain_tp(result, scn0.cluster.gpus_per_node)
    if result.rows:
        from ..analysis.pareto_plot import plot_pareto
        plot_pareto(result.rows, out_dir / "pareto.png", result.capacity_bytes, title=f"{base.display_name}: plans")
    if args.json:
        print(json.dumps({"top": result.ranked[:args.top], "per_tp": list(result.per_tp.values()),
                          "counts": result.counts, "wall_s": result.wall_s, "estimate_s": result.estimate_s,
                          "tp_notes": notes}))
        return 0 if result.ranked else _nothing_fits(result, scn0)
    c = result.counts
    print(f"{c['enumerated']} plans enumerated: {c['invalid']} invalid, {c['pruned_memory']} do not fit, "
          f"{c['dominated']} dominated, {c['pruned_bound']} pruned by the time bound, {c['simulated']} simulated "
          f"({c['cache_hits']} cache hits, {c['failed']} failed) in {result.wall_s:.1f} s "
          f"(estimates {result.estimate_s:.1f} s, then {result.plans_per_s:.2f} plans simulated/s)")
    if not result.ranked:
        return _nothing_fits(result, scn0)
    print(f"\ntop {min(args.top, len(result.ranked))} plans by tokens/s (breakdown: exposed seconds per step)")
    print(format_ranked(result.ranked[:args.top]))
    print("\nbest simulated plan per TP degree (the lowest-bound plan of every degree is simulated)")
    print(format_per_tp(result.per_tp))
    for line in notes:
        print(line)
    print(f"\nCSV: {csv_path}   Pareto chart: {out_dir / 'pareto.png'}")
    return 0


def _nothing_fits(result: SearchResult, probe: Scenario) -> int:
    """No plan to recommend: the model and batch do not fit the cluster (bad input, exit 2), one line."""
    c = result.counts
    why = (f"no plan fits in memory: the {c['pruned_memory']} plans the rules accept all exceed "
           f"{probe.cluster.gpu.memory_capacity_bytes / GiB:.1f} GiB per GPU" if c["simulated"] == 0 else
           f"no simulated plan fits in memory ({c['simulated']} simulated, {c['failed']} failed)")
    print(f"error: {why}; every plan and its estimated peak: {result.csv_path}", file=sys.stderr)
    return 2


def format_per_tp(per_tp: dict) -> str:
    table = [["TP", "plan", "status", "time s", "bound s", "TP comm s"]]
    for tp, r in per_tp.items():
        ok = r["status"] == "ok"
        table.append([str(tp), r["label"], r["status"], f"{r['iteration_time_s']:.3f}" if ok else "",
                      f"{r['time_lower_bound_s']:.3f}", f"{r['time_comm_tp_s']:.3f}" if ok else
                      f">= {r['tp_comm_bound_s']:.3f}"])
    return render_table(table)
