"""Splash attention (TPU Pallas) over the packed multi-item layout.

The visibility rule is a `_ComputableMask` over (P, L) and positions, so splash's MaskInfo
skips every tile that is neither prefix nor a query block's own item; padding comes in as
`SegmentIds` (real tokens 0, padding 1). A padded query always sees its own key (the mask
diagonal holds and both ids are 1), so no row is fully masked and padded outputs stay finite
(they differ from the reference there, and callers ignore them). With `prefix_kv` the cached
prefix K/V are concatenated in front of the row and the mask is rectangular, queries offset
by P (no dummy prefix queries). Tested on CPU with `interpret=True`; splash needs block_kv to be a
multiple of 128 there too.

Backward. The kernel is built with backward block sizes equal to the forward's (a dq kernel and a
dkv kernel; the dkv kernel holds queries in lanes, so its q block is at least 128 and rows pad to
128 queries), so `jax.grad` runs splash's own Pallas backward over the same computable mask, its
MaskInfo (transposed for dkv) skipping the same empty tiles; soft-capping is differentiated there
too. The prefix rotation, padding and scaling around the kernel are plain JAX and differentiate as
such. Padded queries see only padding, so a loss that ignores their outputs gives them, and padded
keys, zero gradient, as the reference does.

Sliding window W. A splash mask is a static function of indices, but a token's serial position
depends on how many prefix tokens are real (slot token j sits at prefix_valid + j). So for a
windowed layer each row's prefix is rotated to end at index P (its padding moves to the front):
then serial position = index - (P - prefix_valid) - L * slot for every token, and the window
term pos[t] - pos[k] < W becomes the static s(t) - s(k) < W with s(x) = x in the prefix and
P + (x - P) mod L in a slot. Outputs of prefix queries are rotated back. Soft-capping is
splash's own `attn_logits_soft_cap`.
"""

import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash_kernel
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as splash_mask
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as splash_mask_info

from layers.kernels.base import KernelOptions, PrefixKV, SegmentLayout, with_prefix

_LANES = 128  # splash computes kv tiles in multiples of 128 lanes, interpret mode included
_PAD_ID = 1   # segment id of every padding token; real tokens are 0


def _div(x, d: int):
  """x // d for x >= 0: numpy while splash builds MaskInfo, lax.div inside the kernel."""
  return jax.lax.div(x, jnp.int32(d)) if isinstance(x, jax.Array) else x // d


class MultiItemMask(splash_mask._ComputableMask):
  """Key k visible from query t iff k <= t and (k < P or (k - P) // L == (t - P) // L).

  `offset` is the absolute position of query 0 (P when the prefix comes from a cache). With a
  `window` W also s(t) - s(k) < W (see the module docstring: rows with a right-aligned prefix).
  """

  def __init__(self, shape: tuple[int, int], prefix_len: int, slot_len: int, offset: int = 0,
               shard_count: int = 1, window: Optional[int] = None):
    self.prefix_len, self.slot_len, self.offset, self.window = prefix_len, max(slot_len, 1), offset, window

    def multi_item_mask_function(q_ids, kv_ids):
      t = q_ids + self.offset if self.offset else q_ids
      p, l = self.prefix_len, self.slot_len
      # (k - P) // L == (t - P) // L, shifted by a multiple of L so both sides are >= 0 and a
      # truncating divide (plain divsi in Mosaic, no sign fix-up) equals floor division.
      shift = -p % l
      same_slot = _div(kv_ids + shift, l) == _div(t + shift, l)
      vis = (kv_ids <= t) & ((kv_ids < p) | same_slot)
      if self.window is None:
        return vis
      # s(x): x in the prefix, P + (x - P) mod L in a slot (the remainder as x - L * (x // L)).
      spos = lambda x: x - (x >= p) * (l * _div(x + shift, l) - shift - p)
      return vis & (spos(t) - spos(kv_ids) < self.window)

    super().__init__(shape=shape, mask_function=multi_item_mask_function, shard_count=shard_count)

  def _key(self):
    return (self.shape, self.prefix_len, self.slot_len, self.offset, self.window)

  def __eq__(self, other: object):
    if not isinstance(other, type(self)):
      return NotImplemented
    return self._key() == other._key()

  def __hash__(self):
    return hash((type(self),) + self._key())


def _round_up(x: int, m: int) -> int:
  return -(-x // m) * m


def _geometry(q_len: int, offset: int, options: KernelOptions):
  """Block sizes clamped to the sequence, and the padded q / kv lengths."""
  block_q = max(1, min(options.splash_block_q, _round_up(q_len, _LANES)))
  block_kv = min(_round_up(options.splash_block_kv, _LANES), _round_up(offset + q_len, _LANES))
  # A multiple of 128 as well: the dkv kernel holds queries in lanes (its q block is _dkv_block_q's).
  q_pad = _round_up(q_len, math.lcm(block_q, _LANES))
  # kv covers every padded query's own (diagonal) key, so no padded row is fully masked.
  kv_pad = _round_up(offset + q_pad, block_kv)
  return block_q, block_kv, q_pad, kv_pad


def _dkv_block_q(block_q: int) -> int:
  """The dkv kernel's q block: block_q when a multiple of 128 lanes (splash needs that there), else 128."""
  return block_q if block_q % _LANES == 0 else _LANES


def make_kernel(mask: MultiItemMask, num_heads: int, block_q: int, block_kv: int, interpret: bool,
                softcap: Optional[float] = None):
  """The splash kernel for one row (heads share one mask; GQA served by MHA with fewer kv heads).

  Under a mesh the kernel runs inside the shard_map that layers/sharding.py puts around every
  kernel, so it sees one shard of the heads and is built with head_shards=1, q_seq_shards=1.
  """
  multi = splash_mask.MultiHeadMask([mask] * num_heads)
  block_sizes = splash_kernel.BlockSizes(block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv,
                                         block_q_dkv=_dkv_block_q(block_q), block_kv_dkv=block_kv, block_kv_dkv_compute=block_kv,
                                         block_q_dq=block_q, block_kv_dq=block_kv)
  return splash_kernel.make_splash_mha(multi, block_sizes=block_sizes, head_shards=1, q_seq_shards=1,
                                       interpret=interpret, attn_logits_soft_cap=softcap)


def _pad_axis1(x, length: int, value=0):
  pad = [(0, 0)] * x.ndim
  pad[1] = (0, length - x.shape[1])
  return jnp.pad(x, pad, constant_values=value)


def _rotate_prefix(x_BxSx_, shift_B, prefix_len: int):
  """Rotates each row's first `prefix_len` entries right by shift_B (the rest unchanged)."""
  src_BxP = (jnp.arange(prefix_len)[None, :] - shift_B[:, None]) % prefix_len
  idx = src_BxP.reshape(src_BxP.shape + (1,) * (x_BxSx_.ndim - 2))
  head = jnp.take_along_axis(x_BxSx_[:, :prefix_len], idx, axis=1)
  return jnp.concatenate([head, x_BxSx_[:, prefix_len:]], axis=1)


def attend(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, layout: SegmentLayout, prefix_kv: Optional[PrefixKV] = None,
           *, options: KernelOptions, window: Optional[int] = None, softcap: Optional[float] = None) -> jax.Array:
  b, t, nh, h = q_BxTxNxH.shape
  dtype = q_BxTxNxH.dtype
  p = layout.prefix_len
  seg_q_BxT = layout.segment_ids(include_prefix=prefix_kv is None)
  k, v, offset = with_prefix(k_BxTxKxH, v_BxTxKxH, prefix_kv, dtype)
  seg_kv_BxS = layout.segment_ids(include_prefix=True)
  if window is not None and p:  # right-align each prefix so the window is a static mask (module docstring)
    shift_B = p - jnp.minimum(layout.prefix_valid_B, p)
    k, v, seg_kv_BxS = (_rotate_prefix(x, shift_B, p) for x in (k, v, seg_kv_BxS))
    if prefix_kv is None:
      q_BxTxNxH, seg_q_BxT = _rotate_prefix(q_BxTxNxH, shift_B, p), seg_kv_BxS
  block_q, block_kv, q_pad, kv_pad = _geometry(t, offset, options)
  mask = MultiItemMask((q_pad, kv_pad), p, layout.slot_len, offset, window=window)
  kernel = make_kernel(mask, nh, block_q, block_kv, options.kernel_interpret, softcap)

  q = (q_BxTxNxH.astype(jnp.float32) * (h ** -0.5)).astype(dtype)
  q_BxNxTxH = _pad_axis1(q, q_pad).transpose(0, 2, 1, 3)
  k_BxKxSxH = _pad_axis1(k, kv_pad).transpose(0, 2, 1, 3)
  v_BxKxSxH = _pad_axis1(v, kv_pad).transpose(0, 2, 1, 3)
  ids_q_BxT = _pad_axis1(jnp.where(seg_q_BxT >= 0, 0, _PAD_ID), q_pad, _PAD_ID).astype(jnp.int32)
  ids_kv_BxS = _pad_axis1(jnp.where(seg_kv_BxS >= 0, 0, _PAD_ID), kv_pad, _PAD_ID).astype(jnp.int32)

  def one_row(q_NxTxH, k_KxSxH, v_KxSxH, ids_q_T, ids_kv_S):
    return kernel(q_NxTxH, k_KxSxH, v_KxSxH, splash_kernel.SegmentIds(q=ids_q_T, kv=ids_kv_S))

  out_BxNxTxH = jax.vmap(one_row)(q_BxNxTxH, k_BxKxSxH, v_BxKxSxH, ids_q_BxT, ids_kv_BxS)
  out_BxTxNxH = out_BxNxTxH.transpose(0, 2, 1, 3)[:, :t].astype(dtype)
  if window is not None and p and prefix_kv is None:
    out_BxTxNxH = _rotate_prefix(out_BxTxNxH, -shift_B, p)
  return out_BxTxNxH


def block_skip_stats(prefix_len: int, slot_len: int, num_slots: int, block_q: int, block_kv: int) -> dict:
  """How many (q-block, kv-block) tiles splash runs for a packed row, from its own MaskInfo."""
  t = prefix_len + slot_len * num_slots
  options = KernelOptions(splash_block_q=block_q, splash_block_kv=block_kv)
  bq, bkv, q_pad, kv_pad = _geometry(t, 0, options)
  mask = MultiItemMask((q_pad, kv_pad), prefix_len, slot_len)
  info, _ = splash_mask_info.process_mask(splash_mask.MultiHeadMask([mask]), (bq, bkv), shrink_grid=False)
  block_mask = np.asarray(info.block_mask)[0]
  return dict(total_blocks=int(block_mask.size), active_blocks=int((block_mask > 0).sum()),
              partial_blocks=int((block_mask == 1).sum()), block_q=bq, block_kv=bkv,
              padded_len=q_pad, grid_width=int((block_mask > 0).sum(axis=1).max()))
