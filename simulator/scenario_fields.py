"""A scenario's [model] table and the typed fields of every section: presets, Hugging Face configs,
per-field type checks (one-line ScenarioErrors naming the key and the value)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from .model.presets import MODEL_PRESETS
from .model.spec import MLP_KINDS, ModelSpec
from .scenario_checks import ScenarioError
from .strategy.ub_config import load_ub_config

MODEL_KEYS = {f.name for f in dataclasses.fields(ModelSpec)} - {"name", "extra"} | {"preset", "hf_config"}


def check_keys(section: str, table: dict, known: set) -> None:
    unknown = set(table) - known
    if unknown:
        raise ScenarioError(f"[{section}] unknown key(s) {sorted(unknown)}; known: {', '.join(sorted(known))}")


def typed(section: str, key: str, value, kind: type):
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise ScenarioError(f"{section}.{key} must be {kind.__name__}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):  # TOML accepts nan and inf
        raise ScenarioError(f"{section}.{key} must be a finite number, got {value!r}")
    return value


def fields_of(section: str, table: dict, cls) -> dict:
    types = {f.name: f.type for f in dataclasses.fields(cls)}
    out = {}
    for key, value in table.items():
        t = types.get(key)
        if t is None:
            continue
        kind = {"int": int, "float": float, "str": str, "bool": bool, "bool | None": bool}.get(str(t))
        if kind is not None:
            out[key] = typed(section, key, value, kind)
        elif key == "recompute_modules":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ScenarioError(f"{section}.{key} must be a list of strings, got {value!r}")
            out[key] = tuple(value)
        elif key == "layers_per_stage":
            if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool)
                                                      for v in value):
                raise ScenarioError(f"{section}.{key} must be a list of integers, got {value!r}")
            out[key] = tuple(value)
    return out


def _model_base(table: dict, base_dir: Path) -> dict:
    """The fields a [model] table starts from: its preset's, or its Hugging Face config's, or none."""
    base: dict = {}
    if "preset" in table:
        preset = table["preset"]
        if not isinstance(preset, str) or preset not in MODEL_PRESETS:
            raise ScenarioError(f"model.preset {preset!r} is unknown; known: {', '.join(MODEL_PRESETS)}")
        spec = MODEL_PRESETS[preset]
        base = {f.name: getattr(spec, f.name) for f in dataclasses.fields(ModelSpec) if f.name != "extra"}
        # Sizes the preset derived (not set) are derived again from the file's overrides.
        if base["v_head_dim"] == base["head_dim"]:
            base["v_head_dim"] = 0
        if base["moe_ffn_hidden_size"] == base["ffn_hidden_size"]:
            base["moe_ffn_hidden_size"] = 0
        if base["head_dim"] * base["num_attention_heads"] == base["hidden_size"]:
            base["head_dim"] = 0
        if base["max_position_embeddings"] == base["seq_length"]:
            base["max_position_embeddings"] = 0
        if base["qkv_bias"] == base["bias"]:
            base["qkv_bias"] = None
        if base["num_kv_heads"] == base["num_attention_heads"]:  # multi-head attention stays multi-head
            base["num_kv_heads"] = 0
        if base["ffn_hidden_size"] == 4 * base["hidden_size"]:
            base["ffn_hidden_size"] = 0
    if "hf_config" in table and not isinstance(table["hf_config"], str):
        raise ScenarioError(f"model.hf_config must be the path of a config.json (a string), got "
                            f"{table['hf_config']!r}")
    if "hf_config" in table and "preset" in table:  # the config would silently replace the preset's fields
        raise ScenarioError(f"model.preset {table['preset']!r} and model.hf_config {table['hf_config']!r} both "
                            f"given: name one (override single fields in [model])")
    if "hf_config" in table:
        from .model.hf import load_hf_config
        cfg = Path(table["hf_config"])
        cfg = cfg if cfg.is_absolute() else base_dir / cfg
        if not cfg.is_file():
            raise ScenarioError(f"model.hf_config file {str(cfg)!r} "
                                + ("is a folder, not a file" if cfg.is_dir() else "does not exist"))
        try:
            base.update(load_hf_config(cfg))
        except ValueError as exc:
            raise ScenarioError(f"model.hf_config {str(cfg)!r}: {exc}") from None
        base.setdefault("name", cfg.parent.name or "hf-model")
    return base


def model_from_table(table: dict, base_dir: Path) -> ModelSpec:
    """A [model] table as a ModelSpec: preset or config.json, then the table's own fields, checked."""
    base = _model_base(table, base_dir)
    fields = fields_of("model", {k: v for k, v in table.items() if k not in ("preset", "hf_config")}, ModelSpec)
    base.update(fields)
    base.setdefault("name", table.get("preset", "custom"))
    required = ("num_layers", "hidden_size", "num_attention_heads", "vocab_size", "seq_length")
    missing = [k for k in required if k not in base]
    if missing == ["seq_length"] and "hf_config" in table:
        raise ScenarioError("model.seq_length is required with model.hf_config: a config.json gives the "
                            "context limit (max_position_embeddings), not the training sequence length")
    if missing:
        raise ScenarioError(f"[model] needs {', '.join(missing)} (or a preset / hf_config)")
    for key in required + ("num_experts", "moe_top_k"):
        if key in base and base[key] <= 0:
            raise ScenarioError(f"model.{key} must be positive, got {base[key]}")
    for key in ("num_kv_heads", "ffn_hidden_size", "head_dim", "sliding_window", "sliding_window_pattern",
                "max_position_embeddings", "moe_ffn_hidden_size", "moe_shared_expert_ffn_hidden_size",
                "moe_first_dense_layers", "moe_layer_interval", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim",
                "v_head_dim"):
        if base.get(key, 0) < 0:
            raise ScenarioError(f"model.{key} must be positive, got {base[key]}")
    if base.get("mlp", "gelu") not in MLP_KINDS:
        raise ScenarioError(f"model.mlp must be one of {', '.join(MLP_KINDS)}; got {base['mlp']!r}")
    # Presets derive norm/bias/... from mlp; an mlp override must re-derive them.
    if "mlp" in fields and "preset" in table:
        for k in ("norm", "position_embedding", "tie_embeddings", "bias", "qkv_bias"):
            if k not in fields:
                base[k] = "" if k in ("norm", "position_embedding") else None
    return ModelSpec(**base)


def ub_config_name(name: str, base_dir: Path) -> str:
    """A userbuffers configuration's name, a TOML path made absolute (relative to the scenario file),
    once it is known to load."""
    if name.endswith(".toml") and not Path(name).is_absolute():
        name = str((base_dir / name).resolve())
    try:
        load_ub_config(name)
    except ValueError as exc:
        raise ScenarioError(f"parallelism.tp_comm_overlap_cfg: {exc}") from None
    return name
