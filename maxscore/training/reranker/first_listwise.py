"""Training with FIRST's objective (Reddy et al. 2024): a window prompt of numbered candidates (the eval's
listwise template, maxscore/rerank/listwise.py) and a ranking loss on the identifier logits at its answer
position, so that the relevant candidates' identifiers come first.

Each train query becomes one window: its positives (up to `window`) and then its best first-stage negatives,
in first-stage order, one request with a single item (the numbered passages and the answer prefix) whose labels
are the window's identifiers. The backbone (frozen, fully trained or with LoRA adapters) gives the identifier
log-probs there, the lm_labels head maps them as for pointwise training, and `weighted_ranknet` compares them
with the ideal order: grade first, the window's order among equal grades.

The loss is FIRST's weighted RankNet: over the pairs (i, j) of a window with target_i > target_j,
    w_ij * log(1 + exp(-(s_i - s_j))),   w_ij = 1 / (r_i + r_j),
r the 1-based ideal ranks, averaged over the pairs (torch's BCEWithLogitsLoss(weight=w), mean reduction, as
FIRST's rank_net(weighted=True) does). The weights put the pairs near the top first. With grades as targets
only pairs of different grades count; targets that order every candidate (a teacher's scores) make every
pair count, as FIRST's teacher rankings do.
"""

from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from maxscore.datasets.data import RerankSet
from maxscore.errors import TrainError
from maxscore.rerank import listwise
from maxscore.training.reranker.features import Examples


def ideal_ranks(targets_BxK, mask_BxK):
  """1-based ranks by target, highest first; equal targets keep their window order; padding ranks last."""
  key = jnp.where(mask_BxK, -targets_BxK.astype(jnp.float32), jnp.inf)
  order = jnp.argsort(key, axis=-1, stable=True)
  return jnp.argsort(order, axis=-1, stable=True) + 1


def weighted_ranknet(logits_BxK, targets_BxK, mask_BxK):
  """FIRST's weighted RankNet per window: (loss [B], weight [B]); a window without a pair of different
  targets has weight 0."""
  pair = mask_BxK[:, :, None] & mask_BxK[:, None, :] & (targets_BxK[:, :, None] > targets_BxK[:, None, :])
  ranks = ideal_ranks(targets_BxK, mask_BxK).astype(jnp.float32)
  weight = 1.0 / (ranks[:, :, None] + ranks[:, None, :])
  diff = logits_BxK[:, :, None] - logits_BxK[:, None, :]
  count = pair.sum((1, 2))
  loss = jnp.sum(jnp.where(pair, weight * jax.nn.softplus(-diff), 0.0), axis=(1, 2)) / jnp.maximum(count, 1)
  return loss, (count > 0).astype(jnp.float32)


def window_prompts(tokenizer, window: int, identifiers: str = "letters", max_passage_tokens: int = 128,
                   max_window_tokens: int = 4096, chat: Optional[bool] = None) -> listwise.WindowPrompts:
  """The eval's FIRST window prompts (listwise.FIRST), checked to hold `window` identifiers."""
  builder = listwise.WindowPrompts(tokenizer, listwise.FIRST, identifiers, max_passage_tokens, max_window_tokens,
                                   chat=chat)
  if not 2 <= window <= builder.max_window:
    raise TrainError(f"listwise_window={window} must be 2 to {builder.max_window} (the identifiers of "
                     f"identifiers={identifiers!r})")
  return builder


def pick_window(grades: Sequence[int], window: int) -> list[int]:
  """Indices of a query's window: its positives (grade > 0, up to `window`), then the first negatives, all in
  first-stage order."""
  pos = [i for i, g in enumerate(grades) if g > 0][:window]
  neg = [i for i, g in enumerate(grades) if g <= 0][:window - len(pos)]
  return sorted(pos + neg)


def window_examples(scorer, dataset: RerankSet, builder: listwise.WindowPrompts, window: int):
  """(Examples with one window request per query, grades [Q, window] per identifier, mask [Q, window])."""
  queries = [q for q in dataset.queries if q.candidates]
  qids, docids, reqs, rows = [], [], [], []
  for q in queries:
    qrels = dataset.qrels.get(q.qid, {})
    grades = [int(qrels.get(d, 0)) for d, _ in q.candidates]
    idx = pick_window(grades, window)
    w = builder.window(q.query, [q.candidates[i][1] for i in idx])
    reqs.append(scorer.make_request(list(w.prefix), [list(w.body)], list(builder.label_ids[:window]),
                                    apply_softmax=False, separator_token_id=None))
    qids.append(q.qid)
    docids.append(tuple(q.candidates[i][0] for i in idx))
    rows.append([grades[i] for i in idx])
  grades_QxK, mask_QxK = np.zeros((len(rows), window), np.float32), np.zeros((len(rows), window), bool)
  for i, g in enumerate(rows):
    grades_QxK[i, :len(g)], mask_QxK[i, :len(g)] = g, True
  # Examples.grades is per item (one item: the window); the digest still names each window's documents.
  examples = Examples(tuple(qids), tuple(docids), tuple(reqs), tuple((0,) for _ in rows),
                      {q.qid: dataset.qrels.get(q.qid, {}) for q in queries})
  return examples, grades_QxK, mask_QxK


def window_run(label_lp_QxK: np.ndarray, examples) -> dict[str, dict[str, float]]:
  """Each window's candidates scored by their identifiers' log-probs (the head's output at its one item), as a
  run ({qid: {docid: score}})."""
  return {qid: {d: float(s) for d, s in zip(docids, np.asarray(label_lp_QxK[i], np.float64))}
          for i, (qid, docids) in enumerate(zip(examples.qids, examples.docids))}
