"""What every algorithm receives, and helpers they share."""

import dataclasses
from typing import Iterator, Optional, Sequence

import numpy as np

from maxscore.config import BucketConfig, ScoringConfig
from maxscore.scoring.runner import ModelRunner
from maxscore.scoring.prefix_cache import PrefixCache
from maxscore.scoring.requests import TokenRequest


@dataclasses.dataclass
class AlgorithmContext:
  """The runner plus the config sections an algorithm reads."""
  runner: ModelRunner
  kernel: str
  buckets: BucketConfig
  scoring: ScoringConfig
  prefix_cache: PrefixCache
  max_tokens_per_forward: int = 1 << 16
  max_stacked_tokens: Optional[int] = None  # most tokens in a forward of several stacked rows (None: no bound)
  output: str = "logprobs"  # runner.OUTPUTS: "logprobs" / "logits" [N, K]; "hidden" [N, D]; "<either>+hidden" [N, K + D]


def by_labels(requests: Sequence[TokenRequest]) -> Iterator[tuple[np.ndarray, list[int]]]:
  """Request indices grouped by label ids (one compiled K per group)."""
  groups: dict[tuple[int, ...], list[int]] = {}
  for i, r in enumerate(requests):
    groups.setdefault(r.label_ids, []).append(i)
  for labels, idx in groups.items():
    yield np.asarray(labels, np.int32), idx


def empty_results(ctx: AlgorithmContext, requests: Sequence[TokenRequest]) -> list[np.ndarray]:
  hidden = ctx.runner.model.hidden_size if ctx.output.endswith("hidden") else 0
  labels = (lambda r: 0) if ctx.output == "hidden" else (lambda r: len(r.label_ids))
  return [np.zeros((len(r.items), labels(r) + hidden), np.float32) for r in requests]


def scatter(out: list[np.ndarray], pending) -> list[np.ndarray]:
  """Writes each (PackedBatch, device log-probs [B, N, K]) into per-request results, in order."""
  for batch, lp in pending:
    lp = np.asarray(lp)
    for b, n in zip(*np.nonzero(batch.item_BxN >= 0)):
      out[batch.request_BxN[b, n]][batch.item_BxN[b, n]] = lp[b, n]
  return out
