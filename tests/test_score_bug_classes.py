"""Three classes of bug the field's scoring engines shipped (sglang's issues), each ruled out for maxscore by a named
test against a real oracle:

- #26618, a prefix-cache hit shifts the multi-item delimiter positions: test_prefix_cache_hit_keeps_multi_item_positions
- #26629, positions past 65,535 overflow silently: test_rope_past_65535_matches_a_float64_oracle,
  test_decoder_past_65535_is_shift_invariant, test_layout_positions_past_65535_are_exact,
  test_default_limits_refuse_a_request_past_65535_positions and, end to end against serial,
  test_a_packed_row_and_a_prefix_past_65535_tokens_score_as_serial
- #26593, a kernel path gives every item the same score: test_no_kernel_path_gives_every_item_the_same_score,
  test_items_score_apart_unless_their_tokens_are_equal (a property over random item lists) and
  test_planted_faults_are_caught (a collapsed segment id, every score read at one index)

The model is tiny-qwen3 with random weights and its embedding table (the tied lm_head) scaled by EMBED_SCALE, and
scores are the softmax over three labels (apply_softmax=True: rows sum to 1), so they spread over most of [0, 1] and
a wrong score shows far above the 1e-5 parity tolerance tests/test_scoring.py and tests/test_kernels.py hold every
algorithm and kernel to.
"""

import dataclasses

import hypothesis
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st

from layers.decoder import Decoder
from layers.embeddings import apply_rope, rope_inv_freq
from layers.kernels import SegmentLayout, get_kernel
from maxscore import ScoreInputError, Scorer, load_config, parse_multi_item_sequence
from maxscore.config import BucketConfig
from maxscore.scoring import layout as layout_lib
from maxscore.scoring.layout import pack_rows, plan_rows
from maxscore.scoring.requests import make_request

ALGORITHMS = ("serial", "packed", "prefill_extend")
LABELS = [5, 17, 300]
DELIM = 3
ATOL = 1e-5  # the parity tolerance of tests/test_scoring.py (scores, float32) for every algorithm and kernel
EMBED_SCALE = 8.0
BUCKETS = ["batch_buckets=[1,8]", "item_count_buckets=[2,4,8]", "item_buckets=[8,16]", "prefix_buckets=[16,32]"]
# Every attention kernel that runs on CPU; the Pallas ones in interpret mode with blocks as tests/test_kernels.py's.
KERNELS = [
    ("reference", {}),
    ("shared_prefix", {}),
    ("splash", dict(kernel_interpret=True, splash_block_q=32, splash_block_kv=128)),
    ("pallas_gpu", dict(kernel_interpret=True, gpu_block_q=16, gpu_block_kv=16)),
]
POSITION_LIMIT = 65535  # the largest uint16 position


@pytest.fixture(scope="module")
def base():
  """(config, params): tiny-qwen3, random weights, the embedding table scaled so that scores spread."""
  config = load_config(["model_name=tiny-qwen3", "attention=reference"] + BUCKETS)
  scorer = Scorer.from_config(config, mesh=None)
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: x * EMBED_SCALE if "embedding" in jax.tree_util.keystr(path) else x, scorer.runner.params)
  return config, params


def make_scorer(base, attention="reference", **extra):
  config, params = base
  return Scorer(config.replace(attention=attention, **extra), params, mesh=None)


def random_tokens(rng, n):
  return rng.integers(10, 500, n).tolist()  # never the delimiter


@pytest.fixture(scope="module")
def oracle_case(base):
  """(query, items, serial scores with the reference kernel): distinct items, two of them of equal length."""
  rng = np.random.default_rng(3)
  query = random_tokens(rng, 9)
  items = [random_tokens(rng, n) for n in (5, 5, 2, 11, 1)]
  want = make_scorer(base).score(query, items, LABELS, apply_softmax=True, algorithm="serial",
                                 separator_token_id=DELIM).scores
  return query, items, want


def assert_items_distinguished(scores):
  """Every pair of items differs by far more than the tolerance (a same-score-for-all answer cannot pass)."""
  diff = np.abs(scores[:, None, :] - scores[None, :, :]).max(-1)
  off = diff[~np.eye(len(scores), dtype=bool)]
  assert off.min() > 100 * ATOL, diff


# --- sglang #26618: prefix-cache hits must not shift multi-item delimiter positions ----------------------------
def test_prefix_cache_hit_keeps_multi_item_positions(base):
  """sglang #26618 (a cached query prefix shifts the multi-item delimiter positions): the same query, parsed from
  sglang's `Q d I1 d ... In d` sequences with item lists of other counts and lengths, scored one after another by
  prefill_extend (the algorithm that reuses the cached prefix state; every call after the first is a cache hit),
  gives each list the scores a fresh scorer's serial algorithm (no cache, every seq_i = Q d I_i from scratch)
  gives, within 1e-5. The oracle is checked to tell a shifted item apart: without the delimiter, or with each item
  moved one position (the delimiter repeated), its scores move by more than ten times the
  tolerance."""
  rng = np.random.default_rng(7)
  query = random_tokens(rng, 11)
  lists = [[random_tokens(rng, n) for n in lens] for lens in ([5, 2], [1, 7, 3, 12, 4], [9], [2, 0, 6], [5, 2])]
  lists[-1] = lists[0]  # the first list again, now from the cache
  cached = make_scorer(base)
  oracle = make_scorer(base)
  first = None
  for calls, items in enumerate(lists, start=1):
    sequence = query + [DELIM] + [t for item in items for t in item + [DELIM]]
    q, parsed = parse_multi_item_sequence(sequence, DELIM)
    assert (q, parsed) == (query, items)
    got = cached.score(q, parsed, LABELS, apply_softmax=True, algorithm="prefill_extend", separator_token_id=DELIM)
    assert got.algorithm == "prefill_extend"
    assert (cached.prefix_cache.stats.misses, cached.prefix_cache.stats.hits) == (1, calls - 1)
    want = oracle.score(q, parsed, LABELS, apply_softmax=True, algorithm="serial", separator_token_id=DELIM).scores
    np.testing.assert_allclose(got.scores, want, atol=ATOL, rtol=0, err_msg=f"list {calls}")
    if first is None:
      first = got.scores
      no_delim = oracle.score(q, parsed, LABELS, apply_softmax=True, algorithm="serial", separator_token_id=None).scores
      shifted = oracle.score(q + [DELIM], parsed, LABELS, apply_softmax=True, algorithm="serial",
                             separator_token_id=DELIM).scores
      assert np.abs(no_delim - want).max(-1).min() > 10 * ATOL  # measured: 500x
      assert np.abs(shifted - want).max(-1).min() > 10 * ATOL  # measured: 35x
      assert_items_distinguished(want)
  np.testing.assert_array_equal(got.scores, first)  # the same list from a cache hit: the same numbers
  assert len(cached.prefix_cache) == 1  # one query, one cached state, reused throughout


# --- sglang #26629: positions past 65,535 must not overflow silently ------------------------------------------------
POSITIONS = np.array([0, 1, 4464, 65534, 65535, 65536, 65537, 69999, 70000, 70001, 131071, 131072], np.int32)


def test_rope_past_65535_matches_a_float64_oracle(base):
  """sglang #26629 (positions past 65,535 overflow silently): RoPE at int32 positions up to 131,072 rotates as a
  float64 numpy oracle does. Against the oracle that computes the angle position * inv_freq in float32 as Hugging
  Face does (then cos/sin in float64) it agrees within 1e-5; against exact float64 angles within the float32
  angle's rounding (per position, half an ulp of its largest angle, times the vector's norm). A position stored in
  16 bits (70000 -> 4464, 65536 -> 0, 131071 -> 65535 or -1) would be a different rotation, which the test checks
  is outside both bounds."""
  config, _ = base
  inv = rope_inv_freq(config.model)
  rng = np.random.default_rng(0)
  h = config.model.head_dim
  x = rng.standard_normal((1, len(POSITIONS), 2, h)).astype(np.float32)
  positions = jnp.asarray(POSITIONS[None])
  assert positions.dtype == jnp.int32 and np.array_equal(np.asarray(positions[0]), POSITIONS)
  got = np.asarray(apply_rope(jnp.asarray(x), positions, inv), np.float64)

  def oracle(positions, angle_dtype):
    angles = (positions.astype(angle_dtype)[:, None] * inv.astype(angle_dtype)).astype(np.float64)
    angles = np.concatenate([angles, angles], -1)[None, :, None, :]
    half = h // 2
    x64 = x.astype(np.float64)
    rotated = np.concatenate([-x64[..., half:], x64[..., :half]], -1)
    return x64 * np.cos(angles) + rotated * np.sin(angles)

  np.testing.assert_allclose(got, oracle(POSITIONS, np.float32), atol=1e-5, rtol=0)
  norm = np.linalg.norm(x, axis=-1).max()
  # per position: half an ulp of its largest float32 angle, turned into a rotation error of a vector of that norm
  bound = 0.5 * np.spacing((POSITIONS.astype(np.float32) * inv.max()).astype(np.float32)) * norm * 1.01 + 1e-5
  exact = oracle(POSITIONS.astype(np.float64), np.float64)
  assert np.all(np.abs(got - exact).max(axis=(0, 2, 3)) <= bound), (np.abs(got - exact).max(axis=(0, 2, 3)), bound)
  big = POSITIONS > POSITION_LIMIT
  for wrapped in (POSITIONS.astype(np.uint16), POSITIONS.astype(np.int16)):  # what a 16-bit position would hold
    err = np.abs(oracle(wrapped.astype(np.int64), np.float32) - got).max(axis=(0, 2, 3))
    assert np.all(err[big] > 10 * bound[big]), (err, bound)
    assert np.all(err[~big & (POSITIONS < 32768)] < 1e-5)


def test_decoder_past_65535_is_shift_invariant(base):
  """sglang #26629 (positions past 65,535 overflow silently): RoPE attention depends on positions only through their
  differences, so a sequence whose positions run across 65,535 (65530 ... 65545) and one near 70,000 give the
  hidden states the same sequence gives at positions 0 ... 15, within the float32 rounding of their angles (each
  angle position * inv_freq rounds by up to half an ulp: 0.004 rad at 65,536), taken as 1e-3 of the largest
  hidden value (they differ by 2.4e-5 of it). The same sequence with its
  positions wrapped at 2^16, as a 16-bit position would hold them, is checked to fall far outside that."""
  config, params = base
  decoder = Decoder(config.model, get_kernel("reference"))
  rng = np.random.default_rng(1)
  t = 16
  tokens = jnp.asarray([random_tokens(rng, t)], jnp.int32)
  layout = SegmentLayout.causal(jnp.asarray([t], jnp.int32), t)
  forward = jax.jit(lambda positions: decoder.apply({"params": params}, tokens, positions, layout)[0])
  at_zero = np.asarray(forward(jnp.arange(t, dtype=jnp.int32)[None]))
  scale = np.abs(at_zero).max()
  errors = {}
  for start in (65530, 70000):
    positions = np.arange(start, start + t, dtype=np.int32)[None]
    assert positions.max() > POSITION_LIMIT
    errors[start] = np.abs(np.asarray(forward(jnp.asarray(positions))) - at_zero).max()
  wrapped = (np.arange(65530, 65530 + t) % 65536).astype(np.int32)[None]
  wrap_error = np.abs(np.asarray(forward(jnp.asarray(wrapped))) - at_zero).max()
  tolerance = 1e-3 * scale  # measured: 2.4e-5 of the scale at both starts; the wrapped positions 0.1
  assert max(errors.values()) < tolerance, (errors, scale)
  assert wrap_error > 10 * tolerance, (wrap_error, errors, scale)


def test_layout_positions_past_65535_are_exact():
  """sglang #26629 (positions past 65,535 overflow silently): the position arrays the packed and prefill_extend
  algorithms hand the model hold each token's serial position exactly past 65,535 (int32): for a 70,000-token
  query, prefix token k sits at k and item token j at 70,000 + j, both in a packed row and in an extend row; the
  kernels' own serial positions (the sliding-window mask) agree."""
  p = 70_000
  prefix = list(range(p))
  items = [[7, 8, 9], [4]]
  rows = plan_rows(0, prefix, items, (4,), 8, 1.5)
  packed = pack_rows(rows, p, 4, 2, 1)
  assert packed.positions_BxT.dtype == np.int32
  np.testing.assert_array_equal(packed.positions_BxT[0, :p], np.arange(p))
  want_slots = p + np.arange(4)
  np.testing.assert_array_equal(packed.positions_BxT[0, p:p + 4], want_slots)
  np.testing.assert_array_equal(packed.positions_BxT[0, p + 4:p + 8], want_slots)
  extend = pack_rows(rows, 0, 4, 2, 1)
  np.testing.assert_array_equal(extend.positions_BxT[0, :4], want_slots)
  np.testing.assert_array_equal(extend.positions_BxT[0, 4:8], want_slots)
  layout = SegmentLayout(jnp.asarray([p], jnp.int32), jnp.asarray([[3, 1]], jnp.int32), 0, 4, 2)
  serial = np.asarray(layout.serial_positions(include_prefix=False))
  np.testing.assert_array_equal(serial[0], np.concatenate([want_slots, want_slots]))
  assert serial.max() > POSITION_LIMIT


def test_default_limits_refuse_a_request_past_65535_positions():
  """sglang #26629 (positions past 65,535 overflow silently): with the default buckets no scored sequence reaches
  position 65,535 (largest prefix bucket + largest item bucket is below it), and a query that would is refused
  with a ScoreInputError naming the limit, before anything is scored."""
  buckets = BucketConfig()
  assert buckets.prefix_buckets[-1] + buckets.item_buckets[-1] <= POSITION_LIMIT
  limits = dict(max_prefix_tokens=buckets.prefix_buckets[-1], max_item_tokens=buckets.item_buckets[-1])
  with pytest.raises(ScoreInputError, match=r"query is 70001 tokens with the separator, above the largest prefix "
                                            r"bucket 32768"):
    make_request([1] * 70_000, [[2]], LABELS, False, False, DELIM, 512, **limits)
  with pytest.raises(ScoreInputError, match=r"items\[1\] is 70000 tokens, above the largest item bucket 4096"):
    make_request([1], [[2], [3] * 70_000], LABELS, False, False, DELIM, 512, **limits)


# Tiny widths and a sliding window (every layer local, W = 128) keep a 65,600-token row cheap on CPU: attention
# reads at most W keys per query, so a pass is linear in the length; positions still run past 65,535, RoPE still
# rotates by them, and the window's mask is drawn from them (a slot token at serial position V + j sees prefix keys
# k > V + j - W).
LONG_PREFIX = 65_600
LONG_MODEL = ["model_name=tiny-qwen3", "hidden_size=16", "num_layers=1", "num_heads=1", "num_kv_heads=1",
              "head_dim=8", "mlp_dim=32", "layer_pattern=L", "sliding_window=128", "max_position_embeddings=131072",
              "attention=shared_prefix", "prefix_buckets=[65664]", "item_buckets=[8]", "item_count_buckets=[4]",
              "batch_buckets=[1,4]", "max_tokens_per_forward=262144", "max_stacked_tokens=262144"]


@pytest.mark.slow
def test_a_packed_row_and_a_prefix_past_65535_tokens_score_as_serial(monkeypatch):
  """sglang #26629 (positions past 65,535 overflow silently), end to end: a 65,600-token query with three items
  scored by the blocked kernel (shared_prefix) as one packed row of 65,664 + 4 x 8 tokens and as a 65,601-token
  prefill extended by the items gives the serial algorithm's scores (each item its own causal sequence of up to
  65,606 tokens) within 1e-5. The check is shown to fail on a planted overflow: the packed row with its positions
  wrapped at 2^16, as a 16-bit position would hold them, scores far outside the tolerance."""
  config = load_config(LONG_MODEL)
  scorer = Scorer.from_config(config, mesh=None)
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: x * EMBED_SCALE if "embedding" in jax.tree_util.keystr(path) else x, scorer.runner.params)
  scorer = Scorer(config, params, mesh=None)
  rng = np.random.default_rng(11)
  query = random_tokens(rng, LONG_PREFIX)
  items = [random_tokens(rng, n) for n in (4, 2, 5)]
  score = lambda algorithm: scorer.score(query, items, LABELS, apply_softmax=True, algorithm=algorithm,
                                         separator_token_id=DELIM)
  want = score("serial").scores
  assert_items_distinguished(want)
  for algorithm in ("packed", "prefill_extend"):
    scorer.prefix_cache.clear()
    got = score(algorithm)
    assert got.algorithm == algorithm
    np.testing.assert_allclose(got.scores, want, atol=ATOL, rtol=0, err_msg=algorithm)

  pack_rows_ = layout_lib.pack_rows

  def wrapped_at_16_bits(*args, **kwargs):
    packed = pack_rows_(*args, **kwargs)
    assert packed.positions_BxT.max() > POSITION_LIMIT
    return dataclasses.replace(packed, positions_BxT=packed.positions_BxT % (POSITION_LIMIT + 1))
  monkeypatch.setattr(layout_lib, "pack_rows", wrapped_at_16_bits)
  scorer.prefix_cache.clear()
  overflowed = score("packed").scores
  assert np.abs(overflowed - want).max() > 10 * ATOL, np.abs(overflowed - want).max()  # measured: 8.3e-4


# --- sglang #26593: no kernel path gives every item the same score -------------------------------------------------
@pytest.mark.parametrize("attention,extra", KERNELS, ids=[k for k, _ in KERNELS])
def test_no_kernel_path_gives_every_item_the_same_score(base, oracle_case, attention, extra):
  """sglang #26593 (a kernel path scores every item the same): with each attention kernel that runs on CPU and
  each algorithm, distinct items (two of equal length) get distinct scores, each within 1e-5 of the reference
  kernel's serial scores; the oracle's own items are checked to differ pairwise by more than 100 times that."""
  query, items, want = oracle_case
  assert_items_distinguished(want)
  scorer = make_scorer(base, attention, **extra)
  for algorithm in ALGORITHMS:
    got = scorer.score(query, items, LABELS, apply_softmax=True, algorithm=algorithm, separator_token_id=DELIM)
    assert got.algorithm == algorithm
    assert_items_distinguished(got.scores)
    np.testing.assert_allclose(got.scores, want, atol=ATOL, rtol=0, err_msg=f"{attention} {algorithm}")


def assert_scores_follow_tokens(items, scores, want):
  """Within 1e-5 of the oracle's scores, and items apart exactly when their tokens are: equal items score within
  the tolerance, distinct ones more than ten times it apart."""
  np.testing.assert_allclose(scores, want, atol=ATOL, rtol=0)
  for i in range(len(items)):
    for j in range(i):
      apart = np.abs(scores[i] - scores[j]).max()
      assert (apart <= ATOL) if items[i] == items[j] else (apart > 10 * ATOL), (i, j, items[i], items[j], apart)


# At most 7 items (8 with the repeat: the largest count bucket) of at most 16 tokens (the largest item bucket).
_ITEMS = st.lists(st.lists(st.integers(10, 40), min_size=1, max_size=16), min_size=2, max_size=7)


@hypothesis.settings(max_examples=8, deadline=None, derandomize=True, database=None, phases=(
    hypothesis.Phase.explicit, hypothesis.Phase.generate))  # no shrinking: each example compiles programs
@hypothesis.given(query=st.lists(st.integers(10, 499), min_size=1, max_size=12), items=_ITEMS,
                  repeat=st.booleans())
def test_items_score_apart_unless_their_tokens_are_equal(base, query, items, repeat):
  """sglang #26593, as a property: for random queries and item lists (tokens from a small vocabulary, so items
  often share tokens and lengths; with `repeat` the first item is given twice), every algorithm with the reference
  and shared_prefix kernels scores as the reference serial path, and no two items score alike unless their tokens
  are the same."""
  if repeat:
    items = items + [items[0]]
  oracle = make_scorer(base).score(query, items, LABELS, apply_softmax=True, algorithm="serial",
                                   separator_token_id=DELIM).scores
  for attention in ("reference", "shared_prefix"):
    scorer = make_scorer(base, attention)
    for algorithm in ALGORITHMS:
      got = scorer.score(query, items, LABELS, apply_softmax=True, algorithm=algorithm, separator_token_id=DELIM)
      assert_scores_follow_tokens(items, got.scores, oracle)


@pytest.mark.parametrize("fault", ["collapsed_segment_ids", "one_score_index"])
def test_planted_faults_are_caught(base, oracle_case, monkeypatch, fault):
  """The checks above catch the faults behind #26593: the packed path with every item's segment id collapsed into
  one (items see each other) or every score read at one slot's index (every item the same score) fails them;
  without the fault the same call passes."""
  query, items, want = oracle_case
  score = lambda: make_scorer(base).score(query, items, LABELS, apply_softmax=True, algorithm="packed",
                                          separator_token_id=DELIM).scores
  assert_scores_follow_tokens(items, score(), want)
  if fault == "collapsed_segment_ids":
    segment_ids = SegmentLayout.segment_ids
    monkeypatch.setattr(SegmentLayout, "segment_ids",
                        lambda self, include_prefix=True: jnp.minimum(segment_ids(self, include_prefix), 1))
  else:
    pack = layout_lib.pack_rows
    def one_index(*args, **kwargs):
      batch = pack(*args, **kwargs)
      return dataclasses.replace(batch, score_index_BxN=np.repeat(batch.score_index_BxN[:, :1],
                                                                  batch.score_index_BxN.shape[1], axis=1))
    monkeypatch.setattr(layout_lib, "pack_rows", one_index)
  jax.clear_caches()  # the fault must be traced, not a compiled program read back from before it
  try:
    with pytest.raises(AssertionError):
      assert_scores_follow_tokens(items, score(), want)
  finally:
    monkeypatch.undo()
    jax.clear_caches()
