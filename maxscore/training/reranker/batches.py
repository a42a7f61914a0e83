"""A reranker step's batch: which items of each query train at a step.
"""

import numpy as np


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
