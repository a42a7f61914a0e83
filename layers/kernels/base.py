"""The layout every attention kernel reads, and the kernel registry.

A row is `[prefix: P][slot 1: L] ... [slot N: L]`. Prefix tokens are segment 0, slot n is
segment n+1, padding is -1; key k is visible to query t iff k <= t, seg[k] >= 0 and
(seg[k] == 0 or seg[k] == seg[t]). With `prefix_kv` the prefix keys come from a cache and
the row holds only the slots. With N = 0 the layout is plain causal attention over P tokens.

Two per-layer options reach every kernel as static keyword arguments:
- `window` W (sliding-window layers): additionally pos[t] - pos[k] < W, where pos is the token's
  serial position (`serial_positions`: a prefix token's index; slot token j: prefix_valid + j),
  so the packed layout sees exactly the keys the serial sequence Q + [s] + I_i sees.
- `softcap` c: attention logits become c * tanh(logits / c) before masking (Gemma 2).
"""

import dataclasses
import functools
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
    return _segment_ids(self, include_prefix)

  def serial_positions(self, include_prefix: bool = True) -> jax.Array:
    """Serial (RoPE) position per token [B, T]: prefix index k -> k, slot token j -> prefix_valid + j."""
    return _serial_positions(self, include_prefix)


# One program per layout shape: called outside a jit (the kernel tests, a layout built on the host), the few
# integer ops below would otherwise each compile a program per shape; inside a jit they are inlined.
@functools.partial(jax.jit, static_argnames="include_prefix")
def _segment_ids(layout: SegmentLayout, include_prefix: bool) -> jax.Array:
  b = layout.prefix_valid_B.shape[0]
  parts = []
  if include_prefix:
    pos_P = jnp.arange(layout.prefix_len)
    parts.append(jnp.where(pos_P[None, :] < layout.prefix_valid_B[:, None], 0, -1))
  if layout.num_slots:
    pos_L = jnp.arange(layout.slot_len)
    seg_BxNxL = jnp.where(pos_L[None, None, :] < layout.slot_valid_BxN[:, :, None],
                          jnp.arange(1, layout.num_slots + 1)[None, :, None], -1)
    parts.append(seg_BxNxL.reshape(b, -1))
  return jnp.concatenate(parts, axis=1).astype(jnp.int32) if parts else jnp.zeros((b, 0), jnp.int32)


@functools.partial(jax.jit, static_argnames="include_prefix")
def _serial_positions(layout: SegmentLayout, include_prefix: bool) -> jax.Array:
  b = layout.prefix_valid_B.shape[0]
  parts = []
  if include_prefix:
    parts.append(jnp.broadcast_to(jnp.arange(layout.prefix_len), (b, layout.prefix_len)))
  if layout.num_slots:
    pos_L = jnp.arange(layout.slot_len)
    pos_BxNxL = jnp.broadcast_to(layout.prefix_valid_B[:, None, None] + pos_L[None, None, :],
                                 (b, layout.num_slots, layout.slot_len))
    parts.append(pos_BxNxL.reshape(b, -1))
  return jnp.concatenate(parts, axis=1).astype(jnp.int32) if parts else jnp.zeros((b, 0), jnp.int32)


def with_prefix(k_BxTxKxH, v_BxTxKxH, prefix_kv: Optional["PrefixKV"], dtype=None):
  """Keys/values [B, S, K, H] a row attends to: the cached prefix (broadcast to B) in front of the row's own.

  Returns (k, v, offset), offset being the absolute index of the row's first token (P with a cache).
  """
  dtype = dtype or k_BxTxKxH.dtype
  k, v = k_BxTxKxH.astype(dtype), v_BxTxKxH.astype(dtype)
  if prefix_kv is None:
    return k, v, 0
  b = k.shape[0]
  pk = jnp.broadcast_to(prefix_kv.k, (b,) + prefix_kv.k.shape[1:]).astype(dtype)
  pv = jnp.broadcast_to(prefix_kv.v, (b,) + prefix_kv.v.shape[1:]).astype(dtype)
  return jnp.concatenate([pk, k], axis=1), jnp.concatenate([pv, v], axis=1), prefix_kv.k.shape[1]


def soft_cap(logits: jax.Array, cap: Optional[float]) -> jax.Array:
  """cap * tanh(logits / cap), or logits unchanged when cap is None."""
  return logits if cap is None else jnp.tanh(logits / cap) * cap


class PrefixKV(NamedTuple):
  """One layer's cached prefix keys and values, [B or 1, P, kv_heads, head_dim]."""
  k: jax.Array
  v: jax.Array


@dataclasses.dataclass(frozen=True)
class KernelOptions:
  """Static kernel settings (hashable, so a bound kernel can be a jit static argument). Each field is also
  the configs/base.yml key of the same name."""
  max_reference_len: int = 8192
  splash_block_q: int = 512
  splash_block_kv: int = 512
  gpu_block_q: int = 64
  gpu_block_kv: int = 64
  gpu_num_warps: int = 0  # Triton warps per pallas_gpu program; 0 = 4 for head_dim <= 64, else 8
  gpu_num_stages: int = 2  # Triton software-pipelining stages of pallas_gpu's kv loop
  kernel_interpret: bool = False  # run the Pallas kernels in interpret mode (CPU)


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


# Kernels whose backward pass jax.grad can run: reference and shared_prefix by XLA's autodiff, splash by its
# own Pallas dq and dkv kernels, pallas_gpu by its custom VJP's Pallas kernels (ARCHITECTURE.md section 4).
BACKWARD_KERNELS = ("reference", "shared_prefix", "splash", "pallas_gpu")


def training_kernel(attention: str, platform: Optional[str] = None) -> tuple[str, str]:
  """(kernel, reason): the attention kernel a training step differentiates. `auto` takes the platform's fast
  kernel (splash on TPU, pallas_gpu on GPU, shared_prefix on CPU); a named kernel is used when it has a
  backward pass, else shared_prefix."""
  platform = platform or jax.default_backend()
  if attention == "auto":
    name = resolve_auto(platform)
    return name, f"attention=auto on {platform}: {name} and its backward pass"
  if attention not in KERNELS:
    raise ValueError(f"attention={attention!r} is not one of {sorted(KERNELS) + ['auto']}")
  if attention in BACKWARD_KERNELS:
    return attention, f"attention={attention} has a backward pass"
  return "shared_prefix", f"attention={attention} has no backward pass; shared_prefix (XLA) trains instead"


@dataclasses.dataclass(frozen=True)
class BoundKernel:
  """A kernel with its options bound; hashable and comparable by (name, options)."""
  name: str
  options: KernelOptions

  def __call__(self, q, k, v, layout: SegmentLayout, prefix_kv: Optional[PrefixKV] = None,
               window: Optional[int] = None, softcap: Optional[float] = None):
    module = importlib.import_module(KERNELS[self.name])
    return module.attend(q, k, v, layout, prefix_kv, options=self.options, window=window, softcap=softcap)


def get_kernel(name: str, options: KernelOptions = KernelOptions()) -> Callable:
  """The kernel `name` (or `auto`) with `options` bound."""
  if name == "auto":
    name = resolve_auto()
  if name not in KERNELS:
    raise ValueError(f"attention={name!r} is not one of {sorted(KERNELS) + ['auto']}")
  return BoundKernel(name, options)
