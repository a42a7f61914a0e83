"""Shared-prefix attention in plain XLA: no [T, T] array ever exists.

prefix queries: causal over the P prefix keys, in query blocks that read only the keys up to
the block's end (the upper triangle is never computed).
slot queries: against the prefix keys [P] and their own causal block, merged with one log-sum-exp.
A slot's own attention runs in query blocks of at most _OWN_BLOCK rows; a block reads its slot's
keys only up to its own end (and from the first its window reaches), so the key blocks above the
diagonal are never computed and no [N, H, L, L] array exists; each block's prefix and own scores
share one max and one normalizer (the log-sum-exp merge of flash attention, exact in float32).
Slots are processed a chunk at a time (lax.map), the chunk sized so the score tile of its largest
query block -- prefix and own keys together -- stays in the last-level cache; memory is O(tile)
whatever the number of slots.

Layout for speed on XLA:CPU: (batch, kv head) are flattened into one batch axis Z and query
heads of a GQA group are folded into the row axis M, so every product is one batched GEMM
[Z, M, H] x [Z, S, H] and K/V are never repeated; own products batch over Y = (batch, kv head,
slot) the same way (as a six-axis einsum over (batch, slot, kv head) they ran 1.7-3.7x slower in a
one-process XLA:CPU microbenchmark). Probabilities are normalized after the PV product (one pass
less over the score tile). The prefill+extend algorithm calls the same slot
path with the prefix K/V taken from a cache. Slot steps are sized so the score tile stays in the
last-level cache, and padding is masked inside the QK product where nothing else needs a mask
(see _TILE_BYTES, _MIN_ROWS, _BIAS_COLUMN for the measurements behind them).

Sliding window W: a prefix query block reads only keys from W-1 before its first query; slot
token j of a row with V real prefix tokens sees prefix keys k > V + j - W and own keys j' > j - W
(its serial position is V + j). Logit soft-capping applies before the masks.
"""

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from layers.kernels.base import MASK_VALUE, KernelOptions, PrefixKV, SegmentLayout, soft_cap, with_prefix

_HI = jax.lax.Precision.HIGHEST
# Bytes of one lax.map step's [Z, rows, P] float32 slot score tile. The QK product writes it and the
# max, exp/sum and PV passes read it again: a tile that stays in the last-level cache (32 MiB on the
# CI machine's EPYC) keeps those passes off memory. In one-process A/B runs at the reference geometry
# (P=2048, 512 slots x 20, 8 kv heads) a ~20 MiB tile took 0.71-0.73x the time of the former
# 1024-token (~80 MiB) one, and a ~10 MiB tile 0.78-0.82x.
_TILE_BYTES = 24 << 20
# ... but a step needs enough rows per (batch, kv head) for the products to be efficient GEMMs: at
# 64 rows x 8 kv heads, P=320, 12 slots of 12 (the many-small-requests workload) one-slot steps took
# 1.8x the time of one 12-slot step (~190 MiB tile) in the same A/B.
_MIN_ROWS = 256
# Without a window or soft-cap the slot path masks only padded prefix keys: a bias column on the keys
# (and a ones column on the queries) puts the mask in the QK product, so no select rewrites the tile
# (0.73x vs 0.80x of the former kernel's time in the same A/B as above). False: always select.
_BIAS_COLUMN = True
_PREFIX_BLOCK = 256      # prefix query block: later blocks read more keys, none reads beyond its end
# Own-attention query block of the slot path: a slot's rows go in blocks of at most this many, each reading
# its own keys only up to the block's end (None: one block, the whole [L, L] square).
_OWN_BLOCK = 128


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


def _query_blocks(l: int, window: Optional[int]) -> list[tuple[int, int, int]]:
  """(first key, first query, end) of each own-attention query block of an l-token slot: blocks of at
  most _OWN_BLOCK rows, of equal size; a block reads its slot's keys from `first key` (0, or the first
  one its window reaches) to its own end, so no block above the diagonal is ever computed."""
  nb = 1 if _OWN_BLOCK is None else -(-l // _OWN_BLOCK)
  size = -(-l // nb)
  blocks = []
  for start in range(0, l, size):
    lo = 0 if window is None else max(0, start - window + 1)
    blocks.append((lo, start, min(l, start + size)))
  return blocks


def _own_mask(lo: int, start: int, end: int, window: Optional[int]) -> Optional[np.ndarray]:
  """Static [rows, keys] mask of a query block over its slot's keys lo..end (None: nothing masked).

  Padding needs no mask here: a real token's own keys are the tokens before it, all real."""
  t, s = np.arange(start, end)[:, None], np.arange(lo, end)[None, :]
  mask = s <= t
  if window is not None:
    mask &= s > t - window
  return None if mask.all() else mask


def _slots_chunk(pk_ZxPxH, pv_ZxPxH, pre_mask_BxLxP, q_BxCxLxKxGxH, k_BxCxLxKxH, v_BxCxLxKxH, window, softcap):
  """One chunk of C slots, a query block at a time: rows (c, l, g) per (batch, kv head) against the
  prefix keys and their own keys up to the block's end, merged by one log-sum-exp.

  `pre_mask_BxLxP` None: the prefix mask is already in the product (pk has a bias column, q gets a
  ones column), so the score tile is not rewritten by a select before the max pass reads it."""
  b, c, l, kh, g, h = q_BxCxLxKxGxH.shape
  # Own keys per (batch, kv head, slot) -- Y = B*K*C -- so each own product is one batched GEMM.
  own_k_YxLxH, own_v_YxLxH = (jnp.moveaxis(x, 3, 1).reshape(b * kh * c, l, h) for x in (k_BxCxLxKxH, v_BxCxLxKxH))
  outs = []
  for lo, start, end in _query_blocks(l, window):
    rows, keys = end - start, end - lo
    q_blk = q_BxCxLxKxGxH[:, :, start:end]
    q_ZxMxH = _to_z(q_blk.reshape(b, c * rows, kh, g, h), g)
    if pre_mask_BxLxP is None:
      ones = jnp.ones(q_ZxMxH.shape[:2] + (pk_ZxPxH.shape[-1] - h,), q_ZxMxH.dtype)
      s_pre = _bmm("ZMH,ZPH->ZMP", jnp.concatenate([q_ZxMxH, ones], axis=-1), pk_ZxPxH)
    else:
      s_pre = soft_cap(_bmm("ZMH,ZPH->ZMP", q_ZxMxH, pk_ZxPxH), softcap).reshape(b, kh, c, rows, g, -1)
      mask = pre_mask_BxLxP[:, None, None, start:end, None, :]
      s_pre = jnp.where(mask, s_pre, MASK_VALUE).reshape(b * kh, c * rows * g, -1)
    s_own = soft_cap(_bmm("YMH,YSH->YMS", q_ZxMxH.reshape(b * kh * c, rows * g, h), own_k_YxLxH[:, lo:end]),
                     softcap)
    own_mask = _own_mask(lo, start, end, window)
    if own_mask is not None:  # rows of the block are (l, g)
      s_own = jnp.where(np.repeat(own_mask, g, axis=0), s_own, MASK_VALUE)
    s_own = s_own.reshape(b * kh, c * rows * g, keys)
    mx = jnp.maximum(s_pre.max(-1), s_own.max(-1))[..., None]
    p_pre, p_own = jnp.exp(s_pre - mx), jnp.exp(s_own - mx)
    denom_ZxM = p_pre.sum(-1) + p_own.sum(-1)
    out = _bmm("ZMP,ZPH->ZMH", p_pre, pv_ZxPxH)
    out += _bmm("YMS,YSH->YMH", p_own.reshape(b * kh * c, rows * g, keys),
                own_v_YxLxH[:, lo:end]).reshape(b * kh, c * rows * g, h)
    outs.append((out / denom_ZxM[..., None]).reshape(b, kh, c, rows, g, h))
  out_BxKxCxLxGxH = jnp.concatenate(outs, axis=3) if len(outs) > 1 else outs[0]
  return jnp.moveaxis(out_BxKxCxLxGxH, 1, 3)


def _chunk_size(n: int, slot_tile_bytes: int, slot_rows: int) -> int:
  """Slots per lax.map step, a divisor of n: the most whose step temporaries (`slot_tile_bytes` per
  slot: the score tile of its largest query block, prefix and own keys) fit in _TILE_BYTES, unless that
  leaves fewer than _MIN_ROWS GEMM rows (`slot_rows` per slot and kv head); then the fewest that reach
  _MIN_ROWS (or all n)."""
  divisors = [d for d in range(1, n + 1) if n % d == 0]
  fit = max(1, _TILE_BYTES // max(slot_tile_bytes, 1))
  need = -(-_MIN_ROWS // max(slot_rows, 1))
  if fit >= need:
    return max(d for d in divisors if d <= fit)
  return min(d for d in divisors if d >= min(need, n))


def slot_step_tile(b: int, kv_heads: int, groups: int, prefix_len: int, slot_len: int,
                   window: Optional[int] = None) -> tuple[int, int]:
  """(bytes, rows per kv head) of one slot's largest query-block score tile: float32 scores of the
  block's rows against the prefix keys and its own keys (the step temporary _chunk_size bounds)."""
  rows, keys = max((end - start, end - lo) for lo, start, end in _query_blocks(slot_len, window))
  return 4 * b * kv_heads * groups * rows * (prefix_len + keys), rows * groups


def slots_attention(q_BxNxLxKxGxH, k_BxNxLxKxH, v_BxNxLxKxH, pk_BxPxKxH, pv_BxPxKxH, prefix_valid_B,
                    slot_valid_BxN, window=None, softcap=None):
  """Slot queries against the shared prefix and their own causal block, one softmax (float32).

  `slot_valid_BxN` is not read: padded slot tokens sit after every real one, so causality alone keeps
  them from real queries (outputs at padding are finite and unspecified)."""
  del slot_valid_BxN
  b, n, l, kh, g, h = q_BxNxLxKxGxH.shape
  pk, pv = _to_z(pk_BxPxKxH), _to_z(pv_BxPxKxH)
  keys_P = jnp.arange(pk_BxPxKxH.shape[1])
  valid_BxP = keys_P[None, :] < prefix_valid_B[:, None]
  if window is None and softcap is None and _BIAS_COLUMN:
    # Only padding is masked, per key: a bias column on the keys (0 or MASK_VALUE) adds it in the product.
    bias_ZxP = jnp.repeat(jnp.where(valid_BxP, 0.0, MASK_VALUE).astype(pk.dtype), kh, axis=0)
    pk, pre_mask_BxLxP = jnp.concatenate([pk, bias_ZxP[..., None]], axis=-1), None
  else:
    pre_mask_BxLxP = jnp.broadcast_to(valid_BxP[:, None, :], (b, l, keys_P.shape[0]))
  if window is not None:  # slot token j sits at serial position prefix_valid + j
    first_BxL = prefix_valid_B[:, None] + jnp.arange(l)[None, :] - window
    pre_mask_BxLxP = pre_mask_BxLxP & (keys_P[None, None, :] > first_BxL[:, :, None])
  c = _chunk_size(n, *slot_step_tile(b, kh, g, pk_BxPxKxH.shape[1], l, window))
  split = lambda x: jnp.moveaxis(x.reshape((b, n // c, c) + x.shape[2:]), 1, 0)
  chunks = (split(q_BxNxLxKxGxH), split(k_BxNxLxKxH), split(v_BxNxLxKxH))
  out = jax.lax.map(lambda a: _slots_chunk(pk, pv, pre_mask_BxLxP, *a, window, softcap), chunks)
  return jnp.moveaxis(out, 0, 1).reshape(b, n, l, kh, g, h)


def _batch_chunk(b: int, row_tile_bytes: int) -> int:
  """Batch rows per lax.map step, a divisor of b: the most whose prefix score tiles fit in _TILE_BYTES."""
  fit = max(1, _TILE_BYTES // max(row_tile_bytes, 1))
  return max(d for d in range(1, b + 1) if b % d == 0 and d <= fit)


def attend(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, layout: SegmentLayout, prefix_kv: Optional[PrefixKV] = None,
           *, options: KernelOptions, window: Optional[int] = None, softcap: Optional[float] = None) -> jax.Array:
  """Rows are independent: many rows (score_batch, serial) run a few at a time, so that the prefix
  score tile of a step stays near _TILE_BYTES instead of growing with the batch."""
  b, _, nh, _ = q_BxTxNxH.shape
  block = min(layout.prefix_len, _PREFIX_BLOCK)
  c = _batch_chunk(b, 4 * nh * block * layout.prefix_len) if prefix_kv is None else b
  run = lambda a: _attend_rows(*a, prefix_kv, window=window, softcap=softcap)
  if c == b:
    return run((q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, layout))
  split = lambda x: x.reshape((b // c, c) + x.shape[1:])
  out = jax.lax.map(run, jax.tree_util.tree_map(split, (q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, layout)))
  return out.reshape((b,) + out.shape[2:])


def _attend_rows(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, layout: SegmentLayout, prefix_kv: Optional[PrefixKV] = None,
                 *, window: Optional[int] = None, softcap: Optional[float] = None) -> jax.Array:
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
