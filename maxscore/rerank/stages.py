"""The three runs an eval reports on the same queries and depth: the first stage, the reranked run and
(when asked) their fusion, each tested against the first stage (docs/ARCHITECTURE.md section 11).

    result = stages.evaluate(qrels, queries, reranked, base, cfg, dev)   # fused run, metrics, tests
    print("\\n".join(stages.table(result)))

The tests are `compare.compare_per_query`'s, as scripts/compare_runs.py makes them: per metric a paired
randomization test and a paired t-test (two-sided) of each run against the first stage, Holm-Bonferroni
across every (run, metric) comparison of the eval.
"""

import dataclasses
from typing import Any, Optional, Sequence

from maxscore.datasets import data
from maxscore.errors import DataError
from maxscore.rerank import compare, first_stage, fusion, metrics

FIRST, RERANKED, FUSED = "first stage", "reranked", "fused"
FUSED_NO_RERANKER = "fused, no reranker"  # fusion=learned tuned without the reranker's score: what the reranker adds
RUN_FILE = "fusion.trec"
RUN_TAG = "fusion"


def first_stage_scores(queries: Sequence[data.RerankQuery], qids) -> metrics.Run:
  """The first stage's own scores of the queries in `qids` (a TREC run's), or, where the input has none
  (the JSONL form), its ranks as scores n, n-1, ..., 1: what interpolation normalizes."""
  keep = set(qids)
  return {q.qid: dict(zip((d for d, _ in q.candidates), q.scores)) if q.scores else
          {d: float(len(q.candidates) - i) for i, (d, _) in enumerate(q.candidates)}
          for q in queries if q.qid in keep}


@dataclasses.dataclass(frozen=True)
class DevSplit:
  """What tuning may read: the dev split's qrels, reranked run, first-stage scores and texts."""
  qrels: metrics.Qrels
  reranked: metrics.Run
  first: metrics.Run
  texts: Optional[fusion.Texts] = None


def texts_of(queries: Sequence[data.RerankQuery]) -> fusion.Texts:
  """The query and candidate texts the learned fusion's lexical features read."""
  return fusion.Texts({q.qid: q.query for q in queries}, {d: t for q in queries for d, t in q.candidates})


def dev_queries(queries: Sequence[data.RerankQuery], dev: Optional[data.RerankSet], fusion_name: str,
                fusion_alpha: Any, max_queries: int, fusion_learned: str = "") -> list[data.RerankQuery]:
  """The dev split's queries to score for tuning (none unless fusion_alpha=dev asks for them); a query in
  both splits is refused, so tuning never sees an evaluated query."""
  if dev is None or not fusion.needs_dev(fusion_name, fusion_alpha, fusion_learned):
    return []
  chosen = dev.queries[:max_queries] if max_queries else dev.queries
  both = sorted({q.qid for q in queries} & {q.qid for q in chosen})
  if both:
    raise DataError(f"fusion tuned on dev: queries {both[:3]} are in both the evaluated split and dev; "
                         "tuning needs a dev split of other queries")
  return list(chosen)


def dev_split(dev: Optional[data.RerankSet], dev_queries, done) -> Optional[DevSplit]:
  """What tuning reads: dev's qrels and its queries' reranked and first-stage runs (nothing of the evaluated split)."""
  if not dev_queries:
    return None
  reranked = {q.qid: dict(zip(done[q.qid]["docids"], done[q.qid]["scores"])) for q in dev_queries
              if q.qid in done and done[q.qid]["docids"]}
  return DevSplit(dev.qrels, reranked, first_stage_scores(dev_queries, reranked), texts_of(dev_queries))


@dataclasses.dataclass(frozen=True)
class Stages:
  """Means per run (first stage, reranked, fused), the fused run, the fusion settings, the tests."""
  means: dict[str, dict[str, float]]
  fused_run: Optional[metrics.Run]
  fused_per_query: metrics.PerQuery
  fusion: dict[str, Any]
  tests: list[dict[str, Any]]
  learned: Optional[tuple] = None  # fusion=learned: (with the reranker, without) fusion.Learned

  def delta(self, run: str) -> dict[str, float]:
    return {m: v - self.means[FIRST][m] for m, v in self.means.get(run, {}).items() if m in self.means[FIRST]}

  def to_json(self) -> dict[str, Any]:
    out = {"fusion": self.fusion, "tests": self.tests}
    if FUSED in self.means:
      out |= {"fused": self.means[FUSED], "fused_delta": self.delta(FUSED)}
    return out


def _learned(cfg, dev: Optional[DevSplit]) -> tuple[fusion.Learned, fusion.Learned]:
  """The learned fusion's weights tuned on `dev` (or read from cfg.fusion_learned), with the reranker's score
  and without it."""
  if cfg.fusion_learned:
    return fusion.load_learned(cfg.fusion_learned)
  if dev is None or dev.texts is None:
    raise fusion.FusionError("fusion=learned is tuned on the dev split's queries (none were given)")
  return tuple(fusion.tune_learned(dev.qrels, dev.reranked, dev.first, dev.texts, cfg.metrics[0], use_reranker=u)
               for u in (True, False))


def _fusion_settings(cfg, dev: Optional[DevSplit], learned=None) -> dict[str, Any]:
  """{"method", "alpha", "alpha_from", "dev_grid", "rrf_k"}; alpha tuned on `dev` when fusion_alpha is dev; the
  learned fusion's weights (and those without the reranker) when fusion=learned."""
  if cfg.fusion == "learned":
    source = {"learned_from": cfg.fusion_learned} if cfg.fusion_learned else {}
    return {"method": "learned", **learned[0].to_json(), "without_reranker": learned[1].to_json(), **source}
  if cfg.fusion != "interpolate":
    return {"method": cfg.fusion} | ({"rrf_k": cfg.rrf_k} if cfg.fusion == "rrf" else {})
  alpha = fusion.parse_alpha(cfg.fusion_alpha)
  if alpha is not None:
    return {"method": "interpolate", "alpha": alpha, "alpha_from": "given"}
  if dev is None:
    raise fusion.FusionError("fusion_alpha=dev needs the dev split's queries (none were given)")
  alpha, grid = fusion.tune_alpha(dev.qrels, dev.reranked, dev.first, cfg.metrics[0])
  return {"method": "interpolate", "alpha": alpha, "alpha_from": "dev", "dev_queries": len(dev.reranked),
          "dev_metric": metrics.canonical_name(cfg.metrics[0]), "dev_grid": {f"{a:g}": v for a, v in grid.items()}}


def evaluate(qrels: metrics.Qrels, queries: Sequence[data.RerankQuery], reranked: metrics.Run,
             reranked_per_query: metrics.PerQuery, base: first_stage.Baseline, cfg,
             dev: Optional[DevSplit] = None) -> Stages:
  """The fused run (cfg.fusion, cfg.fusion_alpha, cfg.rrf_k) and the tests of reranked and fused against
  the first stage on the queries the reranked run was evaluated on."""
  names = list(dict.fromkeys(metrics.canonical_name(m) for m in cfg.metrics))
  learned = _learned(cfg, dev) if cfg.fusion == "learned" else None
  settings = _fusion_settings(cfg, dev, learned)
  evaluated = {FIRST: base.per_query, RERANKED: reranked_per_query}
  fused_run, fused_pq = None, {}
  if cfg.fusion == "learned":
    texts, first = texts_of(queries), first_stage_scores(queries, reranked)
    fused_run = fusion.fuse_learned(reranked, first, texts, learned[0])
    fused_pq = metrics.evaluate(qrels, fused_run, names)
    evaluated[FUSED] = fused_pq
    evaluated[FUSED_NO_RERANKER] = metrics.evaluate(qrels, fusion.fuse_learned(reranked, first, texts, learned[1]),
                                                    names)
  elif cfg.fusion != "none":
    fused_run = fusion.fuse(reranked, first_stage_scores(queries, reranked), cfg.fusion,
                            settings.get("alpha", 0.5), cfg.rrf_k)
    fused_pq = metrics.evaluate(qrels, fused_run, names)
    evaluated[FUSED] = fused_pq
  if not reranked_per_query:
    return Stages({FIRST: {}, RERANKED: {}}, fused_run, fused_pq, settings, [], learned)
  result = compare.compare_per_query({k: {q: v[q] for q in reranked_per_query} for k, v in evaluated.items()},
                                     names, baseline=FIRST)
  tests = [{k: t[k] for k in ("run", "metric", "delta", "p_randomization", "p_randomization_holm", "p_t",
                               "p_t_holm", "randomization_method", "wins", "ties", "losses", "ci_low", "ci_high",
                               "significant")}
           for t in result.tests]
  return Stages(result.means, fused_run, fused_pq, settings, tests, learned)


def trec_lines(run: metrics.Run, qids: Sequence[str]) -> list[str]:
  """The fused run as TREC lines, queries in `qids` order."""
  return [line for q in qids if q in run for line in data.trec_lines(q, list(run[q]), list(run[q].values()), RUN_TAG)]


def table(s: Stages, first_stage_name: str = FIRST) -> list[str]:
  """Console lines: a row per run (first stage, reranked, fused), per metric its mean, delta and p-value."""
  names = list(s.means[FIRST]) if s.means.get(FIRST) else []
  by = {(t["run"], t["metric"]): t for t in s.tests}
  width = 27
  label = {FIRST: first_stage_name, RERANKED: RERANKED,
           FUSED: f"{FUSED} ({fusion.params_text(s.fusion['method'], s.fusion.get('alpha'), s.fusion.get('rrf_k', 0))})"
           if FUSED in s.means else FUSED, FUSED_NO_RERANKER: FUSED_NO_RERANKER}
  lw = max(len(v) for v in label.values())
  widths = [width + (16 if i == 0 else 0) for i in range(len(names))]  # the first metric's cell holds its interval
  lines = [(f"  {'run':<{lw}} " + " ".join(f"{n:<{w}}" for n, w in zip(names, widths))).rstrip()]
  for run, means in s.means.items():
    cells = []
    for i, n in enumerate(names):
      t = by.get((run, n))
      cell = f"{means[n]:.4f}" if t is None else (
          f"{means[n]:.4f} {t['delta']:+.4f} p={t['p_randomization_holm']:.3f}{compare.MARK if t['significant'] else ''}")
      if t is not None and i == 0:  # the first metric's delta with its 95% interval
        cell += f" [{t['ci_low']:+.3f},{t['ci_high']:+.3f}]"
      cells.append(f"{cell:<{widths[i]}}")
    lines.append(f"  {label[run]:<{lw}} " + " ".join(cells).rstrip())
  if s.tests:
    lines.append(f"  (delta and p against the {first_stage_name}: paired randomization test, two-sided, "
                 f"Holm over {len(s.tests)} comparisons; {compare.MARK} p < 0.05; [low,high]: the 95% interval of "
                 f"the {names[0]} delta, percentile bootstrap over queries)")
  return lines
