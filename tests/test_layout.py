"""The packed layout in token space, checked against hand-computed small cases."""

import dataclasses

import numpy as np
import pytest

from maxscore.config import load_config
from maxscore.errors import ScoreInputError
from maxscore.scoring.layout import batch_rows, bucket, group_items, pack_rows, plan_rows, serial_batches


def test_bucket_picks_smallest_fit_and_names_overflow():
  assert bucket(1, [4, 8], "x") == 4 and bucket(4, [4, 8], "x") == 4 and bucket(5, [4, 8], "x") == 8
  with pytest.raises(ScoreInputError, match="item length is 9 tokens, above the largest bucket 8"):
    bucket(9, [4, 8], "item length")


def test_packed_row_hand_computed():
  # prefix Q+s = [11, 12, 13] in P=4; items [21, 22], [], [31] in slots of L=2; N bucket 4.
  rows = plan_rows(0, [11, 12, 13], [[21, 22], [], [31]], item_buckets=[2, 4], max_items=8, ratio=4.0)
  assert len(rows) == 1 and rows[0].slot_len == 2 and rows[0].items == (0, 1, 2)
  b = pack_rows(rows, prefix_len=4, slot_len=2, num_slots=4, batch=1)
  np.testing.assert_array_equal(b.tokens_BxT, [[11, 12, 13, 0, 21, 22, 0, 0, 31, 0, 0, 0]])
  # RoPE position of item token j is len(Q + s) + j.
  np.testing.assert_array_equal(b.positions_BxT, [[0, 1, 2, 3, 3, 4, 3, 4, 3, 4, 0, 0]])
  np.testing.assert_array_equal(b.prefix_valid_B, [3])
  np.testing.assert_array_equal(b.slot_valid_BxN, [[2, 0, 1, 0]])
  # Score index: last real token; the empty item reads the last prefix token (index 2).
  np.testing.assert_array_equal(b.score_index_BxN, [[5, 2, 8, 0]])
  np.testing.assert_array_equal(b.item_BxN, [[0, 1, 2, -1]])
  np.testing.assert_array_equal(b.request_BxN, [[0, 0, 0, -1]])
  assert b.shape_key == (1, 4, 2, 4) and b.real_tokens == 6


def test_segment_ids_from_layout_match_design():
  import jax.numpy as jnp
  from layers.kernels import SegmentLayout
  layout = SegmentLayout(jnp.array([3]), jnp.array([[2, 0, 1]]), 4, 2, 3)
  np.testing.assert_array_equal(layout.segment_ids(), [[0, 0, 0, -1, 1, 1, -1, -1, 3, -1]])


def test_extend_rows_have_no_prefix_and_positions_continue():
  rows = plan_rows(0, [1, 2, 3, 4, 5], [[7], [8, 9, 10], []], item_buckets=[4], max_items=2, ratio=4.0)
  assert [r.items for r in rows] == [(0, 1), (2,)]  # max_items splits the group
  b = pack_rows(rows[:1], prefix_len=0, slot_len=4, num_slots=2, batch=1)
  np.testing.assert_array_equal(b.tokens_BxT, [[7, 0, 0, 0, 8, 9, 10, 0]])
  np.testing.assert_array_equal(b.positions_BxT, [[5, 6, 7, 8, 5, 6, 7, 8]])
  np.testing.assert_array_equal(b.score_index_BxN, [[0, 6]])
  e = pack_rows(rows[1:], prefix_len=0, slot_len=4, num_slots=1, batch=1)
  np.testing.assert_array_equal(e.score_index_BxN, [[-1]])  # empty item: the PrefixState's last hidden


def test_length_groups_split_when_lengths_differ_widely():
  lengths = [100, 3, 90, 2, 0, 30]
  groups = group_items(lengths, item_buckets=[4, 8, 16, 32, 64, 128], ratio=4.0, max_items=64)
  assert groups == [([0, 2], 128), ([5], 32), ([1, 3, 4], 4)]  # 32 * 4 <= 128: own group
  assert group_items(lengths, [4, 8, 16, 32, 64, 128], ratio=1000.0, max_items=64) == [([0, 1, 2, 3, 4, 5], 128)]


def test_rows_with_equal_buckets_share_a_batch():
  rows = (plan_rows(0, [1] * 10, [[2] * 3] * 5, [4], 8, 4.0) + plan_rows(1, [1] * 12, [[2] * 4] * 6, [4], 8, 4.0)
          + plan_rows(2, [1] * 40, [[2]], [4], 8, 4.0))
  batches = batch_rows(rows, prefix_buckets=[16, 64], count_buckets=[1, 8], batch_buckets=[1, 2, 4],
                       max_tokens_per_batch=1 << 16)
  assert sorted(b.shape_key for b in batches) == [(1, 64, 4, 1), (2, 16, 4, 8)]
  two = [b for b in batches if b.shape_key[0] == 2][0]
  np.testing.assert_array_equal(two.request_BxN[:, 0], [0, 1])
  np.testing.assert_array_equal(two.prefix_valid_B, [10, 12])


def test_stacked_rows_stay_under_the_stack_bound_and_pad_little():
  """Rows of one shape stack up to max_stacked_tokens (a single row may exceed it), in batch-bucket sizes
  that pad at most an eighth; every row lands exactly once."""
  rows = [r for i in range(13) for r in plan_rows(i, [1] * 10, [[2] * 3] * 8, [4], 8, 4.0)]  # 16 + 8*4 = 48 tokens
  buckets = [1, 2, 4, 8, 16]
  unbounded = batch_rows(rows, [16], [8], buckets, max_tokens_per_batch=1 << 16)
  assert [b.shape_key[0] for b in unbounded] == [8, 4, 1]  # not one batch of 16 with 3 padded rows
  bounded = batch_rows(rows, [16], [8], buckets, max_tokens_per_batch=1 << 16, max_stacked_tokens=4 * 48 + 10)
  assert [b.shape_key[0] for b in bounded] == [4, 4, 4, 1]
  assert [b.shape_key[0] for b in batch_rows(rows, [16], [8], buckets, 1 << 16, max_stacked_tokens=5)] == [1] * 13
  no_one = batch_rows(rows[:3], [16], [8], [2, 4], 1 << 16, max_stacked_tokens=5)  # no bucket of 1 row
  assert [b.shape_key[0] for b in no_one] == [2, 2, 2] and all(int((b.prefix_valid_B > 0).sum()) == 1 for b in no_one)
  for batches in (unbounded, bounded):
    seen = sorted(int(r) for b in batches for r in b.request_BxN[:, 0] if r >= 0)
    assert seen == list(range(13))


def test_stacking_bound_is_the_configs_else_the_backends():
  from maxscore.scoring import selector
  scoring = load_config([]).scoring
  assert selector.max_stacked_tokens(scoring, "cpu") == selector.CPU_STACKED_TOKENS
  assert selector.max_stacked_tokens(scoring, "tpu") is None
  assert selector.max_stacked_tokens(dataclasses.replace(scoring, max_stacked_tokens=100), "tpu") == 100


def test_serial_batches_sort_and_pad():
  seqs = [[1] * 5, [2] * 2, [3] * 9]
  batches = serial_batches(seqs, [4, 8, 16], batch_size=2, batch_buckets=[1, 2])
  assert [b.shape_key for b in batches] == [(2, 8), (1, 16)]
  np.testing.assert_array_equal(batches[0].item_B, [1, 0])
  np.testing.assert_array_equal(batches[0].valid_B, [2, 5])


def test_split_for_buckets_pads_little_and_keeps_every_item():
  from maxscore.scoring.layout import split_for_buckets
  buckets = load_config([]).buckets.item_count_buckets
  assert split_for_buckets(100, buckets) == [100]  # in 112 slots: within an eighth
  assert split_for_buckets(100, buckets, 1 / 16) == [96, 4] and split_for_buckets(17, buckets, 1 / 16) == [16, 1]
  assert split_for_buckets(64, buckets) == [64] and split_for_buckets(7, buckets) == [7]
  for share in (1 / 8, 1 / 16):
    for n in range(1, 300):
      sizes = split_for_buckets(n, buckets, share)
      assert sum(sizes) == n and all(s > 0 for s in sizes)
      padded = [bucket(s, buckets, "x") for s in sizes]
      assert all(b - s <= b * share for s, b in zip(sizes, padded)), (n, sizes)


def test_prefill_extend_with_split_chunks_reproduces_serial(hf_checkpoints):
  """17 items would pad to 24 slots: they go as chunks of 16 and 1, with the scores of serial. (Their lengths,
  0 to 6, fall in one length group at length_group_ratio=4; the default 1.5 would split them by length first.)"""
  from maxscore import Scorer
  _, _, ckpt = hf_checkpoints("qwen3_kv2_tied")
  scorer = Scorer.from_checkpoint(ckpt, separator_token_id=3, length_group_ratio=4.0)
  rng = np.random.default_rng(3)
  query = rng.integers(0, 520, 6).tolist()
  items = [rng.integers(0, 520, int(n)).tolist() for n in rng.integers(0, 7, 17)]
  want = scorer.score(query, items, [5, 17], algorithm="serial").scores
  got = scorer.score(query, items, [5, 17], algorithm="prefill_extend").scores
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
  extend_counts = {key[5] for key in scorer.runner.compiled_shapes if key[0] == "extend"}
  assert extend_counts == {16, 1}, scorer.runner.compiled_shapes


def test_prefill_extend_chunks_hold_at_most_extend_max_tokens(hf_checkpoints):
  """Items of 9 tokens sit in 10-token slots: extend_max_tokens=30 puts at most 3 in a chunk."""
  from maxscore import Scorer
  _, _, ckpt = hf_checkpoints("qwen3_kv2_tied")
  scorer = Scorer.from_checkpoint(ckpt, separator_token_id=3, extend_max_tokens=30)
  rng = np.random.default_rng(4)
  query = rng.integers(0, 520, 5).tolist()
  items = [rng.integers(0, 520, 9).tolist() for _ in range(7)]
  want = scorer.score(query, items, [5, 17], algorithm="serial").scores
  got = scorer.score(query, items, [5, 17], algorithm="prefill_extend").scores
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
  shapes = [key for key in scorer.runner.compiled_shapes if key[0] == "extend"]
  assert {(key[4], key[5]) for key in shapes} == {(10, 3), (10, 1)}, shapes


@pytest.mark.parametrize("ratio", [1.5, 4.0])
def test_length_groups_pad_each_item_under_the_ratio(ratio):
  """Every item's group slot is under `ratio` times its own length bucket (items longest first; a new group when
  the next bucket is `ratio` times below the group's), every item is in one group, and groups never exceed
  max_items."""
  buckets = [4, 6, 8, 10, 12, 14, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128, 160, 192, 256, 320, 384, 512]
  lengths = np.random.default_rng(0).integers(1, 513, 300).tolist()
  groups = group_items(lengths, buckets, ratio, 32)
  assert sorted(i for idx, _ in groups for i in idx) == list(range(300))
  for idx, slot in groups:
    assert len(idx) <= 32
    assert all(slot < ratio * bucket(lengths[i], buckets, "x") and slot >= lengths[i] for i in idx)


def test_length_groups_join_when_split_rows_would_pad_more():
  """With coarse item-count buckets a length split can double a packed query's work: 12 items in a 64-token
  bucket and 8 needing 96, count buckets [20], become one row of 20 x 96 slots (1,920 slot tokens; split: 20 x 64
  + 20 x 96 = 3,200 and a second prefix). With fine count buckets the split pads little and stays; a group cut
  at the largest count bucket is never joined; without count buckets nothing changes."""
  items = [[1] * 60] * 12 + [[2] * 70] * 8
  split = plan_rows(0, [9] * 8, items, [64, 96], 20, 1.5)
  assert [(len(r.items), r.slot_len) for r in split] == [(8, 96), (12, 64)]
  joined = plan_rows(0, [9] * 8, items, [64, 96], 20, 1.5, count_buckets=[20])
  assert [(r.items, r.slot_len) for r in joined] == [(tuple(range(20)), 96)]
  assert joined[0].item_tokens == tuple(tuple(x) for x in items)  # every item, in request order
  fine = plan_rows(0, [9] * 8, items, [64, 96], 20, 1.5, count_buckets=[4, 8, 12, 16, 20])
  assert [(len(r.items), r.slot_len) for r in fine] == [(8, 96), (12, 64)]  # 8*96 + 12*64 = 1,536 < 1,920
  full = plan_rows(0, [9] * 8, [[2] * 70] * 20 + [[1] * 60] * 3, [64, 96], 20, 1.5, count_buckets=[4, 20])
  assert [(len(r.items), r.slot_len) for r in full] == [(20, 96), (3, 64)]
