"""Dense-mask attention built from segment ids: O(T^2), the oracle for the other kernels."""

from typing import Optional

import jax
import jax.numpy as jnp

from layers.kernels.base import MASK_VALUE, KernelOptions, PrefixKV, SegmentLayout


def visibility(seg_q_BxT: jax.Array, seg_k_BxS: jax.Array, offset: int) -> jax.Array:
  """Mask [B, T, S]: query t (at absolute index t+offset) sees key s per the segment rule."""
  t = jnp.arange(seg_q_BxT.shape[1])[:, None] + offset
  s = jnp.arange(seg_k_BxS.shape[1])[None, :]
  sq, sk = seg_q_BxT[:, :, None], seg_k_BxS[:, None, :]
  return (s <= t)[None] & (sk >= 0) & ((sk == 0) | (sk == sq))


def attend(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, layout: SegmentLayout, prefix_kv: Optional[PrefixKV] = None,
           *, options: KernelOptions) -> jax.Array:
  b, t, n, h = q_BxTxNxH.shape
  kv_heads = k_BxTxKxH.shape[2]
  seg_k = layout.segment_ids(include_prefix=True)
  if prefix_kv is not None:
    pk = jnp.broadcast_to(prefix_kv.k, (b,) + prefix_kv.k.shape[1:]).astype(k_BxTxKxH.dtype)
    pv = jnp.broadcast_to(prefix_kv.v, (b,) + prefix_kv.v.shape[1:]).astype(v_BxTxKxH.dtype)
    k_BxTxKxH = jnp.concatenate([pk, k_BxTxKxH], axis=1)
    v_BxTxKxH = jnp.concatenate([pv, v_BxTxKxH], axis=1)
    offset = layout.prefix_len
  else:
    offset = 0
  s_len = k_BxTxKxH.shape[1]
  if s_len > options.max_reference_len:
    raise ValueError(f"reference attention refuses a row of {s_len} tokens: it builds a [T, T] mask and "
                     f"max_reference_len={options.max_reference_len}; use attention=shared_prefix")
  seg_q = seg_k[:, offset:]
  mask_BxTxS = visibility(seg_q, seg_k, offset)
  q = q_BxTxNxH.reshape(b, t, kv_heads, n // kv_heads, h).astype(jnp.float32)
  logits = jnp.einsum("BTKGH,BSKH->BKGTS", q, k_BxTxKxH.astype(jnp.float32),
                      precision=jax.lax.Precision.HIGHEST) * (h ** -0.5)
  logits = jnp.where(mask_BxTxS[:, None, None], logits, MASK_VALUE)
  probs = jax.nn.softmax(logits, axis=-1)
  out = jnp.einsum("BKGTS,BSKH->BTKGH", probs, v_BxTxKxH.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
  return out.reshape(b, t, n, h).astype(q_BxTxNxH.dtype)
