"""Fusion of the reranked run with its first stage, with ranx's arithmetic (`ranx.fuse`).

    fused = fuse(reranked, first, "interpolate", alpha=0.3)   # alpha * minmax(reranked) + (1-alpha) * minmax(first)
    fused = fuse(reranked, first, "rrf", rrf_k=60)            # sum over both runs of 1 / (k + rank)
    alpha, grid = tune_alpha(dev_qrels, dev_reranked, dev_first, "ndcg@10")
    learned = tune_learned(dev_qrels, dev_reranked, dev_first, dev_texts, "ndcg@10")   # on dev only
    fused = fuse_learned(reranked, first, texts, learned)

`interpolate` min-max normalizes each run per query (ranx's "min-max": (s - min) / (max - min), 0 where a
query's scores are all equal), then takes the weighted sum (ranx's "wsum"). `rrf` is reciprocal rank
fusion (ranx's "rrf") over the ranks trec_eval reads (score desc, then docid desc, so ties break alike).
The scores equal ranx's bit for bit; ranx itself is the tests' oracle, not a dependency of the fusion.
Both runs hold the same candidates per query (the reranker scored the first stage's top k), so no
document is missing from either side.

The alpha of `interpolate` is given, or tuned on a dev split: each alpha of a fixed grid is fused and scored
with maxscore's own metrics (the trec_eval numbers the eval reports; ranx's optimizer would score with its
own), the best on the first metric wins (ties: the smaller alpha, nearer the first stage).
Tuning takes only the dev split's qrels and runs: the evaluated split is never read.

`learned` scores each document by a convex combination, tuned on dev, of four features: the reranker's score
and the first stage's (each min-max normalized per query), and two lexical ones that need no model: the share
of the query's distinct words the document holds (coverage) and that share weighted by each word's IDF. The
IDF is counted over the dev split's candidate documents, so nothing of the evaluated split (its texts, runs or
qrels) shapes the weights. The weights run over a grid of step 0.1 on the simplex; the best dev metric wins
(ties: the grid point with the most weight on the first stage, then on the reranker). The same tuning without
the reranker's feature (first stage and lexical features only) is kept beside it, so a report can show what
the reranker adds.
"""

import dataclasses
import itertools
import json
import math
import os
from typing import Mapping, Optional

import numpy as np

from maxscore.errors import ScoreInputError
from maxscore.files import safety
from maxscore.rerank import metrics

METHODS = ("none", "interpolate", "rrf", "learned")
FEATURES = ("reranker", "first_stage", "coverage", "idf_coverage")
WEIGHT_STEPS = 10  # the learned weights are multiples of 1 / WEIGHT_STEPS
ALPHA_GRID = tuple(round(float(a), 2) for a in np.linspace(0.0, 1.0, 21))
TUNED = "dev"


class FusionError(ScoreInputError):
  """A fusion setting that cannot be applied (unknown method, alpha out of range, non-finite scores)."""


def parse_alpha(value: str) -> Optional[float]:
  """`value` of fusion_alpha: "dev" (None: tune on the dev split) or a number in [0, 1]."""
  if str(value).strip() == TUNED:
    return None
  try:
    alpha = float(value)
  except ValueError:
    alpha = math.nan
  if not 0.0 <= alpha <= 1.0:
    raise FusionError(f"fusion_alpha={value!r} must be 'dev' (tuned on the dev split) or a number in [0, 1]")
  return alpha


def needs_dev(method: str, alpha: str, learned_file: str = "") -> bool:
  """Whether the fusion is tuned on the dev split (interpolate with fusion_alpha=dev, or learned without a
  saved `learned_file`)."""
  return (method == "learned" and not learned_file) or (method == "interpolate" and parse_alpha(alpha) is None)


def check(method: str, alpha: str, rrf_k: float) -> None:
  """Raises FusionError naming the bad key."""
  if method not in METHODS:
    raise FusionError(f"fusion={method!r} is not one of {list(METHODS)}")
  parse_alpha(alpha)
  if not rrf_k > 0:
    raise FusionError(f"rrf_k={rrf_k} must be > 0")


def _min_max(docs: dict[str, float]) -> dict[str, float]:
  """ranx's "min-max": (s - min) / max(max - min, 1e-9), so 0 where all scores are equal."""
  docs = {d: float(s) for d, s in docs.items()}  # float64, as ranx holds scores
  lo, hi = min(docs.values()), max(docs.values())
  denominator = max(hi - lo, 1e-9)
  return {d: (s - lo) / denominator for d, s in docs.items()}


def _rrf_terms(docs: dict[str, float], k: float) -> dict[str, float]:
  """1 / (k + rank) with rank 1, 2, ... in trec_eval's order (score desc, then docid desc)."""
  order = sorted(docs, key=lambda d: (docs[d], d), reverse=True)
  return {d: 1 / (k + i + 1) for i, d in enumerate(order)}


def _weighted_sum(parts: list[dict[str, float]], weights: list[float]) -> dict[str, float]:
  """Per document, the sum of weight * score over the parts, a missing document counting 0 (ranx's "wsum";
  with weights of 1, its "comb_sum"), added in the parts' order as ranx adds them."""
  out = {}
  for part in parts:
    for d in part:
      if d not in out:
        total = 0.0
        for w, other in zip(weights, parts):
          total += w * other.get(d, 0.0)
        out[d] = total
  return out


def _by_score(docs: dict[str, float]) -> dict[str, float]:
  return dict(sorted(docs.items(), key=lambda x: x[1], reverse=True))


def fuse(reranked: metrics.Run, first: metrics.Run, method: str, alpha: float = 0.5,
         rrf_k: float = 60) -> metrics.Run:
  """The fused run of the queries both runs cover ({qid: {docid: score}}, each query's best first).

  The arithmetic is ranx's (`ranx.fuse` with norm="min-max", method="wsum", and method="rrf"), in float64 and
  in its order, so the scores equal ranx's bit for bit (tests/test_fusion_suite.py holds them to it). It is
  written here because ranx builds its runs with numba, which compiles for most of a minute in every process
  that fuses, however few the scores."""
  qids = [q for q in reranked if reranked[q] and first.get(q)]
  if method == "interpolate":
    for name, run in (("reranked", reranked), ("first stage", first)):
      bad = next((q for q in qids if not all(math.isfinite(s) for s in run[q].values())), None)
      if bad is not None:
        raise FusionError(f"fusion=interpolate needs finite scores; the {name} run of query {bad!r} has "
                          "an infinite one (score_mode=log_odds?); use fusion=rrf")
    weights = [alpha, 1.0 - alpha]
    return {q: _by_score(_weighted_sum([_min_max(reranked[q]), _min_max(first[q])], weights)) for q in qids}
  if method == "rrf":
    return {q: _by_score(_weighted_sum([_rrf_terms(reranked[q], rrf_k), _rrf_terms(first[q], rrf_k)], [1.0, 1.0]))
            for q in qids}
  raise FusionError(f"fusion={method!r} is not one of {list(METHODS[1:])}")


def tune_alpha(dev_qrels: metrics.Qrels, dev_reranked: metrics.Run, dev_first: metrics.Run,
               metric: str) -> tuple[float, dict[float, float]]:
  """(best alpha, {alpha: mean `metric` on dev}) over ALPHA_GRID; only dev's qrels and runs are read."""
  name = metrics.canonical_name(metric)
  grid = {}
  for alpha in ALPHA_GRID:
    per_query = metrics.evaluate(dev_qrels, fuse(dev_reranked, dev_first, "interpolate", alpha), [name])
    if not per_query:
      raise FusionError("fusion_alpha=dev: no dev query has both judgments and candidates to tune on")
    grid[alpha] = metrics.aggregate(per_query)[name]
  best = max(grid.values())
  return min(a for a, v in grid.items() if v == best), grid


def params_text(method: str, alpha: Optional[float], rrf_k: float) -> str:
  """A short label of the fusion settings ("interpolate alpha=0.35", "rrf k=60", "learned")."""
  if method == "learned":
    return "learned on dev"
  return f"interpolate alpha={alpha:g}" if method == "interpolate" else f"rrf k={rrf_k:g}"


# --- learned fusion ------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Texts:
  """What the lexical features read: each query's text and each candidate document's text."""
  queries: Mapping[str, str]   # qid -> query text
  docs: Mapping[str, str]      # docid -> document text


@dataclasses.dataclass(frozen=True)
class Learned:
  """Tuned weights of FEATURES (summing to 1), the IDF table they were tuned with, and their dev figures."""
  weights: tuple[float, ...]
  idf: Mapping[str, float]
  idf_unseen: float
  dev_value: float
  dev_metric: str
  dev_queries: int

  def to_json(self) -> dict:
    return {"weights": dict(zip(FEATURES, self.weights)), "dev_metric": self.dev_metric,
            "dev_value": self.dev_value, "dev_queries": self.dev_queries}


def _words(text: str) -> list[str]:
  from maxscore.datasets.bm25 import words  # pylint: disable=import-outside-toplevel
  return words(text)


def idf_table(docs: Mapping[str, str]) -> tuple[dict[str, float], float]:
  """({word: log(1 + (n - df + 0.5) / (df + 0.5))} over `docs`, the IDF of a word in none of them)."""
  n = len(docs)
  df: dict[str, int] = {}
  for text in docs.values():
    for w in set(_words(text)):
      df[w] = df.get(w, 0) + 1
  idf = lambda d: math.log(1 + (n - d + 0.5) / (d + 0.5))  # noqa: E731
  return {w: idf(d) for w, d in sorted(df.items())}, idf(0)


def lexical_features(query: str, doc: str, idf: Mapping[str, float], idf_unseen: float) -> tuple[float, float]:
  """(share of the query's distinct words in the document, the same share weighted by IDF); 0 for a query
  without words."""
  q = set(_words(query))
  if not q:
    return 0.0, 0.0
  d = set(_words(doc))
  hit = q & d
  weight = lambda ws: sum(idf.get(w, idf_unseen) for w in sorted(ws))  # noqa: E731
  return len(hit) / len(q), weight(hit) / weight(q)


def feature_matrix(reranked: metrics.Run, first: metrics.Run, texts: Texts, idf: Mapping[str, float],
                   idf_unseen: float) -> dict[str, tuple[list[str], np.ndarray]]:
  """Per query both runs cover: (docids, features [N, len(FEATURES)] float64)."""
  out = {}
  for q in (q for q in reranked if reranked[q] and first.get(q)):
    r, f = _min_max(reranked[q]), _min_max(first[q])
    docids = list(reranked[q])
    rows = [(r[d], f.get(d, 0.0), *lexical_features(texts.queries[q], texts.docs[d], idf, idf_unseen))
            for d in docids]
    out[q] = (docids, np.asarray(rows, np.float64))
  return out


def _weight_grid(use_reranker: bool) -> list[tuple[float, ...]]:
  """Every weight vector on the simplex in steps of 1 / WEIGHT_STEPS, in tie-break order: most weight on the
  first stage first, then on the reranker."""
  grid = [c for c in itertools.product(range(WEIGHT_STEPS + 1), repeat=len(FEATURES))
          if sum(c) == WEIGHT_STEPS and (use_reranker or c[0] == 0)]
  grid.sort(key=lambda c: (-c[1], -c[0], -c[2], -c[3]))
  return [tuple(x / WEIGHT_STEPS for x in c) for c in grid]


def _score(feats: dict[str, tuple[list[str], np.ndarray]], weights) -> metrics.Run:
  w = np.asarray(weights, np.float64)
  return {q: _by_score(dict(zip(docids, (x @ w).tolist()))) for q, (docids, x) in feats.items()}


def tune_learned(dev_qrels: metrics.Qrels, dev_reranked: metrics.Run, dev_first: metrics.Run, dev_texts: Texts,
                 metric: str, use_reranker: bool = True) -> Learned:
  """The weights of FEATURES with the best mean `metric` on dev (only dev's qrels, runs and texts are read)."""
  name = metrics.canonical_name(metric)
  idf, unseen = idf_table({d: dev_texts.docs[d] for q in dev_reranked for d in dev_reranked[q]})
  feats = feature_matrix(dev_reranked, dev_first, dev_texts, idf, unseen)
  judged = {q: metrics.judge(dev_qrels[q], docids) for q, (docids, _) in feats.items() if dev_qrels.get(q)}
  if not judged:
    raise FusionError("fusion=learned: no dev query has both judgments and candidates to tune on")
  best, best_value = None, -math.inf
  for weights in _weight_grid(use_reranker):
    w = np.asarray(weights, np.float64)  # each query ranked as `_score` would rank it, evaluated in place
    per_query = {q: metrics.evaluate_scores(judged[q], feats[q][1] @ w, [name]) for q in judged}
    value = metrics.aggregate(per_query)[name]
    if value > best_value:
      best, best_value = weights, value
  return Learned(best, idf, unseen, best_value, name, len(feats))


LEARNED_FILE = "learned_fusion.json"
_LEARNED_FORMAT = "maxscore learned fusion 1"


def save_learned(path: os.PathLike, learned: tuple[Learned, Learned], scorer_key: str = "") -> None:
  """Writes the learned fusion (with the reranker, and without it) with its IDF tables, to be read by
  `load_learned` (an eval's --fusion_learned) instead of tuning on dev again; `scorer_key` names the scorer
  whose scores it was tuned on (score_cache.scorer_key of the eval's score fingerprint)."""
  shared = {"idf": dict(learned[0].idf), "idf_unseen": learned[0].idf_unseen}
  parts = {name: {"weights": list(l.weights), "dev_value": l.dev_value, "dev_metric": l.dev_metric,
                  "dev_queries": l.dev_queries,
                  **({} if (dict(l.idf), l.idf_unseen) == (shared["idf"], shared["idf_unseen"]) else
                     {"idf": dict(l.idf), "idf_unseen": l.idf_unseen})}  # one IDF table when both share it
           for name, l in zip(("with_reranker", "without_reranker"), learned)}
  safety.atomic_write_text(path, json.dumps({"format": _LEARNED_FORMAT, "features": list(FEATURES),
                                              "scorer_key": scorer_key, **shared, **parts}, sort_keys=True))


def _read_learned(path: os.PathLike) -> dict:
  """The JSON of a saved learned fusion, its format checked; a FusionError names what is wrong."""
  try:
    with open(path, encoding="utf-8") as f:
      raw = json.load(f)
  except (OSError, ValueError) as e:
    raise FusionError(f"fusion_learned={str(path)!r}: cannot read a learned fusion ({e})") from e
  if not isinstance(raw, dict) or raw.get("format") != _LEARNED_FORMAT or raw.get("features") != list(FEATURES):
    raise FusionError(f"fusion_learned={str(path)!r} is not a learned fusion of features {list(FEATURES)} "
                      f"(an eval writes one as {LEARNED_FILE} with fusion=learned)")
  return raw


def load_learned(path: os.PathLike) -> tuple[Learned, Learned]:
  """The (with reranker, without) learned fusion `save_learned` wrote; a FusionError names what is wrong."""
  raw = _read_learned(path)
  try:
    return tuple(Learned(tuple(float(w) for w in p["weights"]),
                         {str(k): float(v) for k, v in p.get("idf", raw["idf"]).items()},
                         float(p.get("idf_unseen", raw["idf_unseen"])), float(p["dev_value"]), str(p["dev_metric"]),
                         int(p["dev_queries"]))
                 for p in (raw["with_reranker"], raw["without_reranker"]))
  except (KeyError, TypeError, ValueError) as e:
    raise FusionError(f"fusion_learned={str(path)!r}: a part is missing or malformed ({e!r})") from e


def learned_scorer_key(path: os.PathLike) -> str:
  """The scorer key a saved learned fusion was tuned with ("" when it names none)."""
  return str(_read_learned(path).get("scorer_key", ""))


def fuse_learned(reranked: metrics.Run, first: metrics.Run, texts: Texts, learned: Learned) -> metrics.Run:
  """The evaluated split fused with weights and IDF tuned on dev."""
  for name, run in (("reranked", reranked), ("first stage", first)):
    bad = next((q for q in run if not all(math.isfinite(s) for s in run[q].values())), None)
    if bad is not None:
      raise FusionError(f"fusion=learned needs finite scores; the {name} run of query {bad!r} has an infinite "
                        "one (score_mode=log_odds?); use fusion=rrf")
  return _score(feature_matrix(reranked, first, texts, learned.idf, learned.idf_unseen), learned.weights)

