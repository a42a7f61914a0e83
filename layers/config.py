"""Model architecture config: one frozen dataclass covering the Llama-3 and Qwen3 families."""

import dataclasses
from typing import Literal, Optional


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Decoder-only transformer architecture (no runtime knobs; see maxscore.config)."""
  family: Literal["llama", "qwen3"] = "qwen3"
  vocab_size: int = 512
  hidden_size: int = 64
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 16
  mlp_dim: int = 128
  rope_theta: float = 10000.0
  rope_scaling_type: Optional[Literal["llama3"]] = None
  rope_scaling_factor: float = 1.0
  rope_low_freq_factor: float = 1.0
  rope_high_freq_factor: float = 4.0
  rope_original_max_position: int = 8192
  rms_norm_eps: float = 1e-6
  tie_word_embeddings: bool = True
  attention_bias: bool = False
  max_position_embeddings: int = 4096

  @property
  def qk_norm(self) -> bool:
    """Qwen3 normalizes each query/key head with RMSNorm before RoPE."""
    return self.family == "qwen3"

  def validate(self) -> "ModelConfig":
    """Checks cross-field constraints; returns self for chaining."""
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}")
    for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "mlp_dim"):
      if getattr(self, name) <= 0:
        raise ValueError(f"{name}={getattr(self, name)} must be positive")
    if self.head_dim % 2:
      raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
    return self

  def num_params(self) -> int:
    """Parameter count (embeddings included once when tied)."""
    d, h, n, k, f, v = (self.hidden_size, self.head_dim, self.num_heads, self.num_kv_heads, self.mlp_dim,
                        self.vocab_size)
    attn = d * n * h + 2 * d * k * h + n * h * d
    if self.attention_bias:
      attn += n * h + 2 * k * h + d
    if self.qk_norm:
      attn += 2 * h
    layer = attn + 3 * d * f + 2 * d
    head = 0 if self.tie_word_embeddings else d * v
    return v * d + self.num_layers * layer + d + head

  def non_embedding_params(self) -> int:
    """Parameters that do dense work per token (the cost model's multiplier)."""
    return self.num_params() - self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
