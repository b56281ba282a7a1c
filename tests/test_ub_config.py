"""Userbuffers configurations (strategy/ub_config): TE's defaults per major version, the bundled recipe
tables as their sources have them, a table's gaps filled as TE fills them, and one-line errors."""

import subprocess
import sys

import pytest

from simulator.scenario import ScenarioError, scenario_from_dict
from simulator.strategy.ub_config import (GATHER_SITES, SCATTER_SITES, SITES, OverlapSite, bundled_configs,
                                          config_from_table, load_ub_config)

LLAMA = {"num_layers": 2, "hidden_size": 2048, "num_attention_heads": 16, "num_kv_heads": 4,
         "ffn_hidden_size": 5632, "vocab_size": 8192, "seq_length": 2048, "mlp": "swiglu"}


def raw(**par):
    return {"model": dict(LLAMA), "cluster": {"preset": "dgx-h100", "num_nodes": 1},
            "parallelism": {"tp": 4, "dp": 2, "sequence_parallel": True, "tp_comm_overlap": True, **par},
            "training": {"global_batch_size": 8}}


def test_te_defaults_per_major_version():
    # TE module/base.py initialize_ub: ring exchange at the all-gather sites (1 SM), a 4-split pipeline on 16 SMs
    # at the reduce-scatter sites, bulk on 16 SMs; set_sm_margin off in 1.x, on but for ring exchange from 2.0
    for name, margin in (("te1-default", False), ("te2-default", True)):
        cfg = load_ub_config(name)
        assert [cfg.site(s) for s in GATHER_SITES] == [OverlapSite("ring_exchange", 1)] * 4
        assert [cfg.site(s) for s in SCATTER_SITES] == [OverlapSite("pipeline", 16, 4, margin)] * 2
        assert [cfg.site(s).method for s in SITES[6:]] == ["bulk"] * 4
        assert {cfg.site(s).num_sm for s in SITES[6:]} == {16}
    assert scenario_from_dict(raw()).parallel.tp_comm_overlap_cfg == "te2-default"  # today's TE


def test_nemo_h100_70b_table_as_the_recipe_has_it():
    cfg = load_ub_config("userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192")
    assert cfg.site("proj_fprop") == OverlapSite("pipeline", 24, 4, True)
    assert cfg.site("fc2_fprop") == OverlapSite("pipeline", 16, 4, True)
    assert {s: cfg.site(s).num_sm for s in SITES[6:]} == {"qkv_dgrad": 4, "qkv_wgrad": 24, "fc1_dgrad": 2,
                                                          "fc1_wgrad": 4}
    fp8 = load_ub_config("userbuffers_fp8_h100_h16384_tp8_cp2_mbs1_seqlen8192")  # the 405B FP8 recipe's
    assert all(fp8.site(s).aggregate for s in GATHER_SITES)
    assert fp8.site("fc2_fprop") == OverlapSite("ring_exchange", 1, 4, True)


def test_a_launcher_table_leaves_the_rest_to_te_1x():
    # ub_cfg_h100_h12288_tp4_mbs1_seqlen2048.yaml names only method and aggregate at the ring-exchange sites
    cfg = load_ub_config("ub_cfg_h100_h12288_tp4_mbs1_seqlen2048")
    assert cfg.site("fc2_dgrad") == OverlapSite("ring_exchange", 1, aggregate=True)
    assert cfg.site("qkv_fprop") == OverlapSite("ring_exchange", 1)
    assert cfg.site("fc2_fprop") == OverlapSite("pipeline", 20, 4, True)
    assert cfg.site("qkv_wgrad").num_sm == 8


def test_a_changed_method_keeps_the_default_methods_other_fields_as_te_does():
    # TE: ub_cfg = get_default_config(name); ub_cfg.update(table): a reduce-scatter site switched to ring
    # exchange without num_sm keeps the pipeline default's 16 (and TE 2.x's margin)
    cfg = config_from_table({"proj_fprop": {"method": "ring_exchange"}}, "t.toml", "t")
    assert cfg.site("proj_fprop") == OverlapSite("ring_exchange", 16, 4, True)
    assert cfg.site("fc2_fprop") == OverlapSite("pipeline", 16, 4, True)


def test_every_bundled_table_loads_and_names_its_source():
    names = bundled_configs()
    assert {"te1-default", "te2-default", "torch-async-tp"} <= set(names)
    for name in names:
        cfg = load_ub_config(name)
        assert cfg.name == name and cfg.source
        assert [s for s, _ in cfg.sites] == list(SITES)


@pytest.mark.parametrize("table, message", [
    ({"qkv_fprop": {"method": "pipeline"}}, "qkv_fprop.method must be one of ring_exchange, got 'pipeline'"),
    ({"proj_fprop": {"num_sm": -1}}, "proj_fprop.num_sm must be an integer >= 0, got -1"),
    ({"proj_fprop": {"num_splits": 0}}, "proj_fprop.num_splits must be an integer >= 1, got 0"),
    ({"fc2_fprop": {"atomic_gemm": True}}, "atomic_gemm = true (TE's atomic-counter GEMM) is not modelled"),
    ({"fc2_fprop": {"num_sms": 4}}, "[fc2_fprop] unknown key(s) ['num_sms']"),
    ({"fc3_fprop": {}}, "unknown site(s) ['fc3_fprop']"),
    ({"te": 3}, "te must be 1 or 2"),
    ({"qkv_dgrad": {"set_sm_margin": 2}}, "qkv_dgrad.set_sm_margin must be true/false"),
])
def test_bad_tables_are_one_line_errors(table, message):
    with pytest.raises(ValueError) as exc:
        config_from_table(table, "my.toml", "my")
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_a_scenario_names_a_file_relative_to_itself(tmp_path):
    (tmp_path / "mine.toml").write_text('[fc2_fprop]\nmethod = "ring_exchange"\nnum_sm = 1\n')
    scn = scenario_from_dict(raw(tp_comm_overlap_cfg="mine.toml"), base_dir=tmp_path)
    assert load_ub_config(scn.parallel.tp_comm_overlap_cfg).site("fc2_fprop").method == "ring_exchange"
    with pytest.raises(ScenarioError, match="parallelism.tp_comm_overlap_cfg: no userbuffers configuration 'nemo'"):
        scenario_from_dict(raw(tp_comm_overlap_cfg="nemo"))
    with pytest.raises(ScenarioError, match="parallelism.tp_comm_overlap_cfg: no userbuffers configuration"):
        scenario_from_dict(raw(tp_comm_overlap_cfg="missing.toml"), base_dir=tmp_path)


def test_the_cli_refuses_an_unknown_configuration_in_one_line_with_exit_2(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[model]\npreset = "llama3.1-8b"\n[cluster]\npreset = "dgx-h100"\n[parallelism]\ntp = 8\n'
                    'sequence_parallel = true\ntp_comm_overlap = true\ntp_comm_overlap_cfg = "nope"\n'
                    '[training]\nglobal_batch_size = 8\n')
    done = subprocess.run([sys.executable, "-m", "simulator", "run", str(path)], capture_output=True, text=True)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "tp_comm_overlap_cfg" in done.stderr
