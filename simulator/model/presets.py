"""Model presets a scenario can name (``[model] preset = ...``); fields in the file override them.

Sources: GPT-3 (Brown et al. 2020, Table 2.1); Megatron GPT sizes (Narayanan et al. 2021,
Table 1); Llama 2 (Touvron et al. 2023, Table 1 and the released config.json files);
Llama 3 / 3.1 (Dubey et al. 2024, Table 3 and config.json); Mixtral 8x7B (Jiang et al. 2024,
Table 1 and config.json). Megatron GPT models use vocabulary 51200 (GPT-2 BPE padded).
Today's models: Llama 3.1 (Dubey et al. 2024, Table 3; same shapes as Llama 3, pretrained at 8192
tokens, §3.4.1), Mixtral 8x22B (mistralai/Mixtral-8x22B-v0.1 config.json), Nemotron-4 15B (Parmar
et al. 2024, Table 1: squared ReLU, LayerNorm, no bias, no dropout, untied, seq 4096) and 340B
(Adler et al. 2024, Table 1), Grok-1 (xai-org/grok-1 model.py and README: GeGLU, four RMSNorms per
layer, tied embeddings, 8192 context), Qwen3-235B-A22B (Qwen/Qwen3-235B-A22B config.json; Qwen3
report: pretraining stages at 4096 tokens), GPT-OSS-120B (openai/gpt-oss-120b config.json,
initial_context_length 4096), DeepSeek-V3 (deepseek-ai/DeepSeek-V3 config.json without its
multi-token-prediction module; DeepSeek-V3 report §4.2: pretraining at 4K tokens) and Llama 4 Scout and
Maverick (the text model of meta-llama/Llama-4-Scout-17B-16E / -Maverick-17B-128E: 48 layers of 5120, 40
heads, 8 KV heads, one routed expert of 8192 per token beside a shared expert of 8192, 16 / 128 experts,
MoE in every layer / every second one (interleave_moe_layer_step), dense layers 16384 wide, vocabulary
202,048; 107.8B / 400.7B parameters, 17.2B active, against Meta's rounded 109B / 400B and 17B. Their
chunked attention (8192-token chunks in three of four layers) is causal attention at the 8192-token
sequence of these presets; longer sequences are charged full causal attention).
"""

from __future__ import annotations

from .spec import ModelSpec


def _gpt(name: str, layers: int, hidden: int, heads: int, seq: int = 2048) -> ModelSpec:
    return ModelSpec(name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                     vocab_size=51200, seq_length=seq, mlp="gelu")


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int,
           seq: int, **kw) -> ModelSpec:
    return ModelSpec(name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                     num_kv_heads=kv, ffn_hidden_size=ffn, vocab_size=vocab, seq_length=seq,
                     mlp="swiglu", **kw)


MODEL_PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _gpt("gpt3-175b", 96, 12288, 96),
        _gpt("gpt3-13b", 40, 5120, 40),
        _gpt("gpt3-6.7b", 32, 4096, 32),
        _gpt("gpt3-2.7b", 32, 2560, 32),
        _gpt("gpt3-1.3b", 24, 2048, 16),
        # Narayanan et al. 2021 Table 1 (weak-scaling family).
        _gpt("megatron-gpt-1.7b", 24, 2304, 24),
        _gpt("megatron-gpt-3.6b", 30, 3072, 32),
        _gpt("megatron-gpt-7.5b", 36, 4096, 32),
        _gpt("megatron-gpt-18.4b", 40, 6144, 48),
        _gpt("megatron-gpt-39.1b", 48, 8192, 64),
        _gpt("megatron-gpt-76.1b", 60, 10240, 80),
        _gpt("megatron-gpt-145.6b", 80, 12288, 96),
        _gpt("megatron-gpt-310.1b", 96, 16384, 128),
        _gpt("megatron-gpt-529.6b", 105, 20480, 128),
        _gpt("megatron-gpt-1t", 128, 25600, 160),
        _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
        _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
        _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
        _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
        _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
        _llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192),
        # Mixtral trains with 32k context; 4096 is the sequence length of its scenario default.
        _llama("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 4096, num_experts=8, moe_top_k=2),
        _llama("llama3.1-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
        _llama("llama3.1-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
        _llama("llama3.1-405b", 126, 16384, 128, 8, 53248, 128256, 8192),
        _llama("mixtral-8x22b", 56, 6144, 48, 8, 16384, 32000, 4096, num_experts=8, moe_top_k=2),
        ModelSpec("nemotron4-15b", 32, 6144, 48, 256000, 4096, num_kv_heads=8, ffn_hidden_size=24576,
                  mlp="squared-relu", norm="layernorm"),
        ModelSpec("nemotron4-340b", 96, 18432, 96, 256000, 4096, num_kv_heads=8, ffn_hidden_size=73728,
                  mlp="squared-relu", norm="layernorm"),
        ModelSpec("grok-1", 64, 6144, 48, 131072, 8192, num_kv_heads=8, ffn_hidden_size=32768,
                  mlp="geglu", num_experts=8, moe_top_k=2, sandwich_norm=True, tie_embeddings=True),
        _llama("qwen3-235b-a22b", 94, 4096, 64, 4, 12288, 151936, 4096, head_dim=128, qk_norm=True,
               num_experts=128, moe_top_k=8, moe_ffn_hidden_size=1536),
        _llama("gpt-oss-120b", 36, 2880, 64, 8, 2880, 201088, 4096, head_dim=64, bias=True,
               num_experts=128, moe_top_k=4, sliding_window=128, sliding_window_pattern=2),
        _llama("deepseek-v3", 61, 7168, 128, 128, 18432, 129280, 4096, num_experts=256, moe_top_k=8,
               moe_ffn_hidden_size=2048, moe_shared_expert_ffn_hidden_size=2048, moe_first_dense_layers=3,
               q_lora_rank=1536, kv_lora_rank=512, head_dim=192, qk_rope_head_dim=64, v_head_dim=128),
        _llama("llama4-scout", 48, 5120, 40, 8, 16384, 202048, 8192, num_experts=16, moe_top_k=1,
               moe_ffn_hidden_size=8192, moe_shared_expert_ffn_hidden_size=8192),
        _llama("llama4-maverick", 48, 5120, 40, 8, 16384, 202048, 8192, num_experts=128, moe_top_k=1,
               moe_ffn_hidden_size=8192, moe_shared_expert_ffn_hidden_size=8192, moe_layer_interval=2),
    )
}
