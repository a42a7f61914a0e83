"""Grouped-query self-attention with optional q/k RMSNorm (Qwen3) and biases; the kernel is pluggable."""

from typing import Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from layers.config import ModelConfig
from layers.embeddings import apply_rope, rope_inv_freq
from layers.kernels.base import PrefixKV, SegmentLayout
from layers.normalization import RMSNorm, logical


class Attention(nn.Module):
  """Projects to q/k/v, applies RoPE, calls `attend`, projects back. Returns (out, this row's K/V)."""
  config: ModelConfig
  attend: Callable
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32
  precision: jax.lax.Precision | None = None

  @nn.compact
  def __call__(self, x_BxTxD, positions_BxT, layout: SegmentLayout, prefix_kv: Optional[PrefixKV] = None):
    cfg = self.config
    d, n, k, h = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim

    def proj(name, heads, axis):
      w = self.param(name, logical(("embed", axis, "head_dim")), (d, heads, h), self.param_dtype)
      y = jnp.einsum("BTD,DNH->BTNH", x_BxTxD, w.astype(self.dtype), precision=self.precision)
      if cfg.attention_bias:
        y = y + self.param(f"{name}_bias", nn.with_logical_partitioning(nn.initializers.zeros, (axis, "head_dim")),
                           (heads, h), self.param_dtype).astype(self.dtype)
      return y

    q_BxTxNxH, k_BxTxKxH, v_BxTxKxH = proj("q", n, "heads"), proj("k", k, "kv_heads"), proj("v", k, "kv_heads")
    if cfg.qk_norm:
      norm = lambda name: RMSNorm(cfg.rms_norm_eps, self.dtype, self.param_dtype, "head_dim", name=name)
      q_BxTxNxH, k_BxTxKxH = norm("q_norm")(q_BxTxNxH), norm("k_norm")(k_BxTxKxH)
    inv_freq = rope_inv_freq(cfg)
    q_BxTxNxH = apply_rope(q_BxTxNxH, positions_BxT, inv_freq)
    k_BxTxKxH = apply_rope(k_BxTxKxH, positions_BxT, inv_freq)
    q_BxTxNxH = nn.with_logical_constraint(q_BxTxNxH, ("activation_batch", "activation_length", "activation_heads",
                                                       "head_dim"))
    out_BxTxNxH = self.attend(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, layout, prefix_kv)
    w_o = self.param("o", logical(("heads", "head_dim", "embed")), (n, h, d), self.param_dtype)
    out_BxTxD = jnp.einsum("BTNH,NHD->BTD", out_BxTxNxH.astype(self.dtype), w_o.astype(self.dtype),
                           precision=self.precision)
    if cfg.attention_bias:
      out_BxTxD = out_BxTxD + self.param("o_bias", nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
                                         (d,), self.param_dtype).astype(self.dtype)
    return out_BxTxD, PrefixKV(k_BxTxKxH, v_BxTxKxH)
