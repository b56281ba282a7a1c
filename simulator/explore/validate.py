"""`simulator validate`: published training runs become scenarios, are simulated, and are compared.

Each CSV row follows the scenario contract (DESIGN.md §4.1); an empty cell is simply an absent key,
so the row gets exactly the defaults a user's scenario gets (``simulator/defaults.py``). The bundled
CSVs are ``simulator/data/training_runs.csv`` and ``training_runs_2.csv`` (the shared published runs),
``training_runs_extra.csv`` (further published runs, held out from every modelling decision) and
``training_runs_nemo2.csv`` (NeMo 2 recipes as DGX Cloud v25.05 published them on GB200 and H100; the
Blackwell kernel constants come from kernel microbenchmarks, never from these rows) and
``training_runs_torchtitan.csv`` (the PyTorch team's torchtitan runs on 500 W Grand Teton H100: FSDP2,
torch.compile, torchao float8, async TP, PP, CP; held out from every modelling decision) and
``training_runs_nemo1.csv`` (NeMo 24.07's published FP8 pretraining table on DGX H100, held out), each
with the software settings the sources imply (column ``settings_from_source`` says why), never a
fitted number.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from ..hardware.hwfile import read_text
from ..pipeline import simulate_metrics
from ..scenario import scenario_from_dict
from .enumerate import plan_of

DATA = Path(__file__).resolve().parents[1] / "data"
DEFAULT_CSV = DATA / "training_runs.csv"
DEFAULT_CSVS = (DEFAULT_CSV, DATA / "training_runs_extra.csv", DATA / "training_runs_2.csv",
                DATA / "training_runs_nemo2.csv", DATA / "training_runs_torchtitan.csv",
                DATA / "training_runs_nemo1.csv")
MODEL_COLUMNS = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "ffn_hidden_size",
                 "vocab_size", "seq_length", "num_experts", "moe_top_k", "mtp_layers")
PARALLEL_INT = ("tp", "pp", "dp", "cp", "ep", "etp", "zero_stage", "virtual_stages", "recompute_num_layers",
                "wgrad_deferral_limit")
PARALLEL_STR = ("schedule", "recompute", "sharding", "recompute_method", "cp_algorithm", "tp_comm_overlap_cfg")
BOOL = {"true": True, "false": False}
# The other columns row_to_raw reads, and those that only describe a row (its provenance, how its step
# time was derived); any other column is refused, so that a misspelled one is not silently ignored.
OTHER_COLUMNS = ("mlp", "model_preset", "moe_capacity_factor", "dropout", "moe_pad_to_capacity",
                 "moe_shared_expert_overlap", "gpu",
                 "num_nodes", "gpus_per_node", "nics_per_node", "nic_bandwidth_Gbps", "sequence_parallel",
                 "tp_comm_overlap", "layers_per_stage", "recompute_modules", "global_batch_size",
                 "micro_batch_size", "dtype", "attention", "grad_dtype", "grad_accumulation_fusion",
                 "optimizer_state_dtype", "master_weights", "fp8_params", "kernels", "cuda_graphs", "fp8_recipe",
                 "cross_entropy", "attention_module", "nvls", "overlap_grad_reduce", "defer_embedding_wgrad_compute")
DESCRIPTIVE_COLUMNS = ("source", "name", "kind", "notes", "quote", "source_url", "settings_from_source",
                       "measured_metric", "measured_value", "iteration_time_s", "target_iteration_time_s",
                       "measured_memory_GiB")
KNOWN_COLUMNS = frozenset(MODEL_COLUMNS + PARALLEL_INT + PARALLEL_STR + OTHER_COLUMNS + DESCRIPTIVE_COLUMNS)


def _number(row: dict, key: str, kind: type = int, text: str | None = None):
    """``row[key]`` (or ``text``, one item of it) as ``kind``; a bad cell is a one-line error naming
    the row and the column."""
    text = row[key] if text is None else text
    try:
        return kind(text)
    except (TypeError, ValueError):
        what = "an integer" if kind is int else "a number"
        raise ValueError(f"row {row.get('name', '?')}: {key} must be {what}, got {text!r}") from None


def _int(row: dict, key: str) -> int:
    return _number(row, key, int)


def _bool(row: dict, key: str):
    """A true/false cell as a bool; anything else is passed on for the scenario's own check."""
    return BOOL.get(row[key].lower(), row[key])


def _items(row: dict, key: str) -> list[str]:
    """A semicolon-separated cell's items."""
    return [x.strip() for x in row[key].split(";") if x.strip()]


def row_to_raw(row: dict) -> dict:
    """A CSV row as a scenario dict; empty cells are left out (the documented defaults apply)."""
    given = {k: v.strip() for k, v in row.items() if k and v is not None and v.strip() != ""}
    model: dict = {k: _int(given, k) for k in MODEL_COLUMNS if k in given}
    if "mlp" in given:
        model["mlp"] = given["mlp"]
    if "model_preset" in given:  # a row whose model the columns cannot carry (MLA, shared experts...)
        model["preset"] = given["model_preset"]
    if "moe_capacity_factor" in given:
        model["moe_capacity_factor"] = _number(given, "moe_capacity_factor", float)
    for k in ("dropout", "moe_pad_to_capacity", "moe_shared_expert_overlap"):  # dropout empty: the model's style decides
        if k in given:
            model[k] = _bool(given, k)
    cluster = {"preset": given.get("gpu", "dgx-a100-80gb")}
    for k in ("num_nodes", "gpus_per_node", "nics_per_node"):
        if k in given:
            cluster[k] = _int(given, k)
    if "nic_bandwidth_Gbps" in given:
        cluster["nic_bandwidth_Gbps"] = _number(given, "nic_bandwidth_Gbps", float)
    if "nvls" in given:  # NCCL_NVLS_ENABLE=0 in a recipe's environment: false
        cluster["nvls"] = _bool(given, "nvls")
    par: dict = {k: _int(given, k) for k in PARALLEL_INT if k in given}
    par.update({k: given[k] for k in PARALLEL_STR if k in given})
    for k in ("sequence_parallel", "tp_comm_overlap", "overlap_grad_reduce", "defer_embedding_wgrad_compute"):
        if k in given:
            par[k] = _bool(given, k)
    if "layers_per_stage" in given:  # semicolon-separated, first pipeline stage first
        par["layers_per_stage"] = [_number(given, "layers_per_stage", int, x)
                                   for x in _items(given, "layers_per_stage")]
    if "recompute_modules" in given:  # Megatron-Core --recompute-modules, semicolon-separated
        par["recompute_modules"] = _items(given, "recompute_modules")
    training: dict = {k: _int(given, k) for k in ("global_batch_size", "micro_batch_size") if k in given}
    for k in ("dtype", "attention", "grad_dtype", "optimizer_state_dtype", "master_weights", "kernels", "fp8_recipe",
              "cross_entropy", "attention_module"):
        if k in given:
            training[k] = given[k]
    for k in ("grad_accumulation_fusion", "fp8_params", "cuda_graphs"):
        if k in given:
            training[k] = _bool(given, k)
    return {"name": given.get("name", "row"), "model": model, "cluster": cluster, "parallelism": par,
            "training": training}


def evaluate_row(row: dict) -> dict:
    """Simulate one row; an invalid configuration is a failed row with its reason, not a crash."""
    name = row.get("name", "row")
    out = {"name": name, "source": row.get("source", ""), "status": "failed", "reason": "",
           "measured_s": None, "predicted_s": None, "error": None}
    try:
        measured = _number(row, "iteration_time_s", float)
        if not 0 < measured < math.inf:  # nan fails too, and never reaches the JSON
            raise ValueError(f"row {name}: iteration_time_s must be a positive number of seconds, "
                             f"got {row['iteration_time_s']!r}")
        out["measured_s"] = measured
        scn = scenario_from_dict(row_to_raw(row), default_name=name)
        m = simulate_metrics(scn)
    except (ValueError, KeyError) as exc:
        out["reason"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return out
    p = scn.parallel
    if row.get("measured_memory_GiB", "").strip():  # a published peak (a framework's max reserved memory)
        out["measured_memory_bytes"] = _number(row, "measured_memory_GiB", float) * 2 ** 30
    out.update(status="ok", predicted_s=m["iteration_time_s"], error=m["iteration_time_s"] / out["measured_s"] - 1,
               num_gpus=m["num_gpus"], mfu=m["mfu"], hfu=m["hfu"], breakdown=m["time_breakdown_s"],
               fits_in_memory=m["fits_in_memory"], memory_total_bytes=m["memory_bytes"]["total"],
               busiest_rank=m["busiest_rank"]["rank"], busiest_breakdown=m["busiest_rank"]["time_breakdown_s"],
               plan=f"tp{p.tp} pp{p.pp} dp{p.dp}" + (f" v{p.virtual_stages}" if p.virtual_stages > 1 else "")
               + f" mb{scn.training.micro_batch_size} z{p.zero_stage} {plan_of(scn).recompute_label()}")
    return out


def read_rows(paths: list[str | Path]) -> list[dict]:
    rows: list[dict] = []
    for path in paths or DEFAULT_CSVS:
        p = Path(path)
        with io.StringIO(read_text(p, "validation CSV"), newline="") as f:
            reader = csv.DictReader(f)
            names = list(reader.fieldnames or ())
            if len(set(names)) != len(names):  # DictReader would keep the last cell of a repeated column
                raise ValueError(f"validation CSV {str(p)!r} repeats column(s) "
                                 f"{sorted({n for n in names if names.count(n) > 1})}")
            columns = set(names)
            missing = {"name"} - columns | ({"iteration_time_s"} - columns if "target_iteration_time_s" not in columns
                                            else set())
            if missing:
                raise ValueError(f"validation CSV {str(p)!r} lacks column(s) {sorted(missing)}")
            unknown = columns - KNOWN_COLUMNS
            if unknown:
                raise ValueError(f"validation CSV {str(p)!r} has unknown column(s) {sorted(unknown)}; "
                                 f"known: {', '.join(sorted(KNOWN_COLUMNS))}")
            before = len(rows)
            for row in reader:
                if None in row or None in row.values():  # more or fewer cells than the header has
                    cells = sum(v is not None for k, v in row.items() if k is not None) + len(row.get(None) or ())
                    raise ValueError(f"validation CSV {str(p)!r} line {reader.line_num}: {cells} cells, "
                                     f"the header has {len(reader.fieldnames or ())}")
                # the shared training_runs_2.csv names the published step time target_iteration_time_s
                row.setdefault("iteration_time_s", row.get("target_iteration_time_s"))
                rows.append(row)
            if len(rows) == before:
                raise ValueError(f"validation CSV {str(p)!r} has a header and no rows")
    return rows


def validate_rows(rows: list[dict], jobs: int = 0) -> list[dict]:
    jobs = jobs or min(len(rows), os.cpu_count() or 1)
    if jobs <= 1 or len(rows) <= 1:
        return [evaluate_row(r) for r in rows]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(evaluate_row, rows))


def _errors(results: list[dict]) -> dict:
    signed = [r["error"] for r in results if r["status"] == "ok"]
    errs = [abs(e) for e in signed]
    return {"rows": len(results), "ok": len(errs), "failed": len(results) - len(errs),
            "mape": sum(errs) / len(errs) if errs else None, "max_abs_error": max(errs) if errs else None,
            "mean_error": sum(signed) / len(signed) if signed else None}


def summary(results: list[dict]) -> dict:
    """MAPE and largest error over all rows, and the same per source (one paper or table each)."""
    sources = dict.fromkeys(r["source"] for r in results)
    return _errors(results) | {"by_source": {src: _errors([r for r in results if r["source"] == src])
                                             for src in sources}}


def markdown_table(results: list[dict]) -> str:
    head = ("| run | GPUs | plan | measured s | predicted s | error | MFU | compute | recompute | TP | EP | PP | DP "
            "| bubble |\n|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    for r in results:
        if r["status"] != "ok":
            lines.append(f"| {r['name']} | | failed: {r['reason']} | {r['measured_s']} | | | | | | | | | | |")
            continue
        b = r["busiest_breakdown"]
        lines.append(f"| {r['name']} | {r['num_gpus']} | {r['plan']} | {r['measured_s']:.2f} | {r['predicted_s']:.2f} | "
                     f"{100 * r['error']:+.1f}% | {100 * r['mfu']:.1f}% | {b['compute']:.2f} | {b['recompute']:.2f} | "
                     f"{b['comm_tp']:.2f} | {b['comm_ep']:.2f} | {b['comm_pp']:.2f} | {b['comm_dp']:.2f} | "
                     f"{b['bubble']:.2f} |")
    s = summary(results)
    if s["mape"] is not None:
        lines.append(f"\nMAPE {100 * s['mape']:.1f}%, max |error| {100 * s['max_abs_error']:.1f}% over {s['ok']} rows"
                     + (f", {s['failed']} failed" if s["failed"] else "")
                     + ". Breakdown columns: exposed seconds on the busiest rank (idle the least: the "
                     "bottleneck pipeline stage).")
        if len(s["by_source"]) > 1:
            lines += [f"- {src or 'unnamed source'}: MAPE {100 * e['mape']:.1f}%, max |error| "
                      f"{100 * e['max_abs_error']:.1f}%, mean error {100 * e['mean_error']:+.1f}% over {e['ok']} rows"
                      for src, e in s["by_source"].items() if e["mape"] is not None]
    return "\n".join(lines)


def validate_command(args) -> int:
    results = validate_rows(read_rows(args.csv))
    s = summary(results)
    if args.json:
        print(json.dumps({"rows": results, "summary": s}))
    else:
        print(markdown_table(results))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "validation.md").write_text("# Predicted vs measured iteration time\n\n" + markdown_table(results) + "\n")
    ok = [r for r in results if r["status"] == "ok"]
    if ok:
        from ..analysis.accuracy_plot import plot_predicted_vs_measured
        plot_predicted_vs_measured(ok, out / "validation.png")
    if results and not ok:  # nothing to compare: the rows themselves are bad input
        print(f"error: none of the {len(results)} rows could be simulated; the first: {results[0]['reason']}",
              file=sys.stderr)
        return 2
    failed = [r for r in results if r["status"] != "ok"]
    if failed:  # the others are compared: a warning, not an error
        print(f"warning: {len(failed)} of {len(results)} rows could not be simulated; the first, "
              f"{failed[0]['name']}: {failed[0]['reason']}", file=sys.stderr)
    return 0
