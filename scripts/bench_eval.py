"""Times the eval loop against the model's own steady state on the same queries: pipelined, host and model in
turn, and the model alone on ids tokenized beforehand (maxscore/bench/eval_bench.py).

  python scripts/bench_eval.py                         # the embedded default model and data set
  python scripts/bench_eval.py --max_queries=20 --repeats=5

Every flag is a key of configs/bench_eval.yml; trailing key=value arguments override configs/base.yml keys.
"""

import maxscore  # first: importing the package installs the one-line Ctrl-C (maxscore/interrupt.py)
from absl import flags

from maxscore import cli
from maxscore.bench import eval_bench

ENTRY = "bench_eval"
SECTIONS = {"bench": eval_bench.EvalBenchOptions}


def define_flags(fv: flags.FlagValues) -> None:
  """Every key of configs/bench_eval.yml as a flag, plus --output_json."""
  cli.define_report_flags(fv, ENTRY, SECTIONS)


def main(argv, fv: flags.FlagValues = flags.FLAGS) -> dict:
  with cli.one_line_errors():
    opts = cli.entry_from_flags(fv, ENTRY, SECTIONS)["bench"]
    report = eval_bench.run(opts, argv[1:])
  print(eval_bench.summary(report), end="")
  cli.write_report(fv, report)
  return report


def run(argv) -> dict:
  """Parses `argv` into fresh flags and runs the benchmark (for tests)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  cli.run_script(main, define_flags)
