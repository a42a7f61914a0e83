"""serial: every seq_i as its own row (right-padded, batched). The baseline and the oracle."""

import jax.numpy as jnp
import numpy as np

from layers.kernels import SegmentLayout
from maxscore.scoring.algorithms.common import AlgorithmContext, by_labels, empty_results
from maxscore.scoring.layout import serial_batches


def run(ctx: AlgorithmContext, requests) -> list[np.ndarray]:
  out = empty_results(ctx, requests)
  pending = []
  for labels, idx in by_labels(requests):
    seqs, owners = [], []
    for ri in idx:
      for i in range(len(requests[ri].items)):
        seqs.append(requests[ri].serial_sequence(i))
        owners.append((ri, i))
    lengths = sorted(set(ctx.buckets.prefix_buckets) | {ctx.buckets.prefix_buckets[-1] + ctx.buckets.item_buckets[-1]})
    for batch in serial_batches(seqs, lengths, ctx.scoring.serial_batch_size,
                                ctx.buckets.batch_buckets):
      b, t = batch.tokens_BxT.shape
      layout = SegmentLayout.causal(jnp.asarray(batch.valid_B), t)
      positions = np.broadcast_to(np.arange(t, dtype=np.int32), (b, t))
      score_index = np.maximum(batch.valid_B - 1, 0)[:, None]
      lp = ctx.runner.packed_logprobs(ctx.kernel, batch.tokens_BxT, positions, layout, score_index, labels, ctx.output)
      pending.append((batch, owners, lp))
  for batch, owners, lp in pending:  # dispatch everything first, then pull to host
    lp = np.asarray(lp)[:, 0]
    for r, i in enumerate(batch.item_B):
      if i >= 0:
        ri, ii = owners[i]
        out[ri][ii] = lp[r]
  return out
