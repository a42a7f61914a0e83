"""Packed, serial and extend layouts in token space (pure numpy; docs/ARCHITECTURE.md section 2).

A packed row is `[prefix: Q + s padded to P][item 1: L] ... [item N: L]`. Items sit in fixed
slots so the attention mask is a function of (P, L) plus validity counts. Items whose
lengths differ a lot are split into groups, each with its own slot length L, and a group with
more items than the largest count bucket is split into several rows. Rows with equal
(P, L, N) are stacked into batches (several requests share one forward).
"""

import bisect
import dataclasses
from typing import Optional, Sequence

import numpy as np

from maxscore.errors import ScoreInputError

PAD_ID = 0


def bucket(n: int, buckets: Sequence[int], field: str) -> int:
  """Smallest bucket >= n; ScoreInputError naming `field` when n exceeds the largest."""
  i = bisect.bisect_left(buckets, n)
  if i == len(buckets):
    raise ScoreInputError(f"{field} is {n} tokens, above the largest bucket {buckets[-1]}; "
                          f"raise the bucket config or shorten the input")
  return buckets[i]


@dataclasses.dataclass(frozen=True)
class RowSpec:
  """One packed row before padding: which request, its prefix, and which of its items."""
  request: int
  prefix: tuple[int, ...]
  items: tuple[int, ...]               # item indices within the request
  item_tokens: tuple[tuple[int, ...], ...]
  slot_len: int


@dataclasses.dataclass(frozen=True)
class PackedBatch:
  """Rows stacked for one forward: arrays [B, T] / [B, N] plus where each score goes."""
  tokens_BxT: np.ndarray
  positions_BxT: np.ndarray
  prefix_valid_B: np.ndarray
  slot_valid_BxN: np.ndarray
  score_index_BxN: np.ndarray
  request_BxN: np.ndarray              # request index per slot, -1 for an empty slot
  item_BxN: np.ndarray                 # item index within the request, -1 for an empty slot
  prefix_len: int
  slot_len: int
  num_slots: int

  @property
  def shape_key(self) -> tuple[int, int, int, int]:
    """(B, P, L, N): the static shape of the forward this batch compiles."""
    return (self.tokens_BxT.shape[0], self.prefix_len, self.slot_len, self.num_slots)

  @property
  def real_tokens(self) -> int:
    return int(self.prefix_valid_B.sum() + self.slot_valid_BxN.sum())


def group_items(lengths: Sequence[int], item_buckets: Sequence[int], ratio: float,
                max_items: int) -> list[tuple[list[int], int]]:
  """Splits item indices into (indices, slot_len) groups: one slot length per group.

  Items are taken longest first; a new group starts when an item's bucket is at least
  `ratio` times smaller than the group's slot, or the group holds `max_items`.
  """
  order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
  groups: list[tuple[list[int], int]] = []
  for i in order:
    b = bucket(max(lengths[i], 1), item_buckets, f"items[{i}] length")
    if not groups or b * ratio <= groups[-1][1] or len(groups[-1][0]) >= max_items:
      groups.append(([], b))
    groups[-1][0].append(i)
  for idx, _ in groups:
    idx.sort()  # keep request order within a row: results do not depend on it, but it reads better
  return groups


def join_padded_groups(groups: list[tuple[list[int], int]], count_buckets: Sequence[int],
                       prefix_tokens: int) -> list[tuple[list[int], int]]:
  """Joins neighbouring length groups (longest slot first) when one row at the longer slot holds fewer tokens
  than a row each: every row repeats the prefix and pads its item count to a bucket, so with coarse count
  buckets a split can double the work (20 items, 8 of them needing a 96-token slot, count buckets [20]: one
  row of 20 x 96 slots instead of two of 20 x 64 and 20 x 96). Groups above the largest count bucket are
  left as they are."""
  def tokens(n: int, slot: int) -> int:
    return prefix_tokens + bucket(n, count_buckets, "item count") * slot
  out: list[tuple[list[int], int]] = []
  for idx, slot in groups:
    if out:
      kept, kept_slot = out[-1]
      n = len(kept) + len(idx)
      if n <= count_buckets[-1] and tokens(n, kept_slot) <= tokens(len(kept), kept_slot) + tokens(len(idx), slot):
        out[-1] = (sorted(kept + idx), kept_slot)
        continue
    out.append((idx, slot))
  return out


def plan_rows(request: int, prefix: Sequence[int], items: Sequence[Sequence[int]], item_buckets: Sequence[int],
              max_items: int, ratio: float, count_buckets: Optional[Sequence[int]] = None) -> list[RowSpec]:
  """Row specs for one request (no padding yet). With `count_buckets` (a packed row's item counts), length
  groups that would cost more as separate padded rows are joined (join_padded_groups)."""
  if not items:
    return []
  groups = group_items([len(x) for x in items], item_buckets, ratio, max_items)
  if count_buckets is not None and len(groups) > 1:
    groups = join_padded_groups(groups, count_buckets, len(prefix))
  return [RowSpec(request, tuple(prefix), tuple(idx), tuple(tuple(items[i]) for i in idx), slot)
          for idx, slot in groups]


def split_for_buckets(n: int, count_buckets: Sequence[int], max_padding: float = 0.125) -> list[int]:
  """Sizes summing to n whose item-count buckets waste at most `max_padding` of their slots each: a size
  that would pad more is cut to the largest bucket below it and the rest split again (100 items in
  buckets of 64 and 48 -> 64, 32, 4 instead of 64 + 36 padded to 48). Each piece costs one more
  dispatch of fewer items, but padded slots cost the whole forward's work per token."""
  sizes = []
  while n > 0:
    full = bucket(n, count_buckets, "extend chunk")
    below = [c for c in count_buckets if c <= n]
    if full - n <= max_padding * full or not below:
      sizes.append(n)
      break
    sizes.append(below[-1])
    n -= below[-1]
  return sizes


def pack_rows(rows: Sequence[RowSpec], prefix_len: int, slot_len: int, num_slots: int,
              batch: int) -> PackedBatch:
  """Pads `rows` (at most `batch`) into one PackedBatch of shape (batch, P + N*L).

  `prefix_len=0` builds extend rows (the prefix lives in a PrefixState); positions then
  start at each row's real prefix length, read from `len(row.prefix)`.
  """
  if len(rows) > batch:
    raise ValueError(f"{len(rows)} rows do not fit batch {batch}")
  t = prefix_len + slot_len * num_slots
  tokens = np.full((batch, t), PAD_ID, np.int32)
  positions = np.zeros((batch, t), np.int32)
  prefix_valid = np.zeros((batch,), np.int32)
  slot_valid = np.zeros((batch, num_slots), np.int32)
  score_index = np.zeros((batch, num_slots), np.int32)
  req = np.full((batch, num_slots), -1, np.int32)
  item = np.full((batch, num_slots), -1, np.int32)
  for b, row in enumerate(rows):
    p = len(row.prefix)
    if prefix_len:
      tokens[b, :p] = row.prefix
      positions[b, :prefix_len] = np.arange(prefix_len)
    prefix_valid[b] = p
    for n, (i, toks) in enumerate(zip(row.items, row.item_tokens)):
      start = prefix_len + n * slot_len
      tokens[b, start:start + len(toks)] = toks
      positions[b, start:start + slot_len] = p + np.arange(slot_len)
      slot_valid[b, n] = len(toks)
      # An empty item reads the last prefix token (docs/ARCHITECTURE.md section 2).
      score_index[b, n] = start + len(toks) - 1 if toks else (p - 1 if prefix_len else -1)
      req[b, n], item[b, n] = row.request, i
  return PackedBatch(tokens, positions, prefix_valid, slot_valid, score_index, req, item,
                     prefix_len, slot_len, num_slots)


def batch_rows(rows: Sequence[RowSpec], prefix_buckets: Sequence[int], count_buckets: Sequence[int],
               batch_buckets: Sequence[int], max_tokens_per_batch: int,
               max_stacked_tokens: Optional[int] = None) -> list[PackedBatch]:
  """Groups row specs by their (P, L, N) buckets and stacks each group into batches.

  A batch holds at most `max_tokens_per_batch` tokens (a memory bound) and, when it stacks more than
  one row, at most `max_stacked_tokens` (None: no further bound): on CPU a stack beyond the caches
  costs more per row than it saves in dispatches (selector.max_stacked_tokens). A group is
  cut into batch-bucket sizes that pad at most an eighth of their rows (split_for_buckets), since a
  padded row costs as much as a real one.
  """
  by_shape: dict[tuple[int, int, int], list[RowSpec]] = {}
  for row in rows:
    key = (bucket(len(row.prefix), prefix_buckets, "query (with separator)"), row.slot_len,
           bucket(len(row.items), count_buckets, "item count"))
    by_shape.setdefault(key, []).append(row)
  limit = min(max_tokens_per_batch, max_stacked_tokens or max_tokens_per_batch)
  out = []
  for (p, l, n), group in sorted(by_shape.items()):
    row_tokens = p + n * l
    most = max([b for b in batch_buckets if b * row_tokens <= limit] or [1])  # 1: a row per forward
    sizes = [most] * (len(group) // most)
    sizes += split_for_buckets(len(group) - sum(sizes), [b for b in batch_buckets if b <= most])
    start = 0
    for size in sizes:
      chunk = group[start:start + size]
      start += size
      out.append(pack_rows(chunk, p, l, n, bucket(len(chunk), batch_buckets, "batch")))
  return out


@dataclasses.dataclass(frozen=True)
class SerialBatch:
  """Whole sequences seq_i as rows [B, T], right-padded; score at each row's last token."""
  tokens_BxT: np.ndarray
  valid_B: np.ndarray
  item_B: np.ndarray                   # item index per row, -1 for padding rows

  @property
  def shape_key(self) -> tuple[int, int]:
    return self.tokens_BxT.shape


def serial_batches(seqs: Sequence[Sequence[int]], length_buckets: Sequence[int], batch_size: int,
                   batch_buckets: Sequence[int]) -> list[SerialBatch]:
  """Rows of whole sequences, sorted by length so each batch pads little."""
  order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
  out = []
  for start in range(0, len(order), batch_size):
    idx = order[start:start + batch_size]
    t = bucket(max(len(seqs[i]) for i in idx), length_buckets, "serial sequence length")
    b = bucket(len(idx), batch_buckets, "batch")
    tokens = np.full((b, t), PAD_ID, np.int32)
    valid = np.zeros((b,), np.int32)
    item = np.full((b,), -1, np.int32)
    for r, i in enumerate(idx):
      tokens[r, :len(seqs[i])] = seqs[i]
      valid[r], item[r] = len(seqs[i]), i
    out.append(SerialBatch(tokens, valid, item))
  return out
