"""Megatron-Core's selective recompute modules (parallelism.recompute_modules): each module drops
exactly the tensors Megatron-Core does not keep with it (closed forms on a small MLA + MoE model),
re-runs exactly its ops as recompute tasks right before the backward that needs them (and counts in
HFU, not MFU), and bad lists are refused by name."""

from __future__ import annotations

import pytest

from simulator.model.spec import ModelSpec
from simulator.pipeline import simulate
from simulator.scenario import scenario_from_dict
from simulator.scenario_checks import ScenarioError
from simulator.strategy.activation_memory import layer_activation_bytes
from simulator.strategy.stage_units import layer_memory
from simulator.strategy.lower import lower

# DeepSeek-V3's layer in miniature: MLA (q LoRA 128, kv LoRA 64, heads 8 x (64 + 32 RoPE), v 64),
# a first dense SwiGLU layer (ffn 1024), then MoE layers of 4 experts (ffn 256), top-2, one shared
# expert (ffn 128); SwiGLU models train without dropout
SHAPE = dict(num_layers=4, hidden_size=512, num_attention_heads=8, vocab_size=1024, seq_length=256,
             ffn_hidden_size=1024, mlp="swiglu", num_experts=4, moe_top_k=2, moe_ffn_hidden_size=256,
             moe_shared_expert_ffn_hidden_size=128, moe_first_dense_layers=1, q_lora_rank=128, kv_lora_rank=64,
             head_dim=96, qk_rope_head_dim=32, v_head_dim=64)
M = ModelSpec("mla-moe", **SHAPE)
D, S, H, A, TP = 2, 256, 512, 8, 2  # bf16, tokens of one micro-batch (b = 1, cp = 1), hidden, heads, tp (SP on)
F, FE, FS, E, SLOTS = 1024, 256, 128, 4, 2 * 256  # dense / expert / shared widths, experts, top-2 token slots


def saved(modules: tuple[str, ...], dense: bool = False, attention: str = "flash") -> float:
    """Bytes a layer does not keep with ``modules`` recomputed (tp 2 with SP, micro-batch 1)."""
    args = (M, 1, TP, True, 1)
    kept = layer_activation_bytes(*args, "selective", D, 1, attention, dense, modules=modules)
    return layer_activation_bytes(*args, "selective", D, 1, attention, dense, modules=()) - kept


# ---- memory: the tensors each module drops --------------------------------------------------------
def test_mla_up_proj_drops_the_up_projected_q_k_v():
    # multi_latent_attention.py: query, key, value (after RoPE) discarded after the core attention;
    # per rank heads/tp of q and k (head_dim 96 with its RoPE part) and v (64)
    assert saved(("mla_up_proj",)) == D * S * A * (96 + 96 + 64) / TP
    assert saved(("mla_up_proj",), dense=True) == saved(("mla_up_proj",))


def test_layernorm_drops_the_outputs_of_standalone_norms_only():
    # MLA's input norm (TENorm) and an MoE layer's pre-MLP norm; a dense MLP's norm is TE's fused
    # linear_fc1 (IdentityOp in the layer spec) and is not recomputed; /tp: sequence parallel
    assert saved(("layernorm",)) == 2 * D * S * H / TP
    assert saved(("layernorm",), dense=True) == D * S * H / TP
    gpt = ModelSpec("gpt", num_layers=2, hidden_size=H, num_attention_heads=A, vocab_size=1024, seq_length=S)
    args = (gpt, 1, TP, True, 1, "selective", D)
    assert layer_activation_bytes(*args, modules=("layernorm",)) == layer_activation_bytes(*args, modules=())


def test_moe_act_drops_the_experts_activation_output():
    assert saved(("moe_act",)) == D * SLOTS * FE / TP  # fc2's input over the rank's token slots
    assert saved(("moe_act",), dense=True) == 0.0


def test_shared_experts_drop_their_intermediates():
    assert saved(("shared_experts",)) == D * S * (2 * FS + FS) / TP  # fc1 output (gate, up), fc2 input


def test_mlp_drops_the_dense_mlp_after_its_input():
    # the checkpointed MLP keeps its input; TE's linear_fc1 holds the norm, whose output goes too
    assert saved(("mlp",), dense=True) == D * S * H / TP + D * S * (2 * F + F) / TP
    assert saved(("mlp",)) == 0.0  # transformer_layer.py: recompute_mlp only if not is_moe_layer


def test_moe_drops_the_moe_layer_after_its_input():
    router = D * S * E / TP
    experts = D * SLOTS * (H / TP + 2 * FE / TP + FE / TP + H / TP)  # permuted input, fc1 out, fc2 in, output
    assert saved(("moe",)) == router + experts + saved(("shared_experts",))
    assert saved(("moe", "moe_act", "shared_experts")) == saved(("moe",))  # nested: dropped once


def test_core_attn_drops_the_scores_an_unfused_core_keeps():
    assert saved(("core_attn",), attention="unfused") == D * (A / TP) * S * S  # softmax output
    assert saved(("core_attn",)) == 0.0  # fused attention keeps no scores anyway


def test_modules_drop_the_union_of_their_tensors():
    mods = ("mla_up_proj", "layernorm", "moe_act", "shared_experts")
    assert saved(mods) == sum(saved((m,)) for m in mods)


# ---- scenarios -------------------------------------------------------------------------------------
def scn(modules, recompute="selective", tp=2, pp=1, dp=2, ep=2, mbs=1, **par):
    p = {"tp": tp, "pp": pp, "dp": dp, "ep": ep, "sequence_parallel": tp > 1, "recompute": recompute, **par}
    if modules is not None:
        p["recompute_modules"] = list(modules)
    return scenario_from_dict({"model": dict(SHAPE), "parallelism": p,
                               "cluster": {"preset": "dgx-h100", "num_nodes": 1, "gpus_per_node": tp * pp * dp},
                               "training": {"global_batch_size": 8, "micro_batch_size": mbs}})


def test_the_recompute_re_materialises_what_the_modules_drop():
    s = scn(("mla_up_proj", "moe_act"))
    moe, dense = layer_memory(s, False), layer_memory(s, False, dense_mlp=True)
    assert moe.transient == saved(("mla_up_proj", "moe_act"))
    assert dense.transient == saved(("mla_up_proj",))


def _rerun(graph, layer: int) -> list[tuple[str, tuple[str, ...]]]:
    """(name suffix, op names) of one micro-batch's recompute tasks of ``layer`` on rank 0, in order."""
    tasks = [t for t in graph.tasks if t.rank == 0 and t.layer == layer and t.phase == "R" and t.microbatch == 0]
    return [(t.name.split(".R.", 1)[1], tuple(w.name for w in t.work)) for t in tasks]


def test_each_module_re_runs_its_ops_before_the_backward_that_needs_them():
    g = lower(scn(("mla_up_proj", "moe_act", "layernorm"))).graph
    # MoE layer: the pre-MLP norm first (hook on the MLP output), the experts' activation after the
    # combine's backward all-to-all, the input norm before the attention's backward, the up
    # projections and RoPE right before the core's backward
    assert _rerun(g, 1) == [("mlp_norm", ("ln2",)), ("expert_act", ("expert_act",)), ("attn_norm", ("ln1",)),
                            ("up_proj", ("q_up", "kv_up", "rope"))]
    assert _rerun(g, 0) == [("attn_norm", ("ln1",)), ("up_proj", ("q_up", "kv_up", "rope"))]  # dense layer
    names = [t.name for t in g.tasks if t.rank == 0 and t.layer == 1 and t.microbatch == 0 and t.phase in "BR"]
    assert names.index("B0.L1.R.expert_act") == names.index("B0.L1.dispatch") + 1
    assert names.index("B0.L1.experts") == names.index("B0.L1.R.expert_act") + 1
    up = names.index("B0.L1.R.up_proj")
    assert names[up - 1] == "B0.L1.attn_out.grad" and names[up + 1] == "B0.L1.core"
    assert all(t.category == "recompute" for t in g.tasks if t.phase == "R" and t.kind == "compute")


def test_mlp_and_moe_re_run_their_block_with_its_collectives():
    g = lower(scn(("mlp", "moe", "shared_experts"))).graph
    dense = [t for t in g.tasks if t.rank == 0 and t.layer == 0 and t.phase == "R" and t.microbatch == 0]
    assert [(t.comm.op if t.comm else tuple(w.name for w in t.work)) for t in dense] == [
        "all_gather", ("ln2", "fc1", "act", "fc2"), "reduce_scatter"]  # SP: the MLP's entry and exit
    moe = [t for t in g.tasks if t.rank == 0 and t.layer == 1 and t.phase == "R" and t.microbatch == 0]
    assert [(t.comm.op if t.comm else tuple(w.name for w in t.work)) for t in moe] == [
        "all_gather", ("router", "router_topk", "moe_permute"), "all_to_all",
        ("expert_fc1", "expert_act", "expert_fc2"), "all_to_all",
        ("moe_unpermute", "shared_fc1", "shared_act", "shared_fc2"), "reduce_scatter",
        ("shared_fc1", "shared_act", "shared_fc2")]  # the nested shared-experts checkpoint again


def test_default_and_core_attn_are_todays_selective_recompute():
    a, b = lower(scn(None)).graph, lower(scn(("core_attn",))).graph
    assert [(t.name, t.work) for t in a.tasks] == [(t.name, t.work) for t in b.tasks]
    assert _rerun(a, 1) == [("core", ("attn_core",))]


def test_hfu_counts_the_recomputed_flops_and_mfu_does_not():
    base, up = simulate(scn(())).metrics, simulate(scn(("mla_up_proj",))).metrics
    t = S  # tokens of a micro-batch
    q_up, kv_up = 2 * t * A * 96 * 128, 2 * t * A * (64 + 64) * 64  # 2mnk: (q_size x q_lora), (k_nope + v) x kv_lora
    extra = 4 * 8 * (q_up + kv_up)  # every layer of every micro-batch of the global batch
    assert up["hardware_flops_per_iteration"] - base["hardware_flops_per_iteration"] == pytest.approx(extra)
    assert up["model_flops_per_iteration"] == base["model_flops_per_iteration"]
    # HFU / MFU = hardware / model FLOPs: up by exactly the recompute
    ratio = lambda m: m["hfu"] / m["mfu"]  # noqa: E731
    assert ratio(up) - ratio(base) == pytest.approx(extra / base["model_flops_per_iteration"])
    assert up["time_breakdown_s"]["recompute"] > 0.0 == base["time_breakdown_s"]["recompute"]


# ---- refused lists -----------------------------------------------------------------------------------
@pytest.mark.parametrize("modules,recompute,model,match", [
    (["core_attn"], "none", {}, r"recompute_modules = \['core_attn'\] needs recompute = 'selective', got 'none'"),
    (["moe_act"], "full", {}, "needs recompute = 'selective', got 'full'"),
    (["mhc"], "selective", {}, "'mhc' is not modelled"),
    (["attn"], "selective", {}, "'attn' is unknown"),
    (["mla_up_proj"], "selective", {"q_lora_rank": 0, "kv_lora_rank": 0, "head_dim": 0, "qk_rope_head_dim": 0,
                                    "v_head_dim": 0}, "'mla_up_proj' needs an MLA model"),
    (["moe_act"], "selective", {"moe_grouped_gemm": False}, "'moe_act' needs an MoE model with"),
])
def test_bad_lists_are_refused_by_name(modules, recompute, model, match):
    raw = {"model": {**SHAPE, **model}, "cluster": {"preset": "dgx-h100", "num_nodes": 1},
           "parallelism": {"tp": 2, "dp": 4, "ep": 2, "sequence_parallel": True, "recompute": recompute,
                           "recompute_modules": modules}, "training": {"global_batch_size": 8}}
    with pytest.raises(ScenarioError, match=match):
        scenario_from_dict(raw)


def test_fp8_delayed_scaling_refuses_moe_act_and_layernorm():
    raw = {"model": dict(SHAPE), "cluster": {"preset": "dgx-h100", "num_nodes": 1},
           "parallelism": {"tp": 2, "dp": 4, "ep": 2, "sequence_parallel": True, "recompute": "selective",
                           "recompute_modules": ["layernorm"]}, "training": {"global_batch_size": 8, "dtype": "fp8"}}
    with pytest.raises(ScenarioError, match="'layernorm' is not supported with FP8 delayed scaling"):
        scenario_from_dict(raw)
    raw["training"]["fp8_recipe"] = "current"
    assert scenario_from_dict(raw).parallel.recompute_modules == ("layernorm",)


def test_a_list_that_is_not_strings_is_refused():
    raw = {"model": dict(SHAPE), "cluster": {"preset": "dgx-h100", "num_nodes": 1},
           "parallelism": {"tp": 2, "dp": 4, "ep": 2, "sequence_parallel": True, "recompute": "selective",
                           "recompute_modules": "mla_up_proj"}, "training": {"global_batch_size": 8}}
    with pytest.raises(ScenarioError, match="recompute_modules must be a list of strings"):
        scenario_from_dict(raw)


# ---- the DeepSeek-V3 recipe's setting -----------------------------------------------------------------
def test_the_dsv3_row_and_scenario_recompute_mla_up_proj_as_the_recipe_launches_it():
    """dgxc-benchmarking deepseek_v3/pretraining/launch.sh, GPU_TYPE h100: --recompute_modules mla_up_proj."""
    from pathlib import Path

    from simulator.explore.validate import DEFAULT_CSVS, read_rows, row_to_raw
    from simulator.scenario import load_scenario

    rows = read_rows(list(DEFAULT_CSVS))
    (row,) = [r for r in rows if r["name"] == "dgxc-dsv3-671b-bf16-1024gpu"]
    assert "launch.sh" in row["settings_from_source"] and "RM='mla_up_proj'" in row["settings_from_source"]
    par = scenario_from_dict(row_to_raw(row)).parallel
    assert (par.recompute, par.recompute_modules) == ("selective", ("mla_up_proj",))
    assert [r["name"] for r in rows if r.get("recompute_modules")] == [row["name"]]  # that row only
    raw = row_to_raw({**row, "recompute_modules": "mla_up_proj; moe_act"})  # a list: semicolon-separated
    assert raw["parallelism"]["recompute_modules"] == ["mla_up_proj", "moe_act"]
    root = Path(__file__).resolve().parents[1]
    p = load_scenario(root / "scenarios" / "moe" / "deepseek-v3-1024xh100.toml").parallel
    assert (p.recompute, p.recompute_modules) == ("selective", ("mla_up_proj",))


def test_the_deepseek_v3_recipe_fits_in_80_gb_only_with_its_mla_up_proj_recompute():
    """README: the recipe's H100 setting (recompute_modules = [mla_up_proj], its launch script) brings
    the scenario's peak (its MTP module and 3/4/2 layer split included) from 92.4 GiB (out of memory)
    to 75.5 GiB; the static estimate is the simulated peak (tests/test_search.py)."""
    from pathlib import Path

    from simulator.explore.estimate import EstimateCache, estimate
    from simulator.scenario import load_scenario

    path = Path(__file__).resolve().parents[1] / "scenarios" / "moe" / "deepseek-v3-1024xh100.toml"
    peaks = {}
    for modules in ('["mla_up_proj"]', '["core_attn"]'):
        e = estimate(load_scenario(path, [f"parallelism.recompute_modules={modules}"]), EstimateCache(),
                     with_time=False)
        peaks[modules] = (round(e.total_bytes / 2 ** 30, 1), e.fits)
    assert peaks == {'["mla_up_proj"]': (75.5, True), '["core_attn"]': (92.4, False)}


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_an_empty_list_goes_with_any_recompute(recompute):
    """A scenario that names modules can be run without them: an empty list is no module, whatever the
    granularity (a non-empty one needs "selective", as NeMo's set_recompute_configs asserts)."""
    raw = {"model": dict(SHAPE), "cluster": {"preset": "dgx-h100", "num_nodes": 1},
           "parallelism": {"tp": 2, "dp": 4, "ep": 2, "sequence_parallel": True, "recompute": recompute,
                           "recompute_modules": []}, "training": {"global_batch_size": 8}}
    assert scenario_from_dict(raw).parallel.recompute_modules == ()
