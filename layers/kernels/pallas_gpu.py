"""Pallas flash-attention forward for the packed layout (Triton on GPU; `interpret=True` on CPU).

Grid (batch, q head, q block). A q block visits only two kv-block ranges, computed outside the
kernel per (row, q block): the prefix blocks [0, pre_hi) holding real prefix keys it can see, and
the own blocks [own_lo, own_hi) from the first key of its first slot to its last query. Every other
block (other items, the causal upper triangle, padded prefix) is skipped; inside a visited block
the exact segment + causal + padding mask applies. Online softmax in float32; a query that sees no
key (only possible with prefix_valid = 0) returns zeros, never NaN.

Sliding window W: the mask also requires pos[q] - pos[k] < W on serial positions (read from two
small position vectors beside the segment ids); logit soft-capping applies before the mask.
The visited block ranges are those of the full mask (a superset; the window only masks more).
"""

import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from layers.kernels.base import MASK_VALUE, KernelOptions, PrefixKV, SegmentLayout, soft_cap, with_prefix

_HI = jax.lax.Precision.HIGHEST  # f32 inputs -> IEEE dot in Triton (not TF32); bf16 stays bf16.


def _kv_block_bounds(xp, prefix_len, slot_len, q_first, q_last, prefix_valid, block_kv):
  """Per q block (absolute query indices q_first..q_last): prefix range [0, pre_hi), own [own_lo, own_hi)."""
  pre_keys = xp.minimum(xp.minimum(prefix_valid, prefix_len), q_last + 1)
  pre_hi = -(-pre_keys // block_kv)
  first_slot = xp.maximum(q_first - prefix_len, 0) // max(slot_len, 1)
  own_hi = xp.where(q_last >= prefix_len, q_last // block_kv + 1, 0)
  own_lo = xp.minimum(xp.maximum(pre_hi, (prefix_len + first_slot * slot_len) // block_kv), own_hi)
  return pre_hi, own_lo, own_hi


def block_counts(P: int, L: int, N: int, block_q: int, block_kv: int) -> dict:
  """(q block, kv block) pairs visited by the kernel vs the dense causal grid, for a fully valid row."""
  t = P + N * L
  q_first = np.arange(-(-t // block_q), dtype=np.int64) * block_q
  q_last = np.minimum(q_first + block_q, t) - 1
  pre_hi, own_lo, own_hi = _kv_block_bounds(np, P, L, q_first, q_last, P, block_kv)
  return dict(total_blocks=int((q_last // block_kv + 1).sum()),
              visited_blocks=int((pre_hi + own_hi - own_lo).sum()))


def _flash_kernel(bounds_ref, seg_q_ref, seg_k_ref, spos_q_ref, spos_k_ref, q_ref, k_ref, v_ref, o_ref, *,
                  block_kv, offset, scale, window, softcap):
  """One (row, q head, q block): online softmax over the kv blocks named in bounds_ref."""
  block_q, head_dim = q_ref.shape
  q = q_ref[...]
  seg_q = seg_q_ref[...]
  spos_q = spos_q_ref[...]
  pos_q = offset + pl.program_id(2) * block_q + jnp.arange(block_q)

  def body(j, carry):
    acc, m, l = carry
    kv = pl.ds(j * block_kv, block_kv)
    k, v, seg_k = k_ref[kv, :], v_ref[kv, :], seg_k_ref[kv]
    s = soft_cap(jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=_HI,
                                     preferred_element_type=jnp.float32) * scale, softcap)
    pos_k = j * block_kv + jnp.arange(block_kv)
    vis = ((pos_k[None, :] <= pos_q[:, None]) & (seg_k[None, :] >= 0)
           & ((seg_k[None, :] == 0) | (seg_k[None, :] == seg_q[:, None])))
    if window is not None:
      vis &= (spos_q[:, None] - spos_k_ref[kv][None, :]) < window
    s = jnp.where(vis, s, MASK_VALUE)
    m_new = jnp.maximum(m, jnp.max(s, axis=1))
    p = jnp.where(vis, jnp.exp(s - m_new[:, None]), 0.0)
    alpha = jnp.exp(m - m_new)
    pv = jax.lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())), precision=_HI,
                             preferred_element_type=jnp.float32)
    return alpha[:, None] * acc + pv, m_new, alpha * l + jnp.sum(p, axis=1)

  carry = (jnp.zeros((block_q, head_dim), jnp.float32), jnp.full((block_q,), MASK_VALUE, jnp.float32),
           jnp.zeros((block_q,), jnp.float32))
  carry = jax.lax.fori_loop(0, bounds_ref[0], body, carry)
  acc, _, l = jax.lax.fori_loop(bounds_ref[1], bounds_ref[2], body, carry)
  o_ref[...] = (acc / jnp.where(l > 0, l, 1.0)[:, None]).astype(o_ref.dtype)


def _block(requested: int, length: int, name: str, interpret: bool) -> int:
  """A power-of-two block no longer than needed; at least 16 when compiled (Triton dot minimum)."""
  if requested < 1 or requested & (requested - 1):
    raise ValueError(f"{name}={requested} must be a power of two (Triton block shapes)")
  return max(min(requested, pl.next_power_of_2(max(length, 1))), 1 if interpret else 16)


def _pad(x, axis, size, value=0):
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, size - x.shape[axis])
  return jnp.pad(x, widths, constant_values=value)


def attend(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, layout: SegmentLayout, prefix_kv: Optional[PrefixKV] = None,
           *, options: KernelOptions, window: Optional[int] = None, softcap: Optional[float] = None) -> jax.Array:
  """Same contract as reference.attend; T, S and head_dim are padded to blocks here and sliced back."""
  b, t, nh, h = q_BxTxNxH.shape
  kh = k_BxTxKxH.shape[2]
  if nh % kh:
    raise ValueError(f"query heads ({nh}) must be a multiple of kv heads ({kh})")
  p = layout.prefix_len
  offset = p if prefix_kv is not None else 0
  if t != layout.row_len - offset:
    raise ValueError(f"row of {t} tokens does not match the layout ({layout.row_len - offset} expected)")
  if t == 0:
    return q_BxTxNxH
  seg_k_BxS = layout.segment_ids(include_prefix=True)
  spos_k_BxS = layout.serial_positions(include_prefix=True)
  k_BxTxKxH, v_BxTxKxH, _ = with_prefix(k_BxTxKxH, v_BxTxKxH, prefix_kv)
  s = k_BxTxKxH.shape[1]
  bq = _block(options.gpu_block_q, t, "gpu_block_q", options.kernel_interpret)
  bk = _block(options.gpu_block_kv, s, "gpu_block_kv", options.kernel_interpret)
  hp = _block(pl.next_power_of_2(h), h, "head_dim", options.kernel_interpret)
  tp, sp = -(-t // bq) * bq, -(-s // bk) * bk
  q = _pad(_pad(q_BxTxNxH, 1, tp), 3, hp)
  k = _pad(_pad(k_BxTxKxH, 1, sp), 3, hp).astype(q.dtype)
  v = _pad(_pad(v_BxTxKxH, 1, sp), 3, hp).astype(q.dtype)
  seg_q_BxT = _pad(seg_k_BxS[:, offset:], 1, tp, -1)
  seg_k_BxS = _pad(seg_k_BxS, 1, sp, -1)
  spos_q_BxT = _pad(spos_k_BxS[:, offset:], 1, tp)
  spos_k_BxS = _pad(spos_k_BxS, 1, sp)

  nq = tp // bq
  q_first_Q = offset + jnp.arange(nq) * bq
  q_last_Q = jnp.minimum(q_first_Q + bq, offset + t) - 1
  bounds = _kv_block_bounds(jnp, p, layout.slot_len, q_first_Q[None], q_last_Q[None],
                            layout.prefix_valid_B[:, None], bk)
  bounds_BxQx4 = jnp.stack(jnp.broadcast_arrays(*bounds, jnp.zeros((b, nq), jnp.int32)), -1).astype(jnp.int32)

  group = nh // kh
  kernel = functools.partial(_flash_kernel, block_kv=bk, offset=offset, scale=h ** -0.5, window=window,
                             softcap=softcap)
  kv_spec = pl.BlockSpec((None, sp, None, hp), lambda i, n, j: (i, 0, n // group, 0))
  q_spec = pl.BlockSpec((None, bq, None, hp), lambda i, n, j: (i, j, n, 0))
  # jit around the pallas_call: a bare pallas_call is never dead code (its DCE rule keeps every input), and
  # flax's nn.scan (0.12.9 on) proves a scanned layer's broadcast outputs loop-invariant by dead-code elimination.
  out = jax.jit(pl.pallas_call(
      kernel,
      grid=(b, nh, nq),
      in_specs=[pl.BlockSpec((None, None, 4), lambda i, n, j: (i, j, 0)),
                pl.BlockSpec((None, bq), lambda i, n, j: (i, j)),
                pl.BlockSpec((None, sp), lambda i, n, j: (i, 0)),
                pl.BlockSpec((None, bq), lambda i, n, j: (i, j)),
                pl.BlockSpec((None, sp), lambda i, n, j: (i, 0)),
                q_spec, kv_spec, kv_spec],
      out_specs=q_spec,
      out_shape=jax.ShapeDtypeStruct((b, tp, nh, hp), q.dtype),
      compiler_params=plgpu.CompilerParams(num_warps=4 if hp <= 64 else 8, num_stages=2),
      interpret=options.kernel_interpret,
      name="packed_flash_forward",
  ))(bounds_BxQx4, seg_q_BxT, seg_k_BxS, spos_q_BxT, spos_k_BxS, q, k, v)
  return out[:, :t, :, :h]
