"""The layout every attention kernel reads, and the kernel registry.

A row is `[prefix: P][slot 1: L] ... [slot N: L]`. Prefix tokens are segment 0, slot n is
segment n+1, padding is -1; key k is visible to query t iff k <= t, seg[k] >= 0 and
(seg[k] == 0 or seg[k] == seg[t]). With `prefix_kv` the prefix keys come from a cache and
the row holds only the slots. With N = 0 the layout is plain causal attention over P tokens.
"""

import dataclasses
import importlib
from typing import Callable, NamedTuple, Optional

import flax.struct
import jax
import jax.numpy as jnp

# Large finite negative: fully masked rows stay finite instead of NaN.
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


@flax.struct.dataclass
class SegmentLayout:
  """Static geometry (P, L, N) plus per-row validity: prefix_valid_B [B], slot_valid_BxN [B, N]."""
  prefix_valid_B: jax.Array
  slot_valid_BxN: jax.Array
  prefix_len: int = flax.struct.field(pytree_node=False)
  slot_len: int = flax.struct.field(pytree_node=False)
  num_slots: int = flax.struct.field(pytree_node=False)

  @property
  def row_len(self) -> int:
    return self.prefix_len + self.slot_len * self.num_slots

  @classmethod
  def causal(cls, valid_B: jax.Array, length: int) -> "SegmentLayout":
    """Plain causal rows of `length` tokens with `valid_B` real tokens each (serial, prefill)."""
    b = valid_B.shape[0]
    return cls(valid_B.astype(jnp.int32), jnp.zeros((b, 0), jnp.int32), length, 0, 0)

  def segment_ids(self, include_prefix: bool = True) -> jax.Array:
    """Segment id per token [B, T]: 0 prefix, n+1 slot n, -1 padding."""
    b = self.prefix_valid_B.shape[0]
    parts = []
    if include_prefix:
      pos_P = jnp.arange(self.prefix_len)
      parts.append(jnp.where(pos_P[None, :] < self.prefix_valid_B[:, None], 0, -1))
    if self.num_slots:
      pos_L = jnp.arange(self.slot_len)
      seg_BxNxL = jnp.where(pos_L[None, None, :] < self.slot_valid_BxN[:, :, None],
                            jnp.arange(1, self.num_slots + 1)[None, :, None], -1)
      parts.append(seg_BxNxL.reshape(b, -1))
    return jnp.concatenate(parts, axis=1).astype(jnp.int32) if parts else jnp.zeros((b, 0), jnp.int32)


class PrefixKV(NamedTuple):
  """One layer's cached prefix keys and values, [B or 1, P, kv_heads, head_dim]."""
  k: jax.Array
  v: jax.Array


@dataclasses.dataclass(frozen=True)
class KernelOptions:
  """Static kernel settings (hashable, so a bound kernel can be a jit static argument)."""
  max_reference_len: int = 8192
  splash_block_q: int = 512
  splash_block_kv: int = 512
  gpu_block_q: int = 64
  gpu_block_kv: int = 64
  interpret: bool = False


# name -> module path; each module defines `attend(q, k, v, layout, prefix_kv, *, options)`.
KERNELS = {
    "reference": "layers.kernels.reference",
    "shared_prefix": "layers.kernels.shared_prefix",
    "splash": "layers.kernels.splash",
    "pallas_gpu": "layers.kernels.pallas_gpu",
}


def kernel_names() -> tuple[str, ...]:
  return tuple(KERNELS)


def resolve_auto(backend: Optional[str] = None) -> str:
  """attention=auto: splash on TPU, pallas_gpu on GPU, shared_prefix on CPU."""
  backend = backend or jax.default_backend()
  return {"tpu": "splash", "gpu": "pallas_gpu"}.get(backend, "shared_prefix")


@dataclasses.dataclass(frozen=True)
class BoundKernel:
  """A kernel with its options bound; hashable and comparable by (name, options)."""
  name: str
  options: KernelOptions

  def __call__(self, q, k, v, layout: SegmentLayout, prefix_kv: Optional[PrefixKV] = None):
    module = importlib.import_module(KERNELS[self.name])
    return module.attend(q, k, v, layout, prefix_kv, options=self.options)


def get_kernel(name: str, options: KernelOptions = KernelOptions()) -> Callable:
  """The kernel `name` (or `auto`) with `options` bound."""
  if name == "auto":
    name = resolve_auto()
  if name not in KERNELS:
    raise ValueError(f"attention={name!r} is not one of {sorted(KERNELS) + ['auto']}")
  return BoundKernel(name, options)
