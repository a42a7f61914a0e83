"""Fusion of the reranked run with its first stage, computed by ranx (`ranx.fuse`).

    fused = fuse(reranked, first, "interpolate", alpha=0.3)   # alpha * minmax(reranked) + (1-alpha) * minmax(first)
    fused = fuse(reranked, first, "rrf", rrf_k=60)            # sum over both runs of 1 / (k + rank)
    alpha, grid = tune_alpha(dev_qrels, dev_reranked, dev_first, "ndcg@10")

`interpolate` min-max normalizes each run per query (ranx's "min-max": (s - min) / (max - min), 0 where a
query's scores are all equal), then takes the weighted sum (ranx's "wsum"). `rrf` is reciprocal rank
fusion (ranx's "rrf") over the ranks trec_eval reads (score desc, then docid desc, so ties break alike).
Both runs hold the same candidates per query (the reranker scored the first stage's top k), so no
document is missing from either side.

The alpha of `interpolate` is given, or tuned on a dev split: each alpha of a fixed grid is fused with
ranx and scored with maxscore's own metrics (the trec_eval numbers the eval reports; ranx's optimizer would
score with its own), the best on the first metric wins (ties: the smaller alpha, nearer the first stage).
Tuning takes only the dev split's qrels and runs: the evaluated split is never read.
"""

import contextlib
import math
import warnings
from typing import Optional

import numpy as np

from maxscore.errors import ScoreInputError
from maxscore.rerank import metrics

METHODS = ("none", "interpolate", "rrf")
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


def check(method: str, alpha: str, rrf_k: float) -> None:
  """Raises FusionError naming the bad key."""
  if method not in METHODS:
    raise FusionError(f"fusion={method!r} is not one of {list(METHODS)}")
  parse_alpha(alpha)
  if not rrf_k > 0:
    raise FusionError(f"rrf_k={rrf_k} must be > 0")


def _ranx_run(run: metrics.Run, name: str):
  import ranx  # pylint: disable=import-outside-toplevel  (seconds to import; only when fusing)
  return ranx.Run({q: {d: float(s) for d, s in docs.items()} for q, docs in run.items() if docs}, name=name)


@contextlib.contextmanager
def _quiet_ranx():
  """ranx's numba functions (min-max normalization, rrf, Run building) cast uint64 indices to int64, and numba
  warns about it (NumbaTypeSafetyWarning) when it compiles them, in the middle of a report; the indices are
  small, so the warning says nothing about the result."""
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="unsafe cast from uint64 to int64")
    yield


def _trec_ranks(run: metrics.Run) -> metrics.Run:
  """Each query's documents scored n, n-1, ..., 1 in trec_eval's order (score desc, then docid desc): rrf
  reads ranks, and ranx would break score ties in its own way."""
  return {q: {d: float(len(docs) - i) for i, d in enumerate(sorted(docs, key=lambda d: (docs[d], d), reverse=True))}
          for q, docs in run.items()}


def fuse(reranked: metrics.Run, first: metrics.Run, method: str, alpha: float = 0.5,
         rrf_k: float = 60) -> metrics.Run:
  """The fused run of the queries both runs cover ({qid: {docid: score}})."""
  import ranx  # pylint: disable=import-outside-toplevel
  qids = [q for q in reranked if reranked[q] and first.get(q)]
  a = {q: reranked[q] for q in qids}
  b = {q: first[q] for q in qids}
  if method == "interpolate":
    for name, run in (("reranked", a), ("first stage", b)):
      bad = next((q for q, docs in run.items() if not all(math.isfinite(s) for s in docs.values())), None)
      if bad is not None:
        raise FusionError(f"fusion=interpolate needs finite scores; the {name} run of query {bad!r} has "
                          "an infinite one (score_mode=log_odds?); use fusion=rrf")
    params = {"weights": [alpha, 1.0 - alpha]}
    with _quiet_ranx():
      fused = ranx.fuse([_ranx_run(a, "reranked"), _ranx_run(b, "first")], norm="min-max", method="wsum",
                        params=params)
  elif method == "rrf":
    a, b = _trec_ranks(a), _trec_ranks(b)
    with _quiet_ranx():
      fused = ranx.fuse([_ranx_run(a, "reranked"), _ranx_run(b, "first")], method="rrf", params={"k": rrf_k})
  else:
    raise FusionError(f"fusion={method!r} is not one of {list(METHODS[1:])}")
  out = fused.to_dict()
  return {q: dict(out.get(q, {})) for q in qids}


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
  """A short label of the fusion settings ("interpolate alpha=0.35", "rrf k=60")."""
  return f"interpolate alpha={alpha:g}" if method == "interpolate" else f"rrf k={rrf_k:g}"

