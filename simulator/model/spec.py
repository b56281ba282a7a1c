"""ModelSpec: what is trained, a decoder-only transformer (GPT or Llama style, dense or MoE).

Parameter counts follow the layer structure exactly; for GPT they reduce to Narayanan et al.
2021 eq. 2: P = 12·l·h²·(1 + 13/(12h) + (V + s)/(12·l·h)).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# MLP kinds. Gated kinds (Shazeer 2020, "GLU Variants Improve Transformer") multiply an activated
# gate projection by an up projection: 3 weight matrices. SwiGLU: Llama (Touvron et al. 2023);
# GeGLU: Grok-1 (xai-org/grok-1 model.py, gelu(gate) * up). Plain kinds have 2 matrices: GELU
# (GPT-2/3), squared ReLU relu(x)^2 (So et al. 2021 "Primer"; Nemotron-4, Parmar et al. 2024 §2).
MLP_KINDS = ("gelu", "squared-relu", "swiglu", "geglu")
GATED_MLP_KINDS = ("swiglu", "geglu")

@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    vocab_size: int
    seq_length: int
    num_kv_heads: int = 0  # 0 -> num_attention_heads (multi-head attention)
    ffn_hidden_size: int = 0  # 0 -> 4 * hidden_size
    mlp: str = "gelu"  # one of MLP_KINDS: "gelu", "squared-relu" (2 GEMMs); "swiglu", "geglu" (3, gated)
    num_experts: int = 1  # MoE when > 1: every layer's MLP is replaced by num_experts experts
    moe_top_k: int = 1
    moe_capacity_factor: float = 1.0  # GShard/Switch capacity factor: tokens per expert = cf·T·k/E
    # Architecture details; "" -> derived from mlp (gelu: GPT-2/3 style; every other kind: Llama
    # style, so a Nemotron-4 scenario sets norm = "layernorm" itself).
    norm: str = ""  # "layernorm" (weight + bias) | "rmsnorm" (weight only)
    position_embedding: str = ""  # "learned" (s·h table) | "rope" (no parameters)
    tie_embeddings: bool | None = None  # LM head shares the input embedding matrix
    bias: bool | None = None  # linear layers carry biases (GPT yes, Llama no)
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        gpt_style = self.mlp == "gelu"
        if self.num_kv_heads == 0:
            object.__setattr__(self, "num_kv_heads", self.num_attention_heads)
        if self.ffn_hidden_size == 0:
            object.__setattr__(self, "ffn_hidden_size", 4 * self.hidden_size)
        if self.norm == "":
            object.__setattr__(self, "norm", "layernorm" if gpt_style else "rmsnorm")
        if self.position_embedding == "":
            object.__setattr__(self, "position_embedding", "learned" if gpt_style else "rope")
        if self.tie_embeddings is None:
            object.__setattr__(self, "tie_embeddings", gpt_style)
        if self.bias is None:
            object.__setattr__(self, "bias", gpt_style)

    def check(self) -> None:
        """Raise ValueError naming the field and the numbers when the shape is not a transformer."""
        if self.mlp not in MLP_KINDS:
            raise ValueError(f"mlp must be one of {', '.join(MLP_KINDS)}; got {self.mlp!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by "
                             f"num_attention_heads {self.num_attention_heads}")
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(f"num_attention_heads {self.num_attention_heads} is not divisible by "
                             f"num_kv_heads {self.num_kv_heads}")
        if self.is_moe and not 1 <= self.moe_top_k <= self.num_experts:
            raise ValueError(f"moe_top_k {self.moe_top_k} must be in 1..num_experts {self.num_experts}")

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def kv_hidden_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of h x ffn in one MLP (expert): 2 plain (GELU, squared ReLU), 3 gated."""
        return 3 if self.gated_mlp else 2

    @property
    def gated_mlp(self) -> bool:
        return self.mlp in GATED_MLP_KINDS

    def attention_params_per_layer(self) -> int:
        h, kv = self.hidden_size, self.kv_hidden_size
        weights = h * (h + 2 * kv) + h * h  # QKV projection + output projection
        biases = (h + 2 * kv) + h if self.bias else 0
        return weights + biases

    def expert_params(self) -> int:
        """Parameters of one MLP (one expert for MoE)."""
        h, f = self.hidden_size, self.ffn_hidden_size
        weights = self.mlp_matrices * h * f
        biases = ((self.mlp_matrices - 1) * f + h) if self.bias else 0
        return weights + biases

    def norm_params(self) -> int:
        return 2 * self.hidden_size if self.norm == "layernorm" else self.hidden_size

    def router_params_per_layer(self) -> int:
        return self.hidden_size * self.num_experts if self.is_moe else 0

    def mlp_params_per_layer(self) -> int:
        return self.num_experts * self.expert_params() + self.router_params_per_layer()

    def dense_params_per_layer(self) -> int:
        """Per-layer parameters outside the experts (attention, norms, router)."""
        return self.attention_params_per_layer() + 2 * self.norm_params() + self.router_params_per_layer()

    def params_per_layer(self) -> int:
        return self.attention_params_per_layer() + 2 * self.norm_params() + self.mlp_params_per_layer()

    def embedding_params(self) -> int:
        pos = self.seq_length * self.hidden_size if self.position_embedding == "learned" else 0
        return self.vocab_size * self.hidden_size + pos

    def head_params(self) -> int:
        """Final norm plus the LM head (zero extra weights when tied to the embedding)."""
        head = 0 if self.tie_embeddings else self.vocab_size * self.hidden_size
        return self.norm_params() + head

    def num_params(self) -> int:
        return self.embedding_params() + self.num_layers * self.params_per_layer() + self.head_params()

    def num_active_params(self) -> int:
        """Parameters touched per token (MoE: top_k of num_experts experts)."""
        inactive = (self.num_experts - self.moe_top_k) * self.expert_params() if self.is_moe else 0
        return self.num_params() - self.num_layers * inactive
