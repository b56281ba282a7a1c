"""All-to-all context parallelism (``cp_algorithm = "a2a"``, strategy/cp_a2a): Q, K, V exchanged for
heads / cp of every token, one full-length attention kernel, the output exchanged back; the backward
mirrors it; each exchange blocks and carries a reshuffle copy on either side."""

import subprocess
import sys

import pytest

from simulator.pipeline import simulate
from simulator.scenario import scenario_from_dict
from simulator.scenario_checks import ScenarioError
from simulator.strategy.cp_a2a import COPY_BYTES_PER_BYTE
from simulator.strategy.lower import lower
from test_lower import scn

# GQA: 8 query heads and 4 K/V heads of 32; cp 4 leaves 2 and 1 per rank
GQA = {"num_layers": 2, "hidden_size": 256, "num_attention_heads": 8, "num_kv_heads": 4, "vocab_size": 1024,
       "seq_length": 128, "mlp": "swiglu"}
CP = 4
LOCAL = 128 // CP  # tokens per CP rank
Q, KV, OUT = LOCAL * 256 * 2, 2 * LOCAL * 128 * 2, LOCAL * 256 * 2  # bf16 bytes of one rank's Q, K+V, output


def _layer0(phase, **par):
    g = lower(scn(GQA, cp=CP, batch=1, cp_algorithm="a2a", **par)).graph
    return [t for t in g.tasks if t.layer == 0 and t.rank == 0 and t.phase == phase
            and (".core" in t.name or "cp_a2a" in t.name)]


@pytest.mark.parametrize("phase, first, second", [("F", Q + KV, OUT), ("B", OUT, Q + KV)])
def test_the_core_runs_between_two_blocking_all_to_alls(phase, first, second):
    tasks = _layer0(phase)
    assert [t.name.split(".", 2)[-1] for t in tasks] == [
        "cp_a2a_in_pack", "cp_a2a_in", "cp_a2a_in_unpack", "core", "cp_a2a_out_pack", "cp_a2a_out",
        "cp_a2a_out_unpack"]
    for a, b in zip(tasks, tasks[1:]):
        assert b.deps == (a.id,)  # a chain: nothing of the layer runs beside an exchange
    in_pack, a_in, in_unpack, _, out_pack, a_out, out_unpack = tasks
    assert (a_in.comm.op, a_in.comm.size_bytes, a_in.comm.group) == ("all_to_all", first, (0, 1, 2, 3))
    assert (a_out.comm.op, a_out.comm.size_bytes) == ("all_to_all", second)
    assert a_in.stream == a_out.stream == "comm_cp"
    for copy, size in ((in_pack, first), (in_unpack, first), (out_pack, second), (out_unpack, second)):
        assert [w.bytes for w in copy.work] == [COPY_BYTES_PER_BYTE * size]


def test_each_rank_attends_its_heads_over_the_whole_sequence():
    """heads / cp at full length: the FLOPs of the sequence split (s / cp queries of every head) in one
    causal kernel of length s."""
    core = next(t for t in _layer0("F") if t.name.endswith(".core"))
    ring = next(t for t in lower(scn(GQA, cp=CP, batch=1)).graph.tasks
                if t.layer == 0 and t.rank == 0 and t.phase == "F" and t.name.endswith(".core0"))
    (att,) = [w for w in core.work if w.kind == "attention"]
    (step,) = [w for w in ring.work if w.kind == "attention"]
    assert att.shape == (1, 8 // CP, 128, 128, 32) and att.causal
    assert att.flops == pytest.approx(step.flops * CP)


def test_full_recompute_reruns_the_exchanges():
    """The recompute re-runs the forward's exchanges with its core; the copies are recompute work."""
    tasks = _layer0("R", recompute="full")
    assert [t.comm.op for t in tasks if t.comm] == ["all_to_all", "all_to_all"]
    assert {t.category for t in tasks if not t.comm} == {"recompute"}


def test_the_saved_activations_are_the_sequence_split_s():
    ring, a2a = (simulate(scn(GQA, cp=CP, batch=1, cp_algorithm=alg)).metrics["memory_bytes"]["activations"]
                 for alg in ("ring", "a2a"))
    assert a2a == ring


@pytest.mark.parametrize("heads, kv, tp, cp, key", [(8, 4, 1, 8, "num_kv_heads"), (8, 8, 2, 8, "num_attention_heads"),
                                                    (8, 2, 4, 2, "num_kv_heads")])
def test_heads_that_do_not_divide_are_refused_by_name(heads, kv, tp, cp, key):
    raw = {"model": dict(GQA, num_attention_heads=heads, num_kv_heads=kv),
           "cluster": {"preset": "dgx-h100", "num_nodes": 2},
           "parallelism": {"tp": tp, "cp": cp, "dp": 16 // (tp * cp), "cp_algorithm": "a2a"},
           "training": {"global_batch_size": 16, "micro_batch_size": 1}}
    with pytest.raises(ScenarioError, match=f"model.{key} = "):
        scenario_from_dict(raw)


def test_the_command_line_refuses_them_in_one_line(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text('[model]\npreset = "llama3-8b"\n[cluster]\npreset = "dgx-h100"\nnum_nodes = 2\n'
                 '[parallelism]\ntp = 4\ncp = 4\ncp_algorithm = "a2a"\n'
                 '[training]\nglobal_batch_size = 2\nmicro_batch_size = 1\n')
    out = subprocess.run([sys.executable, "-m", "simulator", "run", str(f)], capture_output=True, text=True)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "num_kv_heads = 8 / tp = 4" in lines[0]


def test_k_and_v_travel_at_their_own_head_widths():
    """MLA's K heads (qk_head_dim) and V heads (v_head_dim) differ: each at its own width."""
    g = lower(scn(dict(GQA, v_head_dim=16), cp=CP, batch=1, cp_algorithm="a2a")).graph
    a2a = next(t for t in g.tasks if t.layer == 0 and t.rank == 0 and t.phase == "F" and t.name.endswith("cp_a2a_in"))
    assert a2a.comm.size_bytes == Q + LOCAL * 4 * (32 + 16) * 2
