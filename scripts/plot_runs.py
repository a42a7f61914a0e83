"""Plots for evaluation reports: a metric against the rerank depth, or a score head's training curves.

  python scripts/plot_runs.py depth head=out/k10,out/k20,out/k50 nohead=out/n10,out/n20,out/n50 \\
      --metric=ndcg@10 --output=out/depth.png
  python scripts/plot_runs.py training out/train_head/metrics.jsonl --metric=ndcg@10 --output=out/train.png

depth: each `label=dir,dir,...` is one line over eval output directories run at different --rerank_top_k
(the first label's directories also draw the first stage). training: train loss and the dev metric
over the steps of a train_score_head.py run. A depth line mixing evals of different data or models,
and a --metric the run never logged, are refused in one line; --output's suffix names the format
(.png, .pdf, .svg). The per-query wins-and-losses plot is compare_runs.py's
--plot_dir. Every flag is a key of configs/plot.yml.
"""

import maxscore  # first: importing the package installs the one-line Ctrl-C (maxscore/interrupt.py)
import pathlib

from absl import flags

from maxscore import cli
from maxscore.files import safety
from maxscore.rerank import compare, metrics, plots

KINDS = ("depth", "training")


ENTRY = "plot"
SECTIONS = {"plot": plots.PlotOptions}


def define_flags(fv: flags.FlagValues) -> None:
  """Every key of configs/plot.yml as a flag."""
  cli.define_entry_flags(fv, ENTRY, SECTIONS)


def main(argv, fv: flags.FlagValues = flags.FLAGS):
  args = list(argv[1:])
  if not args or args[0] not in KINDS or len(args) < 2:
    cli.fail(ValueError(f"usage: plot_runs.py {{{'|'.join(KINDS)}}} ARGS... (got {args[:1] or 'nothing'}); "
                        "depth takes label=dir,dir,... groups, training one metrics.jsonl"))
  kind, rest = args[0], args[1:]
  with cli.one_line_errors():
    opts = cli.entry_from_flags(fv, ENTRY, SECTIONS)["plot"]
    output = pathlib.Path(opts.output or f"{kind}.png")
    metric = metrics.canonical_name(opts.metric)
    if kind == "depth":
      groups = {}
      for a in rest:
        label, sep, dirs = a.partition("=")
        if not sep or not label or not dirs:
          raise compare.CompareError(f"depth group {a!r} must be label=dir,dir,...")
        groups[label] = [pathlib.Path(d) for d in dirs.split(",") if d]
      safety.check_output_file(output, [d for ds in groups.values() for d in ds], "--output")
      path = plots.metric_vs_depth(compare.depth_series(groups, metric), output, metric=metric)
    else:
      if len(rest) != 1 or not pathlib.Path(rest[0]).is_file():
        raise compare.CompareError(f"training takes one metrics.jsonl file, got {rest}")
      safety.check_output_file(output, rest, "--output")
      path = plots.training_curves(plots.read_metrics_jsonl(rest[0]), output, dev_metric=metric)
  print(f"wrote {path}")


def run(argv):
  """Parses `argv` into fresh flags and calls main (tests)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  cli.run_script(main, define_flags)
