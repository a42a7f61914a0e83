"""Shared-prefix attention in plain XLA: no [T, T] array ever exists.

prefix queries: causal over the P prefix keys, in query blocks that read only the keys up to
the block's end (the upper triangle is never computed).
slot queries: against the prefix keys [P] and their own causal [L, L] block, merged with one
log-sum-exp. Slots are processed `chunk` at a time (lax.map) so memory is
O(chunk * L * heads * P) whatever the number of slots.

Layout for speed on XLA:CPU: (batch, kv head) are flattened into one batch axis Z and query
heads of a GQA group are folded into the row axis M, so every product is one batched GEMM
[Z, M, H] x [Z, S, H] and K/V are never repeated; probabilities are normalized after the PV
product (one pass less over the score tile). The prefill+extend algorithm calls the same slot
path with the prefix K/V taken from a cache.

Sliding window W: a prefix query block reads only keys from W-1 before its first query; slot
token j of a row with V real prefix tokens sees prefix keys k > V + j - W and own keys j' > j - W
(its serial position is V + j). Logit soft-capping applies before the masks.
"""

from typing import Optional

import jax
import jax.numpy as jnp

from layers.kernels.base import MASK_VALUE, KernelOptions, PrefixKV, SegmentLayout, soft_cap, with_prefix

_HI = jax.lax.Precision.HIGHEST
_ROWS_PER_CHUNK = 1024   # slot tokens per lax.map step: keeps the score tile small and cache-friendly
_PREFIX_BLOCK = 256      # prefix query block: later blocks read more keys, none reads beyond its end


def _bmm(eq: str, a, b):
  return jnp.einsum(eq, a, b, precision=_HI)


def _to_z(x_BxTxKx_, g: Optional[int] = None):
  """[B, T, K, (G,) H] -> [B*K, T*G, H]: one batch axis, GQA group folded into the rows."""
  b, t, k = x_BxTxKx_.shape[:3]
  x = jnp.moveaxis(x_BxTxKx_, 2, 1)
  return x.reshape(b * k, t * (g or 1), x_BxTxKx_.shape[-1])


def _from_z(x_ZxMxH, b: int, k: int, g: int):
  """[B*K, T*G, H] -> [B, T, K, G, H]."""
  z, m, h = x_ZxMxH.shape
  return jnp.moveaxis(x_ZxMxH.reshape(b, k, m // g, g, h), 1, 2)


def _causal_prefix(q_BxPxKxGxH, k_BxPxKxH, v_BxPxKxH, valid_B, window, softcap):
  b, p, kh, g, h = q_BxPxKxGxH.shape
  q, k, v = _to_z(q_BxPxKxGxH, g), _to_z(k_BxPxKxH), _to_z(v_BxPxKxH)
  outs = []
  for start in range(0, p, _PREFIX_BLOCK):
    end = min(p, start + _PREFIX_BLOCK)
    lo = 0 if window is None else max(0, start - window + 1)  # keys no query of the block can see are not read
    s = soft_cap(_bmm("ZMH,ZSH->ZMS", q[:, start * g:end * g], k[:, lo:end]), softcap)
    t = start + jnp.arange((end - start) * g) // g  # query position of each row
    keys = jnp.arange(lo, end)
    mask_MxS = keys[None, :] <= t[:, None]
    if window is not None:
      mask_MxS &= keys[None, :] > t[:, None] - window
    mask_BxMxS = mask_MxS[None] & (keys[None, None, :] < valid_B[:, None, None])
    s = jnp.where(mask_BxMxS[:, None], s.reshape(b, kh, -1, end - lo), MASK_VALUE).reshape(b * kh, -1, end - lo)
    probs = jnp.exp(s - s.max(-1, keepdims=True))
    outs.append(_bmm("ZMS,ZSH->ZMH", probs, v[:, lo:end]) / probs.sum(-1)[..., None])
  return _from_z(jnp.concatenate(outs, axis=1), b, kh, g)


def _slots_chunk(pk_ZxPxH, pv_ZxPxH, pre_mask_BxLxP, q_BxCxLxKxGxH, k_BxCxLxKxH, v_BxCxLxKxH, valid_BxC,
                 window, softcap):
  """One chunk of C slots: rows (c, l, g) per (batch, kv head), against prefix keys and own block."""
  b, c, l, kh, g, h = q_BxCxLxKxGxH.shape
  q_ZxMxH = _to_z(q_BxCxLxKxGxH.reshape(b, c * l, kh, g, h), g)
  s_pre = soft_cap(_bmm("ZMH,ZPH->ZMP", q_ZxMxH, pk_ZxPxH), softcap).reshape(b, kh, c, l, g, -1)
  s_pre = jnp.where(pre_mask_BxLxP[:, None, None, :, None, :], s_pre, MASK_VALUE).reshape(b * kh, c * l * g, -1)
  s_own = soft_cap(_bmm("BCLKGH,BCSKH->BKCLGS", q_BxCxLxKxGxH, k_BxCxLxKxH), softcap)
  idx = jnp.arange(l)
  causal_LxS = idx[None, :] <= idx[:, None]
  if window is not None:
    causal_LxS &= idx[None, :] > idx[:, None] - window
  own_BxCxLxS = causal_LxS[None, None] & (idx[None, None, None, :] < valid_BxC[:, :, None, None])
  s_own = jnp.where(own_BxCxLxS[:, None, :, :, None, :], s_own, MASK_VALUE).reshape(b * kh, c * l * g, l)
  mx = jnp.maximum(s_pre.max(-1), s_own.max(-1))[..., None]
  p_pre, p_own = jnp.exp(s_pre - mx), jnp.exp(s_own - mx)
  denom_ZxM = p_pre.sum(-1) + p_own.sum(-1)
  out = _bmm("ZMP,ZPH->ZMH", p_pre, pv_ZxPxH)
  out += _to_z(_bmm("BKCLGS,BCSKH->BCLKGH", p_own.reshape(b, kh, c, l, g, l), v_BxCxLxKxH).reshape(b, c * l, kh, g, h), g)
  out = _from_z(out / denom_ZxM[..., None], b, kh, g)
  return out.reshape(b, c, l, kh, g, h)


def _chunk_size(n: int, l: int) -> int:
  """Largest divisor of n with at most _ROWS_PER_CHUNK slot tokens (at least 1)."""
  target = max(1, _ROWS_PER_CHUNK // max(l, 1))
  return max(d for d in range(1, min(n, target) + 1) if n % d == 0)


def slots_attention(q_BxNxLxKxGxH, k_BxNxLxKxH, v_BxNxLxKxH, pk_BxPxKxH, pv_BxPxKxH, prefix_valid_B,
                    slot_valid_BxN, window=None, softcap=None):
  """Slot queries against the shared prefix and their own causal block, one softmax (float32)."""
  b, n, l, kh, g, h = q_BxNxLxKxGxH.shape
  pk, pv = _to_z(pk_BxPxKxH), _to_z(pv_BxPxKxH)
  keys_P = jnp.arange(pk_BxPxKxH.shape[1])
  pre_mask_BxLxP = jnp.broadcast_to((keys_P[None, :] < prefix_valid_B[:, None])[:, None, :],
                                    (b, l, keys_P.shape[0]))
  if window is not None:  # slot token j sits at serial position prefix_valid + j
    first_BxL = prefix_valid_B[:, None] + jnp.arange(l)[None, :] - window
    pre_mask_BxLxP = pre_mask_BxLxP & (keys_P[None, None, :] > first_BxL[:, :, None])
  c = _chunk_size(n, l)
  split = lambda x: jnp.moveaxis(x.reshape((b, n // c, c) + x.shape[2:]), 1, 0)
  chunks = (split(q_BxNxLxKxGxH), split(k_BxNxLxKxH), split(v_BxNxLxKxH), split(slot_valid_BxN))
  out = jax.lax.map(lambda a: _slots_chunk(pk, pv, pre_mask_BxLxP, *a, window, softcap), chunks)
  return jnp.moveaxis(out, 0, 1).reshape(b, n, l, kh, g, h)


def attend(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, layout: SegmentLayout, prefix_kv: Optional[PrefixKV] = None,
           *, options: KernelOptions, window: Optional[int] = None, softcap: Optional[float] = None) -> jax.Array:
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
    outs.append(_causal_prefix(q[:, :p], pk, pv, layout.prefix_valid_B, window, softcap))
    q, k, v = q[:, p:], k[:, p:], v[:, p:]
  else:
    pk, pv, _ = with_prefix(k[:, :0], v[:, :0], prefix_kv, jnp.float32)
  if n:
    out = slots_attention(q.reshape(b, n, l, kh, nh // kh, h), k.reshape(b, n, l, kh, h),
                          v.reshape(b, n, l, kh, h), pk, pv, layout.prefix_valid_B, layout.slot_valid_BxN,
                          window, softcap)
    outs.append(out.reshape(b, n * l, kh, nh // kh, h))
  out = jnp.concatenate(outs, axis=1) if len(outs) > 1 else outs[0]
  return out.reshape(b, t, nh, h).astype(q_BxTxNxH.dtype)
