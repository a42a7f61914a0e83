"""Reranks a dataset with a maxscore checkpoint; writes a TREC run, trec_eval metrics and a summary.

  python scripts/eval_rerank.py                          # the embedded default model and data
  python scripts/eval_rerank.py --checkpoint_dir=ckpt/qwen3-reranker-0.6b --template=qwen3_reranker \\
      --data_dir=beir/scifact --run_file=bm25.trec --split=test --rerank_top_k=100 attention=shared_prefix

Trailing `key=value` arguments (or --override=key=value) override configs/base.yml keys.
Input errors print one line and exit 2. A killed run restarted with the same flags resumes. The console
shows the progress bar, warnings, errors and the summary (first stage, reranked, delta); library INFO lines
go to <output_dir>/eval_rerank.log (and the console with -v).
"""


from absl import flags

from maxscore import cli
from maxscore.distributed import mesh as mesh_lib
from maxscore.rerank import data, eval as eval_lib, first_stage, metrics, plots, prompts


def define_flags(fv: flags.FlagValues) -> None:
  """The script's flags, on `fv` (the global FLAGS when run as a script, a fresh one in tests)."""
  d = eval_lib.EvalConfig()
  flags.DEFINE_string("checkpoint_dir", None, "maxscore checkpoint; default: the embedded default model "
                      f"({data.DEFAULT_CHECKPOINT.name}); 'none': random init from the config", flag_values=fv)
  flags.DEFINE_string("jsonl", None, "rerank set in the JSONL form; default (no --jsonl, no --data_dir): "
                      f"the embedded {data.DEFAULT_JSONL.name}", flag_values=fv)
  flags.DEFINE_string("data_dir", None, "BEIR dataset directory (corpus.jsonl, queries.jsonl, qrels/)",
                      flag_values=fv)
  flags.DEFINE_string("run_file", None, "first-stage TREC run to rerank (with --data_dir)", flag_values=fv)
  flags.DEFINE_string("split", "test", "qrels/<split>.tsv for BEIR; JSONL records whose split field "
                      "matches ('all': every record)", flag_values=fv)
  flags.DEFINE_integer("rerank_top_k", 100, "candidates per query to rerank (by first-stage rank); 0 = all",
                       flag_values=fv)
  flags.DEFINE_integer("max_queries", d.max_queries, "evaluate only the first N queries; 0 = all",
                       flag_values=fv)
  flags.DEFINE_bool("skip_bad", False, "skip and count malformed input lines instead of stopping",
                    flag_values=fv)
  flags.DEFINE_string("output_dir", "out/eval", "where results and reports go", flag_values=fv)
  flags.DEFINE_bool("overwrite", False, "discard results already in output_dir instead of resuming",
                    flag_values=fv)
  flags.DEFINE_enum("template", d.template, sorted(prompts.TEMPLATES), "prompt template", flag_values=fv)
  flags.DEFINE_string("instruction", d.instruction, "the {instruction} of templates that have one",
                      flag_values=fv)
  flags.DEFINE_list("labels", list(d.labels), "label words or token ids, positive first; "
                    "default: the template's (Yes,No for plain; yes,no for qwen3_reranker)", flag_values=fv)
  flags.DEFINE_enum("score_mode", d.score_mode, sorted(eval_lib.SCORE_MODES),
                    "ranking score: p_first = softmax over labels, p(first); log_odds = log p0 - log p1; "
                    "raw_logit = the first label's raw logit (FlagEmbedding-style)",
                    flag_values=fv)
  flags.DEFINE_integer("max_query_tokens", d.max_query_tokens, "cut queries to this many tokens; 0 = no limit",
                       flag_values=fv)
  flags.DEFINE_integer("max_item_tokens", d.max_item_tokens, "cut documents to this many tokens; 0 = no limit",
                       flag_values=fv)
  flags.DEFINE_list("metrics", list(d.metrics), "trec_eval names or aliases (ndcg@10, mrr@10, map, ...)",
                    flag_values=fv)
  flags.DEFINE_string("run_tag", d.run_tag, "tag column of the run file", flag_values=fv)
  flags.DEFINE_bool("use_head", True, "score through the checkpoint's trained score head (head/) when it has "
                    "one; --nouse_head scores with the backbone's label probabilities", flag_values=fv)
  flags.DEFINE_multi_string("override", [], "key=value config override (repeatable)", flag_values=fv)
  flags.DEFINE_bool("progress", True, "show a progress bar", flag_values=fv)
  flags.DEFINE_bool("plot", True, "write delta_vs_first_stage.png (per-query differences to the first stage on "
                    "the first metric, sorted) to output_dir", flag_values=fv)
  flags.DEFINE_bool("fsync", False, "fsync results.jsonl after every query (survives power loss)",
                    flag_values=fv)
  flags.DEFINE_integer("gather_every", 1, "multi-process: queries each data group scores between gathers to "
                       "process 0", flag_values=fv)
  mesh_lib.define_flags(fv)


def main(argv, fv: flags.FlagValues = flags.FLAGS):
  try:
    mesh_lib.initialize_from_flags(fv)  # before any other JAX call; single-process when nothing is set
  except mesh_lib.DistributedError as e:
    cli.fail(e, 1)
  overrides = list(argv[1:]) + list(fv.override)
  cfg = eval_lib.EvalConfig(template=fv.template, instruction=fv.instruction, labels=tuple(fv.labels),
                            score_mode=fv.score_mode, max_query_tokens=fv.max_query_tokens,
                            max_item_tokens=fv.max_item_tokens, metrics=tuple(fv.metrics),
                            run_tag=fv.run_tag, max_queries=fv.max_queries)
  jsonl = fv.jsonl if (fv.jsonl or fv.data_dir or fv.run_file) else str(data.DEFAULT_JSONL)
  with cli.one_line_errors():
    cfg.validate()
    dataset = data.load_rerank_set(jsonl, fv.data_dir, fv.run_file, fv.split, fv.rerank_top_k, fv.skip_bad)
    scorer = eval_lib.build_scorer(fv.checkpoint_dir, overrides, use_head=fv.use_head)
    report = eval_lib.run_eval(scorer, dataset, cfg, fv.output_dir, overwrite=fv.overwrite,
                               progress=fv.progress, fsync=fv.fsync, gather_every=fv.gather_every)
  if report is not None:  # process 0 writes and reports; the others only score
    print(eval_lib.format_report(report))
    if fv.plot and report.per_query:
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
