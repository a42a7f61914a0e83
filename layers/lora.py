"""Low-rank adapters (LoRA) on the projection einsums: y = x @ W + (alpha / rank) * (x @ A) @ B.

The adapters live beside the einsums they adapt (Attention's q/k/v/o, MLP's gate/up/down) as
params `<name>_lora_a` [contracting dims of W..., rank] and `<name>_lora_b` [rank, output dims of
W...]; inside the scanned layer stack they gain the leading `layers` axis like every other param.
B starts at zero, so an adapted model computes exactly the base model until B is trained.

Qwix's LoRA (qwix 0.1.8) was tried first and does not fit this model: its einsum path sets an
attribute on the current module (`<weight>_lora_einsum_str`), which a Linen module built with
`nn.compact` refuses (flax SetAttributeFrozenModuleError, at the first adapted einsum), and its rules match
module paths only, while q/k/v/o share one module (`attn`) and gate/up/down another (`mlp`), so
`lora_targets=q,v` cannot be expressed without overriding its provider's private helpers.
"""

import dataclasses
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

ATTENTION_TARGETS = ("q", "k", "v", "o")
MLP_TARGETS = ("gate", "up", "down")
TARGETS = ATTENTION_TARGETS + MLP_TARGETS


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """Adapter rank, scale numerator (the update is alpha / rank * A @ B) and the weights adapted."""
  rank: int
  alpha: float
  targets: tuple[str, ...] = TARGETS

  def __post_init__(self):
    object.__setattr__(self, "targets", tuple(self.targets))

  def validate(self) -> "LoraConfig":
    unknown = [t for t in self.targets if t not in TARGETS]
    if unknown:
      raise ValueError(f"lora_targets has unknown target(s) {unknown}; valid targets are {list(TARGETS)}")
    if not self.targets or len(set(self.targets)) != len(self.targets):
      raise ValueError(f"lora_targets={list(self.targets)} must name each target once, at least one of "
                       f"{list(TARGETS)}")
    if self.rank < 1:
      raise ValueError(f"lora_rank={self.rank} must be >= 1 for adapters (0 means no adapters)")
    if not self.alpha > 0:
      raise ValueError(f"lora_alpha={self.alpha} must be > 0")
    return self

  @property
  def scale(self) -> float:
    return self.alpha / self.rank


def adapts(lora: Optional[LoraConfig], name: str) -> bool:
  """True when `lora` puts adapters on the weight `name`."""
  return lora is not None and name in lora.targets


def lora_delta(module: nn.Module, name: str, equation: str, x: jax.Array, w_shape: tuple[int, ...],
               w_axes: tuple[Optional[str], ...], num_contracting: int, lora: LoraConfig,
               precision: Optional[jax.lax.Precision] = None) -> jax.Array:
  """The adapter term of `jnp.einsum(equation, x, W)`: scale * (x @ A) @ B, in `module.dtype`.

  `equation` is the base einsum, whose weight operand lists its contracting dims first (as every
  projection here does, e.g. "BTD,DNH->BTNH"), so A @ B has W's layout. `w_axes` are W's logical
  axis names; A and B keep them and leave the rank axis unsharded. Creates the params in `module`.
  """
  ins, out = equation.split("->")
  lhs, rhs = ins.split(",")
  contract, rest = rhs[:num_contracting], rhs[num_contracting:]
  batch = "".join(c for c in out if c not in rest)
  if "r" in equation or out != batch + rest:
    raise ValueError(f"{name}: cannot factor the einsum {equation!r} as (x @ A) @ B")
  rank = lora.rank
  a_init = nn.initializers.he_uniform(in_axis=tuple(range(num_contracting)), out_axis=-1)
  a = module.param(f"{name}_lora_a", nn.with_logical_partitioning(a_init, w_axes[:num_contracting] + (None,)),
                   w_shape[:num_contracting] + (rank,), module.param_dtype)
  b = module.param(f"{name}_lora_b", nn.with_logical_partitioning(nn.initializers.zeros,
                                                                  (None,) + w_axes[num_contracting:]),
                   (rank,) + w_shape[num_contracting:], module.param_dtype)
  xa = jnp.einsum(f"{lhs},{contract}r->{batch}r", x, a.astype(module.dtype), precision=precision)
  delta = jnp.einsum(f"{batch}r,r{rest}->{out}", xa, b.astype(module.dtype), precision=precision)
  return delta * jnp.asarray(lora.scale, module.dtype)
