"""A reranker step's batch: what the loss compares against, and the inputs of the step's feature source
(sources.py), as two small pytree dataclasses; and which items of each query train at a step (the group draw).

    FrozenBatch(grades=..., mask=..., hidden=..., logprobs=...)        # a frozen backbone's features
    BackboneBatch(grades=..., mask=..., packed=..., gather=...)         # each query packed in one row
"""

import dataclasses
from typing import Any

import jax
import numpy as np


@dataclasses.dataclass(frozen=True, kw_only=True)
class Batch:
  """Every step's targets, a row per query: grades and mask [B, N]; the teacher's scores [B, N] when the loss
  reads them; with loss=first_listwise, the grades and mask of each window's identifiers [B, K]."""
  grades: Any
  mask: Any
  teacher: Any = None
  id_grades: Any = None
  id_mask: Any = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class FrozenBatch(Batch):
  """The frozen backbone's features of the batch's items: hidden [B, N, D] and label log-probs [B, N, K]."""
  hidden: Any
  logprobs: Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class BackboneBatch(Batch):
  """Each query packed in one row (`packed`: tokens, positions, layout, score_index) and where its items land
  in the packed score rows (`gather` [B, N]); with the match losses, their targets (features.match_targets)."""
  packed: dict
  gather: Any
  match: Any = None
  match_mask: Any = None
  coverage: Any = None


def draw_group_mask(grades_BxN: np.ndarray, mask_BxN: np.ndarray, rows: np.ndarray, step: int, group_size: int,
                    seed: int) -> np.ndarray:
  """Per row, one positive (grade > 0) and `group_size - 1` negatives of the masked items, drawn from
  PRNG(seed, step, row's example index): the same draw on every process and on a resumed run. A row with
  fewer items keeps them all; `group_size` 0 keeps every item."""
  if not group_size:
    return mask_BxN
  out = np.zeros_like(mask_BxN)
  for b, row in enumerate(rows):
    valid = np.nonzero(mask_BxN[b])[0]
    if row < 0 or len(valid) <= group_size:
      out[b, valid] = True
      continue
    rng = np.random.default_rng([seed, step, int(row)])
    pos = valid[grades_BxN[b, valid] > 0]
    neg = valid[grades_BxN[b, valid] <= 0]
    take = [rng.choice(pos)] if len(pos) else []
    need = group_size - len(take)
    take += list(rng.choice(neg, min(need, len(neg)), replace=False))
    if len(take) < group_size:  # too few negatives: more positives
      rest = np.setdiff1d(pos, take)
      take += list(rng.choice(rest, min(group_size - len(take), len(rest)), replace=False))
    out[b, take] = True
  return out
