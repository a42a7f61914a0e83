"""RMSNorm computed in float32, as Llama and Qwen3 do, or with a (1 + w) scale as Gemma does."""

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp


class RMSNorm(nn.Module):
  """y = x / rms(x) * scale over the last axis; statistics in float32, output in `dtype`.

  With `plus_one` (Gemma) the stored weight w is an offset: y = x / rms(x) * (1 + w), computed
  in float32 before the cast, as Gemma's reference does (1 + w in bfloat16 would round).
  """
  eps: float
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32
  axis_name: str = "embed"
  plus_one: bool = False

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    init = nn.initializers.zeros if self.plus_one else nn.initializers.ones
    scale = self.param("scale", nn.with_logical_partitioning(init, (self.axis_name,)),
                       (x.shape[-1],), self.param_dtype)
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    if self.plus_one:
      return (y * (1.0 + scale.astype(jnp.float32))).astype(self.dtype)
    # HF casts the normalized value back to the input dtype before scaling.
    return (scale.astype(self.dtype) * y.astype(self.dtype)).astype(self.dtype)


def logical(names: Sequence[str | None]):
  """Shorthand for a normal(0.02) initializer that carries logical axis names."""
  return nn.with_logical_partitioning(nn.initializers.normal(stddev=0.02), tuple(names))
