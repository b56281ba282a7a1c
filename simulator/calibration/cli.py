"""The ``calibrate`` commands: profile (kernels -> tables, tiny model -> trace), fit (real traces ->
tables), compare (a real trace against the simulated scenario) and show (a real trace as a measured
run). Each returns an exit code; errors are one line on stderr and exit code 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..scenario import Scenario, load_scenario

if TYPE_CHECKING:  # type-only: the profiling modules load where a command runs them
    from .profile import KernelSpec

TINY_SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "calibration" / "tiny-gpt.toml"
# Cluster preset whose GPU matches the profiled one (the roofline fallback of missing ops uses it);
# other devices, the CPU included, keep the scenario's cluster.
_CLUSTER_OF_GPU = (("H200", "dgx-h200"), ("H100", "dgx-h100"), ("A100-SXM4-80GB", "dgx-a100-80gb"),
                   ("A100 80GB", "dgx-a100-80gb"), ("A100", "dgx-a100-40gb"))


def _fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def _trace_stem(path: str) -> str:
    name = Path(path).name
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    return name or "trace"


def calibrated_scenario_toml(scn: Scenario, tables: str, cluster_preset: str | None) -> str:
    """The scenario as a TOML file with ``[cost] compute = "calibrated"`` over ``tables``."""
    m, p, t = scn.model, scn.parallel, scn.training
    lines = [f'name = "{scn.name}"', "", "[model]"]
    lines += [f"{k} = {v}" for k, v in (("num_layers", m.num_layers), ("hidden_size", m.hidden_size),
                                         ("num_attention_heads", m.num_attention_heads),
                                         ("num_kv_heads", m.num_kv_heads), ("ffn_hidden_size", m.ffn_hidden_size),
                                         ("vocab_size", m.vocab_size), ("seq_length", m.seq_length))]
    lines += [f'mlp = "{m.mlp}"', f'norm = "{m.norm}"', f'position_embedding = "{m.position_embedding}"',
              f"tie_embeddings = {str(m.tie_embeddings).lower()}", f"bias = {str(m.bias).lower()}", "",
              "[cluster]", f'preset = "{cluster_preset or scn.cluster.name}"', "num_nodes = 1",
              "gpus_per_node = 1", "nics_per_node = 1", "", "[parallelism]", f"tp = {p.tp}", f"pp = {p.pp}", "",
              "[training]", f"global_batch_size = {t.global_batch_size}",
              f"micro_batch_size = {t.micro_batch_size}", f'dtype = "{t.dtype}"', f'attention = "{t.attention}"',
              f'kernels = "{t.kernels}"', f'cross_entropy = "{t.cross_entropy}"',
              'attention_module = "sdpa"  # the profiled model (calibration/tiny_model): K, V repeated, then SDPA',
              "",
              "[cost]", 'compute = "calibrated"', f'tables = "{tables}"', ""]
    return "\n".join(lines)


def _progress(done: int, total: int, spec: KernelSpec) -> None:
    if done % 100 == 0 or done == total:
        print(f"  {done}/{total} kernels", file=sys.stderr)


def _write_trace_provenance(trace: Path, prov: dict, scn: Scenario, steps: int, warmup: int) -> Path:
    """``<trace>.provenance.json`` next to the trace: how it was made (the tables' provenance, the
    command included), what it holds, and its SHA-256."""
    import hashlib

    from .tiny_model import ANNOTATION_PREFIX

    doc = dict(prov, trace=trace.name, scenario=scn.name, profiled_steps=steps, warmup_steps=warmup,
               record_shapes=True, annotations=f"{ANNOTATION_PREFIX}<microbatch>:<layer>:<op>",
               sha256=hashlib.sha256(trace.read_bytes()).hexdigest())
    path = trace.with_name(trace.name.removesuffix(".json.gz") + ".provenance.json")
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def _bad_profile_args(device: str | None, steps: int, cuda: bool, warmup: int = 0) -> str:
    """What is wrong with ``calibrate profile``'s arguments, checked before any kernel is profiled."""
    if device not in (None, "cpu", "cuda"):
        return f"--device must be cuda or cpu, got {device!r}"
    if steps < 1:
        return f"--steps must be >= 1, got {steps}"
    if warmup < 0:
        return f"--warmup must be >= 0, got {warmup}"
    if device != "cpu" and not cuda:
        return "no CUDA device found; pass --device cpu to run the calibration pipeline on the CPU"
    return ""


def cmd_profile(device: str | None, out_dir: str | None, scenario: str | None = None, steps: int = 3,
                presets: bool | None = None, warmup: int | None = None) -> int:
    """Profile kernels into tables (the presets' layers on a GPU, the scenario's ops always), NCCL
    collectives with more than one GPU, and train the (tiny) scenario's model under torch.profiler."""
    try:
        import torch
    except ImportError:
        return _fail("calibrate profile needs PyTorch (pip install torch)")
    from ..cost.calibrated import COLLECTIVE_COLUMNS, COLLECTIVE_TABLE, KERNEL_COLUMNS, KERNEL_TABLE, write_table
    from .environment import device_provenance, device_slug
    from .profile import copy_specs, kernel_rows_csv, preset_specs, profile_kernels, scenario_specs
    from .tiny_model import WARMUP_STEPS, train_profiled

    warmup = WARMUP_STEPS if warmup is None else warmup
    bad = _bad_profile_args(device, steps, torch.cuda.is_available(), warmup)
    if bad:
        return _fail(bad)
    dev = "cpu" if device == "cpu" else "cuda"
    try:
        scn = load_scenario(scenario or TINY_SCENARIO)
    except ValueError as exc:
        return _fail(str(exc))
    out = Path(out_dir) if out_dir else Path("results") / "calibration" / device_slug(dev)
    command = f"python -m simulator calibrate profile --device {dev} --out {out}" + (
        f" --scenario {scenario}" if scenario else "") + (" --no-presets" if presets is False else "") + (
        f" --warmup {warmup}" if warmup != WARMUP_STEPS else "")
    threads = torch.get_num_threads()
    if dev == "cpu":
        # One thread: OpenMP threads contend with any other process on the host and make CPU timings
        # erratic; the tiny model trains single-threaded too, so tables and trace see the same kernels.
        torch.set_num_threads(1)
    try:
        specs = scenario_specs(scn)
        if presets if presets is not None else dev == "cuda":
            specs = preset_specs(dtype=scn.training.dtype) + specs
        if dev == "cuda":
            specs += copy_specs()
        print(f"profiling {len(specs)} kernels on {dev} ...", file=sys.stderr)
        rows, skipped = profile_kernels(specs, dev, scn.training.dtype, _progress)
        for line in skipped:
            print(f"warning: not profiled: {line}", file=sys.stderr)
        prov = device_provenance(dev, command)
        write_table(out / KERNEL_TABLE, KERNEL_COLUMNS, kernel_rows_csv(rows), prov)
        if dev == "cuda" and torch.cuda.device_count() > 1:
            from .collectives import collective_rows, profile_collectives
            crows = profile_collectives(torch.cuda.device_count())
            write_table(out / COLLECTIVE_TABLE, COLLECTIVE_COLUMNS, collective_rows(crows), prov)
        trace = train_profiled(scn, dev, out / f"{scn.name}.trace.json.gz", steps=steps, warmup=warmup)
        _write_trace_provenance(trace, prov, scn, steps, warmup)
    finally:
        torch.set_num_threads(threads)
    cluster = next((c for key, c in _CLUSTER_OF_GPU if key in prov["device"]), None) if dev == "cuda" else None
    scn_out = out / f"{scn.name}.toml"
    # tables as given on the command line: relative paths are read from the working directory, the
    # convention of scenario files (tables = "scenarios/calibration/h100-sxm", DESIGN.md §4.1)
    scn_out.write_text(calibrated_scenario_toml(scn, str(out), cluster))
    print(f"tables: {out / KERNEL_TABLE} ({len(rows)} kernels, {prov['device']})")
    print(f"trace: {trace}")
    print(f"next: python -m simulator calibrate compare {trace} {scn_out}")
    return 0


def cmd_compare(trace_path: str, scenario_path: str, out_dir: str | None) -> int:
    """Simulate the scenario, map the trace's kernels onto its ops, write the comparison."""
    from ..analysis.measured import plot_side_by_side
    from ..pipeline import simulate
    from ..trace import write_chrome_trace
    from .compare import compare_run, comparison_markdown, coverage_line, simulated_op_trace, simulated_ops
    from .kineto import parse_kineto, run_to_trace

    try:
        scn = load_scenario(scenario_path)
        run = parse_kineto(trace_path)
        result = simulate(scn)
        c = compare_run(run, result)
    except ValueError as exc:
        return _fail(str(exc))
    out = Path(out_dir) if out_dir else Path("results") / f"{scn.name}-compare"
    out.mkdir(parents=True, exist_ok=True)
    measured = run_to_trace(run, include_host=False)
    rank, ops = simulated_ops(result, c["rank"])
    sim_trace = simulated_op_trace(result, rank, ops)
    (out / "compare.json").write_text(json.dumps(c, indent=2) + "\n")
    (out / "compare.md").write_text(comparison_markdown(c))
    write_chrome_trace(measured, out / "measured_trace.json")
    plot_side_by_side(measured, sim_trace, out / "compare_timeline.png",
                      title=f"{scn.name}: measured ({c['device']}) vs simulated",
                      measured_window=tuple(c["measured_window_s"]), simulated_window=tuple(c["simulated_window_s"]))
    err = c["step_time_error"]
    print(coverage_line(c))
    print(c["placement"])
    print(f"{scn.name}: measured step {c['measured_step_s'] * 1e3:.3f} ms, simulated {c['simulated_step_s'] * 1e3:.3f} ms,"
          f" error {'n/a' if err is None else f'{err:+.1%}'}")
    print(f"wrote {out}/compare.md, compare.json, compare_timeline.png, measured_trace.json")
    return 0


def cmd_show(trace_path: str, out_dir: str | None) -> int:
    """A real torch.profiler trace on its own, as a measured run: timelines and per-stream statistics."""
    from ..analysis.measured import (exposed_communication, kernel_time_by_category, plot_measured_timeline,
                                     stream_utilization, summary_markdown)
    from ..trace import write_chrome_trace
    from .kineto import load_kineto_trace

    try:
        trace = load_kineto_trace(trace_path)
    except ValueError as exc:
        return _fail(str(exc))
    out = Path(out_dir) if out_dir else Path("results") / f"{_trace_stem(trace_path)}-show"
    out.mkdir(parents=True, exist_ok=True)
    util = stream_utilization(trace)
    cats = kernel_time_by_category(trace)
    exposed = exposed_communication(trace)
    doc = {"trace": str(trace_path), "device": trace.metadata.get("device", ""), "ranks": trace.ranks(),
           "duration_s": trace.duration_s, "steps": trace.metadata.get("steps", {}),
           "stream_utilization": util, "kernel_time_by_category_s": {str(r): v for r, v in cats.items()},
           "exposed_communication_s": {str(r): v for r, v in exposed.items()}}
    (out / "show.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "show.md").write_text(f"# {_trace_stem(trace_path)} (measured)\n\n" + summary_markdown(util, cats, exposed))
    write_chrome_trace(trace, out / "trace.json")
    title = f"{_trace_stem(trace_path)} ({trace.metadata.get('device', '')})"
    pngs = [plot_measured_timeline(trace, out / "timeline.png", title=title)]
    if len(trace.ranks()) > 1:
        for r in trace.ranks():
            sub = type(trace)(tuple(e for e in trace.events if e.rank == r), trace.source, trace.rank_labels,
                              trace.metadata)
            pngs.append(plot_measured_timeline(sub, out / f"timeline_rank{r}.png", title=f"{title}, rank {r}"))
    for r, c in sorted(cats.items()):
        total = sum(c.values())
        parts = ", ".join(f"{k} {v / total:.0%}" for k, v in c.items() if v > 0) if total else "no kernels"
        x = exposed.get(r, {})
        print(f"rank {r}: kernel time {total * 1e3:.3f} ms ({parts}); exposed communication "
              f"{x.get('exposed_s', 0.0) * 1e3:.3f} of {x.get('comm_s', 0.0) * 1e3:.3f} ms")
    print(f"wrote {out}/show.md, show.json, trace.json, {', '.join(p.name for p in pngs)}")
    return 0


def cmd_fit(trace_paths: list[str], scenario_path: str, out_dir: str) -> int:
    """Match the traces' kernels to the scenario's ops and write tables (kernels.csv, efficiencies.csv,
    collectives.csv when NCCL kernels matched) and fit.json; exit 2 when too few kernels matched."""
    from dataclasses import asdict

    from ..cost.calibrated import (COLLECTIVE_COLUMNS, COLLECTIVE_TABLE, KERNEL_COLUMNS, KERNEL_TABLE, RATE_COLUMNS,
                                   RATE_TABLE, write_table)
    from .fit import fit_traces, provenance, report_lines

    try:
        scn = load_scenario(scenario_path)
        fit = fit_traces(trace_paths, scn)
    except ValueError as exc:
        return _fail(str(exc))
    out = Path(out_dir)
    command = (f"python -m simulator calibrate fit {' '.join(trace_paths)} --scenario {scenario_path} "
               f"--out {out_dir}")
    prov = provenance(fit, scn, command)
    write_table(out / KERNEL_TABLE, KERNEL_COLUMNS, [(r.kind, r.name, r.pass_, r.dtype, r.shape, r.flops, r.bytes,
                                                      r.time_s, r.samples) for r in fit.rows], prov)
    write_table(out / RATE_TABLE, RATE_COLUMNS, [(r.kind, r.pass_, r.dtype, r.rate, r.unit, r.fraction_of_peak,
                                                  r.instances) for r in fit.rates], prov)
    if fit.collectives:
        write_table(out / COLLECTIVE_TABLE, COLLECTIVE_COLUMNS, [tuple(asdict(r).values()) for r in fit.collectives],
                    prov)
    doc = {"provenance": prov, "coverage": fit.coverage, "classes": fit.classes, "traces": fit.traces,
           "rates": [asdict(r) for r in fit.rates], "kernels": len(fit.rows), "collectives": len(fit.collectives)}
    (out / "fit.json").write_text(json.dumps(doc, indent=2) + "\n")
    for line in report_lines(fit):
        print(line)
    print(f"tables: {out / KERNEL_TABLE} ({len(fit.rows)} ops), {out / RATE_TABLE} ({len(fit.rates)} rates)"
          + (f", {out / COLLECTIVE_TABLE} ({len(fit.collectives)} collectives)" if fit.collectives else ""))
    print(f"next: python -m simulator run {scenario_path} --set cost.compute=calibrated --set cost.tables={out}")
    return 0
