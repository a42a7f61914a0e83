"""Token embedding (also the tied lm_head) and rotary position embeddings."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from layers.config import ModelConfig
from layers.normalization import logical


class Embed(nn.Module):
  """Token embedding table [vocab, embed]; `attend` is the tied output projection.

  `scale` (Gemma: sqrt(hidden_size)) multiplies the looked-up rows, in `dtype` as Gemma does.
  """
  vocab_size: int
  features: int
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32
  scale: float | None = None

  def setup(self):
    self.embedding = self.param("embedding", logical(("vocab", "embed")), (self.vocab_size, self.features),
                                self.param_dtype)

  def __call__(self, tokens_BxT: jax.Array) -> jax.Array:
    x = jnp.take(self.embedding, tokens_BxT, axis=0).astype(self.dtype)
    return x if self.scale is None else x * jnp.asarray(self.scale, self.dtype)

  def attend(self, x_BxD: jax.Array) -> jax.Array:
    """Logits in float32 against the embedding rows (tied lm_head)."""
    return jnp.einsum("...D,VD->...V", x_BxD.astype(jnp.float32), self.embedding.astype(jnp.float32),
                      precision=jax.lax.Precision.HIGHEST)

  def attend_rows(self, x_BxD: jax.Array, ids_K: jax.Array) -> jax.Array:
    """`attend` at vocabulary ids [K] only: float32 logits [..., K] from the K gathered embedding rows."""
    rows_KxD = jnp.take(self.embedding, ids_K, axis=0).astype(jnp.float32)
    return jnp.einsum("...D,KD->...K", x_BxD.astype(jnp.float32), rows_KxD, precision=jax.lax.Precision.HIGHEST)


def rope_inv_freq(cfg: ModelConfig, local: bool = False) -> np.ndarray:
  """Inverse frequencies [head_dim/2] in float32 for a global layer (with its scaling) or a local one.

  A local layer uses `rope_local_theta` unscaled when the config sets one (Gemma 3), else the global
  frequencies.
  """
  theta = cfg.rope_local_theta if local and cfg.rope_local_theta is not None else cfg.rope_theta
  exponent = np.arange(0, cfg.head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(cfg.head_dim)
  inv_freq = (np.float32(1.0) / (np.float32(theta) ** exponent)).astype(np.float32)
  if cfg.rope_scaling_type is None or (local and cfg.rope_local_theta is not None):
    return inv_freq
  if cfg.rope_scaling_type == "linear":
    return (inv_freq / np.float32(cfg.rope_scaling_factor)).astype(np.float32)
  if cfg.rope_scaling_type != "llama3":
    raise ValueError(f"rope_scaling_type={cfg.rope_scaling_type!r} is not supported (use llama3, linear or null)")
  factor, low, high = cfg.rope_scaling_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
  old_len = cfg.rope_original_max_position
  wavelen = 2 * math.pi / inv_freq
  scaled = np.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
  smooth = (old_len / wavelen - low) / (high - low)
  smoothed = (1 - smooth) * scaled / factor + smooth * scaled
  medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
  return np.where(medium, smoothed, scaled).astype(np.float32)


def apply_rope(x_BxTxNxH: jax.Array, positions_BxT: jax.Array, inv_freq: np.ndarray) -> jax.Array:
  """Rotate-half RoPE (the Hugging Face convention), angles in float32."""
  angles_BxTxF = positions_BxT.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)
  cos = jnp.cos(jnp.concatenate([angles_BxTxF] * 2, axis=-1))[:, :, None, :]
  sin = jnp.sin(jnp.concatenate([angles_BxTxF] * 2, axis=-1))[:, :, None, :]
  half = x_BxTxNxH.shape[-1] // 2
  rotated = jnp.concatenate([-x_BxTxNxH[..., half:], x_BxTxNxH[..., :half]], axis=-1)
  return (x_BxTxNxH * cos.astype(x_BxTxNxH.dtype) + rotated * sin.astype(x_BxTxNxH.dtype)).astype(x_BxTxNxH.dtype)
