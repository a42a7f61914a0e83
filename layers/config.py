"""Model architecture config: one frozen dataclass for every supported decoder family.

Families (Hugging Face `model_type`s) differ in fixed structural traits, which are properties
here (norm style, MLP activation, embedding scale, norms around each block, q/k norm, q/k/v
biases), and in numeric options, which are fields (sliding window, the per-layer pattern of
local and global attention, RoPE bases, soft-capping, the attention scale).
"""

import dataclasses
import math
from typing import Literal, Optional

GEMMA_FAMILIES = ("gemma", "gemma2", "gemma3")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Decoder-only transformer architecture (no runtime knobs; see maxscore.config)."""
  family: Literal["llama", "qwen3", "qwen2", "mistral", "gemma", "gemma2", "gemma3"] = "qwen3"
  vocab_size: int = 512
  hidden_size: int = 64
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 16
  mlp_dim: int = 128
  rope_theta: float = 10000.0
  rope_scaling_type: Optional[Literal["llama3", "linear"]] = None  # applies to global layers
  rope_scaling_factor: float = 1.0
  rope_low_freq_factor: float = 1.0
  rope_high_freq_factor: float = 4.0
  rope_original_max_position: int = 8192
  rms_norm_eps: float = 1e-6
  tie_word_embeddings: bool = True
  attention_bias: bool = False  # biases on q, k, v and o (Llama's attention_bias); Qwen2 has q/k/v biases always
  max_position_embeddings: int = 4096
  # Per-layer attention, cycled over the layers: "G" global (full causal), "L" local (sliding
  # window). Gemma 2: "LG"; Gemma 3: "LLLLLG"; Mistral: "L".
  layer_pattern: str = "G"
  sliding_window: Optional[int] = None  # W: a local layer's query sees keys less than W positions back
  rope_local_theta: Optional[float] = None  # RoPE base of local layers, unscaled (Gemma 3); None: as global
  query_pre_attn_scalar: Optional[float] = None  # attention scale is its -1/2 power; None: head_dim
  attn_logit_softcap: Optional[float] = None  # attention logits -> cap * tanh(logits / cap)
  final_logit_softcap: Optional[float] = None  # lm_head logits -> cap * tanh(logits / cap)

  @property
  def qk_norm(self) -> bool:
    """Qwen3 and Gemma 3 normalize each query/key head with RMSNorm before RoPE."""
    return self.family in ("qwen3", "gemma3")

  @property
  def gemma_style(self) -> bool:
    """Gemma: (1 + w) RMSNorm, GeGLU, embeddings scaled by sqrt(hidden_size)."""
    return self.family in GEMMA_FAMILIES

  @property
  def sandwich_norm(self) -> bool:
    """Gemma 2/3 also normalize each block's output before adding it to the residual."""
    return self.family in ("gemma2", "gemma3")

  @property
  def qkv_bias(self) -> bool:
    return self.attention_bias or self.family == "qwen2"

  @property
  def embed_scale(self) -> Optional[float]:
    return math.sqrt(self.hidden_size) if self.gemma_style else None

  @property
  def attn_scale(self) -> float:
    return float(self.query_pre_attn_scalar or self.head_dim) ** -0.5

  @property
  def layer_uses_window(self) -> tuple[bool, ...]:
    """Per layer: True where it attends within the sliding window."""
    return tuple(self.layer_pattern[i % len(self.layer_pattern)] == "L" for i in range(self.num_layers))

  @property
  def window(self) -> Optional[int]:
    """The sliding window if any layer uses one, else None."""
    return self.sliding_window if any(self.layer_uses_window) else None

  def validate(self) -> "ModelConfig":
    """Checks cross-field constraints; returns self for chaining."""
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}")
    for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "mlp_dim"):
      if getattr(self, name) <= 0:
        raise ValueError(f"{name}={getattr(self, name)} must be positive")
    if self.head_dim % 2:
      raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
    if not self.layer_pattern or set(self.layer_pattern) - {"G", "L"}:
      raise ValueError(f"layer_pattern={self.layer_pattern!r} must be a non-empty string of G (global) and "
                       "L (local) letters")
    if "L" in self.layer_pattern and (self.sliding_window is None or self.sliding_window < 1):
      raise ValueError(f"layer_pattern={self.layer_pattern!r} has local layers, so sliding_window must be a "
                       f"positive integer (got {self.sliding_window})")
    for name in ("attn_logit_softcap", "final_logit_softcap", "query_pre_attn_scalar"):
      if getattr(self, name) is not None and getattr(self, name) <= 0:
        raise ValueError(f"{name}={getattr(self, name)} must be positive or null")
    return self

  def num_params(self) -> int:
    """Parameter count (embeddings included once when tied)."""
    d, h, n, k, f, v = (self.hidden_size, self.head_dim, self.num_heads, self.num_kv_heads, self.mlp_dim,
                        self.vocab_size)
    attn = d * n * h + 2 * d * k * h + n * h * d
    if self.qkv_bias:
      attn += n * h + 2 * k * h
    if self.attention_bias:
      attn += d
    if self.qk_norm:
      attn += 2 * h
    layer = attn + 3 * d * f + (4 if self.sandwich_norm else 2) * d
    head = 0 if self.tie_word_embeddings else d * v
    return v * d + self.num_layers * layer + d + head

  def non_embedding_params(self) -> int:
    """Parameters that do dense work per token (the cost model's multiplier)."""
    return self.num_params() - self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
