"""pallas_gpu kernel (interpret mode on CPU) against the dense reference, forward and gradients; its block skipping;
its lowering to Triton."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from layers.kernels import pallas_gpu, reference
from layers.kernels.base import KernelOptions, PrefixKV, SegmentLayout
from maxscore.bench import kernel_grads


def _layout(rng, b, p, l, n):
  """Row 0 fully valid prefix, other rows padded prefix; slot lengths mixed, 0 and L included."""
  prefix_valid_B = np.full(b, p)
  prefix_valid_B[1:] = rng.integers(1, p + 1, b - 1)
  slot_valid_BxN = rng.integers(0, l + 1, (b, n))
  if n:
    slot_valid_BxN[0, 0], slot_valid_BxN[-1, -1] = 0, l
  return SegmentLayout(jnp.asarray(prefix_valid_B, jnp.int32), jnp.asarray(slot_valid_BxN, jnp.int32), p, l, n)


def _qkv(rng, b, t, nh, kh, h, dtype=jnp.float32):
  normal = lambda *shape: jnp.asarray(rng.normal(size=shape), dtype)
  return normal(b, t, nh, h), normal(b, t, kh, h), normal(b, t, kh, h)


@functools.partial(jax.jit, static_argnames=("options",))
def _pallas(q, k, v, layout, prefix_kv, options):
  return pallas_gpu.attend(q, k, v, layout, prefix_kv, options=options)


def _check(p, n, l, group, blocks, h=16, prefix_kv=False, seed=0):
  rng = np.random.default_rng(seed)
  b, kh = 2, 2
  layout = _layout(rng, b, p, l, n)
  t = layout.row_len - (p if prefix_kv else 0)
  q, k, v = _qkv(rng, b, t, kh * group, kh, h)
  pkv = PrefixKV(*_qkv(rng, 1, p, kh, kh, h)[1:]) if prefix_kv else None
  options = KernelOptions(gpu_block_q=blocks[0], gpu_block_kv=blocks[1], kernel_interpret=True)
  out = np.asarray(_pallas(q, k, v, layout, pkv, options))
  want = np.asarray(reference.attend(q, k, v, layout, pkv, options=options))
  assert out.shape == want.shape and out.dtype == want.dtype
  assert np.isfinite(out).all()
  np.testing.assert_allclose(out, want, atol=2e-5, rtol=2e-5)


# Every P with N in {1, 5}, both block shapes per P, GQA ratios 1/2/4 spread across them.
@pytest.mark.parametrize("p,n,blocks,group", [
    (1, 1, (16, 16), 1), (1, 5, (8, 32), 4),
    (17, 1, (8, 32), 2), (17, 5, (16, 16), 4), (17, 5, (8, 32), 1),
    (128, 1, (16, 16), 2), (128, 5, (8, 32), 4), (128, 5, (16, 16), 1),
])
def test_matches_reference(p, n, blocks, group):
  _check(p, n, l=7, group=group, blocks=blocks, seed=p * 10 + n)


@pytest.mark.parametrize("p,n,l,blocks", [(17, 5, 7, (16, 16)), (128, 3, 20, (8, 32)), (5, 2, 0, (16, 16))])
def test_prefix_kv_matches_reference(p, n, l, blocks):
  _check(p, n, l, group=2, blocks=blocks, prefix_kv=True, seed=p + n)


def test_odd_head_dim_plain_causal_and_long_slots():
  _check(17, 2, 40, group=2, blocks=(16, 16), h=12)
  _check(33, 0, 5, group=1, blocks=(16, 16))


@pytest.mark.slow
@pytest.mark.parametrize("blocks", [(16, 16), (8, 32), (64, 64)])
def test_long_prefix_matches_reference(blocks):
  _check(700, 5, 13, group=4, blocks=blocks, seed=7)


def test_empty_prefix_row_is_finite():
  """A row with prefix_valid = 0: padded queries see no key; output stays finite, real queries exact."""
  rng = np.random.default_rng(3)
  layout = SegmentLayout(jnp.array([0, 4], jnp.int32), jnp.array([[3, 0], [5, 2]], jnp.int32), 8, 5, 2)
  q, k, v = _qkv(rng, 2, layout.row_len, 2, 1, 16)
  options = KernelOptions(gpu_block_q=8, gpu_block_kv=8, kernel_interpret=True)
  out = np.asarray(_pallas(q, k, v, layout, None, options))
  want = np.asarray(reference.attend(q, k, v, layout, options=options))
  real_BxT = np.asarray(layout.segment_ids()) >= 0
  assert np.isfinite(out).all()
  np.testing.assert_allclose(out[real_BxT], want[real_BxT], atol=2e-5, rtol=2e-5)


def test_skipped_blocks_are_never_read():
  """NaN keys/values in a padded-prefix block and in another item's block cannot reach other queries."""
  rng = np.random.default_rng(5)
  layout = SegmentLayout(jnp.array([10], jnp.int32), jnp.array([[16, 5, 16]], jnp.int32), 32, 16, 3)
  q, k, v = _qkv(rng, 1, layout.row_len, 2, 1, 16)
  poison_T = np.zeros(layout.row_len, bool)
  poison_T[16:32] = poison_T[48:64] = True  # prefix padding block; the block of item 2 (segment 2)
  options = KernelOptions(gpu_block_q=16, gpu_block_kv=16, kernel_interpret=True)
  nan = lambda x: jnp.where(poison_T[None, :, None, None], jnp.nan, x)
  out = np.asarray(_pallas(q, nan(k), nan(v), layout, None, options))
  zero = lambda x: jnp.where(poison_T[None, :, None, None], 0.0, x)
  want = np.asarray(reference.attend(q, zero(k), zero(v), layout, options=options))
  rows = ~poison_T | (np.arange(layout.row_len) < 32)
  assert np.isfinite(out[:, rows]).all()
  np.testing.assert_allclose(out[:, rows], want[:, rows], atol=2e-5, rtol=2e-5)


def test_bfloat16_keeps_dtype():
  rng = np.random.default_rng(4)
  layout = _layout(rng, 2, 17, 6, 3)
  q, k, v = _qkv(rng, 2, layout.row_len, 4, 2, 16, jnp.bfloat16)
  options = KernelOptions(gpu_block_q=16, gpu_block_kv=16, kernel_interpret=True)
  out = _pallas(q, k, v, layout, None, options)
  want = reference.attend(q, k, v, layout, options=options)
  assert out.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(want, np.float32), atol=3e-2)


def test_block_counts_hand_checked():
  # P=4, L=4, N=2, blocks 4/4: q block 0 sees kv 0; q block 1 sees kv 0 + 1; q block 2 sees kv 0 + 2.
  assert pallas_gpu.block_counts(4, 4, 2, 4, 4) == dict(total_blocks=6, visited_blocks=5)
  # No items: plain causal, nothing skipped.
  assert pallas_gpu.block_counts(40, 7, 0, 8, 8) == dict(total_blocks=15, visited_blocks=15)


@pytest.mark.parametrize("p,l,n,bq,bk", [(17, 7, 5, 8, 8), (5, 3, 9, 4, 8), (33, 20, 4, 16, 4), (1, 1, 30, 8, 8)])
def test_block_counts_equal_needed_blocks(p, l, n, bq, bk):
  """With all tokens valid the kernel visits exactly the blocks holding a visible (query, key) pair."""
  seg = np.concatenate([np.zeros(p, int), np.repeat(np.arange(1, n + 1), l)])
  t = len(seg)
  idx = np.arange(t)
  vis = (idx[None] <= idx[:, None]) & ((seg[None] == 0) | (seg[None] == seg[:, None]))
  nq, nk = -(-t // bq), -(-t // bk)
  padded = np.zeros((nq * bq, nk * bk), bool)
  padded[:t, :t] = vis
  needed = padded.reshape(nq, bq, nk, bk).any(axis=(1, 3))
  counts = pallas_gpu.block_counts(p, l, n, bq, bk)
  assert counts["visited_blocks"] == needed.sum()
  causal = sum(int((np.arange(nk) * bk <= min(i * bq + bq, t) - 1).sum()) for i in range(nq))
  assert counts["total_blocks"] == causal


@pytest.mark.parametrize("p,n,l,group,blocks,window,softcap,prefix_kv", [
    (17, 4, 7, 2, (8, 16), None, None, False),
    (9, 3, 10, 1, (16, 8), 6, None, False),
    (5, 3, 8, 2, (8, 8), None, 2.0, False),
    (11, 3, 6, 2, (8, 16), 5, 3.0, True),
    (13, 3, 9, 3, (8, 8), None, None, False),  # a group of 3 (SmolLM2's 9 / 3 heads): not a power of two
])
def test_gradients_match_reference(p, n, l, group, blocks, window, softcap, prefix_kv):
  """The Pallas backward (dq kernel, dkv kernel) on ragged items, GQA, windows, soft-capping, a cached prefix."""
  rng = np.random.default_rng(p * 10 + n)
  b, kh = 2, 2
  layout = _layout(rng, b, p, l, n)
  q, k, v = _qkv(rng, b, layout.row_len - (p if prefix_kv else 0), kh * group, kh, 12)
  pkv = PrefixKV(*_qkv(rng, 1, p, kh, kh, 12)[1:]) if prefix_kv else None
  options = KernelOptions(gpu_block_q=blocks[0], gpu_block_kv=blocks[1], kernel_interpret=True)
  kernel_grads.assert_gradients_match_reference(pallas_gpu.attend, q, k, v, layout, pkv, options, window, softcap)


@pytest.mark.parametrize("p,l,n,bq,bk,offset", [(17, 7, 5, 8, 8, 0), (5, 3, 9, 4, 8, 0), (33, 20, 4, 16, 4, 0),
                                                (1, 1, 30, 8, 8, 0), (17, 7, 5, 8, 16, 17), (6, 0, 0, 4, 4, 0)])
def test_dkv_q_block_ranges_cover_every_visible_pair(p, l, n, bq, bk, offset):
  """The backward's dkv kernel visits, per kv block, the q blocks [q_lo, q_hi): every visible (query, key) pair
  lies in them; a block of prefix padding has none, and later items skip an earlier item's blocks."""
  rng = np.random.default_rng(p + n)
  layout = _layout(rng, 1, p, l, n)
  seg_K = np.asarray(layout.segment_ids())[0]
  s = layout.row_len
  vis_TxK = np.asarray(reference.visibility(layout.segment_ids()[:, offset:], layout.segment_ids(), offset))[0]
  t = s - offset
  nq, nk = -(-t // bq), -(-s // bk)
  k_first = np.arange(nk) * bk
  q_lo, q_hi = pallas_gpu._q_block_bounds(np, p, l, k_first, np.minimum(k_first + bk, s) - 1,
                                          int(layout.prefix_valid_B[0]), offset, s, bq, nq)
  for kb in range(nk):
    q_blocks = np.flatnonzero(vis_TxK[:, kb * bk:(kb + 1) * bk].any(axis=1)) // bq
    if q_blocks.size:
      assert q_lo[kb] <= q_blocks.min() and q_blocks.max() < q_hi[kb], kb
    if (kb + 1) * bk <= p and not (seg_K[kb * bk:(kb + 1) * bk] >= 0).any():  # prefix padding only
      assert q_hi[kb] == q_lo[kb], kb
  if n > 1 and l >= bk:  # a later item's q blocks skip the first item's whole kv blocks
    assert (q_hi - q_lo).sum() < sum(nq - kb * bk // bq for kb in range(nk))


@pytest.mark.parametrize("dtype,window,softcap,group", [(jnp.float32, None, None, 2), (jnp.bfloat16, 8, 30.0, 2),
                                                       (jnp.bfloat16, None, None, 3)])
def test_backward_lowers_to_triton(dtype, window, softcap, group):
  """Lowered for CUDA on this host (Pallas to Triton IR; no GPU, no PTX compile): the gradient holds the forward,
  dq and dkv Triton calls, with dk and dv one per kv head in the keys' dtype; the forward alone holds one."""
  layout = SegmentLayout(jnp.array([20, 13], jnp.int32), jnp.array([[9, 16, 3], [16, 0, 7]], jnp.int32), 32, 16, 3)
  options = KernelOptions(gpu_block_q=32, gpu_block_kv=32)
  attend = functools.partial(pallas_gpu.attend, layout=layout, options=options, window=window, softcap=softcap)
  loss = lambda q, k, v: attend(q, k, v).astype(jnp.float32).sum()
  q, kv = jax.ShapeDtypeStruct((2, 80, 2 * group, 64), dtype), jax.ShapeDtypeStruct((2, 80, 2, 64), dtype)

  lowered = lambda fn: jax.jit(fn).trace(q, kv, kv).lower(lowering_platforms=("cuda",)).as_text()

  def calls(text):
    return text.count("__gpu$xla.gpu.triton"), sorted(set(re.findall(r"packed_flash_\w+", text)))
  text = lowered(jax.grad(loss, argnums=(0, 1, 2)))
  assert calls(text) == (3, ["packed_flash_dkv", "packed_flash_dq", "packed_flash_forward"])
  dkv_call = next(line for line in text.splitlines() if "custom_call" in line and '"packed_flash_dkv"' in line)
  per_kv_head = f"tensor<2x96x2x64x{'bf16' if dtype == jnp.bfloat16 else 'f32'}>"
  assert dkv_call.split("->")[-1].strip() == f"({per_kv_head}, {per_kv_head})", dkv_call  # no per-q-head f32 copy
  assert calls(lowered(attend)) == (1, ["packed_flash_forward"])


@pytest.mark.parametrize("warps,stages,want", [(0, 2, (4, 2)), (8, 3, (8, 3)), (3, 2, None), (4, 0, None)])
def test_warps_and_stages_reach_the_triton_call_or_are_refused(warps, stages, want):
  """gpu_num_warps (0: 4 at head_dim 64) and gpu_num_stages are the Triton call's settings; others are refused."""
  layout = SegmentLayout(jnp.array([20, 13], jnp.int32), jnp.array([[9, 16, 3], [16, 0, 7]], jnp.int32), 32, 16, 3)
  options = KernelOptions(gpu_block_q=32, gpu_block_kv=32, gpu_num_warps=warps, gpu_num_stages=stages)
  attend = functools.partial(pallas_gpu.attend, layout=layout, options=options)
  q, kv = jax.ShapeDtypeStruct((2, 80, 4, 64), jnp.float32), jax.ShapeDtypeStruct((2, 80, 2, 64), jnp.float32)
  lower = lambda: jax.jit(attend).trace(q, kv, kv).lower(lowering_platforms=("cuda",)).as_text()
  if want is None:
    with pytest.raises(ValueError, match="gpu_num_warps"):
      lower()
    return
  line = next(l for l in lower().splitlines() if "custom_call" in l and "packed_flash_forward" in l)
  assert (int(re.search(r"num_warps = (\d+)", line)[1]), int(re.search(r"num_stages = (\d+)", line)[1])) == want
