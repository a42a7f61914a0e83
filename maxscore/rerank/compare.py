"""Comparing ranking runs on one qrels: means, differences to a baseline run, paired tests, wins/ties/losses.

    runs = {name: compare.load_run(path) for name, path in compare.name_runs(["out/a", "bm25.trec"])}
    result = compare.compare(runs, qrels, ["ndcg@10", "map"], baseline="bm25")
    print(compare.markdown(result))

Every run is evaluated with `metrics.evaluate` (trec_eval semantics) on the same queries: those it
retrieved for and that have judgments. Runs covering different queries are refused unless
`intersect=True`, which compares them on the queries all of them cover. Each non-baseline run is
compared with the baseline on every metric by a paired t-test and a paired randomization test (both
two-sided); Holm-Bonferroni adjusts each test's p-values across all (run, metric) comparisons made.
"""

import dataclasses
import json
import pathlib
from typing import Any, Literal, Mapping, Optional, Sequence

from maxscore.datasets import data, records
from maxscore.errors import DataError
from maxscore.rerank import first_stage, metrics, significance

DEFAULT_METRICS = ("ndcg@10", "mrr@10", "map")
TESTS = ("randomization", "t")
MARK = "†"


class CompareError(ValueError):
  """Runs that cannot be compared as given (unknown baseline, different query sets, unreadable input)."""


@dataclasses.dataclass(frozen=True)
class CompareOptions:
  """scripts/compare_runs.py's settings (configs/compare.yml documents each key)."""
  qrels: Optional[str] = None
  metrics: tuple[str, ...] = DEFAULT_METRICS
  baseline: Optional[str] = None
  intersect: bool = False
  test: Literal["randomization", "t"] = "randomization"
  alpha: float = 0.05
  num_samples: int = 10_000
  seed: int = 0
  output_json: Optional[str] = None
  output_latex: Optional[str] = None
  plot_dir: Optional[str] = None

  def validate(self) -> "CompareOptions":
    if not 0 < self.alpha < 1:
      raise CompareError(f"alpha={self.alpha} must be in (0, 1)")
    if self.num_samples < 1:
      raise CompareError(f"num_samples={self.num_samples} must be >= 1")
    if not self.metrics:
      raise CompareError("metrics must name at least one metric")
    return self


# --- inputs --------------------------------------------------------------------------------------
def name_runs(args: Sequence[str]) -> list[tuple[str, pathlib.Path]]:
  """(name, path) of each `path` or `name=path` argument; a default name is the eval directory's or the
  run file's stem, with the parent directory prefixed where that alone would repeat."""
  pairs = []
  for a in args:
    name, sep, path = a.partition("=")
    pairs.append((name, pathlib.Path(path)) if sep and name and path else (None, pathlib.Path(a)))
  stem = lambda p: p.name if p.is_dir() else p.stem
  counts: dict[str, int] = {}
  for name, p in pairs:
    counts[name or stem(p)] = counts.get(name or stem(p), 0) + 1
  named = [(name or (stem(p) if counts[stem(p)] == 1 else f"{p.resolve().parent.name}/{stem(p)}"), p)
           for name, p in pairs]
  seen = set()
  for name, p in named:
    if name in seen:
      raise CompareError(f"two runs are named {name!r}; name them with name=path")
    seen.add(name)
  return named


def load_run(path: pathlib.Path) -> metrics.Run:
  """A TREC run file, or an eval output directory's reranked run (its run.trec)."""
  path = pathlib.Path(path)
  if path.is_dir():
    if not (path / "run.trec").exists():
      raise CompareError(f"{path} is a directory without run.trec (not an eval output directory)")
    path = path / "run.trec"
  if not path.exists():
    raise CompareError(f"run {path} does not exist (pass eval output directories or TREC run files)")
  return data.read_trec_run(path)


def load_qrels(path: Optional[pathlib.Path], run_paths: Sequence[pathlib.Path] = ()) -> tuple[metrics.Qrels, str]:
  """(qrels, where from): a TREC or BEIR qrels file, a JSONL rerank set (its qrels fields), or, with
  `path=None`, the data the first eval output directory among `run_paths` was evaluated on."""
  if path is None:
    evals = [p for p in run_paths if (pathlib.Path(p) / "summary.json").exists()]
    if not evals:
      raise CompareError("no --qrels given and no eval output directory (with summary.json) to take it from")
    src = json.loads((pathlib.Path(evals[0]) / "summary.json").read_text(encoding="utf-8"))["data"]
    if src.get("format") == "jsonl":
      path = pathlib.Path(src["path"])
    else:
      path = pathlib.Path(src["data_dir"]) / "qrels" / f"{src['split']}.tsv"
  path = pathlib.Path(path)
  if not path.exists():
    raise CompareError(f"qrels {path} does not exist")
  try:
    if path.suffix == ".jsonl":
      return data.load_jsonl(path, split="all").qrels, str(path)
    return data.read_qrels(path), str(path)
  except DataError as e:  # compare_runs has no --skip_bad: its hint does not apply here
    raise CompareError(str(e).replace(records.SKIP_HINT, "")) from None


def first_stage_path(eval_dir: pathlib.Path) -> pathlib.Path:
  """The first-stage run an eval output directory wrote beside its reranked run."""
  return pathlib.Path(eval_dir) / first_stage.RUN_FILE


def depth_series(groups: Mapping[str, Sequence[pathlib.Path]], metric: str,
                 first_stage_label: Optional[str] = "first stage") -> dict[str, list[tuple[int, float]]]:
  """label -> [(rerank depth k, mean metric)] from eval output directories run at several --rerank_top_k;
  k is the most candidates any query had in the directory's run.trec. The first group's directories also
  give the first stage's line (its metrics at the same depths), under `first_stage_label` (None: left out)."""
  name = metrics.canonical_name(metric)
  series: dict[str, list[tuple[int, float]]] = {}
  seen_data: dict[str, pathlib.Path] = {}
  for i, (label, dirs) in enumerate(groups.items()):
    if not dirs:
      raise CompareError(f"depth line {label!r} names no eval output directory")
    models: dict[str, pathlib.Path] = {}
    for d in dirs:
      d = pathlib.Path(d)
      if not (d / "metrics.json").exists():
        raise CompareError(f"{d} has no metrics.json (not a finished eval output directory)")
      _same_eval(d, label, seen_data, models)
      report = json.loads((d / "metrics.json").read_text(encoding="utf-8"))
      if name not in report["metrics"]:
        raise CompareError(f"{d}/metrics.json has no {name}; it has {sorted(report['metrics'])}")
      k = max((len(docs) for docs in load_run(d).values()), default=0)
      series.setdefault(label, []).append((k, report["metrics"][name]))
      if i == 0 and first_stage_label and name in report.get("first_stage", {}):
        series.setdefault(first_stage_label, []).append((k, report["first_stage"][name]))
  return {label: sorted(points) for label, points in series.items()}


def _same_eval(d: pathlib.Path, label: str, seen_data: dict[str, pathlib.Path],
               models: dict[str, pathlib.Path]) -> None:
  """Every eval on the plot reranked one data set (at whatever depth), and one line is one model: an eval
  directory (its summary.json) that breaks either is refused, naming both directories."""
  try:
    summary = json.loads((d / "summary.json").read_text(encoding="utf-8"))
  except FileNotFoundError:
    return
  except (OSError, UnicodeDecodeError, ValueError) as e:
    raise CompareError(f"{d / 'summary.json'} is unreadable: {e}") from None
  if not isinstance(summary, dict):
    raise CompareError(f"{d / 'summary.json'} must hold a JSON object")
  dataset = json.dumps({k: v for k, v in (summary.get("data") or {}).items() if k != "top_k"}, sort_keys=True)
  model = json.dumps([summary.get(k) for k in ("model", "checkpoint_dir", "head", "label_ids")], sort_keys=True)
  for key, seen, what in ((dataset, seen_data, "data"), (model, models, f"model of line {label!r}")):
    other = next((p for k, p in seen.items() if k != key), None)
    if other is not None:
      raise CompareError(f"{d} and {other} were evaluated with different {what}; one plot compares one data "
                         f"set, one line one model")
    seen.setdefault(key, d)


# --- the comparison ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Comparison:
  """Means per run, per-query values, and the tests of each run against the baseline."""
  metrics: list[str]
  baseline: str
  qids: list[str]                            # the queries compared on
  coverage: dict[str, int]                   # run -> queries it covers (before any intersection)
  intersected: bool
  means: dict[str, dict[str, float]]         # run -> metric -> mean
  per_query: dict[str, metrics.PerQuery]     # run -> qid -> metric -> value (compared queries only)
  tests: list[dict[str, Any]]                # one per (run, metric), Holm-adjusted p-values included
  test: str                                  # which test's adjusted p marks significance
  alpha: float

  def to_json(self) -> dict[str, Any]:
    d = dataclasses.asdict(self)
    d.pop("per_query")
    d["num_queries"] = len(d.pop("qids"))
    return d


def _query_sets(evaluated: Mapping[str, metrics.PerQuery], intersect: bool) -> list[str]:
  sets = {name: set(pq) for name, pq in evaluated.items()}
  common = set.intersection(*sets.values())
  union = set.union(*sets.values())
  if common != union and not intersect:
    covers = ", ".join(f"{n} {len(s)}" for n, s in sets.items())
    raise CompareError(f"runs cover different judged queries ({covers}; {len(union)} in all, {len(common)} in "
                       f"every run); pass --intersect to compare on the {len(common)} all of them cover")
  if not common:
    raise CompareError("the runs share no judged query")
  return sorted(common)


def compare(runs: Mapping[str, metrics.Run], qrels: metrics.Qrels, metric_names: Sequence[str] = DEFAULT_METRICS,
            baseline: Optional[str] = None, intersect: bool = False,
            test: Literal["randomization", "t"] = "randomization", alpha: float = 0.05,
            num_samples: int = 10_000, seed: int = 0) -> Comparison:
  """Evaluates every run on the same queries and tests each against `baseline` (default: the first run)."""
  try:
    names = list(dict.fromkeys(metrics.canonical_name(m) for m in metric_names))
  except ValueError as e:
    raise CompareError(str(e)) from None
  evaluated = {name: metrics.evaluate(qrels, run, names) for name, run in runs.items()}
  return compare_per_query(evaluated, names, baseline, intersect, test, alpha, num_samples, seed)


def compare_per_query(evaluated: Mapping[str, metrics.PerQuery], metric_names: Sequence[str],
                      baseline: Optional[str] = None, intersect: bool = False,
                      test: Literal["randomization", "t"] = "randomization", alpha: float = 0.05,
                      num_samples: int = 10_000, seed: int = 0) -> Comparison:
  """`compare` from per-query metric values already computed (run -> qid -> metric -> value)."""
  if len(evaluated) < 2:
    raise CompareError(f"need at least 2 runs to compare, got {len(evaluated)}")
  baseline = baseline or next(iter(evaluated))
  if baseline not in evaluated:
    raise CompareError(f"baseline {baseline!r} is not one of the runs {list(evaluated)}")
  if test not in TESTS:
    raise CompareError(f"test={test!r} is not one of {list(TESTS)}")
  names = list(dict.fromkeys(metrics.canonical_name(m) for m in metric_names))
  qids = _query_sets(evaluated, intersect)
  per_query = {name: {q: pq[q] for q in qids} for name, pq in evaluated.items()}
  means = {name: {m: float(sum(v[q][m] for q in qids)) / len(qids) for m in names} for name, v in per_query.items()}
  tests = []
  for name in evaluated:
    if name == baseline:
      continue
    for m in names:
      r = significance.paired([per_query[name][q][m] for q in qids], [per_query[baseline][q][m] for q in qids],
                              num_samples, seed)
      tests.append({"run": name, "metric": m, **dataclasses.asdict(r)})
  for key in ("p_t", "p_randomization"):
    for t, adj in zip(tests, significance.holm([t[key] for t in tests])):
      t[key + "_holm"] = adj
  chosen = "p_randomization_holm" if test == "randomization" else "p_t_holm"
  for t in tests:
    t["significant"] = t[chosen] < alpha
  return Comparison(names, baseline, qids, {n: len(pq) for n, pq in evaluated.items()}, bool(intersect),
                    means, per_query, tests, test, alpha)


# --- reports -------------------------------------------------------------------------------------
def _fmt(x: Optional[float], spec: str = ".4f") -> str:
  return "n/a" if x is None else format(x, spec)


def _legend(c: Comparison) -> str:
  test = "paired randomization test" if c.test == "randomization" else "paired t-test"
  n = len(c.tests)
  legend = (f"{MARK}: p < {c.alpha:g} against {c.baseline} ({test}, two-sided, Holm-Bonferroni over {n} "
            f"comparison{'' if n == 1 else 's'})")
  if any(t["randomization_method"] != "exact" for t in c.tests):
    legend += "; ~: randomization p estimated from random sign vectors (the others enumerate all)"
  return legend


def markdown(c: Comparison) -> str:
  """The means table (delta to the baseline, significance marked) and the tests table, as Markdown."""
  by = {(t["run"], t["metric"]): t for t in c.tests}
  covered = ", ".join(f"{n} {k}" for n, k in c.coverage.items())
  where = f"the {len(c.qids)} queries every run covers" if c.intersected else f"{len(c.qids)} queries"
  lines = [f"Compared on {where} (queries covered: {covered}).", "",
           "| run | " + " | ".join(c.metrics) + " |", "|---|" + "---:|" * len(c.metrics)]
  for name, vals in c.means.items():
    cells = []
    for m in c.metrics:
      t = by.get((name, m))
      cells.append(f"{vals[m]:.4f}" if t is None else
                   f"{vals[m]:.4f} ({t['delta']:+.4f}){MARK if t['significant'] else ''}")
    label = f"{name} (baseline)" if name == c.baseline else name
    lines.append(f"| {label} | " + " | ".join(cells) + " |")
  lines += ["", _legend(c), "",
            "| run | metric | Δ | t-test p (Holm) | randomization p (Holm) | effect size d | wins/ties/losses |",
            "|---|---|---:|---:|---:|---:|---|"]
  for t in c.tests:
    exact = "" if t["randomization_method"] == "exact" else "~"
    lines.append(f"| {t['run']} | {t['metric']} | {t['delta']:+.4f} | {t['p_t']:.4f} ({t['p_t_holm']:.4f}) | "
                 f"{exact}{t['p_randomization']:.4f} ({t['p_randomization_holm']:.4f}) | "
                 f"{_fmt(t['effect_size'], '+.2f')} | {t['wins']}/{t['ties']}/{t['losses']} |")
  return "\n".join(lines)


def tex(s: str) -> str:
  """`s` with LaTeX's special characters escaped."""
  return s.replace("\\", "\\textbackslash{}").replace("_", "\\_").replace("&", "\\&").replace("%", "\\%")


def latex(c: Comparison) -> str:
  """The means table as a LaTeX tabular (booktabs): best value per metric bold, significance as a dagger."""
  by = {(t["run"], t["metric"]): t for t in c.tests}
  best = {m: max(v[m] for v in c.means.values()) for m in c.metrics}
  rows = ["\\begin{tabular}{l" + "r" * len(c.metrics) + "}", "\\toprule",
          "Run & " + " & ".join(tex(m) for m in c.metrics) + " \\\\", "\\midrule"]
  for name, vals in c.means.items():
    cells = []
    for m in c.metrics:
      cell = f"{vals[m]:.4f}"
      cell = f"\\textbf{{{cell}}}" if vals[m] == best[m] else cell
      t = by.get((name, m))
      cells.append(cell + ("\\textsuperscript{\\dag}" if t and t["significant"] else ""))
    rows.append(tex(name) + " & " + " & ".join(cells) + " \\\\")
  rows += ["\\bottomrule", "\\end{tabular}", f"% {_legend(c).replace(MARK, 'dagger')}; {len(c.qids)} queries"]
  return "\n".join(rows) + "\n"


def per_query_deltas(c: Comparison, run: str, metric: str) -> dict[str, float]:
  """qid -> run - baseline on `metric` (for the wins-and-losses plot)."""
  m = metrics.canonical_name(metric)
  return {q: c.per_query[run][q][m] - c.per_query[c.baseline][q][m] for q in c.qids}
