"""Compares ranking runs on one qrels: means, difference to a baseline run, paired significance tests.

  python scripts/compare_runs.py out/eval_head out/eval_nohead given=out/eval_head/first_stage.trec \\
      --baseline=given --metrics=ndcg@10,mrr@10,map --output_json=out/compare.json --plot_dir=out/compare
  python scripts/compare_runs.py bm25.trec out/a out/b --qrels=beir/scifact/qrels/test.tsv --intersect

Runs are eval output directories (their run.trec) or TREC run files, optionally named `name=path`.
--qrels is a TREC or BEIR qrels file or a JSONL rerank set; by default the data the first eval
directory was evaluated on. Prints Markdown; a run covering other queries than the rest is refused
(one line, exit 2) unless --intersect. --plot_dir (default: beside --output_json) gets each run's sorted
per-query differences to the baseline as a PNG. Every flag is a key of configs/compare.yml; no
output may be an input.
"""

import json
import pathlib

from absl import flags

from maxscore import cli
from maxscore.files import safety
from maxscore.rerank import compare, plots


ENTRY = "compare"
SECTIONS = {"compare": compare.CompareOptions}


def define_flags(fv: flags.FlagValues) -> None:
  """Every key of configs/compare.yml as a flag."""
  cli.define_entry_flags(fv, ENTRY, SECTIONS)


def main(argv, fv: flags.FlagValues = flags.FLAGS):
  with cli.one_line_errors():
    opts = cli.entry_from_flags(fv, ENTRY, SECTIONS)["compare"]
    named = compare.name_runs(argv[1:])
    inputs = [p for _, p in named] + [opts.qrels]
    plot_dir = opts.plot_dir or (str(pathlib.Path(opts.output_json).parent) if opts.output_json else None)
    safety.refuse_overlap([opts.output_json, opts.output_latex], inputs, "--output_json/--output_latex")
    runs = {name: compare.load_run(path) for name, path in named}
    qrels, qrels_source = compare.load_qrels(opts.qrels, [p for _, p in named])
    result = compare.compare(runs, qrels, opts.metrics, opts.baseline, opts.intersect, opts.test, opts.alpha,
                             opts.num_samples, opts.seed)
  print(compare.markdown(result))
  written = []
  with cli.one_line_errors():
    if opts.output_json:
      report = {**result.to_json(), "qrels": qrels_source, "inputs": {name: str(p) for name, p in named}}
      written.append(_write(opts.output_json, json.dumps(report, indent=2) + "\n"))
    if opts.output_latex:
      written.append(_write(opts.output_latex, compare.latex(result)))
    if plot_dir:
      written += _plot_deltas(result, pathlib.Path(plot_dir), inputs)
  if written:
    print("\nwrote " + ", ".join(str(p) for p in written))


def _write(path: str, text: str) -> pathlib.Path:
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  safety.atomic_write_text(path, text)
  return path


def _plot_deltas(result: compare.Comparison, plot_dir: pathlib.Path, inputs) -> list[pathlib.Path]:
  """delta_<run>.png per run against the baseline, on the first metric (never over an input file)."""
  metric, out = result.metrics[0], []
  for name in result.means:
    if name != result.baseline:
      safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
      path = plot_dir / f"delta_{safe}.png"
      safety.refuse_overlap([path], inputs, "--plot_dir")
      out.append(plots.per_query_delta(compare.per_query_deltas(result, name, metric), path, run=name,
                                       baseline=result.baseline, metric=metric))
  return out


def run(argv):
  """Parses `argv` into fresh flags and calls main (tests)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  cli.run_script(main, define_flags)
