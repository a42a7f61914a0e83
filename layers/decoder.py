"""The decoder-only transformer (Llama-3 / Qwen3 families).

Flax Linen, chosen once for the whole project: parameters are a plain pytree that
maps one-to-one onto Orbax checkpoints and Hugging Face tensors, `model.apply` is a pure
function to jit, `nn.scan` stacks the layers (compile time does not grow with depth) and
`nn.with_logical_partitioning` names every parameter axis for the sharding rules.

`__call__` returns final-norm hidden states; the lm_head is a separate method so scoring
applies it only at the rows it needs.
"""

from typing import Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from layers.attention import Attention
from layers.config import ModelConfig
from layers.embeddings import Embed
from layers.kernels.base import PrefixKV, SegmentLayout
from layers.mlp import MLP
from layers.normalization import RMSNorm, logical

PRECISIONS = {"default": jax.lax.Precision.DEFAULT, "high": jax.lax.Precision.HIGH,
              "highest": jax.lax.Precision.HIGHEST}


class DecoderLayer(nn.Module):
  """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x)). Scanned: (carry, per-layer input)."""
  config: ModelConfig
  attend: Callable
  dtype: jnp.dtype
  param_dtype: jnp.dtype
  precision: jax.lax.Precision | None
  return_kv: bool = False

  @nn.compact
  def __call__(self, x_BxTxD, positions_BxT, layout, prefix_kv: Optional[PrefixKV]):
    cfg = self.config
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    h = RMSNorm(cfg.rms_norm_eps, name="input_norm", **kw)(x_BxTxD)
    attn, kv = Attention(cfg, self.attend, precision=self.precision, name="attn", **kw)(
        h, positions_BxT, layout, prefix_kv)
    x_BxTxD = x_BxTxD + attn
    h = RMSNorm(cfg.rms_norm_eps, name="post_attn_norm", **kw)(x_BxTxD)
    x_BxTxD = x_BxTxD + MLP(cfg.hidden_size, cfg.mlp_dim, precision=self.precision, name="mlp", **kw)(h)
    x_BxTxD = nn.with_logical_constraint(x_BxTxD, ("activation_batch", "activation_length", "activation_embed"))
    return x_BxTxD, (kv if self.return_kv else None)


class Decoder(nn.Module):
  """Embedding -> scanned layers -> final RMSNorm. `logits` applies the (tied or separate) lm_head."""
  config: ModelConfig
  attend: Callable
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32
  precision: str = "highest"
  return_kv: bool = False
  remat: bool = False  # rematerialize each layer in the backward pass (same params; for training)

  def setup(self):
    cfg = self.config
    self.embed = Embed(cfg.vocab_size, cfg.hidden_size, self.dtype, self.param_dtype)
    layer = nn.remat(DecoderLayer, prevent_cse=False) if self.remat else DecoderLayer
    scanned = nn.scan(layer, variable_axes={"params": 0}, split_rngs={"params": True},
                      in_axes=(nn.broadcast, nn.broadcast, 0), length=cfg.num_layers,
                      metadata_params={nn.PARTITION_NAME: "layers"})
    self.layers = scanned(cfg, self.attend, self.dtype, self.param_dtype, PRECISIONS[self.precision],
                          self.return_kv)
    self.final_norm = RMSNorm(cfg.rms_norm_eps, self.dtype, self.param_dtype)
    if not cfg.tie_word_embeddings:
      self.lm_head = self.param("lm_head", logical(("embed", "vocab")), (cfg.hidden_size, cfg.vocab_size),
                                self.param_dtype)

  def __call__(self, tokens_BxT, positions_BxT, layout: SegmentLayout, prefix_kv: Optional[PrefixKV] = None):
    """Final hidden states [B, T, D], and the stacked per-layer K/V [layers, B, T, K, H] when return_kv."""
    x_BxTxD = self.embed(tokens_BxT)
    x_BxTxD, kv = self.layers(x_BxTxD, positions_BxT, layout, prefix_kv)
    return self.final_norm(x_BxTxD), kv

  def logits(self, h_xD: jax.Array) -> jax.Array:
    """float32 logits over the full vocabulary for hidden rows [..., D]."""
    if self.config.tie_word_embeddings:
      return self.embed.attend(h_xD)
    return jnp.einsum("...D,DV->...V", h_xD.astype(jnp.float32), self.lm_head.astype(jnp.float32),
                      precision=jax.lax.Precision.HIGHEST)


def init_params(model: Decoder, rng: jax.Array):
  """Boxed (logically partitioned) params from a 1-token input; nn.unbox gives plain arrays."""
  tokens = jnp.zeros((1, 1), jnp.int32)
  layout = SegmentLayout.causal(jnp.ones((1,), jnp.int32), 1)
  return model.init(rng, tokens, tokens, layout)["params"]
