"""Shared-prefix attention in plain XLA: no [T, T] array ever exists.

prefix queries: causal over the P prefix keys.
slot queries: against the prefix keys [P] and their own causal [L, L] block, merged with one
log-sum-exp. Slots are processed `chunk` at a time (lax.map), with query heads folded into
the row dimension so each product is a plain batched GEMM [K, M, H] x [K, P, H]; memory is
O(chunk * L * heads * P) whatever the number of slots. GQA never repeats K/V. The
prefill+extend algorithm calls the same slot path with the prefix K/V taken from a cache.
"""

from typing import Optional

import jax
import jax.numpy as jnp

from layers.kernels.base import MASK_VALUE, KernelOptions, PrefixKV, SegmentLayout

_HI = jax.lax.Precision.HIGHEST
_ROWS_PER_CHUNK = 1024  # slot tokens per lax.map step: keeps the score tile small and cache-friendly


def _causal_prefix(q_BxPxKxGxH, k_BxPxKxH, v_BxPxKxH, valid_B):
  b, p, kh, g, h = q_BxPxKxGxH.shape
  q_BxKxMxH = jnp.transpose(q_BxPxKxGxH, (0, 2, 1, 3, 4)).reshape(b, kh, p * g, h)
  s = jnp.einsum("BKMH,BKSH->BKMS", q_BxKxMxH, jnp.swapaxes(k_BxPxKxH, 1, 2), precision=_HI)
  t = jnp.repeat(jnp.arange(p), g)  # query position of each row m = t * G + g
  s_idx = jnp.arange(p)
  mask_BxMxS = (s_idx[None, :] <= t[:, None])[None] & (s_idx[None, None, :] < valid_B[:, None, None])
  s = jnp.where(mask_BxMxS[:, None], s, MASK_VALUE)
  out = jnp.einsum("BKMS,BKSH->BKMH", jax.nn.softmax(s, axis=-1), jnp.swapaxes(v_BxPxKxH, 1, 2), precision=_HI)
  return jnp.transpose(out.reshape(b, kh, p, g, h), (0, 2, 1, 3, 4))


def _slots_chunk(pk_BxKxPxH, pv_BxKxPxH, pre_mask_BxP, q_BxCxLxKxGxH, k_BxCxLxKxH, v_BxCxLxKxH, valid_BxC):
  """One chunk of C slots: rows m = (c, l, g) per kv head, against prefix keys and own block."""
  b, c, l, kh, g, h = q_BxCxLxKxGxH.shape
  m = c * l * g
  q_BxKxMxH = jnp.transpose(q_BxCxLxKxGxH, (0, 3, 1, 2, 4, 5)).reshape(b, kh, m, h)
  s_pre = jnp.einsum("BKMH,BKPH->BKMP", q_BxKxMxH, pk_BxKxPxH, precision=_HI)
  s_pre = jnp.where(pre_mask_BxP[:, None, None, :], s_pre, MASK_VALUE)
  s_own = jnp.einsum("BCLKGH,BCSKH->BKCLGS", q_BxCxLxKxGxH, k_BxCxLxKxH, precision=_HI)
  idx = jnp.arange(l)
  own_BxCxLxS = (idx[None, :] <= idx[:, None])[None, None] & (idx[None, None, None, :] < valid_BxC[:, :, None, None])
  s_own = jnp.where(own_BxCxLxS[:, None, :, :, None, :], s_own, MASK_VALUE).reshape(b, kh, m, l)
  mx = jnp.maximum(s_pre.max(-1), s_own.max(-1))[..., None]
  p_pre, p_own = jnp.exp(s_pre - mx), jnp.exp(s_own - mx)
  denom_BxKxM = p_pre.sum(-1) + p_own.sum(-1)
  out = jnp.einsum("BKMP,BKPH->BKMH", p_pre, pv_BxKxPxH, precision=_HI)
  out += jnp.einsum("BKCLGS,BCSKH->BKCLGH", p_own.reshape(b, kh, c, l, g, l), v_BxCxLxKxH,
                    precision=_HI).reshape(b, kh, m, h)
  out = (out / denom_BxKxM[..., None]).reshape(b, kh, c, l, g, h)
  return jnp.transpose(out, (0, 2, 3, 1, 4, 5))


def _chunk_size(n: int, l: int) -> int:
  """Largest divisor of n with at most _ROWS_PER_CHUNK slot tokens (at least 1)."""
  target = max(1, _ROWS_PER_CHUNK // max(l, 1))
  return max(d for d in range(1, min(n, target) + 1) if n % d == 0)


def slots_attention(q_BxNxLxKxGxH, k_BxNxLxKxH, v_BxNxLxKxH, pk_BxPxKxH, pv_BxPxKxH, prefix_valid_B,
                    slot_valid_BxN):
  """Slot queries against the shared prefix and their own causal block, one softmax (float32)."""
  b, n, l, kh, g, h = q_BxNxLxKxGxH.shape
  pk, pv = jnp.swapaxes(pk_BxPxKxH, 1, 2), jnp.swapaxes(pv_BxPxKxH, 1, 2)
  pre_mask_BxP = jnp.arange(pk.shape[2])[None, :] < prefix_valid_B[:, None]
  c = _chunk_size(n, l)
  split = lambda x: jnp.moveaxis(x.reshape((b, n // c, c) + x.shape[2:]), 1, 0)
  chunks = (split(q_BxNxLxKxGxH), split(k_BxNxLxKxH), split(v_BxNxLxKxH), split(slot_valid_BxN))
  out = jax.lax.map(lambda a: _slots_chunk(pk, pv, pre_mask_BxP, *a), chunks)
  return jnp.moveaxis(out, 0, 1).reshape(b, n, l, kh, g, h)


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
