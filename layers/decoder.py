"""The decoder-only transformer: one module for every family, options from ModelConfig.

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

from layers import quantization as quant
from layers.attention import Attention
from layers.config import ModelConfig
from layers.embeddings import Embed
from layers.kernels.base import PrefixKV, SegmentLayout
from layers.lora import LoraConfig
from layers.mlp import MLP
from layers.normalization import RMSNorm

PRECISIONS = {"default": jax.lax.Precision.DEFAULT, "high": jax.lax.Precision.HIGH,
              "highest": jax.lax.Precision.HIGHEST}


class DecoderLayer(nn.Module):
  """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x)). Scanned: (carry, per-layer input).

  With sandwich norms (Gemma 2/3) each block's output is normalized too before the residual add:
  x + norm(attn(norm(x))). Param names: `input_norm` before attention, `post_attn_norm` before
  the MLP (Llama's post_attention_layernorm), `attn_out_norm` / `mlp_out_norm` on the outputs.
  """
  config: ModelConfig
  attend: Callable
  dtype: jnp.dtype
  param_dtype: jnp.dtype
  precision: jax.lax.Precision | None
  return_kv: bool = False
  lora: Optional[LoraConfig] = None
  quantization: str = "none"
  quantization_group: int = 0

  @nn.compact
  def __call__(self, x_BxTxD, positions_BxT, layout, prefix_kv: Optional[PrefixKV], uses_window: jax.Array):
    cfg = self.config
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    norm = lambda name: RMSNorm(cfg.rms_norm_eps, plus_one=cfg.gemma_style, name=name, **kw)
    h = norm("input_norm")(x_BxTxD)
    attn, kv = Attention(cfg, self.attend, precision=self.precision, lora=self.lora, quantization=self.quantization,
                         quantization_group=self.quantization_group, name="attn", **kw)(
        h, positions_BxT, layout, prefix_kv, uses_window)
    x_BxTxD = x_BxTxD + (norm("attn_out_norm")(attn) if cfg.sandwich_norm else attn)
    h = norm("post_attn_norm")(x_BxTxD)
    act = "gelu_tanh" if cfg.gemma_style else "silu"
    mlp = MLP(cfg.hidden_size, cfg.mlp_dim, precision=self.precision, activation=act, lora=self.lora,
              quantization=self.quantization, quantization_group=self.quantization_group, name="mlp", **kw)(h)
    x_BxTxD = x_BxTxD + (norm("mlp_out_norm")(mlp) if cfg.sandwich_norm else mlp)
    x_BxTxD = nn.with_logical_constraint(x_BxTxD, ("activation_batch", "activation_length", "activation_embed"))
    # Kept only when the caller applies with mutable=["intermediates"] (Decoder.residuals).
    self.sow("intermediates", "residual", x_BxTxD)
    return x_BxTxD, (kv if self.return_kv else None)


class Decoder(nn.Module):
  """Embedding -> scanned layers -> final RMSNorm. `logits` applies the (tied or separate) lm_head.

  Per-layer options that vary along the stack (local or global attention) enter the scan as a
  per-layer input array, so the layers stay one scanned module.
  """
  config: ModelConfig
  attend: Callable
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32
  precision: str = "highest"
  return_kv: bool = False
  remat: bool = False  # rematerialize each layer in the backward pass (same params; for training)
  lora: Optional[LoraConfig] = None  # low-rank adapters beside the targeted projections (layers/lora.py)
  # int8 projections and separate lm_head (layers/quantization.py); params from quantization.quantize_params.
  quantization: str = "none"
  quantization_group: int = 0  # per-group weight scales (layers/quantization.py); 0: one per output channel

  def setup(self):
    cfg = self.config
    if self.lora is not None:  # QLoRA: float adapters beside a frozen int8_weights base
      quant.refuse_qlora(self.quantization)
    elif self.remat:
      quant.refuse_training(self.quantization, "a rematerialized Decoder (for training)")
    self.embed = Embed(cfg.vocab_size, cfg.hidden_size, self.dtype, self.param_dtype, cfg.embed_scale)
    layer = nn.remat(DecoderLayer, prevent_cse=False) if self.remat else DecoderLayer
    scanned = nn.scan(layer, variable_axes={"params": 0, "intermediates": 0}, split_rngs={"params": True},
                      in_axes=(nn.broadcast, nn.broadcast, 0, 0), length=cfg.num_layers,
                      metadata_params={nn.PARTITION_NAME: "layers"})
    self.layers = scanned(cfg, self.attend, self.dtype, self.param_dtype, PRECISIONS[self.precision],
                          self.return_kv, self.lora, self.quantization, self.quantization_group)
    self.final_norm = RMSNorm(cfg.rms_norm_eps, self.dtype, self.param_dtype, plus_one=cfg.gemma_style)
    if not cfg.tie_word_embeddings:
      self.lm_head = quant.weight(self, "lm_head", ("embed", "vocab"), (cfg.hidden_size, cfg.vocab_size), 1,
                                  self.quantization, self.quantization_group)

  def __call__(self, tokens_BxT, positions_BxT, layout: SegmentLayout, prefix_kv: Optional[PrefixKV] = None):
    """Final hidden states [B, T, D], and the stacked per-layer K/V [layers, B, T, K, H] when return_kv."""
    x_BxTxD, kv = self.run_layers(self.embed(tokens_BxT), positions_BxT, layout, prefix_kv)
    return self.final_norm(x_BxTxD), kv

  def run_layers(self, x_BxTxD, positions_BxT, layout: SegmentLayout, prefix_kv: Optional[PrefixKV] = None):
    """The scanned layer stack on embeddings [B, T, D] (each layer gets its sliding-window flag)."""
    uses_window_L = jnp.asarray(self.config.layer_uses_window)
    return self.layers(x_BxTxD, positions_BxT, layout, prefix_kv, uses_window_L)

  @staticmethod
  def residuals(intermediates) -> jax.Array:
    """The residual stream after each layer [layers, B, T, D], from the `intermediates` collection of
    `apply(..., mutable=["intermediates"])`."""
    return intermediates["layers"]["residual"][0]

  def logits(self, h_xD: jax.Array) -> jax.Array:
    """float32 logits over the full vocabulary for hidden rows [..., D] (soft-capped where configured)."""
    if self.config.tie_word_embeddings:
      logits = self.embed.attend(h_xD)
    else:
      logits = quant.einsum("...D,DV->...V", h_xD.astype(jnp.float32), self.lm_head, 1, self.quantization,
                            jnp.float32, jax.lax.Precision.HIGHEST)
    return softcap(logits, self.config.final_logit_softcap)

  def label_logits(self, h_xD: jax.Array, ids_K: jax.Array) -> jax.Array:
    """`logits` at vocabulary ids [K] only: [..., K] from the K lm_head rows (gathered), soft-capped alike.

    Scores that need no vocabulary log-sum-exp (docs/ARCHITECTURE.md section 3) read just these, skipping the
    [D, V] product."""
    if self.config.tie_word_embeddings:
      logits = self.embed.attend_rows(h_xD, ids_K)
    else:
      if self.quantization == "none":
        cols_DxK = jnp.take(self.lm_head, ids_K, axis=1)
      else:  # the K int8 columns and their scales ([V] per channel, [D / G, V] per group)
        wq, scale = self.lm_head
        cols_DxK = (jnp.take(wq, ids_K, axis=1), jnp.take(scale, ids_K, axis=scale.ndim - 1))
      logits = quant.einsum("...D,DK->...K", h_xD.astype(jnp.float32), cols_DxK, 1, self.quantization, jnp.float32,
                            jax.lax.Precision.HIGHEST)
    return softcap(logits, self.config.final_logit_softcap)


def softcap(logits: jax.Array, cap: Optional[float]) -> jax.Array:
  """The final logit soft-cap (Gemma 2): cap * tanh(logits / cap); `cap` None leaves logits as they are."""
  return logits if cap is None else jnp.tanh(logits / cap) * cap


def init_params(model: Decoder, rng: jax.Array):
  """Boxed (logically partitioned) params from a 1-token input; nn.unbox gives plain arrays."""
  tokens = jnp.zeros((1, 1), jnp.int32)
  layout = SegmentLayout.causal(jnp.ones((1,), jnp.int32), 1)
  return model.init(rng, tokens, tokens, layout)["params"]
