"""prefill_extend: prefill Q + s once into a PrefixState, then extend items in chunks against it.

Item tokens attend to the shared prefix K/V (broadcast, never copied per item) and causally
to their own tokens, merged by log-sum-exp -- the same slot math as the shared_prefix kernel. A chunk
holds at most extend_batch_size items and extend_max_tokens slot tokens (so long items go fewer per
chunk, bounding the activations), and one whose item count would pad its bucket by more than an
eighth is cut into bucket-sized chunks.
"""

import dataclasses

import numpy as np

from maxscore.scoring.algorithms.common import AlgorithmContext, by_labels, empty_results, scatter
from maxscore.scoring.layout import bucket, pack_rows, plan_rows, split_for_buckets


def prefix_state(ctx: AlgorithmContext, prefix):
  """The PrefixState of `prefix` from the cache, prefilling it on a miss."""
  p = bucket(len(prefix), ctx.buckets.prefix_buckets, "query (with separator)")
  def compute():
    tokens = np.zeros((1, p), np.int32)
    tokens[0, :len(prefix)] = prefix
    return ctx.runner.prefill(ctx.kernel, tokens, len(prefix))
  return ctx.prefix_cache.get_or_compute((tuple(prefix), p), compute)


# An extend chunk whose item-count bucket would pad more than this share of its slots is split instead: a
# piece of k items computes exactly what k padded slots would waste, so splitting costs one dispatch and saves
# the padded work (100 items -> 96 + 4, not 100 in a bucket of 112).
_CHUNK_MAX_PADDING = 1 / 16


def _chunks(rows, count_buckets, max_tokens: int):
  """Each row cut into chunks of at most `max_tokens` slot tokens whose item counts pad little
  (layout.split_for_buckets)."""
  for row in rows:
    cap = max(1, max_tokens // max(row.slot_len, 1))
    sizes = [s for full in range(0, len(row.items), cap)
             for s in split_for_buckets(min(cap, len(row.items) - full), count_buckets, _CHUNK_MAX_PADDING)]
    start = 0
    for size in sizes:
      yield dataclasses.replace(row, items=row.items[start:start + size],
                                item_tokens=row.item_tokens[start:start + size])
      start += size


def run(ctx: AlgorithmContext, requests) -> list[np.ndarray]:
  out = empty_results(ctx, requests)
  bk, chunk = ctx.buckets, ctx.scoring.extend_batch_size
  pending = []
  for labels, idx in by_labels(requests):
    for ri in idx:
      req = requests[ri]
      if not req.items:
        continue
      state = prefix_state(ctx, req.prefix)
      rows = plan_rows(ri, req.prefix, req.items, bk.item_buckets, chunk, bk.length_group_ratio)
      for row in _chunks(rows, bk.item_count_buckets, ctx.scoring.extend_max_tokens):
        n = bucket(len(row.items), bk.item_count_buckets, "extend chunk")
        batch = pack_rows([row], 0, row.slot_len, n, 1)
        lp = ctx.runner.extend_logprobs(ctx.kernel, state, batch.tokens_BxT, batch.positions_BxT,
                                        batch.slot_valid_BxN, row.slot_len, batch.score_index_BxN, labels, ctx.output)
        pending.append((batch, lp))
  return scatter(out, pending)
