"""Ranking metrics with exact trec_eval semantics, in pure numpy.

Values match `pytrec_eval.RelevanceEvaluator` (relevance_level=1) key by key:

* Ranking: score descending, ties broken by docid in *descending* string order.
* A doc is relevant iff its grade is >= 1; grade 0, negative grades and unjudged
  docs are nonrelevant. nDCG gains are the grades themselves (linear), with
  negative grades counted as 0, discount log2(rank + 1), and the ideal ranking
  built from all judged docs with positive grade.
* Queries evaluated: those in the run and in qrels with at least one judgment
  (a query with no relevant docs scores 0; an empty run list also scores 0).

Metric names are trec_eval's (`ndcg_cut_K`, `recall_K`, `P_K`, `map`,
`map_cut_K`, `recip_rank`, `ndcg`) plus `recip_rank_cut_K` (MRR@K: reciprocal
rank of the first relevant doc within the top K, else 0). Friendly aliases map
to them: `ndcg@K` -> `ndcg_cut_K`, `mrr@K` -> `recip_rank_cut_K`,
`mrr` -> `recip_rank`, `recall@K` -> `recall_K`, `p@K` -> `P_K`,
`map@K` -> `map_cut_K`. Results are always keyed by the trec_eval name.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Optional

import numpy as np

Qrels = dict[str, dict[str, int]]
Run = dict[str, dict[str, float]]
PerQuery = dict[str, dict[str, float]]

DEFAULT_METRICS = ("ndcg_cut_10", "recip_rank", "map", "recall_100", "P_10")


@dataclasses.dataclass(frozen=True)
class _Ranked:
  """One query's ranked grades and judged-relevance summary."""

  gains: np.ndarray  # grade of each retrieved doc in rank order, negatives -> 0
  relevant: np.ndarray  # bool, gains >= 1, in rank order
  ideal_gains: np.ndarray  # positive judged grades, descending
  num_rel: int


def _dcg(gains: np.ndarray) -> float:
  return float(np.sum(gains / np.log2(np.arange(2, gains.size + 2))))


def _ndcg(q: _Ranked, k: Optional[int]) -> float:
  ideal = _dcg(q.ideal_gains[:k])
  return _dcg(q.gains[:k]) / ideal if ideal > 0 else 0.0


def _ap(q: _Ranked, k: Optional[int]) -> float:
  rel = q.relevant[:k]
  if q.num_rel == 0 or not rel.any():
    return 0.0
  precision = np.cumsum(rel) / np.arange(1, rel.size + 1)
  return float(np.sum(precision[rel])) / q.num_rel


def _recip_rank(q: _Ranked, k: Optional[int]) -> float:
  hits = np.flatnonzero(q.relevant[:k])
  return 1.0 / (hits[0] + 1) if hits.size else 0.0


def _recall(q: _Ranked, k: Optional[int]) -> float:
  return int(np.sum(q.relevant[:k])) / q.num_rel if q.num_rel else 0.0


def _precision(q: _Ranked, k: Optional[int]) -> float:
  return int(np.sum(q.relevant[:k])) / k


_Metric = Callable[[_Ranked, Optional[int]], float]
# trec_eval family -> (implementation, whether it takes a cutoff `_K`).
_FAMILIES: dict[str, tuple[_Metric, bool]] = {
    "ndcg": (_ndcg, False),
    "ndcg_cut": (_ndcg, True),
    "map": (_ap, False),
    "map_cut": (_ap, True),
    "recip_rank": (_recip_rank, False),
    "recip_rank_cut": (_recip_rank, True),
    "recall": (_recall, True),
    "P": (_precision, True),
}
_ALIASES = {"ndcg": "ndcg_cut", "mrr": "recip_rank_cut", "recall": "recall",
            "p": "P", "map": "map_cut"}
_VALID_FORMS = ("ndcg_cut_K, ndcg, recall_K, P_K, map, map_cut_K, recip_rank, "
                "recip_rank_cut_K, or aliases ndcg@K, mrr@K, mrr, recall@K, "
                "p@K, map@K (K a positive integer)")


def canonical_name(name: str) -> str:
  """Maps a metric name or alias to its trec_eval name; ValueError if unknown."""
  if name.lower() == "mrr":
    return "recip_rank"
  alias = re.fullmatch(r"([a-zA-Z]+)@(\d+)", name)
  if alias and alias.group(1).lower() in _ALIASES:
    name = f"{_ALIASES[alias.group(1).lower()]}_{alias.group(2)}"
  _parse(name)
  return name


def _parse(name: str) -> tuple[_Metric, Optional[int]]:
  if name in _FAMILIES and not _FAMILIES[name][1]:
    return _FAMILIES[name][0], None
  cut = re.fullmatch(r"(\w+?)_(\d+)", name)
  if cut and cut.group(1) in _FAMILIES and _FAMILIES[cut.group(1)][1]:
    k = int(cut.group(2))
    if k >= 1:
      return _FAMILIES[cut.group(1)][0], k
  raise ValueError(f"Unknown metric {name!r}; valid forms: {_VALID_FORMS}.")


def _rank(judgments: Mapping[str, int], scores: Mapping[str, float]) -> _Ranked:
  # Reverse sort on (score, docid): score desc, then docid desc, as trec_eval.
  order = sorted(scores.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
  grades = np.array([judgments.get(doc, 0) for doc, _ in order], dtype=np.float64)
  gains = np.maximum(grades, 0.0)
  ideal = np.sort(np.array([g for g in judgments.values() if g > 0],
                           dtype=np.float64))[::-1]
  return _Ranked(gains=gains, relevant=gains >= 1, ideal_gains=ideal,
                 num_rel=int(np.sum(ideal >= 1)))


@dataclasses.dataclass(frozen=True)
class Judged:
  """One query's candidates against its judgments, to score many orderings of the same candidates (a
  weight search) without rebuilding a run per ordering: `evaluate_scores` equals `evaluate` of that run."""
  grades: np.ndarray    # each candidate's grade (0 when unjudged), in candidate order
  tie_key: np.ndarray   # each candidate's place in descending docid order: trec_eval's tie-break
  ideal_gains: np.ndarray
  num_rel: int


def judge(judgments: Mapping[str, int], docids: Sequence[str]) -> Judged:
  """The Judged of candidates `docids` (distinct) under one query's `judgments`."""
  by_docid_desc = sorted(range(len(docids)), key=lambda i: docids[i], reverse=True)
  tie_key = np.empty(len(docids), np.int64)
  tie_key[by_docid_desc] = np.arange(len(docids))
  ranked = _rank(judgments, {})
  return Judged(np.array([judgments.get(d, 0) for d in docids], np.float64), tie_key, ranked.ideal_gains,
                ranked.num_rel)


def evaluate_scores(judged: Judged, scores: np.ndarray, metrics: Iterable[str]) -> dict[str, float]:
  """The metric values of the candidates ranked by `scores` (score descending, then docid descending, as
  `evaluate` ranks them)."""
  order = np.lexsort((judged.tie_key, -np.asarray(scores, np.float64)))
  gains = np.maximum(judged.grades[order], 0.0)
  ranked = _Ranked(gains=gains, relevant=gains >= 1, ideal_gains=judged.ideal_gains, num_rel=judged.num_rel)
  return {name: fn(ranked, k) for name, (fn, k) in ((n, _parse(canonical_name(n))) for n in metrics)}


def evaluate(qrels: Qrels, run: Run,
             metrics: Iterable[str] = DEFAULT_METRICS) -> PerQuery:
  """Per-query metric values, keyed by qid then trec_eval metric name."""
  parsed = {}
  for name in metrics:
    canon = canonical_name(name)
    parsed[canon] = _parse(canon)
  results = {}
  for qid, scores in run.items():
    if not qrels.get(qid):  # trec_eval skips queries without judgments.
      continue
    ranked = _rank(qrels[qid], scores)
    results[qid] = {name: fn(ranked, k) for name, (fn, k) in parsed.items()}
  return results


@dataclasses.dataclass(frozen=True)
class MetricSums:
  """Per-metric sums and a query count; merges across hosts, then `means()`."""

  sums: Mapping[str, float]
  count: int

  @classmethod
  def from_per_query(cls, per_query: PerQuery) -> MetricSums:
    names = sorted({name for values in per_query.values() for name in values})
    for qid, values in per_query.items():
      if sorted(values) != names:
        raise ValueError(f"Query {qid!r} has metrics {sorted(values)}, "
                         f"expected {names}.")
    sums = {n: float(sum(v[n] for v in per_query.values())) for n in names}
    return cls(sums=sums, count=len(per_query))

  def merge(self, other: MetricSums) -> MetricSums:
    if not self.count or not other.count:
      return self if other.count == 0 else other
    if set(self.sums) != set(other.sums):
      raise ValueError(f"Cannot merge metrics {sorted(self.sums)} with "
                       f"{sorted(other.sums)}.")
    return MetricSums({n: self.sums[n] + other.sums[n] for n in self.sums},
                      self.count + other.count)

  def means(self) -> dict[str, float]:
    return {n: s / self.count for n, s in self.sums.items()} if self.count else {}


def aggregate(per_query: PerQuery) -> dict[str, float]:
  """Mean of each metric over the evaluated queries (trec_eval's `all` row)."""
  return MetricSums.from_per_query(per_query).means()

