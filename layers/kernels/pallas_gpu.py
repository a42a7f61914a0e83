"""Pallas flash attention, forward and backward, for the packed layout (Triton on GPU; `interpret=True` on CPU).

Grid (batch, q head, q block). A q block visits only two kv-block ranges, computed outside the
kernel per (row, q block): the prefix blocks [0, pre_hi) holding real prefix keys it can see, and
the own blocks [own_lo, own_hi) from the first key of its first slot to its last query. Every other
block (other items, the causal upper triangle, padded prefix) is skipped; inside a visited block
the exact segment + causal + padding mask applies. Online softmax in float32; a query that sees no
key (only possible with prefix_valid = 0) returns zeros, never NaN.

Sliding window W: the mask also requires pos[q] - pos[k] < W on serial positions (read from two
small position vectors beside the segment ids); logit soft-capping applies before the mask.
The visited block ranges are those of the full mask (a superset; the window only masks more).

Backward (a custom VJP; FlashAttention-2's scheme). The forward of a gradient also writes each query's
log-sum-exp. A dq kernel on the forward's grid recomputes each visited tile's probabilities from it; a dkv
kernel on a (row, kv head, kv block) grid visits, for each query head of the kv head's GQA group, the q
blocks [q_lo, q_hi) that can see its keys (every later block for a prefix block, up to the end of its last
slot for an item block, none for prefix padding), and sums their dk and dv in float32 inside the kernel, so
it writes one dk and dv per kv head in the keys' dtype. delta = rowsum(o * do) is computed
outside the kernels. Soft-capping is differentiated as 1 - (s / c)^2 on the capped logits.
"""

import dataclasses
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


def _q_block_bounds(xp, prefix_len, slot_len, k_first, k_last, prefix_valid, offset, num_keys, block_q, num_q_blocks):
  """Per kv block (absolute keys k_first..k_last): the q blocks [q_lo, q_hi) holding a query that can see one of
  its keys. A block with a real prefix key is seen by every later q block; a block of slot keys only by the q
  blocks up to the end of the last slot it touches; a block of prefix padding, or past the row, by none."""
  q_lo = xp.clip((k_first - offset) // block_q, 0, num_q_blocks)
  sees_prefix = k_first < xp.minimum(prefix_valid, prefix_len)
  last_slot = (xp.maximum(k_last, prefix_len) - prefix_len) // max(slot_len, 1)
  slot_end = prefix_len + (last_slot + 1) * max(slot_len, 1)  # one past the last query of that slot
  q_hi = xp.where(k_last >= prefix_len, xp.minimum(-(-(slot_end - offset) // block_q), num_q_blocks), q_lo)
  q_hi = xp.where(sees_prefix, num_q_blocks, q_hi)
  return q_lo, xp.where(k_first < num_keys, xp.maximum(q_hi, q_lo), q_lo)


def _logits(q, k, pos_q, pos_k, seg_q, seg_k, spos_q, spos_k, *, scale, window, softcap):
  """Soft-capped logits [bq, bk] (float32) and the visibility of each (query, key) pair."""
  s = soft_cap(jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=_HI,
                                   preferred_element_type=jnp.float32) * scale, softcap)
  vis = ((pos_k[None, :] <= pos_q[:, None]) & (seg_k[None, :] >= 0)
         & ((seg_k[None, :] == 0) | (seg_k[None, :] == seg_q[:, None])))
  if window is not None:
    vis &= (spos_q[:, None] - spos_k[None, :]) < window
  return s, vis


def _soft_cap_grad(s, cap):
  """d(c tanh(x / c)) / dx = 1 - tanh^2, from the capped logits s = c tanh(x / c)."""
  t = s / cap
  return 1.0 - t * t


def _dot(a, b, dtype):
  """a @ b accumulated in float32, the operands in `dtype`."""
  return jax.lax.dot_general(a.astype(dtype), b.astype(dtype), (((1,), (0,)), ((), ())), precision=_HI,
                             preferred_element_type=jnp.float32)


def _flash_kernel(bounds_ref, seg_q_ref, seg_k_ref, spos_q_ref, spos_k_ref, q_ref, k_ref, v_ref, o_ref, *lse_ref,
                  block_kv, offset, scale, window, softcap):
  """One (row, q head, q block): online softmax over the kv blocks named in bounds_ref; with `lse_ref` (the
  forward of a gradient) also each query's log-sum-exp, which the backward kernels read."""
  block_q, head_dim = q_ref.shape
  q = q_ref[...]
  seg_q = seg_q_ref[...]
  spos_q = spos_q_ref[...]
  pos_q = offset + pl.program_id(2) * block_q + jnp.arange(block_q)

  def body(j, carry):
    acc, m, l = carry
    kv = pl.ds(j * block_kv, block_kv)
    k, v = k_ref[kv, :], v_ref[kv, :]
    s, vis = _logits(q, k, pos_q, j * block_kv + jnp.arange(block_kv), seg_q, seg_k_ref[kv], spos_q,
                     spos_k_ref[kv], scale=scale, window=window, softcap=softcap)
    s = jnp.where(vis, s, MASK_VALUE)
    m_new = jnp.maximum(m, jnp.max(s, axis=1))
    p = jnp.where(vis, jnp.exp(s - m_new[:, None]), 0.0)
    alpha = jnp.exp(m - m_new)
    return alpha[:, None] * acc + _dot(p, v, v.dtype), m_new, alpha * l + jnp.sum(p, axis=1)

  carry = (jnp.zeros((block_q, head_dim), jnp.float32), jnp.full((block_q,), MASK_VALUE, jnp.float32),
           jnp.zeros((block_q,), jnp.float32))
  carry = jax.lax.fori_loop(0, bounds_ref[0], body, carry)
  acc, m, l = jax.lax.fori_loop(bounds_ref[1], bounds_ref[2], body, carry)
  o_ref[...] = (acc / jnp.where(l > 0, l, 1.0)[:, None]).astype(o_ref.dtype)
  if lse_ref:  # a query that sees no key keeps 0: its probabilities are masked to 0 in the backward anyway
    lse_ref[0][...] = jnp.where(l > 0, m + jnp.log(jnp.where(l > 0, l, 1.0)), 0.0)


def _dq_kernel(bounds_ref, seg_q_ref, seg_k_ref, spos_q_ref, spos_k_ref, q_ref, k_ref, v_ref, do_ref, lse_ref,
               delta_ref, dq_ref, *, block_kv, offset, scale, window, softcap):
  """dq of one (row, q head, q block), over the same kv blocks as the forward."""
  block_q, head_dim = q_ref.shape
  q, do = q_ref[...], do_ref[...]
  seg_q, spos_q, lse, delta = seg_q_ref[...], spos_q_ref[...], lse_ref[...], delta_ref[...]
  pos_q = offset + pl.program_id(2) * block_q + jnp.arange(block_q)

  def body(j, dq):
    kv = pl.ds(j * block_kv, block_kv)
    k, v = k_ref[kv, :], v_ref[kv, :]
    s, vis = _logits(q, k, pos_q, j * block_kv + jnp.arange(block_kv), seg_q, seg_k_ref[kv], spos_q,
                     spos_k_ref[kv], scale=scale, window=window, softcap=softcap)
    p = jnp.where(vis, jnp.exp(s - lse[:, None]), 0.0)
    dp = jax.lax.dot_general(do, v, (((1,), (1,)), ((), ())), precision=_HI, preferred_element_type=jnp.float32)
    ds = p * (dp - delta[:, None])
    if softcap is not None:
      ds = ds * _soft_cap_grad(s, softcap)
    return dq + _dot(ds, k, k.dtype) * scale

  dq = jax.lax.fori_loop(0, bounds_ref[0], body, jnp.zeros((block_q, head_dim), jnp.float32))
  dq = jax.lax.fori_loop(bounds_ref[1], bounds_ref[2], body, dq)
  dq_ref[...] = dq.astype(dq_ref.dtype)


def _dkv_kernel(qbounds_ref, seg_q_ref, seg_k_ref, spos_q_ref, spos_k_ref, q_ref, k_ref, v_ref, do_ref, lse_ref,
                delta_ref, dk_ref, dv_ref, *, block_q, offset, scale, window, softcap):
  """dk and dv of one (row, kv head, kv block): the sum over the kv head's GQA group of query heads (q_ref,
  do_ref [T, group, H]; lse_ref, delta_ref [group, T]) and over the q blocks [q_lo, q_hi) that can see it,
  accumulated in float32 inside the kernel."""
  block_kv, head_dim = k_ref.shape
  group = q_ref.shape[1]
  k, v = k_ref[...], v_ref[...]
  seg_k, spos_k = seg_k_ref[...], spos_k_ref[...]
  pos_k = pl.program_id(2) * block_kv + jnp.arange(block_kv)

  def head(g, carry):
    def body(i, carry):
      dk, dv = carry
      rows = pl.ds(i * block_q, block_q)
      q, do, lse, delta = q_ref[rows, g, :], do_ref[rows, g, :], lse_ref[g, rows], delta_ref[g, rows]
      s, vis = _logits(q, k, offset + i * block_q + jnp.arange(block_q), pos_k, seg_q_ref[rows], seg_k,
                       spos_q_ref[rows], spos_k, scale=scale, window=window, softcap=softcap)
      p = jnp.where(vis, jnp.exp(s - lse[:, None]), 0.0)
      dv = dv + _dot(p.T, do, do.dtype)
      dp = jax.lax.dot_general(do, v, (((1,), (1,)), ((), ())), precision=_HI, preferred_element_type=jnp.float32)
      ds = p * (dp - delta[:, None])
      if softcap is not None:
        ds = ds * _soft_cap_grad(s, softcap)
      return dk + _dot(ds.T, q, q.dtype) * scale, dv
    return jax.lax.fori_loop(qbounds_ref[0], qbounds_ref[1], body, carry)

  zeros = jnp.zeros((block_kv, head_dim), jnp.float32)
  dk, dv = jax.lax.fori_loop(0, group, head, (zeros, zeros))
  dk_ref[...] = dk.astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


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

  nq, nk = tp // bq, sp // bk
  q_first_Q = offset + jnp.arange(nq) * bq
  q_last_Q = jnp.minimum(q_first_Q + bq, offset + t) - 1
  bounds = _kv_block_bounds(jnp, p, layout.slot_len, q_first_Q[None], q_last_Q[None],
                            layout.prefix_valid_B[:, None], bk)
  bounds_BxQx4 = jnp.stack(jnp.broadcast_arrays(*bounds, jnp.zeros((b, nq), jnp.int32)), -1).astype(jnp.int32)
  k_first_K = jnp.arange(nk) * bk
  qbounds = _q_block_bounds(jnp, p, layout.slot_len, k_first_K[None], jnp.minimum(k_first_K + bk, s)[None] - 1,
                            layout.prefix_valid_B[:, None], offset, s, bq, nq)
  qbounds_BxKx2 = jnp.stack(jnp.broadcast_arrays(*qbounds), -1).astype(jnp.int32)
  if options.gpu_num_warps < 0 or options.gpu_num_warps & (options.gpu_num_warps - 1) or options.gpu_num_stages < 1:
    raise ValueError(f"gpu_num_warps={options.gpu_num_warps} must be 0 (auto) or a power of two, and "
                     f"gpu_num_stages={options.gpu_num_stages} >= 1")
  warps = options.gpu_num_warps or (4 if hp <= 64 else 8)
  geo = _Geometry(group=nh // kh, block_q=bq, block_kv=bk, offset=offset, scale=h ** -0.5, window=window,
                  softcap=softcap, interpret=options.kernel_interpret, num_warps=warps,
                  num_stages=options.gpu_num_stages)
  ints = (bounds_BxQx4, qbounds_BxKx2, seg_q_BxT, seg_k_BxS, spos_q_BxT, spos_k_BxS)
  return _flash(geo, ints, q, k, v)[:, :t, :, :h]


@dataclasses.dataclass(frozen=True)
class _Geometry:
  """The static settings the forward and backward kernels share."""
  group: int  # query heads per kv head
  block_q: int
  block_kv: int
  offset: int  # absolute index of query 0 (P with a cached prefix)
  scale: float
  window: Optional[int]
  softcap: Optional[float]
  interpret: bool
  num_warps: int
  num_stages: int


def _specs(geo: _Geometry, tp: int, sp: int, hp: int, grid_over_kv: bool):
  """BlockSpecs of (seg_q, seg_k, spos_q, spos_k, q, k, v, do, lse, delta) for a grid (row, head, block). The
  forward and dq tile the queries, over (row, q head, q block), and read the keys whole; dkv tiles the keys,
  over (row, kv head, kv block), and reads whole the queries of the kv head's GQA group (heads n * group to
  n * group + group - 1, consecutive in the head axis)."""
  bq, bk, group = geo.block_q, geo.block_kv, geo.group
  if grid_over_kv:
    seg_q, seg_k = pl.BlockSpec((None, tp), lambda i, n, j: (i, 0)), pl.BlockSpec((None, bk), lambda i, n, j: (i, j))
    q = pl.BlockSpec((None, tp, group, hp), lambda i, n, j: (i, 0, n, 0))
    kv = pl.BlockSpec((None, bk, None, hp), lambda i, n, j: (i, j, n, 0))
    per_query = pl.BlockSpec((None, group, tp), lambda i, n, j: (i, n, 0))
  else:
    seg_q, seg_k = pl.BlockSpec((None, bq), lambda i, n, j: (i, j)), pl.BlockSpec((None, sp), lambda i, n, j: (i, 0))
    q = pl.BlockSpec((None, bq, None, hp), lambda i, n, j: (i, j, n, 0))
    kv = pl.BlockSpec((None, sp, None, hp), lambda i, n, j: (i, 0, n // group, 0))
    per_query = pl.BlockSpec((None, None, bq), lambda i, n, j: (i, n, j))
  return [seg_q, seg_k, seg_q, seg_k, q, kv, kv, q, per_query, per_query]


def _call(kernel, geo: _Geometry, grid, in_specs, out_specs, out_shape, name: str):
  # jit around the pallas_call: a bare pallas_call is never dead code (its DCE rule keeps every input), and
  # flax's nn.scan (0.12.9 on) proves a scanned layer's broadcast outputs loop-invariant by dead-code elimination.
  return jax.jit(pl.pallas_call(
      kernel, grid=grid, in_specs=in_specs, out_specs=out_specs, out_shape=out_shape,
      compiler_params=plgpu.CompilerParams(num_warps=geo.num_warps, num_stages=geo.num_stages),
      interpret=geo.interpret, name=name))


def _forward(geo: _Geometry, ints, q, k, v, with_lse: bool):
  bounds_BxQx4, _, seg_q_BxT, seg_k_BxS, spos_q_BxT, spos_k_BxS = ints
  b, tp, nh, hp = q.shape
  kernel = functools.partial(_flash_kernel, block_kv=geo.block_kv, offset=geo.offset, scale=geo.scale,
                             window=geo.window, softcap=geo.softcap)
  specs = _specs(geo, tp, k.shape[1], hp, grid_over_kv=False)
  out_specs = [specs[4]] + ([specs[8]] if with_lse else [])
  out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype)] + (
      [jax.ShapeDtypeStruct((b, nh, tp), jnp.float32)] if with_lse else [])
  bounds_spec = pl.BlockSpec((None, None, 4), lambda i, n, j: (i, j, 0))
  return _call(kernel, geo, (b, nh, tp // geo.block_q), [bounds_spec] + specs[:7], out_specs, out_shape,
               "packed_flash_forward")(bounds_BxQx4, seg_q_BxT, seg_k_BxS, spos_q_BxT, spos_k_BxS, q, k, v)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(geo: _Geometry, ints, q, k, v):
  return _forward(geo, ints, q, k, v, with_lse=False)[0]


def _flash_fwd(geo: _Geometry, ints, q, k, v):
  out, lse_BxNxT = _forward(geo, ints, q, k, v, with_lse=True)
  return out, (ints, q, k, v, out, lse_BxNxT)


def _flash_bwd(geo: _Geometry, residuals, do):
  """dq from a q-block grid over the forward's kv blocks; dk and dv from a (kv head, kv block) grid over the q
  blocks that see each kv block, for every query head of the kv head's GQA group. delta = rowsum(o * do) is
  the softmax backward's per-query term (FlashAttention-2)."""
  ints, q, k, v, out, lse_BxNxT = residuals
  bounds_BxQx4, qbounds_BxKx2, seg_q_BxT, seg_k_BxS, spos_q_BxT, spos_k_BxS = ints
  b, tp, nh, hp = q.shape
  sp, kh = k.shape[1], k.shape[2]
  delta_BxNxT = jnp.einsum("BTNH,BTNH->BNT", out.astype(jnp.float32), do.astype(jnp.float32))
  args = (seg_q_BxT, seg_k_BxS, spos_q_BxT, spos_k_BxS, q, k, v, do.astype(q.dtype), lse_BxNxT, delta_BxNxT)
  statics = dict(offset=geo.offset, scale=geo.scale, window=geo.window, softcap=geo.softcap)

  q_specs = _specs(geo, tp, k.shape[1], hp, grid_over_kv=False)
  dq = _call(functools.partial(_dq_kernel, block_kv=geo.block_kv, **statics), geo, (b, nh, tp // geo.block_q),
             [pl.BlockSpec((None, None, 4), lambda i, n, j: (i, j, 0))] + q_specs, q_specs[4],
             jax.ShapeDtypeStruct(q.shape, q.dtype), "packed_flash_dq")(bounds_BxQx4, *args)

  kv_specs = _specs(geo, tp, sp, hp, grid_over_kv=True)
  kv_block = kv_specs[5]  # k's spec, (row, kv head, kv block): dk and dv are written in the same blocks
  dk, dv = _call(
      functools.partial(_dkv_kernel, block_q=geo.block_q, **statics), geo, (b, kh, sp // geo.block_kv),
      [pl.BlockSpec((None, None, 2), lambda i, n, j: (i, j, 0))] + kv_specs, [kv_block, kv_block],
      [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
      "packed_flash_dkv")(qbounds_BxKx2, *args)
  return None, dq, dk, dv


_flash.defvjp(_flash_fwd, _flash_bwd)
