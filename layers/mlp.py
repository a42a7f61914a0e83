"""Gated feed-forward block: SwiGLU (Llama, Qwen, Mistral) or GeGLU with tanh GELU (Gemma)."""

import flax.linen as nn
import jax
import jax.numpy as jnp

from layers.normalization import logical


class MLP(nn.Module):
  """down(act(gate(x)) * up(x)), act = silu or gelu_tanh."""
  hidden_size: int
  mlp_dim: int
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32
  precision: jax.lax.Precision | None = None
  activation: str = "silu"

  @nn.compact
  def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
    d, f = self.hidden_size, self.mlp_dim
    gate = self.param("gate", logical(("embed", "mlp")), (d, f), self.param_dtype)
    up = self.param("up", logical(("embed", "mlp")), (d, f), self.param_dtype)
    down = self.param("down", logical(("mlp", "embed")), (f, d), self.param_dtype)
    dot = lambda eq, a, w: jnp.einsum(eq, a, w.astype(self.dtype), precision=self.precision)
    act = {"silu": nn.silu, "gelu_tanh": lambda x: nn.gelu(x, approximate=True)}[self.activation]
    h_BxTxF = act(dot("BTD,DF->BTF", x_BxTxD, gate)) * dot("BTD,DF->BTF", x_BxTxD, up)
    h_BxTxF = nn.with_logical_constraint(h_BxTxF, ("activation_batch", "activation_length", "activation_mlp"))
    return dot("BTF,FD->BTD", h_BxTxF, down)
