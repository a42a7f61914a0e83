"""Gated feed-forward block: SwiGLU (Llama, Qwen, Mistral) or GeGLU with tanh GELU (Gemma)."""

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from layers import quantization as quant
from layers.lora import LoraConfig, adapts, lora_delta


class MLP(nn.Module):
  """down(act(gate(x)) * up(x)), act = silu or gelu_tanh."""
  hidden_size: int
  mlp_dim: int
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32
  precision: jax.lax.Precision | None = None
  activation: str = "silu"
  lora: Optional[LoraConfig] = None  # low-rank adapters on the projections it targets (layers/lora.py)
  quantization: str = "none"  # int8 projection weights (and activations) (layers/quantization.py)
  quantization_group: int = 0  # weight scales per group of this many along the contracting dim (0: per channel)

  @nn.compact
  def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
    d, f = self.hidden_size, self.mlp_dim
    axes = {"gate": ("embed", "mlp"), "up": ("embed", "mlp"), "down": ("mlp", "embed")}
    shapes = {"gate": (d, f), "up": (d, f), "down": (f, d)}
    weights = {name: quant.weight(self, name, axes[name], shapes[name], 1, self.quantization, self.quantization_group)
               for name in axes}

    def dot(eq, a, name):
      y = quant.einsum(eq, a, weights[name], 1, self.quantization, self.dtype, self.precision)
      if adapts(self.lora, name):
        y = y + lora_delta(self, name, eq, a, shapes[name], axes[name], 1, self.lora, self.precision)
      return y
    act = {"silu": nn.silu, "gelu_tanh": lambda x: nn.gelu(x, approximate=True)}[self.activation]
    h_BxTxF = act(dot("BTD,DF->BTF", x_BxTxD, "gate")) * dot("BTD,DF->BTF", x_BxTxD, "up")
    h_BxTxF = nn.with_logical_constraint(h_BxTxF, ("activation_batch", "activation_length", "activation_mlp"))
    return dot("BTF,FD->BTD", h_BxTxF, "down")
