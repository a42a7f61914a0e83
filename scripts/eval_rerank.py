"""Reranks a dataset with a maxscore checkpoint; writes a TREC run, trec_eval metrics and a summary.

  python scripts/eval_rerank.py                          # the embedded default: BM25 -> reranked -> fused
  python scripts/eval_rerank.py --fusion=rrf --rrf_k=60  # fusion.trec: reciprocal rank fusion with the first stage
  python scripts/eval_rerank.py --checkpoint_dir=ckpt/qwen3-reranker-0.6b --template=qwen3_reranker \\
      --data_dir=beir/scifact --run_file=bm25.trec --split=test --rerank_top_k=100 attention=shared_prefix

Every flag is a key of configs/eval.yml; trailing `key=value` arguments override configs/base.yml keys.
Input errors print one line and exit 2. A killed run restarted with the same flags resumes; Ctrl-C stops after
the query being scored with one line and exit 130. The console
shows the progress bar, warnings, errors and the summary (first stage, reranked and fused, with deltas and
p-values against the first stage); library INFO lines
go to <output_dir>/eval_rerank.log (and the console with -v).
"""


import maxscore  # first: importing the package installs the one-line Ctrl-C (maxscore/interrupt.py)
from absl import flags

from maxscore import cli, interrupt
from maxscore.datasets import data
from maxscore.files import safety
from maxscore.rerank import eval as eval_lib, first_stage, metrics, plots
from maxscore.scoring import loading


ENTRY = "eval"
SECTIONS = {"run": eval_lib.EvalRun, "eval": eval_lib.EvalConfig}


def define_flags(fv: flags.FlagValues) -> None:
  """Every key of configs/eval.yml as a flag, plus the multi-process flags."""
  cli.define_job_entry_flags(fv, ENTRY, SECTIONS)


def main(argv, fv: flags.FlagValues = flags.FLAGS):
  cli.join_job(fv)  # before any other JAX call
  with cli.one_line_errors():
    s = cli.entry_from_flags(fv, ENTRY, SECTIONS)
    run, cfg = s["run"], s["eval"]
    dataset, dev = eval_lib.load_data(run, cfg.validate())
    safety.check_output_dir(run.output_dir, "eval",
                            [*data.input_paths(dataset), *(data.input_paths(dev) if dev else []), run.checkpoint_dir,
                             run.packaged_reranker, run.score_cache], "--output_dir")  # before loading a model
    with interrupt.note(lambda: eval_lib.stop_note(run.output_dir)):  # Ctrl-C: one line (cli.run_script)
      checkpoint_dir, adapters_dir = eval_lib.model_dirs(run, cfg)
      scorer = loading.build_scorer(checkpoint_dir, argv[1:], use_head=run.use_head, adapters_dir=adapters_dir)
      report = eval_lib.run_eval(scorer, dataset, cfg, run.output_dir, overwrite=run.overwrite,
                                 progress=run.progress, fsync=run.fsync, gather_every=run.gather_every, dev=dev,
                                 score_cache=run.score_cache)
  if report is not None:  # process 0 writes and reports; the others only score
    print(eval_lib.format_report(report))
    if run.plot and report.per_query:
      _plot_against_first_stage(report, dataset.qrels)


def _plot_against_first_stage(report: eval_lib.EvalReport, qrels) -> None:
  metric = metrics.canonical_name(report.summary["eval_config"]["metrics"][0])
  base = metrics.evaluate(qrels, data.read_trec_run(report.output_dir / first_stage.RUN_FILE), [metric])
  deltas = {q: v[metric] - base[q][metric] for q, v in report.per_query.items() if q in base}
  plots.per_query_delta(deltas, report.output_dir / "delta_vs_first_stage.png", run="reranked",
                        baseline="first stage", metric=metric)


def run(argv):
  """Parses `argv` into fresh flags and calls main (for tests: no global flag state)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  cli.run_script(main, define_flags, log_dir_flag="output_dir")
