"""FSDP2 under torch.distributed.pipelining (sharding "fsdp2" with pp > 1): the pipeline stage turns off
gradient sync and resharding for every backward and runs each unit's post-backward after its last one,
so every unit is reduce-scattered once per step, after the stage's last backward, and the step holds
whole parameters and unsharded gradients."""

import pytest

from simulator.pipeline import simulate_metrics
from simulator.scenario import scenario_from_dict
from simulator.strategy.lower import lower
from simulator.strategy.zero_impl import pipelined_fsdp2, state_zero_stage

MODEL = {"num_layers": 4, "hidden_size": 512, "num_attention_heads": 8, "vocab_size": 8192, "seq_length": 256}


def scn(pp: int = 2, zero_stage: int = 2, sharding: str = "fsdp2", microbatches: int = 4):
    dp = 8 // pp
    return scenario_from_dict({"model": MODEL, "cluster": {"preset": "dgx-h100", "num_nodes": 1},
                               "parallelism": {"pp": pp, "dp": dp, "zero_stage": zero_stage,
                                               **({"sharding": sharding} if sharding else {})},
                               "training": {"global_batch_size": dp * microbatches, "grad_dtype": "fp32"}})


def test_the_rule_is_fsdp2_with_a_pipeline_and_sharded_state():
    assert pipelined_fsdp2(scn().parallel) and pipelined_fsdp2(scn(zero_stage=3).parallel)
    assert not pipelined_fsdp2(scn(pp=1).parallel)
    assert not pipelined_fsdp2(scn(sharding="fsdp1").parallel)
    assert state_zero_stage(scn().parallel) == 1 and state_zero_stage(scn(pp=1).parallel) == 2


def _reduce_scatters(s):
    g = lower(s).graph
    return g, [t for t in g.tasks if t.name.endswith("grad_reduce_scatter")]


def test_each_unit_is_reduce_scattered_once_after_the_stages_last_backward():
    g, rs = _reduce_scatters(scn())
    for rank in {t.rank for t in rs}:
        mine = [t for t in rs if t.rank == rank]
        names = [t.name.split(".")[1] for t in mine]
        assert len(names) == len(set(names))  # one per unit
        assert {t.name.split(".")[0] for t in mine} == {"B3"}  # after the last micro-batch's backward
        last_b = max(i for i, t in enumerate(g.tasks) if t.rank == rank and t.phase == "B" and t.kind == "compute"
                     and "fsdp2_chunk_cat" not in t.name)
        for t in mine:  # each waits for its gradients' copy, which waits for the whole backward's end
            copy = g.tasks[t.deps[0]]
            assert "fsdp2_chunk_cat" in copy.name and max(copy.deps) >= last_b
    # without a pipeline, FSDP2 reduce-scatters every unit in every micro-batch's backward
    _, rs1 = _reduce_scatters(scn(pp=1))
    rank0 = [t for t in rs1 if t.rank == rs1[0].rank]
    assert len(rank0) == 4 * len({t.name.split(".")[1] for t in rank0})


def test_the_step_holds_whole_parameters_and_unsharded_gradients():
    piped, flat = simulate_metrics(scn())["memory_bytes"], simulate_metrics(scn(sharding="fsdp1"))["memory_bytes"]
    assert piped["grads"] == pytest.approx(flat["grads"] * 4)  # fp32, sharded over dp 4 when not piped
    assert piped["params"] == pytest.approx(flat["params"])  # SHARD_GRAD_OP: whole through a micro-batch
    assert piped["optimizer"] == pytest.approx(flat["optimizer"])


def test_zero2_with_a_pipeline_defaults_to_fsdp2_and_deepspeed_refuses_it():
    """DeepSpeed's PipelineEngine asserts "ZeRO-2 and ZeRO-3 are incompatible with pipeline
    parallelism": ZeRO-2 with pp > 1 means FSDP2's SHARD_GRAD_OP under torch's pipelining (torchtitan)."""
    from simulator.defaults import default_sharding
    from simulator.scenario import ScenarioError

    assert (default_sharding(2), default_sharding(2, pp=4), default_sharding(3, pp=4)) == ("deepspeed", "fsdp2", "fsdp2")
    assert scn(zero_stage=2, sharding="").parallel.sharding == "fsdp2"
    assert scn(pp=1, zero_stage=2, sharding="").parallel.sharding == "deepspeed"
    for sharding, z in (("deepspeed", 2), ("deepspeed", 3), ("deepspeed-2021", 3)):
        with pytest.raises(ScenarioError) as exc:
            scn(zero_stage=z, sharding=sharding)
        assert "DeepSpeed's pipeline engine refuses ZeRO-2 and ZeRO-3" in str(exc.value)
        assert f"zero_stage {z} and pp = 2" in str(exc.value) and "\n" not in str(exc.value)


def test_each_unit_is_gathered_once_at_its_chunks_first_forward():
    g = lower(scn(zero_stage=3)).graph
    gathers = [t for t in g.tasks if t.name.endswith("param_all_gather")]
    for rank in {t.rank for t in gathers}:
        mine = [t for t in gathers if t.rank == rank]
        assert {t.name.split(".")[0] for t in mine} == {"F0"}  # the first micro-batch's forward, no backward
        assert len(mine) == len({t.name.split(".")[1] for t in mine})
    # the search's bound counts them so: never above the simulated step
    from simulator.explore.estimate import estimate
    s = scn(zero_stage=3)
    assert estimate(s).time_lower_bound_s <= simulate_metrics(s)["iteration_time_s"] * (1 + 1e-9)
