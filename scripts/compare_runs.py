"""Compares ranking runs on one qrels: means, difference to a baseline run, paired significance tests.

  python scripts/compare_runs.py out/eval_head out/eval_nohead given=out/eval_head/first_stage.trec \\
      --baseline=given --metrics=ndcg@10,mrr@10,map --output_json=out/compare.json --plot_dir=out/compare
  python scripts/compare_runs.py bm25.trec out/a out/b --qrels=beir/scifact/qrels/test.tsv --intersect

Runs are eval output directories (their run.trec) or TREC run files, optionally named `name=path`.
--qrels is a TREC or BEIR qrels file or a JSONL rerank set; by default the data the first eval
directory was evaluated on. Prints Markdown; a run covering other queries than the rest is refused
(one line, exit 2) unless --intersect. --plot_dir (default: beside --output_json) gets each run's sorted
per-query differences to the baseline as a PNG.
"""

import json
import pathlib

from absl import flags

from maxscore import cli
from maxscore.rerank import compare, data, plots


def define_flags(fv: flags.FlagValues) -> None:
  flags.DEFINE_string("qrels", None, "qrels (TREC/BEIR file or JSONL rerank set); default: the first eval "
                      "directory's data", flag_values=fv)
  flags.DEFINE_list("metrics", list(compare.DEFAULT_METRICS), "trec_eval names or aliases (ndcg@10, mrr@10, map, "
                    "...); the first one is plotted", flag_values=fv)
  flags.DEFINE_string("baseline", None, "name of the run the others are compared with; default: the first run",
                      flag_values=fv)
  flags.DEFINE_bool("intersect", False, "compare on the queries every run covers instead of refusing runs "
                    "whose query sets differ", flag_values=fv)
  flags.DEFINE_enum("test", "randomization", list(compare.TESTS), "which test's Holm-adjusted p marks a "
                    "difference significant (both are reported)", flag_values=fv)
  flags.DEFINE_float("alpha", 0.05, "significance level", flag_values=fv)
  flags.DEFINE_integer("num_samples", 10_000, "random sign vectors of the randomization test when the queries "
                       "are too many to enumerate all", flag_values=fv)
  flags.DEFINE_integer("seed", 0, "seed of the randomization test's samples", flag_values=fv)
  flags.DEFINE_string("output_json", None, "write the comparison as JSON here", flag_values=fv)
  flags.DEFINE_string("output_latex", None, "write the means table as a LaTeX tabular here", flag_values=fv)
  flags.DEFINE_string("plot_dir", None, "write delta_<run>.png (per-query differences to the baseline on the "
                      "first metric) here; default: beside --output_json, if given", flag_values=fv)


def main(argv, fv: flags.FlagValues = flags.FLAGS):
  try:
    named = compare.name_runs(argv[1:])
    runs = {name: compare.load_run(path) for name, path in named}
    qrels, qrels_source = compare.load_qrels(fv.qrels, [p for _, p in named])
    result = compare.compare(runs, qrels, fv.metrics, fv.baseline, fv.intersect, fv.test, fv.alpha,
                             fv.num_samples, fv.seed)
  except (compare.CompareError, data.DataError) as e:
    cli.fail(e)
  print(compare.markdown(result))
  written = []
  if fv.output_json:
    path = pathlib.Path(fv.output_json)
    path.parent.mkdir(parents=True, exist_ok=True)
    report = {**result.to_json(), "qrels": qrels_source, "inputs": {name: str(p) for name, p in named}}
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    written.append(path)
  if fv.output_latex:
    path = pathlib.Path(fv.output_latex)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(compare.latex(result), encoding="utf-8")
    written.append(path)
  plot_dir = fv.plot_dir or (pathlib.Path(fv.output_json).parent if fv.output_json else None)
  if plot_dir:
    metric = result.metrics[0]
    for name in result.means:
      if name != result.baseline:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        written.append(plots.per_query_delta(compare.per_query_deltas(result, name, metric),
                                             pathlib.Path(plot_dir) / f"delta_{safe}.png", run=name,
                                             baseline=result.baseline, metric=metric))
  if written:
    print("\nwrote " + ", ".join(str(p) for p in written))


def run(argv):
  """Parses `argv` into fresh flags and calls main (tests)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  cli.run_script(main, define_flags)
