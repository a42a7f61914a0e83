"""Picks the algorithm for a request from its geometry, the kernel and the backend.

Cost model (docs/ARCHITECTURE.md section 3): packed and prefill_extend do the same dense work for one
row (2 * non_embedding_params * tokens); packed needs one dispatch, but recomputes the
prefix in every row, and a dense reference mask costs T^2. prefill_extend pays the prefix
once (or never, on a cache hit) and one dispatch per chunk. Serial recomputes the query
for every item, so it is chosen only where the others cannot run (item_first).

On CPU (the shared_prefix kernel), measured at 2 layers of Qwen3-0.6B dims over ten geometries
(BENCHMARKS.md, "Selector"): with the items in one packed row, prefill_extend was 6-43% faster in
six of the seven geometries whose items span more than one extend chunk (the dense layers, lm_head
and score tiles work on chunk-sized blocks instead of one long row; 18% slower in the seventh).
Within one chunk it was slower in all three: 2-10% in two (an extra dispatch for the same work),
48% in the third (20 items of 200 tokens, unexplained). The TPU and GPU kernels are unmeasured,
so they keep one packed row.
"""

import dataclasses
import math
from typing import Optional, Sequence

from absl import logging

from maxscore.config import BucketConfig, KernelConfig, ScoringConfig
from maxscore.scoring.layout import bucket


@dataclasses.dataclass(frozen=True)
class Choice:
  algorithm: str
  reason: str
  kind: str = ""  # short reason category; INFO logs once per (algorithm, kind)


def packed_row_tokens(prefix_len: int, item_lens: Sequence[int], buckets: BucketConfig) -> tuple[int, int]:
  """(rows, tokens of the longest row) the packed layout would use, ignoring length groups."""
  n = len(item_lens)
  rows = math.ceil(n / buckets.item_count_buckets[-1])
  per_row = math.ceil(n / rows)
  p = bucket(prefix_len, buckets.prefix_buckets, "query (with separator)")
  l = bucket(max(max(item_lens), 1), buckets.item_buckets, "item length")
  return rows, p + bucket(per_row, buckets.item_count_buckets, "item count") * l


def select(prefix_len: int, item_lens: Sequence[int], item_first: bool, kernel: str, kernel_cfg: KernelConfig,
           scoring: ScoringConfig, buckets: BucketConfig, prefix_cached: bool = False) -> Choice:
  """The algorithm for one request; `scoring.algorithm` other than auto always wins."""
  if item_first:
    return Choice("serial", "item_first=True puts the item before the query, so nothing is shared", "item_first")
  if scoring.algorithm != "auto":
    return Choice(scoring.algorithm, "set by config/call", "config")
  if not item_lens:
    return Choice("packed", "no items", "no_items")
  if prefix_cached:
    return Choice("prefill_extend", "the query's PrefixState is cached: extend skips the prefix entirely",
                  "cached")
  rows, row_tokens = packed_row_tokens(prefix_len, item_lens, buckets)
  if kernel == "reference" and row_tokens > kernel_cfg.max_reference_len:
    return Choice("prefill_extend", f"packed row of {row_tokens} tokens exceeds the reference kernel's "
                                    f"max_reference_len={kernel_cfg.max_reference_len}", "reference_limit")
  if row_tokens > scoring.max_tokens_per_forward:
    return Choice("prefill_extend", f"a packed row of {row_tokens} tokens exceeds max_tokens_per_forward="
                                    f"{scoring.max_tokens_per_forward}; prefill_extend bounds memory by chunks",
                  "memory")
  if rows > 1:
    return Choice("prefill_extend", f"{len(item_lens)} items need {rows} packed rows, each recomputing the "
                                    f"query; prefill_extend computes it once", "many_rows")
  chunks = math.ceil(len(item_lens) / scoring.extend_batch_size)
  if kernel == "shared_prefix" and chunks > 1:
    return Choice("prefill_extend", f"{len(item_lens)} items need {chunks} or more extend chunks of up to "
                                    f"{scoring.extend_batch_size}: on CPU, cache-sized chunks against the "
                                    f"prefill's K/V beat one packed row of {row_tokens} tokens", "chunks")
  return Choice("packed", f"one packed row of {row_tokens} tokens: same dense work as prefill_extend, one dispatch", "one_row")


# On CPU, stacking packed rows pays while the stack stays cache-sized: at the embedded default's dims,
# rows of 1,552 tokens cost 20 ms each stacked 1 to 4 high (6,208 tokens) and 26-28 ms each stacked 8 to
# 32 high; rows of 116-528 tokens kept getting cheaper per row up to 8-17k tokens (BENCHMARKS.md, "Serving
# under load"). Accelerators keep stacking up to max_tokens_per_forward.
CPU_STACKED_TOKENS = 8192


def max_stacked_tokens(scoring: ScoringConfig, platform: str) -> Optional[int]:
  """The most tokens a forward of several stacked rows may hold: the config's, else the backend's default."""
  if scoring.max_stacked_tokens:
    return scoring.max_stacked_tokens
  return CPU_STACKED_TOKENS if platform == "cpu" else None


_logged_kinds: set = set()


def log_choice(choice: Choice, prefix_len: int, num_items: int) -> None:
  """Logs a choice at INFO the first time its (algorithm, kind) appears, at DEBUG after that."""
  msg = "algorithm=%s for query of %d tokens x %d items: %s"
  key = (choice.algorithm, choice.kind)
  log = logging.debug if key in _logged_kinds else logging.info
  _logged_kinds.add(key)
  log(msg, choice.algorithm, prefix_len, num_items, choice.reason)
