"""Specification of the Trace type's Chrome/Perfetto JSON output and its exact round trip."""

from __future__ import annotations

import gzip
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.trace import Trace, TraceEvent, read_chrome_trace, to_chrome_json, write_chrome_trace


def three_events() -> Trace:
    return Trace(
        events=(
            TraceEvent("fwd.l0", "compute", 0, "compute", 0.001, 0.0025, stage=0, microbatch=3,
                       phase="F", layer=0, flops=2.5e12),
            TraceEvent("allreduce", "comm_tp", 0, "comm_tp", 0.0015, 0.002, mem_delta_bytes=-64.0),
            TraceEvent("fwd.l1", "compute", 1, "compute", 0.002, 0.004, stage=1, chunk=1),
        ),
        rank_labels={0: "stage 0 (rank 0)"},
        metadata={"num_stages": 2, "scenario": "tiny", "schedule": ["1f1b", 2]},
    )


def metadata_events(doc: dict, name: str) -> list[dict]:
    return [e for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == name]


def test_one_process_per_rank_named_by_its_label():
    doc = to_chrome_json(three_events())
    names = {e["pid"]: e["args"]["name"] for e in metadata_events(doc, "process_name")}
    assert names == {0: "stage 0 (rank 0)", 1: "rank 1"}
    sort = {e["pid"]: e["args"]["sort_index"] for e in metadata_events(doc, "process_sort_index")}
    assert sort == {0: 0, 1: 1}


def test_one_thread_per_stream_compute_first_with_unique_nonzero_tids():
    doc = to_chrome_json(three_events())
    threads = {(e["pid"], e["args"]["name"]): e["tid"] for e in metadata_events(doc, "thread_name")}
    assert set(threads) == {(0, "compute"), (0, "comm_tp"), (1, "compute")}
    assert len(set(threads.values())) == 3 and min(threads.values()) >= 1
    order = {(e["pid"], e["tid"]): e["args"]["sort_index"]
             for e in metadata_events(doc, "thread_sort_index")}
    assert order[(0, threads[(0, "compute")])] < order[(0, threads[(0, "comm_tp")])]


def test_complete_events_in_microseconds_with_exact_ts_and_dur():
    doc = to_chrome_json(three_events())
    tid = {(e["pid"], e["args"]["name"]): e["tid"] for e in metadata_events(doc, "thread_name")}
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert [(e["name"], e["cat"], e["pid"], e["tid"], e["ts"], e["dur"]) for e in xs] == [
        ("fwd.l0", "compute", 0, tid[(0, "compute")], 1000.0, 1500.0),
        ("allreduce", "comm_tp", 0, tid[(0, "comm_tp")], 1500.0, 500.0),
        ("fwd.l1", "compute", 1, tid[(1, "compute")], 2000.0, 2000.0),
    ]
    # Default-valued fields are omitted from args.
    assert xs[0]["args"] == {"stage": 0, "microbatch": 3, "phase": "F", "layer": 0,
                             "flops": 2.5e12}
    assert xs[1]["args"] == {"mem_delta_bytes": -64.0}
    assert xs[2]["args"] == {"stage": 1, "chunk": 1}


def test_document_follows_the_trace_event_format():
    doc = to_chrome_json(three_events())
    assert list(doc)[0] == "displayTimeUnit" and doc["displayTimeUnit"] == "ms"
    assert all(isinstance(v, str) for v in doc["otherData"].values())
    assert doc["otherData"]["scenario"] == "tiny" and doc["otherData"]["num_stages"] == "2"
    json.dumps(doc, allow_nan=False)  # strict JSON: no NaN/Infinity


def assert_same(a: Trace, b: Trace) -> None:
    assert len(a.events) == len(b.events)
    for x, y in zip(a.events, b.events):
        assert abs(x.start_s - y.start_s) <= 1e-9 and abs(x.end_s - y.end_s) <= 1e-9
        assert (x.name, x.category, x.rank, x.stream, x.stage, x.microbatch, x.chunk, x.phase,
                x.layer, x.flops, x.mem_delta_bytes) == (
                y.name, y.category, y.rank, y.stream, y.stage, y.microbatch, y.chunk, y.phase,
                y.layer, y.flops, y.mem_delta_bytes)
    assert (a.source, a.rank_labels, a.metadata) == (b.source, b.rank_labels, b.metadata)


@pytest.mark.parametrize("name", ["trace.json", "trace.json.gz"])
def test_round_trip_is_exact(tmp_path, name):
    trace = three_events()
    path = write_chrome_trace(trace, tmp_path / "sub" / name)
    assert path == tmp_path / "sub" / name
    assert (path.read_bytes()[:2] == b"\x1f\x8b") == name.endswith(".gz")
    back = read_chrome_trace(path)
    assert back.metadata["num_stages"] == 2  # types survive, not only the strings
    assert_same(trace, back)


def test_gz_holds_the_same_document(tmp_path):
    trace = three_events()
    plain = json.loads(write_chrome_trace(trace, tmp_path / "t.json").read_text())
    packed = json.loads(gzip.decompress(write_chrome_trace(trace, tmp_path / "t.json.gz")
                                        .read_bytes()))
    assert plain == packed == to_chrome_json(trace)


times = st.floats(min_value=0.0, max_value=1e4, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(times, times, st.integers(0, 5), st.sampled_from(["compute", "dp"])),
                min_size=1, max_size=20))
def test_round_trip_within_one_nanosecond_for_any_times(tmp_path_factory, rows):
    trace = Trace(tuple(TraceEvent(f"e{i}", "other", r, s, min(a, b), max(a, b))
                        for i, (a, b, r, s) in enumerate(rows)), source="measured")
    path = write_chrome_trace(trace, tmp_path_factory.mktemp("rt") / "t.json")
    assert_same(trace, read_chrome_trace(path))


def test_foreign_file_of_our_shape_uses_process_names(tmp_path):
    doc = to_chrome_json(three_events())
    doc["otherData"] = {"scenario": "tiny"}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    back = read_chrome_trace(path)
    assert back.rank_labels == {0: "stage 0 (rank 0)", 1: "rank 1"}
    assert back.metadata == {"scenario": "tiny"}
    assert [e.stream for e in back.events] == ["compute", "comm_tp", "compute"]


def test_not_a_trace_is_a_value_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"foo": 1}')
    with pytest.raises(ValueError, match="traceEvents"):
        read_chrome_trace(bad)
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not a JSON trace"):
        read_chrome_trace(bad)


def test_streams_order_compute_first_and_default_labels():
    trace = three_events()
    assert trace.streams() == ["compute", "comm_tp"]
    assert trace.label(0) == "stage 0 (rank 0)" and trace.label(7) == "rank 7"


def test_a_column_trace_is_the_trace_of_its_tasks_made_one_by_one():
    from simulator.pipeline import simulate
    from simulator.scenario import load_scenario
    from simulator.trace import ColumnTrace

    res = simulate(load_scenario("scenarios/gpt3-1.3b-8xa100.toml"))
    trace = res.trace
    assert isinstance(trace, ColumnTrace)
    # a fresh copy (the run's memory report has made the events): answers from the lanes before any
    # event exists, and one rank's events or one lane's made alone
    trace = ColumnTrace(res.graph.tasks, res.sim.start_s, res.sim.end_s, trace._columns[3], trace.source,
                        trace.rank_labels, trace.metadata, res.graph.streams)
    last = trace.last_end_by_rank()
    flops = trace.total_flops()
    on = {r: trace.on(r) for r in res.graph.ranks}
    on_comm = {r: trace.on(r, "comm_tp") for r in res.graph.ranks}
    mem = {r: trace.memory_events(r) for r in res.graph.ranks}
    cols = {r: (trace.columns(r), trace.memory_columns(r), trace.busy_s(r)) for r in res.graph.ranks}
    span = (trace.start_s, trace.end_s)
    assert "events" not in trace.__dict__
    start, end = res.sim.start_s, res.sim.end_s
    one_by_one = tuple(TraceEvent(t.name, t.category, t.rank, t.stream, start[t.id], end[t.id], t.stage,
                                  t.microbatch, t.chunk, t.phase, t.layer, t.flops, t.mem_delta_bytes)
                       for t in res.graph.tasks)
    plain = Trace(one_by_one, trace.source, trace.rank_labels, trace.metadata)
    assert trace.events == one_by_one and all(type(e) is TraceEvent for e in trace.events)
    assert (trace.source, trace.rank_labels, trace.metadata) == (plain.source, plain.rank_labels, plain.metadata)
    assert last == plain.last_end_by_rank() and flops == plain.total_flops() > 0
    assert list(last) == list(plain.last_end_by_rank())  # ranks in order of first appearance
    assert on == {r: plain.on(r) for r in res.graph.ranks} and all(on.values())
    assert on_comm == {r: plain.on(r, "comm_tp") for r in res.graph.ranks} and all(on_comm.values())
    assert mem == {r: plain.memory_events(r) for r in res.graph.ranks} and all(mem.values())
    assert mem[0] == [e for e in plain.events if e.rank == 0 and e.mem_delta_bytes != 0]
    for r, ((start, end, streams, cats), (m_start, m_end, delta, phases), busy) in cols.items():
        (p_start, p_end, p_streams, p_cats), (pm_start, pm_end, p_delta, p_phases) = plain.columns(r), plain.memory_columns(r)
        assert start.tolist() == p_start.tolist() and end.tolist() == p_end.tolist() and (streams, cats) == (p_streams, p_cats)
        assert (m_start.tolist(), m_end.tolist(), delta.tolist(), phases) == (pm_start.tolist(), pm_end.tolist(),
                                                                            p_delta.tolist(), p_phases)
        assert busy == plain.busy_s(r)
    assert span == (plain.start_s, plain.end_s)
    assert to_chrome_json(trace) == to_chrome_json(plain)
