"""Benchmarks scoring (or the attention kernels alone) on this machine; prints a table, writes JSON.

  python scripts/bench.py                                  # the reference workload, Qwen3-0.6B dims, 2 layers
  python scripts/bench.py --query_len=300 --num_items=10 --item_len=10 --batch_requests=64 --algorithms=auto
  python scripts/bench.py --suite --algorithms=serial,packed,prefill_extend --hf_batch_sizes=16,64   # every suite workload, one peak
  python scripts/bench.py --mode=kernels                   # shared_prefix vs reference at P=2001, N=500, L=20
  python scripts/bench.py --query_len=200 --num_items=50 --item_len=10 --num_layers=1 matmul_precision=default

Every flag is a key of configs/bench.yml; trailing `key=value` arguments override configs/base.yml keys. See maxscore/bench/ for
what each figure means (model FLOPs follow docs/ARCHITECTURE.md section 3).
"""

import maxscore  # first: importing the package installs the one-line Ctrl-C (maxscore/interrupt.py)
import dataclasses

from absl import flags

from maxscore import cli
from maxscore import bench as benchmark
from maxscore.files import safety

ENTRY = "bench"
SECTIONS = {"bench": benchmark.BenchOptions}


def define_flags(fv: flags.FlagValues) -> None:
  """Every key of configs/bench.yml as a flag, plus --output_json."""
  cli.define_report_flags(fv, ENTRY, SECTIONS)


def options_from_flags(fv: flags.FlagValues, overrides) -> benchmark.BenchOptions:
  opts = cli.entry_from_flags(fv, ENTRY, SECTIONS)["bench"]
  return dataclasses.replace(opts, overrides=opts.overrides + tuple(overrides))


def main(argv, fv: flags.FlagValues = flags.FLAGS) -> dict:
  """Runs the benchmark the flags describe, prints its table, writes --output_json; returns the report."""
  with cli.one_line_errors():
    options = options_from_flags(fv, argv[1:])
    safety.check_output_file(fv.output_json, [], "--output_json")
    report = benchmark.run_benchmark(options)
  print(benchmark.summary(report))
  cli.write_report(fv, benchmark.to_json(report))
  return report


def run(argv) -> dict:
  """Parses `argv` into fresh flags and runs the benchmark (for tests: no global flag state)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  cli.run_script(main, define_flags)
