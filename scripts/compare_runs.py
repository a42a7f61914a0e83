"""Compares ranking runs on one qrels: means, difference to a baseline run, paired significance tests.

  python scripts/compare_runs.py out/eval_head out/eval_nohead given=out/eval_head/first_stage.trec \\
      --baseline=given --metrics=ndcg@10,mrr@10,map --output_json=out/compare.json --plot_dir=out/compare
  python scripts/compare_runs.py bm25.trec out/a out/b --qrels=beir/scifact/qrels/test.tsv --intersect

Runs are eval output directories (their run.trec) or TREC run files, optionally named `name=path`.
--qrels is a TREC or BEIR qrels file or a JSONL rerank set; by default the data the first eval
directory was evaluated on. Prints Markdown; a run covering other queries than the rest is refused
(one line, exit 2) unless --intersect. --plot_dir (default: <output_json stem>_plots beside --output_json)
gets each run's sorted per-query differences to the baseline as a PNG; it is a directory of maxscore's own
(new, empty, or written by compare_runs before). Every flag is a key of configs/compare.yml; no output
may be an input, nor another output.
"""

import maxscore  # first: importing the package installs the one-line Ctrl-C (maxscore/interrupt.py)
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
    plot_dir = opts.plot_dir or (_default_plot_dir(opts.output_json) if opts.output_json else None)
    plots_of = _plot_paths(named, plot_dir)  # every output path is known, and checked, before any work
    safety.refuse_same({"--output_json": opts.output_json, "--output_latex": opts.output_latex})
    safety.refuse_overlap([opts.output_json, opts.output_latex], inputs, "--output_json/--output_latex")
    if plot_dir:
      safety.check_output_dir(plot_dir, PLOTS_KIND, inputs, "--plot_dir")
      safety.refuse_same({"--output_json": opts.output_json, "--output_latex": opts.output_latex,
                          **{f"the plot of run {n!r}": p for n, p in plots_of.items()}})
    runs = {name: compare.load_run(path) for name, path in named}
    qrels, qrels_source = compare.load_qrels(opts.qrels, [p for _, p in named])
    result = compare.compare(runs, qrels, opts.metrics, opts.baseline, opts.intersect, opts.test, opts.alpha,
                             opts.num_samples, opts.seed)
  print(compare.markdown(result))
  written = []
  with cli.one_line_errors():
    if plot_dir:  # first: the JSON may go into it
      safety.prepare_output_dir(plot_dir, PLOTS_KIND, inputs, "--plot_dir")
    if opts.output_json:
      report = {**result.to_json(), "qrels": qrels_source, "inputs": {name: str(p) for name, p in named}}
      written.append(_write(opts.output_json, json.dumps(report, indent=2) + "\n"))
    if opts.output_latex:
      written.append(_write(opts.output_latex, compare.latex(result)))
    if plot_dir:
      written += _plot_deltas(result, plots_of)
  if written:
    print("\nwrote " + ", ".join(str(p) for p in written))


PLOTS_KIND = "compare_plots"


def _default_plot_dir(output_json: str) -> str:
  """<output_json without its suffix>_plots: a directory of its own, beside the JSON."""
  path = pathlib.Path(output_json)
  return str(path.with_name(f"{path.stem}_plots"))


def _plot_paths(named, plot_dir) -> dict[str, pathlib.Path]:
  """delta_<run>.png per run (the baseline's is never drawn); two runs whose names give one file are refused."""
  if not plot_dir:
    return {}
  paths: dict[str, pathlib.Path] = {}
  for name, _ in named:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    path = pathlib.Path(plot_dir) / f"delta_{safe}.png"
    clash = [n for n, p in paths.items() if p == path]
    if clash:
      raise compare.CompareError(f"runs {clash[0]!r} and {name!r} would both be plotted to {path}; "
                                 f"rename one with name=path")
    paths[name] = path
  return paths


def _write(path: str, text: str) -> pathlib.Path:
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  safety.atomic_write_text(path, text)
  return path


def _plot_deltas(result: compare.Comparison, paths: dict[str, pathlib.Path]) -> list[pathlib.Path]:
  """delta_<run>.png per run against the baseline, on the first metric."""
  metric, out = result.metrics[0], []
  for name in result.means:
    if name != result.baseline:
      out.append(plots.per_query_delta(compare.per_query_deltas(result, name, metric), paths[name], run=name,
                                       baseline=result.baseline, metric=metric))
  return out


def run(argv):
  """Parses `argv` into fresh flags and calls main (tests)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  cli.run_script(main, define_flags)
