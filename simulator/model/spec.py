"""ModelSpec: what is trained, a decoder-only transformer (GPT or Llama style, dense or MoE with
shared experts, MHA/GQA or multi-head latent attention).

Parameter counts follow the layer structure exactly; for GPT they reduce to Narayanan et al.
2021 eq. 2: P = 12·l·h²·(1 + 13/(12h) + (V + s)/(12·l·h)).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# MLP kinds. Gated kinds (Shazeer 2020, "GLU Variants Improve Transformer") multiply an activated gate
# projection by an up projection, 3 weight matrices: SwiGLU (Llama, Touvron et al. 2023), GeGLU (Grok-1,
# model.py: gelu(gate) * up). Plain kinds, 2: GELU (GPT-2/3), squared ReLU (So et al. 2021; Nemotron-4).
MLP_KINDS = ("gelu", "squared-relu", "swiglu", "geglu")
NORM_KINDS = ("layernorm", "rmsnorm")  # weight + bias | weight only
POSITION_KINDS = ("learned", "rope")  # an s·h table | no parameters
GATED_MLP_KINDS = ("swiglu", "geglu")
MOE_DISPATCHERS = ("alltoall", "allgather")

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
    num_experts: int = 1  # MoE when > 1: the MoE layers' MLP is replaced by num_experts experts
    moe_top_k: int = 1
    # Expert capacity (GShard, Lepikhin et al. 2020 §2.2; Switch, Fedus et al. 2021 eq. 4): each expert
    # takes at most cf·T·k/E tokens, the rest are dropped; 0: dropless (Megatron-core
    # moe_expert_capacity_factor None, its default). moe_pad_to_capacity: every expert computes its
    # full capacity (Megatron-core moe_pad_expert_input_to_capacity).
    moe_capacity_factor: float = 0.0
    moe_pad_to_capacity: bool = False
    # Routing imbalance: the busiest expert's tokens / the mean (1.0: balanced). The EP rank holding it
    # sets the pace of every MoE layer (its co-located experts taken at the mean load).
    moe_load_imbalance: float = 1.0
    # Local experts as one grouped GEMM (TEGroupedMLP / GroupedMLP) or one GEMM per expert
    # (SequentialMLP): Megatron-core's TransformerConfig.moe_grouped_gemm, False there by default, but
    # the model configs of today's MoEs in NeMo 2 / Megatron-Bridge (GPT-OSS, Qwen3-MoE, GLM-4.x
    # providers) set it True, so True is the default here; NeMo's older Mixtral config and the
    # dgxc Grok-1 recipe leave it off (moe_grouped_gemm = false in its YAML).
    moe_grouped_gemm: bool = True
    # Token dispatcher (Megatron-core moe_token_dispatcher_type): "alltoall" (dispatch and combine
    # all-to-alls over EP) or "allgather" (all-gather the tokens over EP, reduce-scatter the outputs).
    moe_token_dispatcher: str = "alltoall"
    # Megatron-core moe_shared_expert_overlap (default False; NeMo 2's DeepSeekConfig sets it True): the
    # shared experts run on a side stream inside the alltoall dispatcher, fc1 and the activation beside
    # the dispatch all-to-all, fc2 beside the combine (moe/shared_experts.py, token_dispatcher.py).
    moe_shared_expert_overlap: bool = False
    # Fine-grained MoE (DeepSeekMoE, Dai et al. 2024; Qwen3-MoE): experts narrower than the dense
    # MLP (0 -> ffn_hidden_size), shared experts every token passes through (their total width, as
    # Megatron-core's moe_shared_expert_intermediate_size), and dense MLPs in the first layers
    # (DeepSeek-V3 first_k_dense_replace = 3), then layer i is MoE when (i + 1) % moe_layer_interval == 0
    # (Llama 4 interleave_moe_layer_step; Megatron-core moe_layer_freq, [0, 1] * n for 2).
    moe_ffn_hidden_size: int = 0
    moe_shared_expert_ffn_hidden_size: int = 0
    moe_first_dense_layers: int = 0
    moe_layer_interval: int = 1
    # Multi-head latent attention (MLA, DeepSeek-V2 §2.1, Liu et al. 2024), on when kv_lora_rank > 0:
    # K and V come up from a kv_lora_rank latent, Q from a q_lora_rank latent (0: a plain projection);
    # head_dim is the query/key head (qk_nope + qk_rope_head_dim, the decoupled RoPE part) and
    # v_head_dim the value head (0 -> head_dim).
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # Architecture details; "" -> derived from mlp (gelu: GPT-2/3 style; every other kind: Llama
    # style, so a Nemotron-4 scenario sets norm = "layernorm" itself).
    norm: str = ""  # "layernorm" (weight + bias) | "rmsnorm" (weight only)
    position_embedding: str = ""  # "learned" (s·h table) | "rope" (no parameters)
    tie_embeddings: bool | None = None  # LM head shares the input embedding matrix
    bias: bool | None = None  # linear layers carry biases (GPT yes, Llama no)
    qkv_bias: bool | None = None  # the QKV projection alone carries biases (Qwen2); None -> bias
    # Attention shape. head_dim 0 -> hidden_size / num_attention_heads; Mistral-Nemo (5120 hidden,
    # 32 heads, head_dim 128), Gemma 2/3 and Qwen3 set it, so Q is heads·head_dim wide, not hidden.
    head_dim: int = 0
    qk_norm: bool = False  # Qwen3 / Gemma 3: a norm over each query and key head (head_dim weights)
    sandwich_norm: bool = False  # Gemma 2/3, Grok-1: norms after attention and MLP too (4 per layer)
    # Sliding-window attention (Mistral 7B, Gemma 2/3, GPT-OSS): a query attends to the last
    # sliding_window tokens (0: the whole causal prefix). sliding_window_pattern N >= 2 makes every
    # N-th layer global (Gemma 2 and GPT-OSS alternate: 2; Gemma 3: 6); 0: every layer is windowed.
    sliding_window: int = 0
    sliding_window_pattern: int = 0
    max_position_embeddings: int = 0  # rows of a learned position table; 0 -> seq_length
    dropout: bool | None = None  # residual and attention dropout (GPT-2/3 0.1); None -> GPT style
    # Multi-token prediction (DeepSeek-V3 §2.2, Liu et al. 2024; Megatron-core mtp_num_layers;
    # Hugging Face num_nextn_predict_layers): D sequential modules after the last layer, each
    # RMSNorm(h) and RMSNorm(Emb(next token)) concatenated, projected 2h -> h, one transformer layer
    # of the model's main kind, a norm and the shared output head with its own loss. Embedding and
    # output head are shared with the main model; the modules run on the last pipeline stage.
    mtp_layers: int = 0
    # Parallel attention + MLP blocks (GPT-J, Wang & Komatsuzaki 2021; GPT-NeoX-20B, Black et al. 2022
    # §2.1; PaLM, Chowdhery et al. 2022 §2): x + attn(norm(x)) + mlp(norm'(x)), both branches read the
    # layer input. ``parallel_norms``: 1, one norm shared by the two branches (GPT-J's ln_1, PaLM), or 2,
    # one per branch (GPT-NeoX's input_layernorm and post_attention_layernorm, both applied to x).
    parallel_attn_mlp: bool = False
    parallel_norms: int = 1
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
        if self.dropout is None:
            object.__setattr__(self, "dropout", gpt_style)
        if self.qkv_bias is None:
            object.__setattr__(self, "qkv_bias", self.bias)
        if self.head_dim == 0 and self.num_attention_heads > 0:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.v_head_dim == 0:
            object.__setattr__(self, "v_head_dim", self.head_dim)
        if self.moe_ffn_hidden_size == 0:
            object.__setattr__(self, "moe_ffn_hidden_size", self.ffn_hidden_size)
        if self.max_position_embeddings == 0:
            object.__setattr__(self, "max_position_embeddings", self.seq_length)

    def check(self) -> None:
        """Raise ValueError naming the field and the numbers when the shape is not a transformer."""
        if self.mlp not in MLP_KINDS:
            raise ValueError(f"mlp must be one of {', '.join(MLP_KINDS)}; got {self.mlp!r}")
        for key, known in (("norm", NORM_KINDS), ("position_embedding", POSITION_KINDS)):
            if getattr(self, key) not in known:
                raise ValueError(f"{key} must be one of {', '.join(known)}; got {getattr(self, key)!r}")
        if self.head_dim * self.num_attention_heads == 0 or (
                self.hidden_size % self.num_attention_heads
                and self.head_dim == self.hidden_size // self.num_attention_heads):
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by "
                             f"num_attention_heads {self.num_attention_heads} (or set head_dim)")
        for key in ("sliding_window", "sliding_window_pattern", "mtp_layers"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key} must be >= 0, got {getattr(self, key)}")
        self._check_parallel()
        if self.sliding_window_pattern and not self.sliding_window:
            raise ValueError(f"sliding_window_pattern {self.sliding_window_pattern} needs sliding_window > 0")
        if (self.q_lora_rank or self.qk_rope_head_dim) and not self.kv_lora_rank:
            raise ValueError(f"q_lora_rank {self.q_lora_rank} / qk_rope_head_dim {self.qk_rope_head_dim} are "
                             f"multi-head latent attention fields: they need kv_lora_rank > 0")
        if self.sliding_window_pattern == 1:
            raise ValueError("sliding_window_pattern 1 makes every layer global: set sliding_window = 0")
        if self.position_embedding == "learned" and self.seq_length > self.max_position_embeddings:
            raise ValueError(f"seq_length {self.seq_length} exceeds the learned position table's "
                             f"max_position_embeddings {self.max_position_embeddings}")
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(f"num_attention_heads {self.num_attention_heads} is not divisible by "
                             f"num_kv_heads {self.num_kv_heads}")
        self._check_moe()
        if self.is_moe and not 1 <= self.moe_top_k <= self.num_experts:
            raise ValueError(f"moe_top_k {self.moe_top_k} must be in 1..num_experts {self.num_experts}")
        if self.moe_first_dense_layers > (self.num_layers if self.is_moe else 0):
            raise ValueError(f"moe_first_dense_layers {self.moe_first_dense_layers} needs an MoE model "
                             f"with that many layers (num_layers {self.num_layers}, num_experts {self.num_experts})")
        if not 1 <= self.moe_layer_interval <= (self.num_layers if self.is_moe else 1):
            raise ValueError(f"moe_layer_interval {self.moe_layer_interval} must be 1 (up to {self.num_layers}: MoE)")
        if self.is_mla and not 0 < self.qk_rope_head_dim < self.head_dim:
            raise ValueError(f"qk_rope_head_dim {self.qk_rope_head_dim} must be in 1..head_dim-1 "
                             f"(head_dim {self.head_dim} = qk_nope + qk_rope) with kv_lora_rank {self.kv_lora_rank}")
        if self.is_mla and self.num_kv_heads != self.num_attention_heads:
            raise ValueError(f"MLA (kv_lora_rank {self.kv_lora_rank}) up-projects K and V per head: "
                             f"num_kv_heads {self.num_kv_heads} must equal num_attention_heads {self.num_attention_heads}")

    def _check_parallel(self) -> None:
        if self.parallel_norms not in (1, 2):
            raise ValueError(f"parallel_norms must be 1 (one shared norm, GPT-J) or 2 (GPT-NeoX), got "
                             f"{self.parallel_norms}")
        if self.parallel_norms != 1 and not self.parallel_attn_mlp:
            raise ValueError(f"parallel_norms = {self.parallel_norms} needs parallel_attn_mlp = true")
        unmodelled = [k for k, on in (("num_experts > 1", self.is_moe), ("kv_lora_rank > 0 (MLA)", self.is_mla),
                                      ("sandwich_norm", self.sandwich_norm)) if on]
        if self.parallel_attn_mlp and unmodelled:
            raise ValueError(f"parallel_attn_mlp with {unmodelled[0]} is not modelled (no published model "
                             f"has both)")

    def _check_moe(self) -> None:
        if self.moe_capacity_factor < 0:
            raise ValueError(f"moe_capacity_factor must be >= 0 (0: dropless), got {self.moe_capacity_factor}")
        if self.moe_pad_to_capacity and not self.moe_capacity_factor:
            raise ValueError("moe_pad_to_capacity needs moe_capacity_factor > 0 (dropless experts have no capacity)")
        if not 1 <= self.moe_load_imbalance <= max(1, self.num_experts):
            raise ValueError(f"moe_load_imbalance (busiest expert's tokens / mean) must be in 1..num_experts "
                             f"{self.num_experts}, got {self.moe_load_imbalance}")
        if self.moe_token_dispatcher not in MOE_DISPATCHERS:
            raise ValueError(f"moe_token_dispatcher must be one of {', '.join(MOE_DISPATCHERS)}, got "
                             f"{self.moe_token_dispatcher!r}")
        if self.moe_shared_expert_overlap and not (self.is_moe and self.moe_shared_expert_ffn_hidden_size):
            raise ValueError("moe_shared_expert_overlap needs shared experts (num_experts > 1 and "
                             "moe_shared_expert_ffn_hidden_size > 0)")
        if self.moe_shared_expert_overlap and self.moe_token_dispatcher != "alltoall":
            raise ValueError(f"moe_shared_expert_overlap runs inside the alltoall token dispatcher "
                             f"(Megatron-core), not with moe_token_dispatcher = {self.moe_token_dispatcher!r}")

    def moe_mean_load(self) -> float:
        """Token slots the experts compute per routed slot (T·k), balanced routing: the capacity
        factor when padded to capacity, at most the capacity when dropping, 1 dropless."""
        cf = self.moe_capacity_factor
        return 1.0 if not cf else cf if self.moe_pad_to_capacity else min(1.0, cf)

    def moe_expert_loads(self) -> tuple[float, float]:
        """(busiest expert, every other expert) routed token slots relative to the mean expert's
        T·k/E, after the capacity: the busiest takes moe_load_imbalance times the mean, the other
        E - 1 share the rest evenly, (E - imb)/(E - 1) each (the slots are T·k in all); a capacity cf
        caps both; padding makes every expert compute exactly cf."""
        cf, imb, e = self.moe_capacity_factor, self.moe_load_imbalance, self.num_experts
        others = (e - imb) / (e - 1) if e > 1 else 1.0
        if not cf:
            return imb, others
        return (cf, cf) if self.moe_pad_to_capacity else (min(imb, cf), min(others, cf))

    def moe_rank_slots_per_token(self, experts_per_rank: int) -> float:
        """Token slots per local token the busiest EP rank's experts compute: top_k times the mean of
        its experts' loads (``moe_expert_loads``: the busiest expert and experts_per_rank - 1 others)."""
        busy, other = self.moe_expert_loads()
        n = max(1, experts_per_rank)
        return self.moe_top_k * (busy + (n - 1) * other) / n

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def q_size(self) -> int:
        """Width of Q and of the attention output projection's input: heads·head_dim."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_hidden_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def attn_out_size(self) -> int:
        """Input width of the output projection: heads·v_head_dim (q_size unless MLA sets v_head_dim)."""
        return self.num_attention_heads * self.v_head_dim

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def total_layers(self) -> int:
        """Transformer layers of the op graph: the main model's, then the MTP modules' (``mtp_layers``)."""
        return self.num_layers + self.mtp_layers

    @property
    def num_moe_layers(self) -> int:
        return sum(not self.has_dense_mlp(i) for i in range(self.num_layers)) if self.is_moe else 0

    def has_dense_mlp(self, index: int) -> bool:
        """Layer ``index`` of an MoE model runs a dense ffn_hidden_size MLP (MTP layers: MoE)."""
        return self.is_moe and index < self.num_layers and (
            index < self.moe_first_dense_layers or (index + 1) % self.moe_layer_interval != 0)

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

    @property
    def norms_per_layer(self) -> int:
        return 4 if self.sandwich_norm else self.parallel_norms if self.parallel_attn_mlp else 2

    def qk_norm_params(self) -> int:
        """One norm of head_dim shared by all query heads, one by all key heads (Qwen3RMSNorm)."""
        return 2 * self.head_dim * (2 if self.norm == "layernorm" else 1) if self.qk_norm else 0

    def attention_params_per_layer(self) -> int:
        h, q, kv, o = self.hidden_size, self.q_size, self.kv_hidden_size, self.attn_out_size
        if self.is_mla:
            return self.mla_params_per_layer() + o * h + (h if self.bias else 0)
        weights = h * (q + 2 * kv) + o * h  # QKV projection + output projection
        biases = ((q + 2 * kv) if self.qkv_bias else 0) + (h if self.bias else 0)
        return weights + biases + self.qk_norm_params()

    def mla_params_per_layer(self) -> int:
        """MLA's projections before the output one (DeepSeek-V2 eq. 9-13, 37-40; DeepseekV3Attention):
        q: h -> q_lora_rank, its norm, -> heads·head_dim (or h -> heads·head_dim directly); kv: h ->
        kv_lora_rank + qk_rope_head_dim (the shared RoPE key), the latent's norm, latent -> heads·
        (qk_nope + v_head_dim)."""
        h, heads, r_q, r_kv = self.hidden_size, self.num_attention_heads, self.q_lora_rank, self.kv_lora_rank
        norm = 2 if self.norm == "layernorm" else 1
        q = h * r_q + norm * r_q + r_q * self.q_size if r_q else h * self.q_size
        nope = self.head_dim - self.qk_rope_head_dim
        kv = h * (r_kv + self.qk_rope_head_dim) + norm * r_kv + r_kv * heads * (nope + self.v_head_dim)
        return q + kv

    def kv_cache_elements_per_token_per_layer(self) -> int:
        """Key/value elements one token leaves per layer (DeepSeek-V2 Table 1): 2·n_kv·d_h for
        MHA/GQA, (d_c + d_h^R) for MLA, the latent and the shared RoPE key."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.kv_hidden_size

    def is_windowed_layer(self, index: int) -> bool:
        """Layer ``index`` (0-based) attends through the sliding window: every layer with pattern 0,
        else all but every N-th ((index + 1) % N == 0 is global: HF Gemma2 ``is_sliding = not
        layer_idx % 2``, Gemma 3 ``(layer_idx + 1) % sliding_window_pattern``, GPT-OSS layer_types
        sliding/full alternating from layer 0)."""
        w, n = self.sliding_window, self.sliding_window_pattern
        if w == 0 or w >= self.seq_length:
            return False
        return not n or (index + 1) % n != 0

    def window_flops_fraction(self) -> float:
        """Score FLOPs of a windowed layer relative to full causal attention. A windowed query at
        position i scores min(w, i) keys: sum over s queries w(w+1)/2 + (s - w)·w against s(s+1)/2
        for the causal prefix."""
        s, w = self.seq_length, self.sliding_window
        if w == 0 or w >= s:
            return 1.0
        return (w * (w + 1) / 2 + (s - w) * w) / (s * (s + 1) / 2)

    def attention_flops_fraction(self) -> float:
        """Score FLOPs relative to full causal attention, averaged over the layers."""
        windowed = sum(self.is_windowed_layer(i) for i in range(self.num_layers))
        return (self.num_layers - windowed + windowed * self.window_flops_fraction()) / self.num_layers

    def _mlp_params(self, width: int) -> int:
        h = self.hidden_size
        biases = ((self.mlp_matrices - 1) * width + h) if self.bias else 0
        return self.mlp_matrices * h * width + biases

    def expert_params(self) -> int:
        """Parameters of one MLP (one routed expert for MoE, moe_ffn_hidden_size wide)."""
        return self._mlp_params(self.moe_ffn_hidden_size if self.is_moe else self.ffn_hidden_size)

    def shared_expert_params(self) -> int:
        return self._mlp_params(self.moe_shared_expert_ffn_hidden_size) if (
            self.is_moe and self.moe_shared_expert_ffn_hidden_size) else 0

    def norm_params(self) -> int:
        return 2 * self.hidden_size if self.norm == "layernorm" else self.hidden_size

    def router_params_per_layer(self) -> int:
        """The h x E gate, plus E biases when linear layers carry biases (GPT-OSS's router)."""
        return (self.hidden_size + (1 if self.bias else 0)) * self.num_experts if self.is_moe else 0

    def mlp_params_per_layer(self) -> int:
        """The MLP block of an MoE layer (routed and shared experts, router), or the dense MLP."""
        return (self.num_experts * self.expert_params() + self.shared_expert_params()
                + self.router_params_per_layer()) if self.is_moe else self.expert_params()

    def dense_params_per_layer(self) -> int:
        """Per-layer parameters outside the routed experts (attention, norms, router, shared experts)."""
        return (self.attention_params_per_layer() + self.norms_per_layer * self.norm_params()
                + self.router_params_per_layer() + self.shared_expert_params())

    def params_per_layer(self) -> int:
        """Parameters of one MoE layer (of every layer for a dense model)."""
        return (self.attention_params_per_layer() + self.norms_per_layer * self.norm_params()
                + self.mlp_params_per_layer())

    def dense_layer_params(self) -> int:
        """Parameters of an MoE model's dense layer (``has_dense_mlp``): a dense ffn_hidden_size MLP."""
        return (self.attention_params_per_layer() + self.norms_per_layer * self.norm_params()
                + self._mlp_params(self.ffn_hidden_size))

    def embedding_params(self) -> int:
        pos = self.max_position_embeddings * self.hidden_size if self.position_embedding == "learned" else 0
        return self.vocab_size * self.hidden_size + pos

    def head_params(self) -> int:
        """Final norm plus the LM head (zero extra weights when tied to the embedding)."""
        head = 0 if self.tie_embeddings else self.vocab_size * self.hidden_size
        return self.norm_params() + head

    def mtp_module_params(self) -> int:
        """One MTP module's own weights: two input norms, the 2h -> h projection, a main-kind layer and
        the output norm (embedding and output head are the main model's)."""
        return 3 * self.norm_params() + 2 * self.hidden_size ** 2 + self.params_per_layer()

    def num_params(self) -> int:
        """Trained parameters: the main model plus its MTP modules (``mtp_module_params``)."""
        moe = self.num_moe_layers if self.is_moe else self.num_layers
        return (self.embedding_params() + moe * self.params_per_layer()
                + (self.num_layers - moe) * self.dense_layer_params() + self.head_params()
                + self.mtp_layers * self.mtp_module_params())

    def num_active_params(self) -> int:
        """Parameters touched per token (MoE: top_k of num_experts routed experts)."""
        inactive = (self.num_experts - self.moe_top_k) * self.expert_params() if self.is_moe else 0
        return self.num_params() - (self.num_moe_layers + (self.mtp_layers if self.is_moe else 0)) * inactive
