"""Trained score heads vs no head: head kinds x seeds, nDCG@10 on dev and test, paired tests.

  python scripts/head_study.py                                   # the embedded default, as in the README
  python scripts/head_study.py --specs=lm_labels --seeds=0 --checkpoint_dir=ckpt/m --jsonl=data.jsonl
  python scripts/head_study.py --specs=linear,mlp,lm_labels,lm_labels_low_rank --seeds=0 \
      --learning_rates=3e-4,1e-3,3e-3,1e-2 --losses=listwise,pairwise,pointwise   # the README's sweep

Prints a markdown table (mean and range over seeds) and the paired t and randomization tests of the first
seed's exported head against the backbone without a head; writes the whole report as JSON.
Trailing `key=value` arguments override configs/base.yml keys. Input errors exit 2.
"""

import json
import pathlib

from absl import flags

from maxscore import cli

from maxscore.heads import study as head_study, train as train_lib
from maxscore.files import safety


def define_flags(fv: flags.FlagValues) -> None:
  flags.DEFINE_string("checkpoint_dir", None, "backbone checkpoint; default: the embedded default", flag_values=fv)
  flags.DEFINE_string("jsonl", None, "rerank set (JSONL with train/dev/test splits); default: the embedded one",
                      flag_values=fv)
  flags.DEFINE_list("specs", ["lm_labels", "lm_labels_low_rank", "linear"], f"head settings, from {sorted(head_study.SPECS)}",
                    flag_values=fv)
  flags.DEFINE_list("seeds", ["0", "1", "2", "3", "4"], "training seeds (the first one is exported)", flag_values=fv)
  flags.DEFINE_list("learning_rates", [], "peak learning rates to sweep; default: the trainer's", flag_values=fv)
  flags.DEFINE_list("losses", [], f"losses to sweep, from {sorted(train_lib.LOSSES)}; default: the trainer's",
                    flag_values=fv)
  flags.DEFINE_integer("max_queries", 0, "use only the first N queries of each split; 0 = all", flag_values=fv)
  flags.DEFINE_integer("num_epochs", train_lib.TrainConfig.num_epochs, "epochs per run", flag_values=fv)
  flags.DEFINE_string("workdir", "out/head_study", "training runs, features, evals", flag_values=fv)
  flags.DEFINE_string("output_json", None, "report path; default: <workdir>/report.json", flag_values=fv)


def main(argv, fv: flags.FlagValues = flags.FLAGS):
  try:
    seeds, rates = [int(s) for s in fv.seeds], [float(x) for x in fv.learning_rates] or [None]
  except ValueError as e:
    cli.fail(ValueError(f"--seeds and --learning_rates must be numbers: {e}"))
  with cli.one_line_errors():
    report = head_study.study(fv.checkpoint_dir, fv.jsonl, fv.specs, seeds, fv.workdir, overrides=list(argv[1:]),
                              max_queries=fv.max_queries, num_epochs=fv.num_epochs, learning_rates=rates,
                              losses=fv.losses or [None])
  path = pathlib.Path(fv.output_json or pathlib.Path(fv.workdir) / "report.json")
  with cli.one_line_errors():
    path.parent.mkdir(parents=True, exist_ok=True)
    safety.atomic_write_text(path, json.dumps(report, indent=2) + "\n")
  print(head_study.markdown(report))
  print(f"\nreport: {path}")


def run(argv):
  """Parses `argv` into fresh flags and calls main (tests)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  cli.run_script(main, define_flags, log_dir_flag="workdir")
