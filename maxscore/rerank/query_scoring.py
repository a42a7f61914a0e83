"""One query's reranker scores: its prompts tokenized (`prepare_query`, the host half, safe in a worker thread),
then all its candidates scored in one score call (`score_prepared`, with passages aggregated per document, the
score cache consulted and the listwise stage applied), as one record of results.jsonl."""

import dataclasses
import time
from typing import Any, Optional, Sequence

import numpy as np

from maxscore.datasets import data
from maxscore.rerank import listwise, prompts
from maxscore.rerank.eval_outputs import EvalReport, format_report  # noqa: F401  (this module's public face)
from maxscore import errors
from maxscore.rerank.score_cache import ScoreCache
from maxscore.scoring.scorer import Scorer

# How a document scored as several passages gets its one score (EvalConfig.aggregate).
AGGREGATES = {"maxp": max, "firstp": lambda scores: scores[0], "sump": sum}


def _model_scores(scorer: Scorer, query_ids, item_ids, label_ids, cfg: prompts.PromptConfig, qid: str):
  """(ranking scores float32 [N], ScoreResult) of one score call over the items."""
  apply_softmax, rank_fn = prompts.SCORE_MODES[cfg.score_mode]
  scorer.prefix_cache.clear()
  try:
    if apply_softmax is None:
      result = scorer.label_logits(query_ids, item_ids, label_token_ids=label_ids)
    else:
      result = scorer.score(query_ids, item_ids, label_token_ids=label_ids, apply_softmax=apply_softmax)
  except errors.ScoreInputError as e:  # the eval's own prompt: name the query, and the flags that cut it
    raise errors.ScoreInputError(f"query {qid!r}: {e} (the eval cuts queries to --max_query_tokens="
                                 f"{cfg.max_query_tokens} and items to --max_item_tokens={cfg.max_item_tokens} "
                                 f"tokens; lower those, or raise the buckets)") from None
  if not np.isfinite(np.asarray(result.scores)).all():
    raise errors.ScoreInputError(f"query {qid!r}: the model produced non-finite scores (NaN or Inf); "
                                 f"check the checkpoint {scorer.config.runtime.checkpoint_dir} for non-finite weights")
  ranking = np.asarray(rank_fn(result.scores), np.float32)
  if np.isnan(ranking).any():
    raise errors.ScoreInputError(f"query {qid!r}: the ranking scores of score_mode={cfg.score_mode} are NaN")
  return ranking, result


@dataclasses.dataclass
class PreparedQuery:
  """A query's host work, done before its model work: token ids of the query and of every candidate's
  items (its passages, or itself), ready for one score call."""
  query: data.RerankQuery
  query_ids: list
  query_truncated: bool
  texts: list
  items: list       # per candidate: [(item token ids, truncated), ...]
  seconds: float    # the host work's own time


def prepare_query(builder: prompts.PromptBuilder, q: data.RerankQuery, cfg: prompts.PromptConfig) -> PreparedQuery:
  """Tokenizes the query and its candidates (the host half of score_query; safe in a worker thread)."""
  start = time.perf_counter()
  query_ids, query_truncated = builder.query(q.query)
  texts = [text for _, text in q.candidates]
  passage_tokens, aggregate = getattr(cfg, "passage_tokens", 0), getattr(cfg, "aggregate", "maxp")
  if passage_tokens:  # each document as its passages, scored as items of the query
    units = [builder.passages(text, passage_tokens, cfg.passage_stride, first_only=aggregate == "firstp")
             for text in texts]
  else:
    units = [[text] for text in texts]
  items = [[builder.item(u) for u in doc] for doc in units]
  return PreparedQuery(q, query_ids, query_truncated, texts, items, time.perf_counter() - start)


def score_prepared(scorer: Scorer, prep: PreparedQuery, label_ids, cfg: prompts.PromptConfig,
                   cache: Optional[ScoreCache] = None, write_cache: bool = True) -> dict[str, Any]:
  """One query's record for results.jsonl from its prepared ids: ranking scores of all its candidates from one
  score call (of the candidates `cache` does not hold; those it holds are its scores, and the new ones are
  added to it when `write_cache`). `seconds` is the host work plus this call."""
  start = time.perf_counter()
  q, items, texts = prep.query, prep.items, prep.texts
  aggregate = getattr(cfg, "aggregate", "maxp")
  compiled_before = len(scorer.runner.compiled_shapes)
  scores = cache.get(q.query, texts) if cache is not None else [None] * len(items)
  missing = [i for i, s in enumerate(scores) if s is None]
  algorithm, prompt_tokens, processed_tokens = "cache", 0, 0
  if missing:
    item_ids = [ids for i in missing for ids, _ in items[i]]
    ranking, result = _model_scores(scorer, prep.query_ids, item_ids, label_ids, cfg, q.qid)
    at = 0
    for i in missing:
      n = len(items[i])
      part = [float(s) for s in ranking[at:at + n]]
      scores[i] = part[0] if n == 1 else float(np.float32(AGGREGATES[aggregate](part)))
      at += n
    algorithm, prompt_tokens = result.algorithm, result.usage["prompt_tokens"]
    processed_tokens = result.usage["processed_tokens"]
    if cache is not None and write_cache:
      cache.put(q.query, [texts[i] for i in missing], [scores[i] for i in missing])
  usage = listwise.Usage()
  lw = cfg.listwise() if hasattr(cfg, "listwise") else None
  if lw is not None:
    scores = listwise_stage(scorer, q, scores, lw, cfg.listwise_top_k, usage)
  return {
      "qid": q.qid,
      "digest": q.digest(),
      "docids": [d for d, _ in q.candidates],
      "scores": scores,
      "algorithm": algorithm,
      "prompt_tokens": prompt_tokens,
      "processed_tokens": processed_tokens,
      "query_truncated": prep.query_truncated,
      "items_truncated": sum(t for doc in items for _, t in doc),
      "passages": sum(len(doc) for doc in items),
      "seconds": prep.seconds + time.perf_counter() - start,
      "compiled": len(scorer.runner.compiled_shapes) > compiled_before,
      "cached": len(items) - len(missing),
      "listwise_forwards": usage.forwards,
      "listwise_tokens": usage.tokens,
  }


def score_query(scorer: Scorer, builder: prompts.PromptBuilder, q: data.RerankQuery, label_ids,
                cfg: prompts.PromptConfig, cache: Optional[ScoreCache] = None,
                write_cache: bool = True) -> dict[str, Any]:
  """prepare_query then score_prepared: one query's record for results.jsonl, host and model work in turn."""
  return score_prepared(scorer, prepare_query(builder, q, cfg), label_ids, cfg, cache, write_cache)


def listwise_stage(scorer: Scorer, q: data.RerankQuery, scores: Sequence[float], cfg: listwise.ListwiseConfig,
                   top_k: int, usage: listwise.Usage) -> list[float]:
  """The query's candidates with the pointwise top `top_k` (0 = all) reordered by the listwise stage.

  A listwise stage gives an order, not scores: every candidate's score becomes n - rank (n candidates; the best
  n, the last 1), the listwise order over the head and the pointwise order below it (equal pointwise scores
  in first-stage order), so run.trec, the metrics and the fusion read it as any reranked run. The stage reads
  the model's label log-probs, never a trained score head's."""
  n = len(scores)
  pointwise = sorted(range(n), key=lambda i: (-scores[i], i))
  head = pointwise[:top_k] if top_k > 0 else pointwise
  backbone = getattr(scorer, "scorer", scorer)  # HeadScorer: its backbone
  backbone.prefix_cache.clear()
  (order,) = listwise.listwise_rerank(backbone, [q.query], [[q.candidates[i][1] for i in head]], cfg, usage)
  final = [head[i] for i in order] + pointwise[len(head):]
  out = [0.0] * n
  for rank, i in enumerate(final):
    out[i] = float(n - rank)
  return out
