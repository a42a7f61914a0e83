"""packed: all items of a query in one forward over the segment layout (docs/ARCHITECTURE.md section 2)."""

import jax.numpy as jnp
import numpy as np

from layers.kernels import SegmentLayout
from maxscore.scoring.algorithms.common import AlgorithmContext, by_labels, empty_results, scatter
from maxscore.scoring.layout import batch_rows, plan_rows


def run(ctx: AlgorithmContext, requests) -> list[np.ndarray]:
  out = empty_results(ctx, requests)
  bk = ctx.buckets
  pending = []
  for labels, idx in by_labels(requests):
    rows = [row for ri in idx for row in plan_rows(ri, requests[ri].prefix, requests[ri].items, bk.item_buckets,
                                                   bk.item_count_buckets[-1], bk.length_group_ratio,
                                                   bk.item_count_buckets)]
    for batch in batch_rows(rows, bk.prefix_buckets, bk.item_count_buckets, bk.batch_buckets,
                            ctx.max_tokens_per_forward, ctx.max_stacked_tokens):
      layout = SegmentLayout(jnp.asarray(batch.prefix_valid_B), jnp.asarray(batch.slot_valid_BxN),
                             batch.prefix_len, batch.slot_len, batch.num_slots)
      lp = ctx.runner.packed_logprobs(ctx.kernel, batch.tokens_BxT, batch.positions_BxT, layout,
                                      batch.score_index_BxN, labels, ctx.output)
      pending.append((batch, lp))
  return scatter(out, pending)
