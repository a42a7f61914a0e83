"""Splash attention (interpret mode on CPU) against the dense reference kernel."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from layers.kernels import reference, splash
from layers.kernels.base import KernelOptions, PrefixKV, SegmentLayout
from maxscore.bench import kernel_grads

# Interpret mode needs block_kv to be a multiple of 128; block_q may be small.
_OPTIONS = KernelOptions(splash_block_q=32, splash_block_kv=128, kernel_interpret=True)


def _case(seed, batch, prefix_len, num_slots, slot_len, heads, kv_heads, head_dim=8, with_prefix_kv=False):
  """Random q/k/v, a layout with random prefix padding and item lengths (0 and L included)."""
  rng = np.random.default_rng(seed)
  prefix_valid_B = rng.integers(1, prefix_len + 1, size=batch)
  prefix_valid_B[0] = prefix_len
  slot_valid_BxN = rng.integers(0, slot_len + 1, size=(batch, num_slots))
  if num_slots:
    slot_valid_BxN[0, 0] = slot_len
  if num_slots > 1:
    slot_valid_BxN[-1, 1] = 0
  layout = SegmentLayout(jnp.asarray(prefix_valid_B, jnp.int32), jnp.asarray(slot_valid_BxN, jnp.int32),
                         prefix_len, slot_len, num_slots)
  t = slot_len * num_slots if with_prefix_kv else layout.row_len
  normal = lambda *shape: jnp.asarray(rng.standard_normal(shape, np.float32))
  q = normal(batch, t, heads, head_dim)
  k, v = normal(batch, t, kv_heads, head_dim), normal(batch, t, kv_heads, head_dim)
  prefix_kv = None
  if with_prefix_kv:
    prefix_kv = PrefixKV(normal(1, prefix_len, kv_heads, head_dim), normal(1, prefix_len, kv_heads, head_dim))
  return q, k, v, layout, prefix_kv


def _check(q, k, v, layout, prefix_kv, options=_OPTIONS, atol=2e-5):
  out = jax.jit(functools.partial(splash.attend, options=options))(q, k, v, layout, prefix_kv)
  ref = jax.jit(functools.partial(reference.attend, options=options))(q, k, v, layout, prefix_kv)
  assert out.shape == ref.shape and out.dtype == q.dtype
  assert bool(jnp.isfinite(out).all()), "padded positions must stay finite"
  # Padded query positions are ignored by callers (splash lets them see only padding).
  real_BxT = layout.segment_ids(include_prefix=prefix_kv is None) >= 0
  err = np.abs(np.asarray(out, np.float32) - np.asarray(ref, np.float32))
  assert float(np.where(np.asarray(real_BxT)[:, :, None, None], err, 0).max()) < atol


@pytest.mark.parametrize("prefix_len,num_slots,slot_len,heads,kv_heads", [
    (1, 1, 5, 2, 2),
    (1, 5, 6, 4, 1),
    (17, 5, 7, 4, 2),
    (17, 1, 12, 4, 4),
    (128, 5, 9, 4, 1),
    (128, 1, 3, 2, 1),
])
def test_matches_reference(prefix_len, num_slots, slot_len, heads, kv_heads):
  _check(*_case(prefix_len + num_slots, 2, prefix_len, num_slots, slot_len, heads, kv_heads))


def test_skipped_item_tiles_match_reference():
  """Long items: whole kv tiles of earlier items are skipped for later items' q-blocks."""
  options = KernelOptions(splash_block_q=64, splash_block_kv=128, kernel_interpret=True)
  stats = splash.block_skip_stats(1, 128, 4, 64, 128)
  causal_tiles = sum((i * 64 + 63) // 128 + 1 for i in range(9))  # 25 of the 9x5 grid
  assert stats["active_blocks"] < causal_tiles
  _check(*_case(9, 2, 1, 4, 128, 2, 1), options=options)


def test_plain_causal_layout():
  q, k, v, _, _ = _case(3, 2, 40, 0, 1, 4, 2)
  _check(q, k, v, SegmentLayout.causal(jnp.array([40, 23]), 40), None)


@pytest.mark.parametrize("prefix_len,num_slots,slot_len,heads,kv_heads", [
    (17, 5, 7, 4, 2),
    (128, 5, 9, 4, 1),
    (1, 1, 4, 2, 2),
])
def test_prefix_kv_matches_reference(prefix_len, num_slots, slot_len, heads, kv_heads):
  _check(*_case(7 + prefix_len, 2, prefix_len, num_slots, slot_len, heads, kv_heads, with_prefix_kv=True))


def test_bfloat16_keeps_dtype():
  q, k, v, layout, _ = _case(11, 2, 17, 5, 7, 4, 2)
  bf = lambda x: x.astype(jnp.bfloat16)
  _check(bf(q), bf(k), bf(v), layout, None, atol=5e-2)


@pytest.mark.slow
@pytest.mark.parametrize("with_prefix_kv", [False, True])
def test_long_prefix_matches_reference(with_prefix_kv):
  q, k, v, layout, prefix_kv = _case(5, 2, 700, 5, 40, 4, 2, with_prefix_kv=with_prefix_kv)
  _check(q, k, v, layout, prefix_kv, KernelOptions(splash_block_q=128, splash_block_kv=128, kernel_interpret=True))


def test_mask_is_the_layout_rule():
  """The computable mask equals the reference visibility when nothing is padded."""
  layout = SegmentLayout(jnp.array([6]), jnp.array([[4, 4, 4]]), 6, 4, 3)
  seg_BxT = layout.segment_ids()
  expected = np.asarray(reference.visibility(seg_BxT, seg_BxT, 0)[0])
  assert np.array_equal(splash.MultiItemMask((18, 18), 6, 4)[:, :], expected)
  offset_mask = splash.MultiItemMask((12, 18), 6, 4, offset=6)[:, :]
  assert np.array_equal(offset_mask, expected[6:])


def test_mask_equality_and_hash():
  a = splash.MultiItemMask((256, 256), 17, 7)
  assert a == splash.MultiItemMask((256, 256), 17, 7)
  assert hash(a) == hash(splash.MultiItemMask((256, 256), 17, 7))
  assert len({a, splash.MultiItemMask((256, 256), 17, 7)}) == 1
  for other in (splash.MultiItemMask((256, 256), 18, 7), splash.MultiItemMask((256, 256), 17, 8),
                splash.MultiItemMask((128, 256), 17, 7), splash.MultiItemMask((256, 256), 17, 7, offset=17)):
    assert a != other
  assert a != object()


def test_block_skip_stats_hand_checked():
  # P=256, two items of L=128, tiles 128x128: a 4x4 grid. Prefix q-blocks see the causal
  # prefix (1 + 2 tiles); each item q-block sees both prefix tiles and its own diagonal tile,
  # and item 2 skips item 1's tile. Diagonal tiles are the partial ones.
  stats = splash.block_skip_stats(256, 128, 2, 128, 128)
  assert (stats["total_blocks"], stats["active_blocks"], stats["partial_blocks"]) == (16, 9, 4)


def test_block_skip_stats_skips_most_tiles_for_many_items():
  stats = splash.block_skip_stats(300, 20, 100, 128, 128)
  causal_tiles = 18 * 19 // 2  # 2300 tokens padded to 18 tiles of 128
  assert stats["total_blocks"] == 18 * 18
  assert stats["partial_blocks"] <= stats["active_blocks"] < causal_tiles


@pytest.mark.parametrize("prefix_len,num_slots,slot_len,heads,kv_heads,window,softcap", [
    (17, 5, 7, 4, 2, None, None),
    (17, 4, 9, 2, 1, 6, None),
    (5, 3, 8, 2, 2, None, 2.0),
    (9, 3, 6, 4, 2, 5, 3.0),
])
def test_gradients_match_reference(prefix_len, num_slots, slot_len, heads, kv_heads, window, softcap):
  """splash's Pallas backward (dq and dkv kernels) on ragged items, sliding windows and soft-capping."""
  q, k, v, layout, _ = _case(prefix_len * num_slots, 2, prefix_len, num_slots, slot_len, heads, kv_heads)
  kernel_grads.assert_gradients_match_reference(splash.attend, q, k, v, layout, None, _OPTIONS, window, softcap)


def test_gradients_with_cached_prefix_match_reference():
  q, k, v, layout, prefix_kv = _case(4, 2, 17, 4, 7, 4, 2, with_prefix_kv=True)
  kernel_grads.assert_gradients_match_reference(splash.attend, q, k, v, layout, prefix_kv, _OPTIONS)
