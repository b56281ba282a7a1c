"""Memory of published runs that ran: the OOM verdict must not refuse them. The recipes' optimizer
settings that decide it (NeMo's DistributedFusedAdam with bf16 gradients and, for Nemotron-4 340B, bf16
optimizer state) and DeepSpeed's per-submodule gathers, against closed forms."""

import pytest

from simulator.analysis.buffers import fp8_linear_params, zero3_gathered_bytes
from simulator.analysis.memory import optimizer_bytes_per_param
from simulator.explore.validate import read_rows, row_to_raw
from simulator.pipeline import simulate_metrics
from simulator.scenario import scenario_from_dict
from simulator.scenario_checks import ScenarioError

WIDE = {"num_layers": 2, "hidden_size": 12288, "num_attention_heads": 96, "vocab_size": 1024, "seq_length": 128}


def scn(model=None, training=None, **par):
    return scenario_from_dict({"model": model or {"preset": "gpt3-1.3b"}, "parallelism": {"dp": 8, **par},
                               "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1},
                               "training": {"global_batch_size": 8, **(training or {})}})


def test_bf16_optimizer_state_halves_adam_memory_and_traffic():
    """Apex DistributedFusedAdam keeps its parameter shard and both moments in its ``dtype``: 12 B per
    parameter in fp32, 6 in bf16; the optimizer step moves half the state bytes."""
    from simulator.strategy.lower import lower
    fp32, bf16 = scn(zero_stage=1), scn(zero_stage=1, training={"optimizer_state_dtype": "bf16"})
    assert (optimizer_bytes_per_param(fp32.training), optimizer_bytes_per_param(bf16.training)) == (12, 6)
    m32, m16 = simulate_metrics(fp32)["memory_bytes"], simulate_metrics(bf16)["memory_bytes"]
    assert m16["optimizer"] == pytest.approx(m32["optimizer"] / 2)
    adam = [[w for t in lower(s).graph.tasks if t.name == "optimizer" for w in t.work if w.name == "adam"][0]
            for s in (fp32, bf16)]
    params = adam[0].shape[0]
    assert adam[0].bytes - adam[1].bytes == pytest.approx(params * 12)  # 24 -> 12 B of state read + written
    with pytest.raises(ScenarioError, match="optimizer_state_dtype"):
        scn(training={"optimizer_state_dtype": "fp8"})


def test_apex_master_weights_as_nemo_1_configures_them():
    """NeMo 1's distributed_fused_adam (Apex DistributedFusedAdam): with fp32 state and a BF16 model it keeps
    the 16 low bits of each fp32 master (store_param_remainders): 4 + 4 + 2 = 10 B per parameter; with bf16
    state the BF16 parameter is the master (store_params False): 2 + 2 = 4 B. The step reads and writes
    each state element."""
    from simulator.strategy.grad_sync import adam_state_rw_bytes
    stored = scn(zero_stage=1)
    rem = scn(zero_stage=1, training={"master_weights": "remainders"})
    par = scn(zero_stage=1, training={"master_weights": "parameter", "optimizer_state_dtype": "bf16"})
    assert [optimizer_bytes_per_param(s.training) for s in (stored, rem, par)] == [12, 10, 4]
    assert [adam_state_rw_bytes(s.training) for s in (stored, rem, par)] == [24, 20, 8]
    m12, m10 = simulate_metrics(stored)["memory_bytes"], simulate_metrics(rem)["memory_bytes"]
    assert m10["optimizer"] == pytest.approx(m12["optimizer"] * 10 / 12)
    for training in ({"master_weights": "remainders", "optimizer_state_dtype": "bf16"},
                     {"master_weights": "parameter"},
                     {"master_weights": "remainders", "dtype": "fp16"}):
        with pytest.raises(ScenarioError, match="training.master_weights = '(remainders|parameter)' needs BF16 "
                                                "parameters and optimizer_state_dtype"):
            scn(zero_stage=1, training=training)
    with pytest.raises(ScenarioError, match="needs BF16 parameters and optimizer_state_dtype = 'fp32'; got "
                                            "dtype 'fp8', fp8_params True"):
        scenario_from_dict({"model": {"preset": "gpt3-1.3b"}, "parallelism": {"dp": 8, "zero_stage": 1},
                            "cluster": {"preset": "dgx-h100", "num_nodes": 1},
                            "training": {"global_batch_size": 8, "dtype": "fp8", "fp8_params": True,
                                         "master_weights": "remainders"}})
    with pytest.raises(ScenarioError, match="training.master_weights must be one of stored, remainders, "
                                            "parameter, got 'fp32'"):
        scn(training={"master_weights": "fp32"})


def test_deepspeed_holds_its_prefetched_submodules_not_two_layers():
    """GPT-3 175B's layer: QKV 453M, proj 151M, fc1 604M, fc2 604M elements, all under
    stage3_max_live_parameters (1e9), so a fetch and the next are held at once: fc1 + fc2 at most; the
    2021 engine adds ProcessGroupNCCL's flattened copy of the largest; a submodule's fp16 gradient.
    FSDP holds two whole layers and a layer's gradient."""
    h = 12288
    ds = scn(WIDE, zero_stage=3, sharding="deepspeed-2021", training={"dtype": "fp16"})
    got = zero3_gathered_bytes(ds)
    assert got == pytest.approx((2 * 4 * h * h) * 2 + 4 * h * h * 2 + 4 * h * h * 2, rel=1e-3)
    fsdp = scn(WIDE, zero_stage=3, sharding="fsdp1", training={"dtype": "fp16"})
    layer = 12 * h * h + 13 * h  # GPT layer: weights, biases, two LayerNorms
    assert zero3_gathered_bytes(fsdp) == pytest.approx(layer * (2 * 2 + fsdp.training.grad_dtype_bytes))
    assert got < 0.5 * zero3_gathered_bytes(fsdp)


@pytest.mark.parametrize("row", ["dgxc-llama31-8b-fp8-8gpu", "dgxc-llama31-405b-bf16-576gpu", "dgxc-llama31-405b-fp8-576gpu",
                                 "dgxc-nemotron4-340b-bf16-128gpu", "dgxc-nemotron4-340b-fp8-128gpu",
                                 "dgxc-gpt3-175b-fp8-128gpu", "dgxc-dsv3-671b-bf16-1024gpu",
                                 "narayanan-zero3-530b-640"])
def test_published_runs_fit_in_memory(row):
    """Runs that were measured did not run out of memory: with their recipes' optimizer settings
    (grad_dtype / optimizer_state_dtype), DeepSpeed's gather rule and FP8's one-byte saved inputs,
    the verdict agrees."""
    r = next(x for x in read_rows([]) if x["name"] == row)
    m = simulate_metrics(scenario_from_dict(row_to_raw(r), default_name=row))
    assert m["fits_in_memory"], (row, m["memory_bytes"]["total"] / 2**30)


def test_fp8_params_store_the_weights_in_one_byte_and_gather_them_in_fp8():
    """fp8_params (TE fp8_model_init, NeMo fp8_params): the parameter is the FP8 copy, 1 B, and TE caches
    only its transpose, 1 B: 2 B per parameter against BF16's 2 + 2; the distributed optimizer gathers
    1 B per parameter. Per-tensor recipes and ZeRO <= 1 only."""
    from simulator.strategy.lower import lower
    base = {"model": {"preset": "gpt3-1.3b"}, "cluster": {"preset": "dgx-h100", "num_nodes": 1},
            "parallelism": {"dp": 8, "zero_stage": 1}}
    def make(fp8_params, **training):
        return scenario_from_dict({**base, "training": {"global_batch_size": 8, "dtype": "fp8",
                                                        "fp8_params": fp8_params, **training}})
    off, on = make(False), make(True)
    m_off, m_on = simulate_metrics(off)["memory_bytes"], simulate_metrics(on)["memory_bytes"]
    h, layers, vocab = 2048, 24, on.model.vocab_size
    linear = layers * (12 * h * h + 9 * h)  # QKV, projection, fc1, fc2 with their biases
    assert fp8_linear_params(on, 0) == linear
    assert m_off["params"] - m_on["params"] == linear  # those weights in 1 B; embedding and norms stay BF16
    rest = vocab * h + 2048 * h + (4 * layers + 2) * h  # word and position embeddings, LayerNorms
    assert m_on["params"] - linear == 2 * rest
    assert m_off["buffers"] - m_on["buffers"] == pytest.approx(linear, rel=1e-2)  # the cache's 1 B
    gathered = [sum(t.comm.size_bytes for t in lower(s).graph.tasks if t.name.startswith("param_all_gather"))
                for s in (off, on)]
    assert gathered[1] == pytest.approx(gathered[0] / 2)
    with pytest.raises(ScenarioError, match="fp8_params"):
        make(True, fp8_recipe="blockwise")
    with pytest.raises(ScenarioError, match="fp8_params"):
        scenario_from_dict({**base, "training": {"global_batch_size": 8, "fp8_params": True}})
    with pytest.raises(ScenarioError, match="fp8_params"):
        scenario_from_dict({**base, "parallelism": {"dp": 8, "zero_stage": 3},
                            "training": {"global_batch_size": 8, "dtype": "fp8", "fp8_params": True}})

