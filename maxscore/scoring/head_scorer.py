"""Scoring with a trained head: `load_scorer(dir)` returns a `HeadScorer` (a Scorer that applies the head)
when the directory has a head, else a plain `Scorer`; `loading.build_scorer` goes through it. A head scores the
labels it was trained for; requests for other labels get the backbone's scores, as without a head.
"""

import os
from typing import Any, Mapping, Optional, Sequence

import jax.numpy as jnp
import numpy as np

from maxscore.checkpoints import storage as checkpointing
from maxscore.checkpoints.head_storage import has_head, load_head
from maxscore.errors import ScoreInputError
from maxscore.files import identity
from maxscore.heads.head import HeadConfig, jit_apply
from maxscore.scoring.requests import TokenRequest, validate_batch
from maxscore.scoring.scorer import ScoreResult, Scorer, finalize_scores, score_output


class HeadScorer:
  """A Scorer whose scores go through a trained head. Everything but scoring is the wrapped
  scorer's (config, tokenizer, runner, prefix_cache, hidden_states, ...), request validation included.

  The head scores the labels it was trained for (`label_token_ids=None` in `score()` picks them);
  a request for any other labels is scored by the backbone exactly as without a head. One forward
  per request group: it returns hidden states (linear/mlp), label log-probs (bias-only lm_labels), or
  both (lm_labels with a hidden-state delta), and a zero delta reproduces the scorer's scores bit for bit.
  """

  def __init__(self, scorer: Scorer, cfg: HeadConfig, params: Mapping, info: Optional[Mapping] = None):
    cfg.validate()
    if cfg.hidden_size != scorer.config.model.hidden_size:
      raise checkpointing.CheckpointError(f"the head reads hidden size {cfg.hidden_size}, the model has "
                                          f"{scorer.config.model.hidden_size}")
    self.scorer = scorer
    self.head_config = cfg
    self.head_params = {k: jnp.asarray(v) for k, v in params.items()}
    self.head_info = dict(info or {})

  def __getattr__(self, name: str) -> Any:
    return getattr(self.scorer, name)

  def label_logits(self, *args, **kwargs):
    """Refused: a head gives label log-probs, not raw lm_head logits (score mode raw_logit)."""
    raise ScoreInputError("score_mode=raw_logit ranks by the backbone's raw label logits, which a trained score "
                          "head does not produce; score without the head (--nouse_head) or use p_first/log_odds")

  label_logits_requests = label_logits

  @property
  def head_fingerprint(self) -> dict[str, Any]:
    """What the head contributes to a score (for resume identity): its config and a params digest."""
    return {"config": self.head_config.to_dict(), "params_sha256": identity.tree_digest(self.head_params)}

  def score(self, query: Any, items: Any, label_token_ids: Optional[Sequence[int]] = None,
            apply_softmax: Optional[bool] = None, item_first: bool = False, algorithm: Optional[str] = None,
            separator_token_id: Any = "config") -> ScoreResult:
    """Scorer.score through the head (maxscore/heads/head.py says what the scores are)."""
    labels = self.head_config.label_token_ids if label_token_ids is None else label_token_ids
    req = self.scorer.make_request(query, items, labels, apply_softmax, item_first, separator_token_id)
    return self.score_requests([req], algorithm=algorithm)[0]

  def score_batch(self, requests: Sequence[Mapping[str, Any]], algorithm: Optional[str] = None) -> list[ScoreResult]:
    return self.score_requests(validate_batch(requests, self.scorer.validate), algorithm=algorithm)

  def score_requests(self, reqs: Sequence[TokenRequest], algorithm: Optional[str] = None) -> list[ScoreResult]:
    cfg = self.head_config
    mine = [i for i, r in enumerate(reqs) if tuple(r.label_ids) == cfg.label_token_ids]
    others = [i for i in range(len(reqs)) if tuple(reqs[i].label_ids) != cfg.label_token_ids]
    out: list = [None] * len(reqs)
    if others:
      for i, res in zip(others, self.scorer.score_requests([reqs[i] for i in others], algorithm)):
        out[i] = res
    if not mine:
      return out
    for output in sorted({score_output(reqs[i].apply_softmax) for i in mine}):
      idx = [i for i in mine if score_output(reqs[i].apply_softmax) == output]
      for i, res in zip(idx, self._head_scores([reqs[i] for i in idx], algorithm, output)):
        out[i] = res
    return out

  def _head_scores(self, head_reqs: Sequence[TokenRequest], algorithm: Optional[str], output: str):
    """Head scores of requests that share a score output (Scorer.score_requests).

    With apply_softmax ("logits") the head reads the label logits shifted by their row max instead of
    the full-vocabulary log-probs: the two differ by a per-row constant, which lm_labels' lp' keeps
    and the labels' softmax cancels; so the vocabulary log-sum-exp is skipped and a zero delta still
    reproduces the scorer's scores bit for bit."""
    cfg = self.head_config
    # The scorer's forwards (Scorer._run): per request (output, algorithm name); one forward for both
    # outputs when the head reads both ([N, K + D]: the labels' columns, then the hidden state).
    if cfg.reads_logprobs and cfg.reads_hidden:
      both = self.scorer._run(head_reqs, algorithm, f"{output}+hidden")
      k = cfg.num_labels
      lps, hs = [(x[:, :k], name) for x, name in both], [(x[:, k:], name) for x, name in both]
    else:
      lps = self.scorer._run(head_reqs, algorithm, output) if cfg.reads_logprobs else None
      hs = self.scorer._run(head_reqs, algorithm, "hidden") if cfg.reads_hidden else None
    out = []
    for j, r in enumerate(head_reqs):
      name = (lps or hs)[j][1]
      lp = lps[j][0] if lps else np.zeros((len(r.items), cfg.num_labels), np.float32)
      if lps and output == "logits" and lp.size:
        lp = lp - lp.max(axis=-1, keepdims=True)
      h = hs[j][0] if hs else np.zeros((len(r.items), 0), np.float32)
      new_lp = np.asarray(jit_apply(cfg)(self.head_params, h, lp)) if len(r.items) else lp
      out.append(ScoreResult(finalize_scores(new_lp, r.apply_softmax), name, self.scorer._usage(r, name)))
    return out


def load_scorer(checkpoint_dir: os.PathLike, use_head: bool = True, **overrides: Any):
  """`Scorer.from_checkpoint`, wrapped in a HeadScorer when the checkpoint has a head (and use_head)."""
  scorer = Scorer.from_checkpoint(checkpoint_dir, **overrides)
  if use_head and has_head(checkpoint_dir):
    cfg, params, info = load_head(checkpoint_dir)
    return HeadScorer(scorer, cfg, params, info)
  return scorer
