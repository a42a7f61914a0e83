"""The first-stage baseline of an eval: the ranking the reranker started from, on the same queries and depth.

A `RerankQuery` holds its candidates in first-stage order (the TREC run's ranks cut to --rerank_top_k,
or the JSONL form's given order), so the baseline is that order scored `n, n-1, ..., 1`: distinct
scores, so trec_eval's tie-breaking by docid never reorders it.

    base = first_stage.evaluate(dataset.qrels, queries, reranked_run, ("ndcg@10", "map"))
    base.means, base.delta(reranked_means)
"""

import dataclasses
from typing import Iterable, Mapping, Sequence

from maxscore.datasets import data
from maxscore.rerank import metrics

RUN_FILE = "first_stage.trec"
RUN_TAG = "first_stage"


def run_of(queries: Sequence[data.RerankQuery], qids: Iterable[str]) -> metrics.Run:
  """The first-stage run of the queries in `qids` (the ones the reranked run covers), rank order kept."""
  keep = set(qids)
  return {q.qid: {docid: float(len(q.candidates) - i) for i, (docid, _) in enumerate(q.candidates)}
          for q in queries if q.qid in keep}


@dataclasses.dataclass(frozen=True)
class Baseline:
  """The first-stage run, its per-query metrics and their means (metric names in trec_eval form)."""
  run: metrics.Run
  per_query: metrics.PerQuery
  means: dict[str, float]

  def delta(self, reranked: Mapping[str, float]) -> dict[str, float]:
    """reranked - first stage, per metric both have."""
    return {n: reranked[n] - self.means[n] for n in reranked if n in self.means}


def evaluate(qrels: metrics.Qrels, queries: Sequence[data.RerankQuery], reranked: metrics.Run,
             metric_names: Sequence[str]) -> Baseline:
  """The baseline of `reranked`: the same queries, each cut to the candidates the reranker saw."""
  run = run_of(queries, reranked)
  per_query = metrics.evaluate(qrels, run, metric_names)
  names = dict.fromkeys(metrics.canonical_name(m) for m in metric_names)
  means = metrics.aggregate(per_query) if per_query else {}
  return Baseline(run, per_query, {n: means[n] for n in names if n in means})


def trec_lines(baseline: Baseline) -> list[str]:
  """The baseline as TREC run lines (for scripts/compare_runs.py)."""
  return [line for qid, scores in baseline.run.items()
          for line in data.trec_lines(qid, list(scores), list(scores.values()), RUN_TAG)]

