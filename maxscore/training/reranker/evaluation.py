"""The reranker's dev evaluation during training: the metrics eval would compute from the head's scores."""

from typing import Optional

import jax
import numpy as np

from layers.decoder import Decoder
from maxscore.heads import head
from maxscore.rerank import metrics
from maxscore.rerank.prompts import SCORE_MODES, PromptConfig
from maxscore.scoring.scorer import finalize_scores
from maxscore.training import first_listwise, partition
from maxscore.training import head_features as features
from maxscore.training.head_features import Examples
from maxscore.training.reranker.config import TrainConfig
from maxscore.training.reranker.prepare import Prepared


def evaluate_split(label_lp, examples: Examples, prompt: PromptConfig, runs: Optional[list] = None
                   ) -> dict[str, float]:
  """Metrics the ranking eval would compute from the head's label log-probs `label_lp` [Q, N, K] (score_mode of
  `prompt`); `runs`, when given, gets the scores themselves appended ({qid: {docid: score}})."""
  apply_softmax, rank_fn = SCORE_MODES[prompt.score_mode]
  if apply_softmax is None:
    raise ValueError("score_mode=raw_logit needs raw lm_head logits; a score head gives log-probs (use p_first)")
  run = {}
  for i, (qid, docids) in enumerate(zip(examples.qids, examples.docids)):
    scores = np.asarray(rank_fn(finalize_scores(label_lp[i, :len(docids)], apply_softmax)), np.float32)
    run[qid] = {d: float(s) for d, s in zip(docids, scores)}
  if runs is not None:
    runs.append(run)
  per_query = metrics.evaluate(examples.qrels, run, prompt.metrics)
  return metrics.aggregate(per_query) if per_query else {}


def dev_metrics(cfg: TrainConfig, prompt: PromptConfig, prep: Prepared, decoder: Optional[Decoder],
                labels_K: jax.Array, params, runs: Optional[list] = None) -> Optional[dict[str, float]]:
  """Dev metrics of the current params (None without a dev split); every process computes them. `runs`, when
  given, gets the dev scores appended (pointwise losses only)."""
  if "dev" not in prep.examples:
    return None
  params = partition.host_copy(params)
  if decoder is not None:
    h, lp = features.backbone_features(decoder, params["backbone"], prep.examples["dev"], prep.geometry["dev"],
                                       labels_K, cfg.batch_size)
  else:
    h, lp = prep.feats["dev"].hidden, prep.feats["dev"].logprobs
  label_lp = np.asarray(head.jit_apply(prep.head_cfg)(params["head"], h, lp))
  if cfg.loss == "first_listwise":  # each dev window ordered by its identifiers' scores
    return {"split": "dev", **first_listwise.evaluate_windows(label_lp[:, 0, :], prep.examples["dev"], prompt.metrics)}
  return {"split": "dev", **evaluate_split(label_lp, prep.examples["dev"], prompt, runs)}
