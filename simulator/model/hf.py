"""Hugging Face ``config.json`` import: the ModelSpec field values of a checkpoint's configuration
(llama, mistral, mixtral, qwen2, qwen3, qwen3_moe, gemma2, gemma3, phi3, nemotron, gpt_oss,
deepseek_v2/v3, gpt2, gpt_neox, gptj); every key that could change the trained model is read or refused by name.

Key names and per-architecture defaults follow the transformers configuration and modeling classes
(LlamaConfig ... GptOssConfig). The training sequence length is not in a config.json
(max_position_embeddings is the context limit): the scenario sets ``model.seq_length``. Keys in
``_NO_WORK_KEYS`` change neither shapes nor kernels of training; keys neither read nor listed there
are refused, so an unknown architecture detail is never silently dropped. Approximations, each
below 0.01 % of parameters or of one kernel's bytes: Gemma 2's logit soft-capping (a tanh inside the
attention kernel and over the logits), GPT-OSS's attention sinks (one scalar per head), DeepSeek-V3's
router score-correction bias (one scalar per expert), GPT-J's bias-free attention output projection
(counted with the MLP's biases: h per layer) and its LM head's bias (V, not counted). Partial rotary
embeddings (GPT-NeoX rotary_pct, GPT-J rotary_dim) rotate part of each head; the rope kernel is
charged over whole heads, which the implementations write back whole (transformers' GPTNeoX and GPTJ
attention and mesh-transformer-jax concatenate the rotated and the passed-through parts).
"""

from __future__ import annotations

import json
from pathlib import Path

# model_type -> (MLP gated?, norm, tied embeddings by default). transformers: LlamaConfig,
# MistralConfig, MixtralConfig, Qwen2/3(Moe)Config, Phi3Config, GptOssConfig default
# tie_word_embeddings=False; Gemma2/3 tie (Gemma2Config tie_word_embeddings=True); Nemotron uses
# LayerNorm1P, a LayerNorm with weight and bias (modeling_nemotron.py), and relu2 without a gate.
_DECODERS = {
    "llama": (True, "rmsnorm", False), "mistral": (True, "rmsnorm", False),
    "mixtral": (True, "rmsnorm", False), "qwen2": (True, "rmsnorm", False),
    "qwen3": (True, "rmsnorm", False), "qwen3_moe": (True, "rmsnorm", False),
    "phi3": (True, "rmsnorm", False), "gemma2": (True, "rmsnorm", True),
    "gemma3_text": (True, "rmsnorm", True), "nemotron": (False, "layernorm", False),
    "gpt_oss": (True, "rmsnorm", False), "deepseek_v2": (True, "rmsnorm", False),
    "deepseek_v3": (True, "rmsnorm", False),
}
_GPT_TYPES = ("gpt2", "gpt_neox", "gptj")
_MODEL_TYPES = tuple(_DECODERS) + _GPT_TYPES
_ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
                  "MixtralForCausalLM": "mixtral", "Qwen2ForCausalLM": "qwen2",
                  "Qwen3ForCausalLM": "qwen3", "Qwen3MoeForCausalLM": "qwen3_moe",
                  "Phi3ForCausalLM": "phi3", "Gemma2ForCausalLM": "gemma2",
                  "Gemma3ForCausalLM": "gemma3_text", "NemotronForCausalLM": "nemotron",
                  "GptOssForCausalLM": "gpt_oss", "DeepseekV2ForCausalLM": "deepseek_v2",
                  "DeepseekV3ForCausalLM": "deepseek_v3", "GPT2LMHeadModel": "gpt2",
                  "GPTNeoXForCausalLM": "gpt_neox", "GPTJForCausalLM": "gptj"}
# hidden_act -> MLP kind, for gated and plain MLPs (transformers ACT2FN names)
_ACTIVATIONS = {True: {"silu": "swiglu", "swish": "swiglu", "gelu": "geglu",
                       "gelu_pytorch_tanh": "geglu", "gelu_new": "geglu"},
                False: {"relu2": "squared-relu", "gelu": "gelu", "gelu_new": "gelu",
                        "gelu_fast": "gelu", "gelu_pytorch_tanh": "gelu"}}
# Residual / attention / embedding dropout probabilities (GPT2Config, GPTJConfig, GPTNeoXConfig,
# LlamaConfig; GPT-NeoX-20B's config.json of 2022 names them as BERT does: *_dropout_prob).
_DROPOUT_KEYS = ("resid_pdrop", "embd_pdrop", "attn_pdrop", "attention_dropout", "hidden_dropout",
                 "attention_probs_dropout_prob", "hidden_dropout_prob")
# Keys that change neither a shape nor the work of a training step.
_NO_WORK_KEYS = {
    # identity, tokenizer ids, serialisation, inference-time caching
    "architectures", "model_type", "_name_or_path", "transformers_version", "torch_dtype", "dtype",
    "bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "use_cache",
    "cache_implementation", "auto_map", "tokenizer_class", "return_dict", "is_decoder",
    # the checkpoint's storage format (GPT-OSS ships MXFP4 experts); training uses the scenario dtype
    "quantization_config",
    # numerics only: epsilons, initialisation, scales, clamps, RoPE frequencies and their scaling
    "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps", "initializer_range",
    "rope_theta", "rope_scaling", "rope_parameters", "rope_local_base_freq", "rotary_emb_base",
    "original_max_position_embeddings", "initial_context_length", "max_position_embeddings",
    "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping", "swiglu_limit",
    "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn",
    "pretraining_tp", "layer_norm_type", "use_bfloat16",
    # transformers' activation checkpointing switch (GPT-J's config.json): the scenario's recompute decides
    "gradient_checkpointing",
    # partial rotary embeddings: only the rope kernel's bytes, charged over whole heads
    "rotary_pct", "partial_rotary_factor",
    # MoE router numerics and its auxiliary loss (E scalars per token); DeepSeek's group-limited
    # routing (n_group, topk_group) bounds the nodes a token reaches, which the all-to-all model
    # does not use; ep_size is the reference code's inference parallelism, not the model
    "norm_topk_prob", "router_aux_loss_coef", "output_router_logits", "router_jitter_noise",
    "aux_loss_alpha", "seq_aux", "scoring_func", "topk_method", "n_group", "topk_group",
    "routed_scaling_factor", "ep_size",
    # GPT-2 sequence-classification / double-heads extras, not part of the causal LM
    "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
    "summary_first_dropout", "classifier_dropout", "task_specific_params", "n_ctx",
}


class _Keys:
    """A config dict that remembers which keys were read, so the rest can be refused by name."""

    def __init__(self, cfg: dict, model_type: str) -> None:
        self.cfg, self.model_type = cfg, model_type
        self.read: set[str] = set()

    def get(self, *keys: str, default=None):
        """The first of ``keys`` set (HF aliases: hidden_size / n_embd); required if no default."""
        self.read.update(keys)
        for k in keys:
            if self.cfg.get(k) is not None:
                return self.cfg[k]
        if default is None:
            raise ValueError(f"config.json is missing field {' / '.join(keys)}")
        return default

    def int(self, *keys: str, default: int | None = None) -> int:
        v = self.get(*keys, default=default)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"config.json field {keys[0]} must be a non-negative integer, got {v!r}")
        return v

    def fraction(self, key: str) -> float:
        """A probability in [0, 1] (0 when absent)."""
        v = self.get(key, default=0.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
            raise ValueError(f"config.json field {key} must be a number in [0, 1], got {json.dumps(v)}")
        return float(v)

    def flag(self, *keys: str, default: bool) -> bool:
        """A JSON true/false (a string such as "false" is refused, not read as true)."""
        v = self.get(*keys, default=default)
        if not isinstance(v, bool):
            raise ValueError(f"config.json {' / '.join(keys)} must be true or false, got {json.dumps(v)}")
        return v

    def refuse(self, key: str, why: str) -> ValueError:
        return ValueError(f"config.json {key} = {json.dumps(self.cfg.get(key))}: {why} "
                          f"(model_type {self.model_type!r})")

    def check_all_read(self) -> None:
        for k in sorted(set(self.cfg) - self.read - _NO_WORK_KEYS):
            raise ValueError(f"config.json key {k!r} (model_type {self.model_type!r}) is not understood "
                             f"by the importer and may change the model, so it is refused")


def _model_type(cfg: dict) -> str:
    mt = cfg.get("model_type")
    if mt is not None:
        if mt not in _MODEL_TYPES:
            raise ValueError(f"config.json model_type {mt!r} is not supported; known: {', '.join(_MODEL_TYPES)}")
        return mt
    archs = cfg.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise ValueError(f"config.json architectures must be a list of class names, got {json.dumps(archs)}")
    for a in archs:
        if a in _ARCHITECTURES:
            return _ARCHITECTURES[a]
    raise ValueError(f"config.json architectures {archs!r} is not supported; known: {', '.join(_ARCHITECTURES)}")


def _mlp(k: _Keys, gated: bool) -> str:
    act = str(k.get("hidden_activation", "hidden_act", "activation_function",
                    default="silu" if gated else "gelu"))
    kinds = _ACTIVATIONS[gated]
    if act not in kinds:
        raise k.refuse("hidden_act", f"only {', '.join(kinds)} are supported for a "
                                     f"{'gated' if gated else 'plain'} MLP")
    return kinds[act]


def _window(k: _Keys, layers: int) -> tuple[int, int]:
    """(sliding_window, sliding_window_pattern) from the family's way of writing them."""
    mt = k.model_type
    if mt in ("qwen2", "qwen3", "qwen3_moe"):
        k.get("sliding_window", "max_window_layers", default=0)  # read: apply only with the flag
        if k.flag("use_sliding_window", default=False):
            raise k.refuse("use_sliding_window", "windowed layers after max_window_layers are not "
                                                 "an every-N-th-layer-global pattern")
        return 0, 0
    window = k.int("sliding_window", "sliding_window_size", default=0) if mt not in (
        "llama", "nemotron", "deepseek_v2", "deepseek_v3") else 0
    types = k.get("layer_types", default=[])
    pattern = k.int("sliding_window_pattern", default=0)
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise k.refuse("layer_types", "must be a list of sliding_attention / full_attention")
    if types:
        if len(types) != layers or set(types) - {"sliding_attention", "full_attention"}:
            raise k.refuse("layer_types", f"needs {layers} entries of sliding_attention / full_attention")
        full = [i for i, t in enumerate(types) if t == "full_attention"]
        if len(full) == layers:
            return 0, 0
        n = full[0] + 1 if full else 0
        if not window:
            raise k.refuse("layer_types", "sliding_attention layers need a sliding_window")
        if any((t == "full_attention") != (n > 0 and (i + 1) % n == 0) for i, t in enumerate(types)):
            raise k.refuse("layer_types", "global layers are not every N-th layer")
        return window, n
    if mt == "gemma2":  # Gemma2DecoderLayer: is_sliding = not bool(layer_idx % 2)
        pattern = 2
    return window, pattern if window else 0


def _bias(k: _Keys) -> tuple[bool, bool]:
    """(bias of the output projection and the MLP, bias of Q, K, V)."""
    mt = k.model_type
    attn = k.flag("attention_bias", default=False)
    if mt == "qwen2":  # Qwen2Attention: q/k/v_proj bias=True, o_proj bias=False, MLP without
        return False, True
    if mt == "gpt_oss":  # GptOssExperts and the router always carry biases
        if not attn:
            raise k.refuse("attention_bias", "GPT-OSS with a bias-free attention is not representable")
        return True, True
    mlp = k.flag("mlp_bias", default=False) if mt in ("llama", "nemotron") else False
    if attn != mlp:
        raise k.refuse("attention_bias", f"attention biases without MLP biases (mlp_bias = {mlp}) are "
                                         f"not representable")
    return attn, attn


def _moe(k: _Keys, ffn: int) -> dict:
    mt = k.model_type
    if mt == "mixtral":  # MixtralConfig defaults: 8 local experts, 2 per token
        return {"ffn_hidden_size": ffn, "num_experts": k.int("num_local_experts", default=8),
                "moe_top_k": k.int("num_experts_per_tok", default=2)}
    if mt == "gpt_oss":
        return {"ffn_hidden_size": ffn, "num_experts": k.int("num_local_experts"),
                "moe_top_k": k.int("num_experts_per_tok", "experts_per_token")}
    if mt == "qwen3_moe":  # Qwen3MoeDecoderLayer: MoE when (layer_idx + 1) % decoder_sparse_step == 0
        if k.get("mlp_only_layers", default=[]):
            raise k.refuse("mlp_only_layers", "a list of dense layers among the MoE layers is not representable")
        return {"num_experts": k.int("num_experts"), "moe_top_k": k.int("num_experts_per_tok"),
                "ffn_hidden_size": ffn, "moe_ffn_hidden_size": k.int("moe_intermediate_size"),
                "moe_layer_interval": k.int("decoder_sparse_step", default=1)}
    if mt in ("deepseek_v2", "deepseek_v3"):  # DeepseekV3MoE: routed experts + shared experts
        if k.int("moe_layer_freq", default=1) != 1:
            raise k.refuse("moe_layer_freq", "only every layer after the first dense ones sparse (1) is representable")
        moe_ffn = k.int("moe_intermediate_size")
        return {"num_experts": k.int("n_routed_experts"), "moe_top_k": k.int("num_experts_per_tok"),
                "ffn_hidden_size": ffn, "moe_ffn_hidden_size": moe_ffn,
                "moe_shared_expert_ffn_hidden_size": k.int("n_shared_experts", default=0) * moe_ffn,
                "moe_first_dense_layers": k.int("first_k_dense_replace", default=0),
                "mtp_layers": k.int("num_nextn_predict_layers", default=0)}
    return {"ffn_hidden_size": ffn}


def _mla(k: _Keys) -> dict:
    """DeepSeek's multi-head latent attention: head_dim is the query/key head, nope + rope."""
    rope = k.int("qk_rope_head_dim")
    return {"head_dim": k.int("qk_nope_head_dim") + rope, "qk_rope_head_dim": rope,
            "v_head_dim": k.int("v_head_dim"), "kv_lora_rank": k.int("kv_lora_rank"),
            "q_lora_rank": k.int("q_lora_rank", default=0)}


def _dropout(k: _Keys) -> bool:
    return any([k.fraction(key) > 0 for key in _DROPOUT_KEYS])  # a list: every key is read (and checked)


def _decoder_fields(k: _Keys) -> dict:
    mt = k.model_type
    gated, norm, tied = _DECODERS[mt]
    heads = k.int("num_attention_heads")
    layers = k.int("num_hidden_layers")
    window, pattern = _window(k, layers)
    bias, qkv_bias = _bias(k)
    fields = {
        "num_layers": layers, "hidden_size": k.int("hidden_size"), "num_attention_heads": heads,
        "num_kv_heads": k.int("num_key_value_heads", default=heads),
        "head_dim": 0 if mt.startswith("deepseek") else k.int("head_dim", "kv_channels", default=0),
        "vocab_size": k.int("vocab_size"), "mlp": _mlp(k, gated), "norm": norm,
        "position_embedding": "rope", "tie_embeddings": k.flag("tie_word_embeddings", default=tied),
        "bias": bias, "qkv_bias": qkv_bias, "dropout": _dropout(k),
        "qk_norm": mt in ("qwen3", "qwen3_moe", "gemma3_text"),  # Qwen3Attention / Gemma3Attention q_norm, k_norm
        "sandwich_norm": mt in ("gemma2", "gemma3_text"),  # pre/post_feedforward_layernorm
        "sliding_window": window, "sliding_window_pattern": pattern,
    }
    fields.update(_moe(k, k.int("intermediate_size")))
    if mt in ("deepseek_v2", "deepseek_v3"):
        fields.update(_mla(k))
    return fields


def _gpt_fields(k: _Keys) -> dict:
    mt = k.model_type
    if mt == "gpt_neox" and not k.flag("attention_bias", default=True):
        raise k.refuse("attention_bias", "GPT-NeoX without attention biases is not representable")
    heads, hidden = k.int("num_attention_heads", "n_head"), k.int("hidden_size", "n_embd")
    act = str(k.get("activation_function", "hidden_act", default="gelu_new"))
    if act not in _ACTIVATIONS[False] or _ACTIVATIONS[False][act] != "gelu":
        raise k.refuse("hidden_act" if mt == "gpt_neox" else "activation_function",
                       "only GELU variants are supported")
    fields = {
        "num_layers": k.int("num_hidden_layers", "n_layer"), "hidden_size": hidden,
        "num_attention_heads": heads, "num_kv_heads": heads, "vocab_size": k.int("vocab_size"),
        "mlp": "gelu", "norm": "layernorm", "bias": True, "dropout": _dropout(k),
        # n_inner = None in GPT2Config / GPTJConfig means 4 * n_embd: 0 selects ModelSpec's 4·h default
        "ffn_hidden_size": k.int("intermediate_size") if mt == "gpt_neox" else k.int("n_inner", default=0),
    }
    if mt == "gpt2":  # GPT-2 always ties its LM head to wte and learns an n_positions x h table
        fields.update(position_embedding="learned", tie_embeddings=True,
                      max_position_embeddings=k.int("n_positions", "max_position_embeddings"))
    else:  # GPT-NeoX, GPT-J: rotary, separate LM head (GPTNeoXConfig, GPTJConfig tie_word_embeddings=False)
        fields.update(position_embedding="rope", tie_embeddings=k.flag("tie_word_embeddings", default=False))
        fields.update(_parallel_block(k, hidden // max(heads, 1)))
    return fields


def _parallel_block(k: _Keys, head_dim: int) -> dict:
    """GPT-NeoX: parallel blocks unless use_parallel_residual is false (GPTNeoXConfig default true), two
    norms both applied to the layer input (GPTNeoXLayer input_layernorm, post_attention_layernorm).
    GPT-J: always parallel, one shared ln_1 (GPTJBlock), bias-free q/k/v projections; rotary over the
    first rotary_dim dimensions of each head (None: all), as transformers' GPTJAttention applies it."""
    if k.model_type == "gpt_neox":
        parallel = k.flag("use_parallel_residual", default=True)
        return {"parallel_attn_mlp": parallel, "parallel_norms": 2 if parallel else 1}
    if not k.flag("rotary", default=True):
        raise k.refuse("rotary", "transformers' GPT-J always applies rotary embeddings")
    if not 0 <= k.int("rotary_dim", default=0) <= head_dim:
        raise k.refuse("rotary_dim", f"must be at most the head dimension {head_dim}")
    k.get("n_positions", default=0)  # the context limit (rotary: no position table), as max_position_embeddings
    return {"parallel_attn_mlp": True, "parallel_norms": 1, "qkv_bias": False}


def hf_config_to_fields(cfg: dict, name: str = "hf-model") -> dict:
    """ModelSpec keyword arguments (all but seq_length) from a parsed config.json."""
    k = _Keys(cfg, _model_type(cfg))
    fields = _gpt_fields(k) if k.model_type in _GPT_TYPES else _decoder_fields(k)
    if fields["num_kv_heads"] == 0 or fields["hidden_size"] == 0 or fields["num_attention_heads"] == 0:
        raise ValueError(f"config.json: hidden_size {fields['hidden_size']}, num_attention_heads "
                         f"{fields['num_attention_heads']}, num_key_value_heads {fields['num_kv_heads']} "
                         f"must be positive")
    k.check_all_read()
    return {"name": name, **fields}


def load_hf_config(path: str | Path) -> dict:
    """ModelSpec field values from a Hugging Face config.json; the name is the checkpoint folder's
    name for ``.../<name>/config.json``, otherwise the file's stem."""
    p = Path(path)
    try:
        cfg = json.loads(p.read_text())
    except OSError as e:
        raise ValueError(f"hf_config {str(p)!r} cannot be read: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"hf_config {str(p)!r} is not valid JSON: {e.msg} at line {e.lineno}") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"hf_config {str(p)!r} must hold a JSON object")
    name = p.parent.name if p.stem == "config" and p.parent.name else p.stem
    return hf_config_to_fields(cfg, name or "hf-model")
