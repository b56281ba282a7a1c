"""Seeded fuzz of the command line over scenario files (hypothesis, derandomized): random plans on a
small model and cluster, and well-formed files with one malformed value. Every run exits 0 or 2 (1 is
a simulator bug, a traceback is a bug), none hangs, a successful run's time breakdown adds up to its
iteration time, and the same file gives byte-identical metrics.json.

Runs call ``simulator.__main__.main`` in-process with the figures left out (``write_results`` keeps
only metrics.json, written as it writes it): the figures have their own tests, and leaving them out
keeps a hundred runs within seconds."""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import simulator.pipeline as pipeline
from simulator.__main__ import main
from simulator.strategy.schedules import SCHEDULES

TIMEOUT_S = 20  # a run of these sizes takes well under a second; longer is a hang

BASE = {
    "model": {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "seq_length": 128,
              "vocab_size": 1024},
    "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1},
    "parallelism": {"tp": 2, "pp": 2},
    "training": {"global_batch_size": 16, "micro_batch_size": 1},
}


def toml(doc: dict) -> str:
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float) and math.isnan(v):
            return "nan"
        if isinstance(v, float) and math.isinf(v):
            return "inf" if v > 0 else "-inf"
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return repr(v)
    return "".join(f"[{sec}]\n" + "".join(f"{k} = {value(v)}\n" for k, v in table.items()) + "\n"
                   for sec, table in doc.items())


def _metrics_only(result, out_dir):
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(result.metrics, indent=2) + "\n")
    return out


def _alarm(signum, frame):
    raise TimeoutError(f"a run took more than {TIMEOUT_S} s: hang")


@pytest.fixture(autouse=True)
def fast_results(monkeypatch):
    monkeypatch.setattr(pipeline, "write_results", _metrics_only)
    old = signal.signal(signal.SIGALRM, _alarm)
    yield
    signal.signal(signal.SIGALRM, old)


def run(tmp: Path, doc: dict, tag: str, capsys) -> tuple[int, str, str]:
    (tmp / tag).mkdir(exist_ok=True)
    path = tmp / tag / "scenario.toml"  # same file name: the scenario's name is its stem
    path.write_text(toml(doc))
    signal.alarm(TIMEOUT_S)
    try:
        rc = main(["run", str(path), "--out", str(tmp / tag / "out"), "--json"])
    finally:
        signal.alarm(0)
    out, err = capsys.readouterr()
    return rc, out, err


def check_run(tmp: Path, doc: dict, capsys) -> int:
    rc, out, err = run(tmp, doc, "a", capsys)
    event(f"exit {rc}")
    assert rc in (0, 2), err
    if rc == 2:
        assert err.startswith("error: ") and err.count("\n") == 1, err
        return rc
    metrics = json.loads(out)
    parts = sum(metrics["time_breakdown_s"].values())
    assert math.isclose(parts, metrics["iteration_time_s"], rel_tol=1e-9), (parts, metrics["iteration_time_s"])
    first = (tmp / "a" / "out" / "metrics.json").read_bytes()
    rc2, _, _ = run(tmp, doc, "b", capsys)
    assert rc2 == 0 and (tmp / "b" / "out" / "metrics.json").read_bytes() == first
    return rc


@st.composite
def plans(draw):
    nodes = draw(st.sampled_from([1, 2]))
    gpus = 8 * nodes
    tp = draw(st.sampled_from([1, 2, 4]))
    cp = draw(st.sampled_from([1, 1, 2]))
    pp = draw(st.sampled_from([1, 2, 4]))
    dp = gpus // (tp * cp * pp)
    par = {"tp": tp, "pp": pp, "cp": cp, "dp": dp, "schedule": draw(st.sampled_from(sorted(SCHEDULES))),
           "zero_stage": draw(st.integers(0, 3)), "recompute": draw(st.sampled_from(["none", "selective", "full"])),
           "sequence_parallel": draw(st.booleans()) and tp > 1}
    layers = draw(st.sampled_from([4, 8]))
    mb = draw(st.sampled_from([1, 2]))
    batch = mb * dp * draw(st.sampled_from([1, 2, 4, 8]))
    doc = {"model": dict(BASE["model"], num_layers=layers, num_attention_heads=draw(st.sampled_from([4, 8]))),
           "cluster": {"preset": "dgx-a100-80gb", "num_nodes": nodes}, "parallelism": par,
           "training": {"global_batch_size": batch, "micro_batch_size": mb}}
    if draw(st.booleans()):
        doc["model"].update(num_experts=4, moe_top_k=2)
        par["ep"] = draw(st.sampled_from([1, 2]))
    return doc


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(plans())
def test_random_plans_exit_0_or_2_add_up_and_repeat(tmp_path_factory, capsys, doc):
    check_run(tmp_path_factory.mktemp("plan"), doc, capsys)


BAD_VALUES = [float("nan"), float("inf"), -1, 0, 1e30, "x", True, [1, 2], 2**62, 0.5, ""]
KEYS = [("model", k) for k in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size",
                               "ffn_hidden_size", "num_kv_heads", "num_experts", "moe_top_k", "mlp")] + \
       [("cluster", k) for k in ("num_nodes", "gpus_per_node", "nvlink_bandwidth_GBps", "nics_per_node",
                                 "nic_bandwidth_Gbps", "topology", "preset", "gpu")] + \
       [("parallelism", k) for k in ("tp", "pp", "dp", "cp", "ep", "zero_stage", "schedule", "virtual_stages",
                                     "recompute", "sequence_parallel", "layers_per_stage",
                                     "defer_embedding_wgrad_compute", "wgrad_deferral_limit")] + \
       [("training", k) for k in ("global_batch_size", "micro_batch_size", "dtype", "optimizer", "attention_module")]


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.sampled_from(KEYS), st.sampled_from(BAD_VALUES))
def test_one_malformed_value_exits_0_or_2_with_one_line(tmp_path_factory, capsys, key, value):
    section, name = key
    doc = json.loads(json.dumps(BASE))
    doc[section][name] = value
    check_run(tmp_path_factory.mktemp("bad"), doc, capsys)


def test_nan_bandwidth_is_refused_with_the_field_named(tmp_path, capsys):
    doc = json.loads(json.dumps(BASE))
    doc["cluster"]["nic_bandwidth_Gbps"] = float("nan")
    rc, _, err = run(tmp_path, doc, "nan", capsys)
    assert rc == 2 and "nic_bandwidth_Gbps" in err
