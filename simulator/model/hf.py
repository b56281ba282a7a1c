"""Hugging Face ``config.json`` import: the ModelSpec field values of a Llama / Mistral / Mixtral /
Qwen2 / GPT-2 / GPT-NeoX checkpoint's configuration.

Key names and per-architecture defaults follow the transformers configuration classes
(LlamaConfig, MistralConfig, MixtralConfig, Qwen2Config, GPT2Config, GPTNeoXConfig).
Approximations: Qwen2 has biases on the QKV projection only (ModelSpec's ``bias`` is all-or-none,
so it is imported as bias-free, about 0.01 % fewer parameters); Mistral's sliding window and
GPT-NeoX's partial rotary / parallel residual do not change parameters and are ignored.
"""

from __future__ import annotations

import json
from pathlib import Path

# model_type -> family. "llama" family: gated SiLU MLP (SwiGLU), RMSNorm, RoPE, untied embeddings
# by default (tie_word_embeddings=False in LlamaConfig, MistralConfig, MixtralConfig, Qwen2Config).
_FAMILY = {"llama": "llama", "mistral": "llama", "mixtral": "llama", "qwen2": "llama",
           "gpt2": "gpt2", "gpt_neox": "gpt_neox"}
_ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
                  "MixtralForCausalLM": "mixtral", "Qwen2ForCausalLM": "qwen2",
                  "GPT2LMHeadModel": "gpt2", "GPTNeoXForCausalLM": "gpt_neox"}


def _model_type(cfg: dict) -> str:
    mt = cfg.get("model_type")
    if mt is not None:
        if mt not in _FAMILY:
            raise ValueError(f"config.json model_type {mt!r} is not supported; known: "
                             f"{', '.join(_FAMILY)}")
        return mt
    archs = cfg.get("architectures") or []
    for a in archs:
        if a in _ARCHITECTURES:
            return _ARCHITECTURES[a]
    raise ValueError(f"config.json architectures {archs!r} is not supported; known: "
                     f"{', '.join(_ARCHITECTURES)}")


def _get(cfg: dict, *keys: str, default=None):
    """The first of ``keys`` present (HF aliases: hidden_size / n_embd); required if no default."""
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    if default is None:
        raise ValueError(f"config.json is missing field {' / '.join(keys)}")
    return default


def _int(cfg: dict, *keys: str, default: int | None = None) -> int:
    v = _get(cfg, *keys, default=default)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"config.json field {keys[0]} must be a non-negative integer, got {v!r}")
    return v


def hf_config_to_fields(cfg: dict, name: str = "hf-model") -> dict:
    """ModelSpec keyword arguments from a parsed config.json."""
    mt = _model_type(cfg)
    family = _FAMILY[mt]
    act = str(_get(cfg, "hidden_act", "activation_function", default="gelu_new" if family == "gpt2"
                   else "silu"))
    if family == "llama":
        if act not in ("silu", "swish"):
            raise ValueError(f"config.json hidden_act {act!r}: only 'silu' (SwiGLU) is supported "
                             f"for model_type {mt!r}")
        mlp, norm, pos = "swiglu", "rmsnorm", "rope"
        bias = bool(cfg.get("attention_bias", False)) and bool(cfg.get("mlp_bias", False))
        tie = bool(cfg.get("tie_word_embeddings", False))
    else:
        if not act.startswith("gelu"):
            raise ValueError(f"config.json hidden_act {act!r}: only GELU variants are supported "
                             f"for model_type {mt!r}")
        mlp, norm, bias = "gelu", "layernorm", True
        # GPT-2 always ties its LM head to wte; GPT-NeoX has a separate embed_out (default untied)
        pos, tie = ("learned", True) if family == "gpt2" else (
            "rope", bool(cfg.get("tie_word_embeddings", False)))
    heads = _int(cfg, "num_attention_heads", "n_head")
    fields = {
        "name": name,
        "num_layers": _int(cfg, "num_hidden_layers", "n_layer"),
        "hidden_size": _int(cfg, "hidden_size", "n_embd"),
        "num_attention_heads": heads,
        "num_kv_heads": _int(cfg, "num_key_value_heads", default=heads),
        # n_inner = None in GPT2Config means 4 * n_embd: 0 selects ModelSpec's 4·h default
        "ffn_hidden_size": _int(cfg, "n_inner", default=0) if family == "gpt2"
        else _int(cfg, "intermediate_size"),
        "vocab_size": _int(cfg, "vocab_size"),
        "seq_length": _int(cfg, "max_position_embeddings", "n_positions", "n_ctx"),
        "mlp": mlp,
        # MixtralConfig defaults: 8 local experts, 2 per token
        "num_experts": _int(cfg, "num_local_experts", default=8) if mt == "mixtral" else 1,
        "moe_top_k": _int(cfg, "num_experts_per_tok", default=2) if mt == "mixtral" else 1,
        "norm": norm,
        "position_embedding": pos,
        "tie_embeddings": tie,
        "bias": bias,
    }
    if fields["num_kv_heads"] == 0 or fields["hidden_size"] == 0 or heads == 0:
        raise ValueError(f"config.json: hidden_size {fields['hidden_size']}, num_attention_heads "
                         f"{heads}, num_key_value_heads {fields['num_kv_heads']} must be positive")
    return fields


def load_hf_config(path: str | Path) -> dict:
    """ModelSpec field values from a Hugging Face config.json; the name is the checkpoint folder's
    name for ``.../<name>/config.json``, otherwise the file's stem."""
    p = Path(path)
    try:
        cfg = json.loads(p.read_text())
    except OSError as e:
        raise ValueError(f"hf_config {str(p)!r} cannot be read: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"hf_config {str(p)!r} is not valid JSON: {e.msg} at line "
                         f"{e.lineno}") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"hf_config {str(p)!r} must hold a JSON object")
    name = p.parent.name if p.stem == "config" and p.parent.name else p.stem
    return hf_config_to_fields(cfg, name or "hf-model")
