"""Cost per query of pointwise, FIRST (sliding windows) and setwise on the same queries and candidates, with
the prefix cache on and off (maxscore/bench/listwise_cost.py): forwards, tokens, prefix-cache hits, seconds.

  python scripts/bench_listwise_cost.py                          # the embedded default model and data set
  python scripts/bench_listwise_cost.py --max_queries=10 algorithm=prefill_extend

Every flag is a key of configs/bench_listwise.yml; trailing key=value arguments override configs/base.yml keys.
"""

import maxscore  # first: importing the package installs the one-line Ctrl-C (maxscore/interrupt.py)
from absl import flags

from maxscore import cli
from maxscore.bench import listwise_cost

ENTRY = "bench_listwise"
SECTIONS = {"bench": listwise_cost.ListwiseCostOptions}


def define_flags(fv: flags.FlagValues) -> None:
  """Every key of configs/bench_listwise.yml as a flag, plus --output_json."""
  cli.define_report_flags(fv, ENTRY, SECTIONS)


def main(argv, fv: flags.FlagValues = flags.FLAGS) -> dict:
  with cli.one_line_errors():
    opts = cli.entry_from_flags(fv, ENTRY, SECTIONS)["bench"]
    report = listwise_cost.run(opts, argv[1:])
  print(listwise_cost.summary(report), end="")
  cli.write_report(fv, report)
  return report


def run(argv) -> dict:
  """Parses `argv` into fresh flags and runs the benchmark (for tests)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  cli.run_script(main, define_flags)
