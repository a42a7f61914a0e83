"""Shared-prefix attention in plain XLA: no [T, T] array ever exists.

prefix queries: causal over the P prefix keys.
slot queries [N*L]: one dense product against the prefix keys [P] plus their own causal
[N, L, L] blocks, merged with one log-sum-exp. GQA groups query heads per kv head
instead of repeating K/V. The prefill+extend algorithm calls the same slot path with the
prefix K/V taken from a cache, so both algorithms share this math.
"""

from typing import Optional

import jax
import jax.numpy as jnp

from layers.kernels.base import MASK_VALUE, KernelOptions, PrefixKV, SegmentLayout

_HI = jax.lax.Precision.HIGHEST


def _causal_prefix(q_BxPxKxGxH, k_BxPxKxH, v_BxPxKxH, valid_B):
  p = q_BxPxKxGxH.shape[1]
  s = jnp.einsum("BTKGH,BSKH->BKGTS", q_BxPxKxGxH, k_BxPxKxH, precision=_HI)
  idx = jnp.arange(p)
  mask_BxTxS = (idx[None, :] <= idx[:, None])[None] & (idx[None, None, :] < valid_B[:, None, None])
  s = jnp.where(mask_BxTxS[:, None, None], s, MASK_VALUE)
  return jnp.einsum("BKGTS,BSKH->BTKGH", jax.nn.softmax(s, axis=-1), v_BxPxKxH, precision=_HI)


def slots_attention(q_BxNxLxKxGxH, k_BxNxLxKxH, v_BxNxLxKxH, pk_BxPxKxH, pv_BxPxKxH, prefix_valid_B,
                    slot_valid_BxN):
  """Slot queries against the shared prefix and their own causal block, one softmax (float32)."""
  b, n, l, kh, g, h = q_BxNxLxKxGxH.shape
  s_pre = jnp.einsum("BNLKGH,BPKH->BKGNLP", q_BxNxLxKxGxH, pk_BxPxKxH, precision=_HI)
  pre_mask_BxP = jnp.arange(pk_BxPxKxH.shape[1])[None, :] < prefix_valid_B[:, None]
  s_pre = jnp.where(pre_mask_BxP[:, None, None, None, None, :], s_pre, MASK_VALUE)
  s_own = jnp.einsum("BNLKGH,BNMKH->BKGNLM", q_BxNxLxKxGxH, k_BxNxLxKxH, precision=_HI)
  idx = jnp.arange(l)
  own_mask_BxNxLxM = ((idx[None, :] <= idx[:, None])[None, None]
                      & (idx[None, None, None, :] < slot_valid_BxN[:, :, None, None]))
  s_own = jnp.where(own_mask_BxNxLxM[:, None, None], s_own, MASK_VALUE)
  m = jnp.maximum(s_pre.max(-1), s_own.max(-1))[..., None]
  p_pre, p_own = jnp.exp(s_pre - m), jnp.exp(s_own - m)
  denom_BxKxGxNxL = p_pre.sum(-1) + p_own.sum(-1)
  out = (jnp.einsum("BKGNLP,BPKH->BNLKGH", p_pre, pv_BxPxKxH, precision=_HI)
         + jnp.einsum("BKGNLM,BNMKH->BNLKGH", p_own, v_BxNxLxKxH, precision=_HI))
  return out / jnp.moveaxis(denom_BxKxGxNxL, (1, 2), (3, 4))[..., None]


def attend(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, layout: SegmentLayout, prefix_kv: Optional[PrefixKV] = None,
           *, options: KernelOptions) -> jax.Array:
  del options
  b, t, nh, h = q_BxTxNxH.shape
  kh = k_BxTxKxH.shape[2]
  f32 = lambda x: x.astype(jnp.float32)
  q = f32(q_BxTxNxH).reshape(b, t, kh, nh // kh, h) * (h ** -0.5)
  k, v = f32(k_BxTxKxH), f32(v_BxTxKxH)
  p, n, l = layout.prefix_len, layout.num_slots, layout.slot_len
  outs = []
  if prefix_kv is None:
    pk, pv = k[:, :p], v[:, :p]
    outs.append(_causal_prefix(q[:, :p], pk, pv, layout.prefix_valid_B))
    q, k, v = q[:, p:], k[:, p:], v[:, p:]
  else:
    pk = jnp.broadcast_to(f32(prefix_kv.k), (b,) + prefix_kv.k.shape[1:])
    pv = jnp.broadcast_to(f32(prefix_kv.v), (b,) + prefix_kv.v.shape[1:])
  if n:
    out = slots_attention(q.reshape(b, n, l, kh, nh // kh, h), k.reshape(b, n, l, kh, h),
                          v.reshape(b, n, l, kh, h), pk, pv, layout.prefix_valid_B, layout.slot_valid_BxN)
    outs.append(out.reshape(b, n * l, kh, nh // kh, h))
  out = jnp.concatenate(outs, axis=1) if len(outs) > 1 else outs[0]
  return out.reshape(b, t, nh, h).astype(q_BxTxNxH.dtype)
