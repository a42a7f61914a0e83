"""Every attention kernel equals the reference kernel; the shared-prefix kernel never builds [T, T]."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from layers.kernels import KernelOptions, PrefixKV, SegmentLayout
from layers.kernels import reference, shared_prefix

OPTS = KernelOptions(max_reference_len=1 << 20)


def random_case(seed, b, p, n, l, heads, kv_heads, h=16, prefix_kv=False):
  rng = np.random.default_rng(seed)
  t = (0 if prefix_kv else p) + n * l
  arr = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
  q, k, v = arr(b, t, heads, h), arr(b, t, kv_heads, h), arr(b, t, kv_heads, h)
  prefix_valid = rng.integers(max(1, p // 2), p + 1, b)  # padding at the end of the prefix
  slot_valid = rng.integers(0, l + 1, (b, n))
  slot_valid[:, :1] = l  # a full slot and (with luck) empty ones
  layout = SegmentLayout(jnp.asarray(prefix_valid, jnp.int32), jnp.asarray(slot_valid, jnp.int32), p, l, n)
  cache = PrefixKV(arr(1, p, kv_heads, h), arr(1, p, kv_heads, h)) if prefix_kv else None
  return q, k, v, layout, cache


def check_equal(out, want, layout, prefix_kv):
  seg = np.asarray(layout.segment_ids(include_prefix=not prefix_kv))
  valid = seg >= 0  # outputs at padding positions are unspecified (but finite)
  assert np.all(np.isfinite(np.asarray(out)))
  np.testing.assert_allclose(np.asarray(out)[valid], np.asarray(want)[valid], atol=2e-5, rtol=0)


GEOMETRIES = [(p, n, l) for p in (1, 17, 128, 700) for n, l in ((1, 9), (5, 6), (64, 3))]


@pytest.mark.parametrize("p,n,l", GEOMETRIES)
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (8, 2)])
def test_shared_prefix_equals_reference(p, n, l, heads, kv_heads):
  q, k, v, layout, _ = random_case(p * 31 + n + heads, 2, p, n, l, heads, kv_heads)
  out = jax.jit(lambda *a: shared_prefix.attend(*a, options=OPTS))(q, k, v, layout)
  check_equal(out, reference.attend(q, k, v, layout, options=OPTS), layout, False)


@pytest.mark.parametrize("p,n,l", [(1, 3, 4), (17, 5, 6), (300, 64, 3)])
def test_shared_prefix_with_cached_prefix_equals_reference(p, n, l):
  q, k, v, layout, cache = random_case(p + n, 1, p, n, l, 8, 2, prefix_kv=True)
  out = shared_prefix.attend(q, k, v, layout, cache, options=OPTS)
  check_equal(out, reference.attend(q, k, v, layout, cache, options=OPTS), layout, True)


@pytest.mark.parametrize("window,softcap", [(None, None), (9, None), (None, 5.0)])
def test_shared_prefix_batch_in_steps_equals_reference_and_all_rows_at_once(monkeypatch, window, softcap):
  """A small tile budget splits 8 rows into steps of 2 (as 64-request batches split at the real
  budget): the result is that of all rows at once, and of the reference kernel."""
  q, k, v, layout, _ = random_case(5, 8, 40, 6, 5, 4, 2)
  whole = shared_prefix.attend(q, k, v, layout, options=OPTS, window=window, softcap=softcap)
  monkeypatch.setattr(shared_prefix, "_TILE_BYTES", 2 * 4 * 4 * 40 * 40)
  assert shared_prefix._batch_chunk(8, 4 * 4 * 40 * 40) == 2
  stepped = jax.jit(lambda *a: shared_prefix.attend(*a, options=OPTS, window=window, softcap=softcap))(q, k, v, layout)
  np.testing.assert_allclose(np.asarray(stepped), np.asarray(whole), atol=1e-6, rtol=0)
  check_equal(stepped, reference.attend(q, k, v, layout, options=OPTS, window=window, softcap=softcap), layout, False)


def test_plain_causal_layout():
  q, k, v, _, _ = random_case(0, 2, 40, 0, 0, 4, 2)
  layout = SegmentLayout.causal(jnp.array([40, 23]), 40)
  check_equal(shared_prefix.attend(q, k, v, layout, options=OPTS), reference.attend(q, k, v, layout, options=OPTS),
              layout, False)


def test_shared_prefix_memory_at_32k_tokens_is_far_below_t_squared():
  p, n, l, heads, kv, h = 2048, 1500, 20, 4, 2, 64
  t = p + n * l
  sds = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
  layout = SegmentLayout(jax.ShapeDtypeStruct((1,), jnp.int32), jax.ShapeDtypeStruct((1, n), jnp.int32), p, l, n)
  compiled = jax.jit(lambda q, k, v, lay: shared_prefix.attend(q, k, v, lay, options=OPTS)).lower(
      sds(1, t, heads, h), sds(1, t, kv, h), sds(1, t, kv, h), layout).compile()
  temp = compiled.memory_analysis().temp_size_in_bytes
  one_t_squared = t * t * 4
  assert t >= 32_000 and temp < one_t_squared / 10, (temp, one_t_squared)


def test_reference_refuses_long_rows_with_a_clear_error():
  t = 9000
  layout = SegmentLayout.causal(jnp.array([t]), t)
  x = jax.ShapeDtypeStruct((1, t, 2, 8), jnp.float32)
  with pytest.raises(ValueError, match="refuses a row of 9000 tokens.*max_reference_len=8192.*shared_prefix"):
    jax.eval_shape(lambda q: reference.attend(q, q, q, layout, options=KernelOptions()), x)


@pytest.mark.parametrize("kernel,extra", [
    ("shared_prefix", {}),
    ("splash", dict(kernel_interpret=True, splash_block_q=32, splash_block_kv=128)),
    ("pallas_gpu", dict(kernel_interpret=True, gpu_block_q=16, gpu_block_kv=16)),
])
@pytest.mark.parametrize("algorithm", ["packed", "prefill_extend"])
def test_scorer_with_each_kernel_reproduces_serial(hf_checkpoints, kernel, extra, algorithm):
  from maxscore import Scorer
  _, _, ckpt = hf_checkpoints("qwen3_kv2_tied")
  scorer = Scorer.from_checkpoint(ckpt, attention=kernel, separator_token_id=3, **extra)
  rng = np.random.default_rng(5)
  query = rng.integers(0, 520, 37).tolist()
  items = [rng.integers(0, 520, n).tolist() for n in (5, 0, 12, 3, 9)]
  labels = [5, 17, 300]
  want = scorer.score(query, items, labels, algorithm="serial").scores
  got = scorer.score(query, items, labels, algorithm=algorithm).scores
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kernel,extra", [
    ("reference", {}),
    ("shared_prefix", {}),
    ("splash", dict(kernel_interpret=True, splash_block_q=32, splash_block_kv=128)),
    ("pallas_gpu", dict(kernel_interpret=True, gpu_block_q=16, gpu_block_kv=16)),
])
def test_a_kernel_call_whose_output_is_unused_is_dead_code(kernel, extra):
  """flax's nn.scan (0.12.9 on) proves a layer's broadcast outputs loop-invariant by dead-code elimination of
  the traced body: a kernel call that survives it, used or not, fails every scanned model with "broadcasted
  variable has a data dependency on the scan body". A bare pallas_call is never eliminated (its DCE rule
  keeps every input); a jit around it is."""
  from jax._src.interpreters import partial_eval as pe

  from layers.kernels import get_kernel
  q, k, v, layout, _ = random_case(0, 1, 33, 3, 16, 4, 2, h=16)
  attend = get_kernel(kernel, KernelOptions(**extra))
  unused = lambda q, k, v: (attend(q, k, v, layout, None), jnp.zeros(()))[1]
  jaxpr = jax.make_jaxpr(unused)(q, k, v).jaxpr
  dced, used_inputs = pe.dce_jaxpr(jaxpr, [True])
  assert not any(used_inputs) and not dced.eqns, [e.primitive.name for e in dced.eqns]
