"""Dense-mask attention built from segment ids: O(T^2), the oracle for the other kernels."""

import functools
from typing import Optional

import jax
import jax.numpy as jnp

from layers.kernels.base import MASK_VALUE, KernelOptions, PrefixKV, SegmentLayout, soft_cap, with_prefix


@functools.partial(jax.jit, static_argnames=("offset", "window"))  # one program per shape, as attend below
def visibility(seg_q_BxT: jax.Array, seg_k_BxS: jax.Array, offset: int, pos_q_BxT: Optional[jax.Array] = None,
               pos_k_BxS: Optional[jax.Array] = None, window: Optional[int] = None) -> jax.Array:
  """Mask [B, T, S]: query t (at absolute index t+offset) sees key s per the segment rule (and window)."""
  t = jnp.arange(seg_q_BxT.shape[1])[:, None] + offset
  s = jnp.arange(seg_k_BxS.shape[1])[None, :]
  sq, sk = seg_q_BxT[:, :, None], seg_k_BxS[:, None, :]
  vis = (s <= t)[None] & (sk >= 0) & ((sk == 0) | (sk == sq))
  if window is not None:
    vis &= (pos_q_BxT[:, :, None] - pos_k_BxS[:, None, :]) < window
  return vis


def attend(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, layout: SegmentLayout, prefix_kv: Optional[PrefixKV] = None,
           *, options: KernelOptions, window: Optional[int] = None, softcap: Optional[float] = None) -> jax.Array:
  """One compiled program per shape and setting (called outside a jit, as the kernel tests call the oracle, its
  mask and softmax would compile a program per step); inside a model's jit it is inlined."""
  return _attend_jit(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, layout, prefix_kv, options=options, window=window,
                     softcap=softcap)


def _attend(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, layout: SegmentLayout, prefix_kv: Optional[PrefixKV] = None,
            *, options: KernelOptions, window: Optional[int] = None, softcap: Optional[float] = None) -> jax.Array:
  b, t, n, h = q_BxTxNxH.shape
  kv_heads = k_BxTxKxH.shape[2]
  seg_k = layout.segment_ids(include_prefix=True)
  pos_k = layout.serial_positions(include_prefix=True)
  k_BxSxKxH, v_BxSxKxH, offset = with_prefix(k_BxTxKxH, v_BxTxKxH, prefix_kv, jnp.float32)
  s_len = k_BxSxKxH.shape[1]
  if s_len > options.max_reference_len:
    raise ValueError(f"reference attention refuses a row of {s_len} tokens: it builds a [T, T] mask and "
                     f"max_reference_len={options.max_reference_len}; use attention=shared_prefix")
  mask_BxTxS = visibility(seg_k[:, offset:], seg_k, offset, pos_k[:, offset:], pos_k, window)
  q = q_BxTxNxH.reshape(b, t, kv_heads, n // kv_heads, h).astype(jnp.float32)
  logits = jnp.einsum("BTKGH,BSKH->BKGTS", q, k_BxSxKxH, precision=jax.lax.Precision.HIGHEST) * (h ** -0.5)
  logits = jnp.where(mask_BxTxS[:, None, None], soft_cap(logits, softcap), MASK_VALUE)
  probs = jax.nn.softmax(logits, axis=-1)
  out = jnp.einsum("BKGTS,BSKH->BTKGH", probs, v_BxSxKxH, precision=jax.lax.Precision.HIGHEST)
  return out.reshape(b, t, n, h).astype(q_BxTxNxH.dtype)


_attend_jit = jax.jit(_attend, static_argnames=("options", "window", "softcap"))
