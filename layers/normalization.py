"""RMSNorm computed in float32, as Llama and Qwen3 do."""

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp


class RMSNorm(nn.Module):
  """y = x / rms(x) * scale over the last axis; statistics in float32, output in `dtype`."""
  eps: float
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32
  axis_name: str = "embed"

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, (self.axis_name,)),
                       (x.shape[-1],), self.param_dtype)
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    # HF casts the normalized value back to the input dtype before scaling.
    return (scale.astype(self.dtype) * y.astype(self.dtype)).astype(self.dtype)


def logical(names: Sequence[str | None]):
  """Shorthand for a normal(0.02) initializer that carries logical axis names."""
  return nn.with_logical_partitioning(nn.initializers.normal(stddev=0.02), tuple(names))
