"""Grouped-query self-attention with the families' options; the kernel is pluggable.

Options from the config: q/k/v (and o) biases, per-head q/k RMSNorm (Qwen3, Gemma 3), the
attention scale (`query_pre_attn_scalar`), logit soft-capping, and per layer a sliding window
and its RoPE base. The layer is scanned, so "is this layer local" arrives as a traced flag; a
model that mixes local and global layers picks the kernel call with `lax.cond` (each branch has
a static window, which a splash mask or a Triton block range needs).
"""

from typing import Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from layers.config import ModelConfig
from layers.embeddings import apply_rope, rope_inv_freq
from layers.kernels.base import PrefixKV, SegmentLayout
from layers import quantization as quant
from layers.lora import LoraConfig, adapts, lora_delta
from layers.normalization import RMSNorm


class Attention(nn.Module):
  """Projects to q/k/v, applies RoPE, calls `attend`, projects back. Returns (out, this row's K/V)."""
  config: ModelConfig
  attend: Callable
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32
  precision: jax.lax.Precision | None = None
  lora: Optional[LoraConfig] = None  # low-rank adapters on the projections it targets (layers/lora.py)
  quantization: str = "none"  # int8 projection weights (and activations) (layers/quantization.py)
  quantization_group: int = 0  # weight scales per group of this many along the contracting dim (0: per channel)

  @nn.compact
  def __call__(self, x_BxTxD, positions_BxT, layout: SegmentLayout, prefix_kv: Optional[PrefixKV] = None,
               uses_window: Optional[jax.Array] = None):
    cfg = self.config
    d, n, k, h = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim

    def proj(name, heads, axis):
      w = quant.weight(self, name, ("embed", axis, "head_dim"), (d, heads, h), 1, self.quantization,
                      self.quantization_group)
      y = quant.einsum("BTD,DNH->BTNH", x_BxTxD, w, 1, self.quantization, self.dtype, self.precision)
      if adapts(self.lora, name):
        y = y + lora_delta(self, name, "BTD,DNH->BTNH", x_BxTxD, (d, heads, h), ("embed", axis, "head_dim"), 1,
                           self.lora, self.precision)
      if cfg.qkv_bias:
        y = y + self.param(f"{name}_bias", nn.with_logical_partitioning(nn.initializers.zeros, (axis, "head_dim")),
                           (heads, h), self.param_dtype).astype(self.dtype)
      return y

    q_BxTxNxH, k_BxTxKxH, v_BxTxKxH = proj("q", n, "heads"), proj("k", k, "kv_heads"), proj("v", k, "kv_heads")
    if cfg.qk_norm:
      norm = lambda name: RMSNorm(cfg.rms_norm_eps, self.dtype, self.param_dtype, "head_dim", cfg.gemma_style,
                                  name=name)
      q_BxTxNxH, k_BxTxKxH = norm("q_norm")(q_BxTxNxH), norm("k_norm")(k_BxTxKxH)
    inv_freq = rope_inv_freq(cfg)
    if cfg.rope_local_theta is not None and uses_window is not None:
      inv_freq = jnp.where(uses_window, jnp.asarray(rope_inv_freq(cfg, local=True)), jnp.asarray(inv_freq))
    q_BxTxNxH = apply_rope(q_BxTxNxH, positions_BxT, inv_freq)
    k_BxTxKxH = apply_rope(k_BxTxKxH, positions_BxT, inv_freq)
    if cfg.query_pre_attn_scalar is not None and cfg.query_pre_attn_scalar != h:
      # Kernels scale by head_dim ** -0.5; this makes the product query_pre_attn_scalar ** -0.5.
      q_BxTxNxH = (q_BxTxNxH.astype(jnp.float32) * (cfg.attn_scale * h ** 0.5)).astype(q_BxTxNxH.dtype)
    q_BxTxNxH = nn.with_logical_constraint(q_BxTxNxH, ("activation_batch", "activation_length", "activation_heads",
                                                       "head_dim"))
    out_BxTxNxH = self._attend(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, layout, prefix_kv, uses_window)
    w_o = quant.weight(self, "o", ("heads", "head_dim", "embed"), (n, h, d), 2, self.quantization,
                       self.quantization_group)
    out_BxTxD = quant.einsum("BTNH,NHD->BTD", out_BxTxNxH.astype(self.dtype), w_o, 2, self.quantization, self.dtype,
                             self.precision)
    if adapts(self.lora, "o"):
      out_BxTxD = out_BxTxD + lora_delta(self, "o", "BTNH,NHD->BTD", out_BxTxNxH.astype(self.dtype), (n, h, d),
                                         ("heads", "head_dim", "embed"), 2, self.lora, self.precision)
    if cfg.attention_bias:
      out_BxTxD = out_BxTxD + self.param("o_bias", nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
                                         (d,), self.param_dtype).astype(self.dtype)
    return out_BxTxD, PrefixKV(k_BxTxKxH, v_BxTxKxH)

  def _attend(self, q, k, v, layout, prefix_kv, uses_window):
    """The kernel with this layer's window: static where every layer agrees, else lax.cond on the flag."""
    cfg = self.config
    call = lambda window: self.attend(q, k, v, layout, prefix_kv, window=window, softcap=cfg.attn_logit_softcap)
    windowed = cfg.layer_uses_window
    if cfg.window is None or not any(windowed):
      return call(None)
    if all(windowed):
      return call(cfg.sliding_window)
    if uses_window is None:
      raise ValueError(f"layer_pattern={cfg.layer_pattern!r} mixes local and global layers: pass uses_window")
    return jax.lax.cond(uses_window, lambda: call(cfg.sliding_window), lambda: call(None))
