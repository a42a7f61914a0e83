"""The shared_prefix kernel's own-item attention in query blocks: the reference kernel's result and the
serial scores, for every block edge case, and bounded temporaries at the long-passage geometry.

Small blocks (`_OWN_BLOCK` patched to 4) put many block edges into tiny items; one case keeps the real
block size with items longer than it."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from layers.kernels import KernelOptions, PrefixKV, SegmentLayout
from layers.kernels import reference, shared_prefix

OPTS = KernelOptions(max_reference_len=1 << 20)


@pytest.fixture
def small_blocks(monkeypatch):
  monkeypatch.setattr(shared_prefix, "_OWN_BLOCK", 4)


def _case(seed, b, p, n, l, slot_valid, heads=4, kv_heads=2, h=8, prefix_kv=False, scale=1.0, dtype=jnp.float32):
  rng = np.random.default_rng(seed)
  t = (0 if prefix_kv else p) + n * l
  arr = lambda *s: jnp.asarray(rng.standard_normal(s) * scale, dtype)
  q, k, v = arr(b, t, heads, h), arr(b, t, kv_heads, h), arr(b, t, kv_heads, h)
  prefix_valid = rng.integers(max(1, p // 2), p + 1, b)
  layout = SegmentLayout(jnp.asarray(prefix_valid, jnp.int32), jnp.asarray(slot_valid, jnp.int32), p, l, n)
  cache = PrefixKV(arr(1, p, kv_heads, h), arr(1, p, kv_heads, h)) if prefix_kv else None
  return q, k, v, layout, cache


def _check(q, k, v, layout, cache, atol=2e-5, **kw):
  out = jax.jit(functools.partial(shared_prefix.attend, options=OPTS, **kw))(q, k, v, layout, cache)
  want = reference.attend(q, k, v, layout, cache, options=OPTS, **kw)
  real = np.asarray(layout.segment_ids(include_prefix=cache is None)) >= 0
  assert bool(jnp.isfinite(out.astype(jnp.float32)).all())
  got, want = (np.asarray(x.astype(jnp.float32))[real] for x in (out, want))
  np.testing.assert_allclose(got, want, atol=atol, rtol=0)


def test_query_blocks_cover_every_row_and_never_read_above_the_diagonal(small_blocks):
  for l, window in ((11, None), (1, None), (8, None), (13, 3), (4, 2)):
    blocks = shared_prefix._query_blocks(l, window)
    assert [s for _, s, _ in blocks] == sorted(s for _, s, _ in blocks) and blocks[0][1] == 0
    assert all(e == s2 for (_, _, e), (_, s2, _) in zip(blocks, blocks[1:])) and blocks[-1][2] == l
    assert all(e - s <= 4 for _, s, e in blocks)  # keys never beyond the block's own end
    if window is not None:  # keys no row of the block can see are not read
      assert all(lo == max(0, s - window + 1) for lo, s, _ in blocks)
  assert len(shared_prefix._query_blocks(11, None)) == 3  # 11 = 4 + 4 + 3: not a multiple of the block


@pytest.mark.parametrize("prefix_kv", [False, True])
@pytest.mark.parametrize("l,slot_valid", [
    (11, [[11, 7, 0, 3], [5, 11, 1, 10]]),   # not a multiple of the block, mixed lengths with padding
    (1, [[1, 0, 1, 1], [0, 1, 1, 0]]),        # items of one token (and empty ones)
    (8, [[8, 8, 4, 5], [8, 1, 8, 2]]),        # a multiple of the block
])
def test_blocked_equals_reference(small_blocks, prefix_kv, l, slot_valid):
  _check(*_case(l, 2, 13, 4, l, slot_valid, prefix_kv=prefix_kv))


@pytest.mark.parametrize("window,softcap", [(3, None), (6, 2.0), (None, 2.0), (20, None)])
@pytest.mark.parametrize("prefix_kv", [False, True])
def test_blocked_with_window_and_softcap_equals_reference(small_blocks, window, softcap, prefix_kv):
  """Windows shorter than an item (3, 6), longer than it (20), with and without soft-capping."""
  case = _case(window or 7, 2, 9, 3, 13, [[13, 6, 0], [2, 13, 9]], prefix_kv=prefix_kv, scale=2.0)
  _check(*case, window=window, softcap=softcap)
  if window is not None and window < 13:  # the window changes the result: the check can fail
    q, k, v, layout, cache = case
    a = reference.attend(q, k, v, layout, cache, options=OPTS, window=window, softcap=softcap)
    b = reference.attend(q, k, v, layout, cache, options=OPTS, softcap=softcap)
    assert float(jnp.abs(a - b).max()) > 1e-2


def test_real_block_size_with_items_longer_than_a_block():
  l = shared_prefix._OWN_BLOCK + 5
  assert len(shared_prefix._query_blocks(l, None)) == 2
  _check(*_case(0, 1, 7, 2, l, [[l, l - 40]], heads=2, kv_heads=1, prefix_kv=True))


def test_bf16_inputs_match_the_reference_to_bf16_rounding(small_blocks):
  """The kernel computes in float32 whatever its inputs: bf16 in, it matches the reference kernel on the
  same bf16 inputs to the output's rounding (bf16 has 8 significant bits; outputs are below ~3)."""
  case = _case(3, 2, 13, 4, 11, [[11, 7, 0, 3], [5, 11, 1, 10]], dtype=jnp.bfloat16)
  _check(*case, atol=2 ** -6)


@pytest.mark.parametrize("algorithm", ["packed", "prefill_extend"])
def test_scorer_reproduces_serial_with_small_blocks(hf_checkpoints, small_blocks, algorithm):
  from maxscore import Scorer
  _, _, ckpt = hf_checkpoints("qwen3_kv2_tied")
  scorer = Scorer.from_checkpoint(ckpt, attention="shared_prefix", separator_token_id=3, extend_batch_size=2)
  rng = np.random.default_rng(7)
  query = rng.integers(0, 520, 9).tolist()
  items = [rng.integers(0, 520, n).tolist() for n in (13, 1, 0, 9, 4, 11)]
  want = scorer.score(query, items, [5, 17], algorithm="serial").scores
  got = scorer.score(query, items, [5, 17], algorithm=algorithm).scores
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_bf16_scores_with_small_blocks_stay_within_the_gated_bounds(hf_checkpoints, small_blocks):
  """bf16 against float32 on the same weights, items spanning several blocks: within the bounds
  tests/test_precision.py holds (|d log-prob| < 0.08, |d score| < 0.02, Kendall tau > 0.9)."""
  from maxscore import Scorer
  from maxscore.bench import precision
  _, _, ckpt = hf_checkpoints("qwen3_kv2_tied")
  ref = Scorer.from_checkpoint(ckpt, attention="shared_prefix", separator_token_id=3)
  bf16 = Scorer(ref.config.replace(dtype="bfloat16", weight_dtype="bfloat16"), ref.runner.params, mesh=None)
  r = precision.compare_on_random_tokens(ref, bf16, 20, 12, 14, [5, 17])
  assert 0 < r["max_abs_logprob"] < 0.08, r
  assert r["max_abs_score"] < 0.02, r
  assert r["kendall_tau"] > 0.9, r


# The extend geometry of the long-passage workload (32-token query + separator -> P=48; 100 items of 512
# tokens -> extend chunks of 64 slots) at Qwen3-0.6B's attention widths.
LONG_P, LONG_N, LONG_L, HEADS, KV_HEADS, HEAD_DIM = 48, 64, 512, 16, 8, 128


def test_extend_attention_temporaries_at_long_passages_stay_bounded():
  """XLA's memory analysis of the compiled extend attention: its temporaries stay within a few copies of
  the queries plus the step budget, never an [N, H, L, L] score array (1 GiB per chunk here)."""
  sds = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
  t = LONG_N * LONG_L
  layout = SegmentLayout(jax.ShapeDtypeStruct((1,), jnp.int32), jax.ShapeDtypeStruct((1, LONG_N), jnp.int32),
                         LONG_P, LONG_L, LONG_N)
  cache = PrefixKV(sds(1, LONG_P, KV_HEADS, HEAD_DIM), sds(1, LONG_P, KV_HEADS, HEAD_DIM))
  fn = jax.jit(lambda q, k, v, lay, c: shared_prefix.attend(q, k, v, lay, c, options=OPTS))
  compiled = fn.lower(sds(1, t, HEADS, HEAD_DIM), sds(1, t, KV_HEADS, HEAD_DIM), sds(1, t, KV_HEADS, HEAD_DIM),
                      layout, cache).compile()
  temp = compiled.memory_analysis().temp_size_in_bytes
  q_bytes = 4 * t * HEADS * HEAD_DIM
  scores_nhll = 4 * LONG_N * HEADS * LONG_L * LONG_L
  assert temp < 3 * q_bytes + 4 * shared_prefix._TILE_BYTES < scores_nhll, (temp, q_bytes, scores_nhll)


@pytest.mark.slow
def test_compiled_extend_program_at_long_passages_fits_the_memory_goal():
  """The whole extend program (Qwen3-0.6B dims, one layer) that prefill_extend compiles for 32 x 100 x 512:
  its temporaries, read from XLA's memory analysis, stay under 2 GiB (the workload's RSS goal beyond the
  weights)."""
  from maxscore.bench import BenchOptions, bench_config
  from maxscore.scoring.scorer import Scorer
  scorer = Scorer.from_config(bench_config(BenchOptions(num_layers=1)).replace(algorithm="prefill_extend"))
  scorer.warmup([(33, 100, 512)])
  extend = [p for key, p in scorer.runner.programs.items() if key[0].startswith("extend")]
  assert extend and all(p.slot_len == 512 for p in extend)
  temps = [p.compiled.memory_analysis().temp_size_in_bytes for p in extend]
  assert max(temps) < 2 << 30, temps
