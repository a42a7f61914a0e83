"""Sliding windows and logit soft-capping in every attention kernel, against the dense reference.

The reference's window is checked against the serial definition (docs/ARCHITECTURE.md section 1): a query
token sees a key only within W serial positions, the packed layout keeping serial positions.
Windows: shorter than the prefix and an item, equal to the item slot, equal to the prefix.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from layers.kernels import KernelOptions, PrefixKV, SegmentLayout
from layers.kernels import pallas_gpu, reference, shared_prefix, splash

P, N, L = 8, 3, 5
OPTIONS = {
    "shared_prefix": KernelOptions(),
    "splash": KernelOptions(splash_block_q=16, splash_block_kv=128, kernel_interpret=True),
    "pallas_gpu": KernelOptions(gpu_block_q=8, gpu_block_kv=8, kernel_interpret=True),
}
MODULES = {"shared_prefix": shared_prefix, "splash": splash, "pallas_gpu": pallas_gpu}


def _case(seed, with_prefix_kv, heads=4, kv_heads=2, h=8):
  rng = np.random.default_rng(seed)
  layout = SegmentLayout(jnp.asarray([P, 5], jnp.int32), jnp.asarray([[L, 2, 0], [4, L, 1]], jnp.int32), P, L, N)
  t = N * L if with_prefix_kv else layout.row_len
  normal = lambda *s: jnp.asarray(rng.standard_normal(s, np.float32) * 2)  # big logits: the soft-cap bends
  q, k, v = normal(2, t, heads, h), normal(2, t, kv_heads, h), normal(2, t, kv_heads, h)
  cache = PrefixKV(normal(1, P, kv_heads, h), normal(1, P, kv_heads, h)) if with_prefix_kv else None
  return q, k, v, layout, cache


def _serial_visibility(layout: SegmentLayout, window: int) -> np.ndarray:
  """[B, T, T] from first principles: each token's serial sequence and serial position."""
  valid, slots = np.asarray(layout.prefix_valid_B), np.asarray(layout.slot_valid_BxN)
  t = layout.row_len
  out = np.zeros((len(valid), t, t), bool)
  for b in range(len(valid)):
    where = {}  # row index -> (slot or -1, serial position)
    for i in range(valid[b]):
      where[i] = (-1, i)
    for n in range(N):
      for j in range(slots[b, n]):
        where[P + n * L + j] = (n, valid[b] + j)
    for qi, (qs, qp) in where.items():
      for ki, (ks, kp) in where.items():
        out[b, qi, ki] = (ks == -1 or ks == qs) and kp <= qp and qp - kp < window
  return out


@pytest.mark.parametrize("window", [3, 5, 8])
def test_reference_window_is_the_serial_rule(window):
  _, _, _, layout, _ = _case(0, False)
  seg = layout.segment_ids()
  pos = layout.serial_positions()
  got = np.asarray(reference.visibility(seg, seg, 0, pos, pos, window)) & (np.asarray(seg) >= 0)[:, :, None]
  np.testing.assert_array_equal(got, _serial_visibility(layout, window))


@pytest.mark.parametrize("kernel", sorted(MODULES))
@pytest.mark.parametrize("window,softcap,with_prefix_kv", [
    (3, 2.0, False),    # window shorter than the prefix and than an item, with soft-capping
    (5, None, True),    # window == item slot, prefix from a cache
    (8, None, False),   # window == prefix
])
def test_kernel_equals_reference(kernel, window, softcap, with_prefix_kv):
  q, k, v, layout, cache = _case(window or 1, with_prefix_kv)
  opts = OPTIONS[kernel]
  kw = dict(window=window, softcap=softcap)
  out = jax.jit(functools.partial(MODULES[kernel].attend, options=opts, **kw))(q, k, v, layout, cache)
  want = reference.attend(q, k, v, layout, cache, options=KernelOptions(), **kw)
  assert bool(jnp.isfinite(out).all())
  real = np.asarray(layout.segment_ids(include_prefix=cache is None)) >= 0
  np.testing.assert_allclose(np.asarray(out)[real], np.asarray(want)[real], atol=2e-5, rtol=0)
  if window is not None:  # the window changes the result (the test can fail)
    unwindowed = reference.attend(q, k, v, layout, cache, options=KernelOptions(), softcap=softcap)
    assert np.abs(np.asarray(unwindowed)[real] - np.asarray(want)[real]).max() > 1e-2


def test_splash_window_mask_is_static_on_right_aligned_prefix():
  """The splash mask with a window equals the serial rule once each prefix ends at index P."""
  mask = np.asarray(splash.MultiItemMask((P + N * L, P + N * L), P, L, window=4)[:, :])
  full = SegmentLayout(jnp.asarray([P], jnp.int32), jnp.full((1, N), L, jnp.int32), P, L, N)
  np.testing.assert_array_equal(mask, _serial_visibility(full, 4)[0])


@pytest.mark.parametrize("p,lens,window", [(7, [3, 0, 5, 5], 4), (16, [4] * 6, 2), (5, [9, 1], 5), (3, [2], 100)])
def test_cost_model_counts_the_windowed_mask(p, lens, window):
  """Windowed attention pairs (packed and serial) are exactly what the windowed mask allows."""
  from maxscore.scoring import cost_model
  layout = SegmentLayout(jnp.asarray([p]), jnp.asarray([lens]), p, max(lens), len(lens))
  seg, pos = layout.segment_ids(), layout.serial_positions()
  mask = np.asarray(reference.visibility(seg, seg, 0, pos, pos, window))[0] & (np.asarray(seg)[0] >= 0)[:, None]
  assert mask.sum() == cost_model.attention_pairs(p, lens, window)
  serial = sum(int(np.sum((np.arange(n)[:, None] >= np.arange(n)) & (np.arange(n)[:, None] - np.arange(n) < window)))
               for n in (p + l for l in lens))
  assert serial == cost_model.serial_attention_pairs(p, lens, window)


def test_model_flops_sum_local_and_global_layers():
  from layers.config import ModelConfig
  from maxscore.scoring import cost_model
  kw = dict(vocab_size=10, hidden_size=4, num_layers=3, num_heads=2, num_kv_heads=1, head_dim=2, mlp_dim=8)
  glob = cost_model.model_flops(ModelConfig(**kw), 9, [6, 2])
  mixed = cost_model.model_flops(ModelConfig(layer_pattern="LLG", sliding_window=3, **kw), 9, [6, 2])
  per_pair = 4 * 2 * 2
  assert glob["attention"] == 3 * per_pair * cost_model.attention_pairs(10, [6, 2])
  assert mixed["attention"] == per_pair * (cost_model.attention_pairs(10, [6, 2]) +
                                           2 * cost_model.attention_pairs(10, [6, 2], 3))
