"""Runs the reranking eval over several datasets and prints one table (first stage, reranked, fused).

  python scripts/eval_suite.py --datasets=pydoc=maxscore/assets/default/pydoc_beir,scifact=beir/scifact \\
      --output_dir=out/suite --output_json=out/suite.json --output_latex=out/suite.tex

Each dataset is name=path: a BEIR directory with its first-stage run as <path>/<run_name>, or a JSONL
rerank set. Its eval goes to <output_dir>/<name>/ and resumes there. A dataset that fails is reported
in the table and the others go on; the exit code is then 1. Every flag is a key of configs/eval_suite.yml;
trailing key=value arguments override configs/base.yml keys (the scorer).
"""

import maxscore  # first: importing the package installs the one-line Ctrl-C (maxscore/interrupt.py)
import pathlib

from absl import flags

from maxscore import cli
from maxscore.files import safety
from maxscore.rerank import eval as eval_lib, suite
from maxscore.scoring import loading

ENTRY = "eval_suite"
SECTIONS = {"suite": suite.SuiteRun, "eval": eval_lib.EvalConfig}


def define_flags(fv: flags.FlagValues) -> None:
  """Every key of configs/eval_suite.yml as a flag."""
  cli.define_entry_flags(fv, ENTRY, SECTIONS)


def main(argv, fv: flags.FlagValues = flags.FLAGS):
  with cli.one_line_errors():
    s = cli.entry_from_flags(fv, ENTRY, SECTIONS)
    opts, cfg = s["suite"], s["eval"]
    inputs = list(suite.parse_datasets(opts.datasets).values())
    safety.refuse_overlap([opts.output_json, opts.output_latex], inputs, "--output_json/--output_latex")
    scorer = loading.build_scorer(opts.checkpoint_dir, list(argv[1:]), use_head=opts.use_head)
  result = suite.run_suite(scorer, opts, cfg, expected=cli.expected_errors())
  print(suite.markdown(result))
  with cli.one_line_errors():
    for path, text in ((opts.output_json, suite.to_json_text), (opts.output_latex, suite.latex)):
      if path:
        pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
        safety.atomic_write_text(path, text(result))
  return 1 if result.failed else 0


def run(argv):
  """Parses `argv` into fresh flags and calls main (tests: no global flag state)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  cli.run_script(main, define_flags, log_dir_flag="output_dir")
