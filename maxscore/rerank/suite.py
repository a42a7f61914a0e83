"""An eval suite: the eval over many datasets into one table, as BEIR and reranker papers publish them.

    opts = SuiteRun(datasets=("pydoc=maxscore/assets/default/pydoc_beir", "scifact=beir/scifact"))
    result = run_suite(scorer, opts, EvalConfig(fusion="rrf"))
    print(markdown(result))

Each dataset `name=path` is a BEIR directory holding its first-stage run as `<path>/<run_name>`, or a
JSONL rerank set; its eval (maxscore.rerank.eval.run_eval) writes into `<output_dir>/<name>/` and resumes
there as scripts/eval_rerank.py does. The table has, per dataset and metric, the first stage, the
reranked run and the fused run (when the eval fuses), then the average over the datasets that finished
(each dataset weighs the same). Significance: each run's paired test against the first stage on a
dataset is the eval's (compare.compare_per_query: randomization or t); its raw p-values are
Holm-Bonferroni adjusted across the datasets, per run and metric. A dataset that fails is reported
with its error and the others go on.
"""

import dataclasses
import json
import pathlib
from typing import Any, Literal, Optional

from absl import logging

from maxscore.errors import DataError
from maxscore.rerank import compare, eval as eval_lib, metrics, significance, stages

RUNS = (stages.FIRST, stages.RERANKED, stages.FUSED)
P_KEYS = {"randomization": "p_randomization", "t": "p_t"}


@dataclasses.dataclass(frozen=True)
class SuiteRun:
  """What scripts/eval_suite.py reads and writes (configs/eval_suite.yml documents each key)."""
  datasets: tuple[str, ...] = ()
  run_name: str = "bm25.trec"
  checkpoint_dir: Optional[str] = None
  split: str = "test"
  rerank_top_k: int = 100
  skip_bad: bool = False
  output_dir: str = "out/eval_suite"
  overwrite: bool = False
  use_head: bool = True
  progress: bool = True
  test: Literal["randomization", "t"] = "randomization"
  alpha: float = 0.05
  output_json: Optional[str] = None
  output_latex: Optional[str] = None
  score_cache: Optional[str] = None

  def validate(self) -> "SuiteRun":
    if self.datasets:  # none is an error only when the suite runs (the YAML's default is [])
      parse_datasets(self.datasets)
    if not 0 < self.alpha < 1:
      raise DataError(f"alpha={self.alpha} must be in (0, 1)")
    if self.rerank_top_k < 0:
      raise DataError(f"rerank_top_k={self.rerank_top_k} must be >= 0")
    return self


def parse_datasets(entries) -> dict[str, pathlib.Path]:
  """{name: path} of `name=path` entries; names are unique, one word (they name output directories)."""
  out = {}
  for e in entries:
    name, sep, path = str(e).partition("=")
    if not sep or not name or not path:
      raise DataError(f"datasets entry {e!r} must be name=path (a BEIR directory or a JSONL rerank set)")
    if not all(c.isalnum() or c in "-_." for c in name) or name in (".", ".."):
      raise DataError(f"datasets entry {e!r}: the name may hold only letters, digits, '-', '_', '.'")
    if name in out:
      raise DataError(f"datasets: the name {name!r} appears twice")
    out[name] = pathlib.Path(path)
  if not out:
    raise DataError("datasets is empty: give name=path entries (--datasets=a=dir1,b=dir2)")
  return out


def _eval_run(opts: SuiteRun, name: str, path: pathlib.Path) -> eval_lib.EvalRun:
  beir = path.is_dir()
  return eval_lib.EvalRun(checkpoint_dir=opts.checkpoint_dir, jsonl=None if beir else str(path),
                          data_dir=str(path) if beir else None, run_file=str(path / opts.run_name) if beir else None,
                          split=opts.split, rerank_top_k=opts.rerank_top_k, skip_bad=opts.skip_bad,
                          output_dir=str(pathlib.Path(opts.output_dir) / name), overwrite=opts.overwrite,
                          use_head=opts.use_head, progress=opts.progress, score_cache=opts.score_cache)


@dataclasses.dataclass(frozen=True)
class SuiteResult:
  """Per dataset its means per run and raw tests (or its error); the metrics; the tests' settings."""
  metrics: list[str]
  datasets: dict[str, dict[str, Any]]   # name -> {"means", "tests", "queries", "output_dir"} or {"error"}
  test: str
  alpha: float

  @property
  def failed(self) -> list[str]:
    return [n for n, d in self.datasets.items() if "error" in d]

  def to_json(self) -> dict[str, Any]:
    return {"metrics": self.metrics, "test": self.test, "alpha": self.alpha, "datasets": self.datasets,
            "average": average(self), "failed": self.failed}


def run_suite(scorer, opts: SuiteRun, cfg: eval_lib.EvalConfig,
              expected: tuple[type[BaseException], ...] = ()) -> SuiteResult:
  """Runs the eval per dataset (each into <output_dir>/<name>/), then Holm across datasets.

  A dataset that fails is reported in the result and the others go on; a failure of the `expected` kinds
  (bad input: scripts/eval_suite.py passes the documented errors) is logged as one warning line, any other
  (a bug) with its traceback."""
  names = list(dict.fromkeys(metrics.canonical_name(m) for m in cfg.metrics))
  out: dict[str, dict[str, Any]] = {}
  for name, path in parse_datasets(opts.datasets).items():
    try:
      run = _eval_run(opts, name, path)
      dataset, dev = eval_lib.load_data(run, cfg)
      report = eval_lib.run_eval(scorer, dataset, cfg, run.output_dir, overwrite=run.overwrite,
                                 progress=run.progress, dev=dev, score_cache=run.score_cache)
      c = report.comparison
      out[name] = {"means": c.means, "tests": c.tests, "fusion": c.fusion, "queries": len(report.per_query),
                   "output_dir": run.output_dir}
    except Exception as e:  # pylint: disable=broad-except  (reported in the table; the others go on)
      out[name] = {"error": f"{type(e).__name__}: {' '.join(str(e).split())}"}
      if isinstance(e, expected):
        logging.warning("suite: dataset %s failed: %s", name, out[name]["error"])
      else:
        logging.exception("suite: dataset %s failed", name)
  _holm_across_datasets(out, opts.test, opts.alpha)
  return SuiteResult(names, out, opts.test, opts.alpha)


def _holm_across_datasets(out: dict[str, dict[str, Any]], test: str, alpha: float) -> None:
  """Adds "p_holm_datasets" and "significant" to every test: its raw p adjusted over the datasets that
  test the same run on the same metric."""
  groups: dict[tuple[str, str], list[dict]] = {}
  for d in out.values():
    for t in d.get("tests", []):
      groups.setdefault((t["run"], t["metric"]), []).append(t)
  for tests in groups.values():
    for t, p in zip(tests, significance.holm([t[P_KEYS[test]] for t in tests])):
      t["p_holm_datasets"] = p
      t["significant"] = p < alpha


def average(r: SuiteResult) -> dict[str, dict[str, float]]:
  """run -> metric -> mean over the datasets that finished and have that run."""
  done = [d for d in r.datasets.values() if "means" in d]
  return {run: {m: sum(d["means"][run][m] for d in has) / len(has) for m in r.metrics}
          for run in RUNS if (has := [d for d in done if run in d["means"]])}


def _cells(r: SuiteResult, d: dict[str, Any], runs, fmt) -> list[str]:
  by = {(t["run"], t["metric"]): t for t in d.get("tests", [])}
  cells = []
  for m in r.metrics:
    for run in runs:
      v = d["means"].get(run, {}).get(m)
      t = by.get((run, m))
      cells.append("–" if v is None else fmt(v, t is not None and t["significant"]))
  return cells


def markdown(r: SuiteResult) -> str:
  """One row per dataset (first stage, reranked, fused per metric), the average, the legend, errors."""
  runs = [run for run in RUNS if any(run in d.get("means", {}) for d in r.datasets.values())] or list(RUNS[:2])
  md = lambda v, sig: f"{v:.4f}{compare.MARK if sig else ''}"
  lines = ["| dataset | " + " | ".join(f"{m} {run}" for m in r.metrics for run in runs) + " |",
           "|---|" + "---:|" * (len(r.metrics) * len(runs))]
  for name, d in r.datasets.items():
    if "error" in d:
      lines.append(f"| {name} | failed: {d['error'].replace('|', '/')} |" + " |" * (len(r.metrics) * len(runs) - 1))
    else:
      lines.append(f"| {name} ({d['queries']} q) | " + " | ".join(_cells(r, d, runs, md)) + " |")
  avg = average(r)
  lines.append("| average | " + " | ".join(f"{avg[run][m]:.4f}" if run in avg else "–"
                                           for m in r.metrics for run in runs) + " |")
  test = "paired randomization test" if r.test == "randomization" else "paired t-test"
  lines += ["", f"{compare.MARK}: p < {r.alpha:g} against the dataset's first stage ({test}, two-sided: a worse "
                f"run is marked too; Holm-Bonferroni across datasets per run and metric); average: unweighted mean over the "
                f"{len(r.datasets) - len(r.failed)} datasets that finished"]
  lines += [f"FAILED {n}: {r.datasets[n]['error']}" for n in r.failed]
  return "\n".join(lines)


def latex(r: SuiteResult) -> str:
  """The table as a LaTeX tabular (booktabs), significance as a dagger."""
  runs = [run for run in RUNS if any(run in d.get("means", {}) for d in r.datasets.values())] or list(RUNS[:2])
  tex = lambda v, sig: f"{v:.4f}" + ("\\textsuperscript{\\dag}" if sig else "")
  rows = ["\\begin{tabular}{l" + "r" * (len(r.metrics) * len(runs)) + "}", "\\toprule",
          "Dataset & " + " & ".join(compare.tex(f"{m} {run}") for m in r.metrics for run in runs) + " \\\\",
          "\\midrule"]
  for name, d in r.datasets.items():
    cells = ["failed"] * (len(r.metrics) * len(runs)) if "error" in d else _cells(r, d, runs, tex)
    rows.append(compare.tex(name) + " & " + " & ".join(cells) + " \\\\")
  avg = average(r)
  rows += ["\\midrule", "Average & " + " & ".join(f"{avg[run][m]:.4f}" if run in avg else "--"
                                                for m in r.metrics for run in runs) + " \\\\",
           "\\bottomrule", "\\end{tabular}",
           f"% dagger: p < {r.alpha:g} against the first stage ({r.test}, Holm across datasets)"]
  return "\n".join(rows) + "\n"


def to_json_text(r: SuiteResult) -> str:
  return json.dumps(r.to_json(), indent=2) + "\n"
