"""bfloat16 (or int8) against float32 on the same weights: label log-probs, scores, and the ranking they give.

    ref = loading.build_scorer(None, [], use_head=False)
    bf16 = loading.build_scorer(None, ["dtype=bfloat16", "weight_dtype=bfloat16"], use_head=False)
    compare_on_rerank_set(ref, bf16, data.load_jsonl(data.DEFAULT_JSONL), eval.EvalConfig())

TPU runs score in bfloat16; these figures (measured on CPU, where XLA emulates bf16 matmuls
with f32 accumulation as the TPU MXU does) bound what that changes, and a test holds them.
"""

from typing import Any, Mapping, Sequence

import numpy as np

from maxscore.datasets import data
from maxscore.rerank import metrics, prompts
from maxscore.rerank.eval import EvalConfig
from maxscore.rerank.prompts import SCORE_MODES
from maxscore.scoring.scorer import Scorer, finalize_scores


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float:
  """Kendall's tau-a of two score lists over the same items: 1 = same order, -1 = reversed."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  n = len(a)
  if n < 2:
    return 1.0
  sa = np.sign(a[:, None] - a[None, :])
  sb = np.sign(b[:, None] - b[None, :])
  return float((sa * sb)[np.triu_indices(n, 1)].sum() / (n * (n - 1) / 2))


def _delta(ref_lp: np.ndarray, test_lp: np.ndarray) -> dict[str, float]:
  """Largest |difference| of label log-probs, of softmax scores and of full-vocabulary probabilities."""
  return dict(max_abs_logprob=float(np.abs(ref_lp - test_lp).max(initial=0.0)),
              max_abs_score=float(np.abs(finalize_scores(ref_lp, True) - finalize_scores(test_lp, True)).max(
                  initial=0.0)),
              max_abs_prob=float(np.abs(np.exp(ref_lp) - np.exp(test_lp)).max(initial=0.0)))


def _label_logprobs(scorer: Scorer, query: Any, items: Any, label_ids: Sequence[int]) -> np.ndarray:
  with np.errstate(divide="ignore"):
    return np.log(scorer.score(query, items, label_token_ids=label_ids, apply_softmax=False).scores)


def compare_on_rerank_set(ref: Scorer, test: Scorer, dataset: data.RerankSet, cfg: EvalConfig) -> dict[str, Any]:
  """Scores every query with both scorers; log-prob and score deltas, Kendall tau and metric deltas."""
  builder, label_ids = prompts.prompt_and_labels(ref.tokenizer, cfg.template, cfg.labels, cfg.instruction,
                                                 cfg.max_query_tokens, cfg.max_item_tokens)
  rank_fn = SCORE_MODES[cfg.score_mode][1]
  deltas, taus, runs = [], [], ({}, {})
  queries = dataset.queries[:cfg.max_queries] if cfg.max_queries else dataset.queries
  for q in queries:
    query_ids, _ = builder.query(q.query)
    items = [builder.item(text)[0] for _, text in q.candidates]
    lps = [_label_logprobs(s, query_ids, items, label_ids) for s in (ref, test)]
    deltas.append(_delta(*lps))
    ranking = [rank_fn(finalize_scores(lp, SCORE_MODES[cfg.score_mode][0])) for lp in lps]
    taus.append(kendall_tau(*ranking))
    for run, r in zip(runs, ranking):
      run[q.qid] = {d: float(s) for (d, _), s in zip(q.candidates, r)}
  means = [metrics.aggregate(metrics.evaluate(dataset.qrels, run, cfg.metrics)) for run in runs]
  return dict(queries=len(queries), items=sum(len(q.candidates) for q in queries),
              **{k: max(d[k] for d in deltas) for k in deltas[0]},
              kendall_tau_mean=float(np.mean(taus)), kendall_tau_min=float(np.min(taus)),
              metrics_ref=means[0], metrics_test=means[1],
              metric_deltas={k: means[1][k] - means[0][k] for k in means[0]})


def compare_on_random_tokens(ref: Scorer, test: Scorer, query_len: int, num_items: int, item_len: int,
                             label_ids: Sequence[int], seed: int = 0) -> dict[str, Any]:
  """The same deltas for one request of random tokens (e.g. on a random Qwen3-shaped model)."""
  rng = np.random.default_rng(seed)
  vocab = ref.config.model.vocab_size
  query = rng.integers(0, vocab, query_len).tolist()
  items = rng.integers(0, vocab, (num_items, item_len)).tolist()
  lps = [_label_logprobs(s, query, items, label_ids) for s in (ref, test)]
  out = _delta(*lps)
  out.update(kendall_tau=kendall_tau(lps[0][:, 0], lps[1][:, 0]), query_len=query_len, num_items=num_items,
             item_len=item_len)
  return out



def ranking_agreement(ref: Scorer, tests: Mapping[str, Scorer], num_queries: int, query_len: int, num_items: int,
                      item_len: int, label_ids: Sequence[int], seed: int = 0) -> dict[str, Any]:
  """Per scorer of `tests`: Kendall tau of its item order against `ref`'s for each of `num_queries` requests of
  random tokens (`num_items` items of `item_len` after a `query_len` query), ranked by the first label's
  softmax score over `label_ids`; their mean and min."""
  rng = np.random.default_rng(seed)
  vocab = ref.config.model.vocab_size
  taus: dict[str, list[float]] = {name: [] for name in tests}
  for _ in range(num_queries):
    query = rng.integers(0, vocab, query_len).tolist()
    items = rng.integers(0, vocab, (num_items, item_len)).tolist()
    order = lambda s: s.score(query, items, label_token_ids=label_ids, apply_softmax=True).scores[:, 0]  # noqa: E731
    expected = order(ref)
    for name, scorer in tests.items():
      taus[name].append(kendall_tau(expected, order(scorer)))
  return {name: dict(kendall_tau_mean=float(np.mean(t)), kendall_tau_min=float(np.min(t)), queries=num_queries,
                     query_len=query_len, num_items=num_items, item_len=item_len) for name, t in taus.items()}
