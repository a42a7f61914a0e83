"""The reranker's dev evaluation during training: the metrics eval would compute from the head's scores."""

from typing import Optional

import jax
import numpy as np

from maxscore.heads import head
from maxscore.rerank import metrics
from maxscore.rerank.prompts import SCORE_MODES, PromptConfig
from maxscore.scoring.scorer import finalize_scores
from maxscore.training import partition
from maxscore.training.reranker import first_listwise
from maxscore.training.reranker.features import Examples
from maxscore.training.reranker.config import TrainConfig
from maxscore.training.reranker.prepare import Prepared


def head_run(label_lp, examples: Examples, prompt: PromptConfig) -> dict[str, dict[str, float]]:
  """The ranking scores the eval would compute from the head's label log-probs `label_lp` [Q, N, K] (score_mode
  of `prompt`), as a run ({qid: {docid: score}})."""
  apply_softmax, rank_fn = SCORE_MODES[prompt.score_mode]
  if apply_softmax is None:
    raise ValueError("score_mode=raw_logit needs raw lm_head logits; a score head gives log-probs (use p_first)")
  run = {}
  for i, (qid, docids) in enumerate(zip(examples.qids, examples.docids)):
    scores = np.asarray(rank_fn(finalize_scores(label_lp[i, :len(docids)], apply_softmax)), np.float32)
    run[qid] = {d: float(s) for d, s in zip(docids, scores)}
  return run


def dev_metrics(cfg: TrainConfig, prompt: PromptConfig, prep: Prepared, labels_K: jax.Array, params,
                runs: Optional[list] = None) -> Optional[dict[str, float]]:
  """Dev metrics of the current params (None without a dev split); every process computes them. `runs`, when
  given, gets the dev scores appended (pointwise losses only)."""
  if "dev" not in prep.examples:
    return None
  params = partition.host_copy(params)
  examples = prep.examples["dev"]
  h, lp = prep.source.dev_features(params, "dev", examples, labels_K, cfg.batch_size)
  label_lp = np.asarray(head.jit_apply(prep.head_cfg)(params["head"], h, lp))
  if cfg.loss.window is not None:  # each dev window ordered by its identifiers' scores
    run = first_listwise.window_run(label_lp[:, 0, :], examples)
  else:
    run = head_run(label_lp, examples, prompt)
    if runs is not None:
      runs.append(run)
  per_query = metrics.evaluate(examples.qrels, run, prompt.metrics)
  return {"split": "dev", **(metrics.aggregate(per_query) if per_query else {})}
