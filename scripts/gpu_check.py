"""The GPU check (`make gpu-check`): the pallas_gpu kernel and the scorer against their oracles on the
device, then SmolLM2-135M's and Qwen3-0.6B's dimensions at full depth against transformers on the same GPU.

  python scripts/gpu_check.py --output_json=gpu_check.json     # on a machine with a GPU (a few minutes)
  python scripts/gpu_check.py --quick                           # every part at toy sizes (CPU: interpret mode)
  python scripts/gpu_check.py --parts=seed,int8 --output_json=$OUT/gpu_check.json   # the reference workload
      # at 2,000 and 8,000 query tokens, and what w8a8 runs (its optimized HLO beside the JSON, in gpu_check_hlo/)

Each part's result is written to --output_json as soon as it ends, so a run cut short keeps what it did.
Exit status 1 when a kernel case or a parity check is off (maxscore/bench/gpu_check.py says what each is).
"""

import maxscore  # first: importing the package installs the one-line Ctrl-C (maxscore/interrupt.py)
import os

from absl import flags

from maxscore import cli
from maxscore.bench import gpu_check, gpu_check_report
from maxscore.bench.report import to_json
from maxscore.files import safety

ENTRY = "gpu_check"
SECTIONS = {"gpu_check": gpu_check.GpuCheckOptions}


def define_flags(fv: flags.FlagValues) -> None:
  """Every key of configs/gpu_check.yml as a flag, plus --output_json."""
  cli.define_report_flags(fv, ENTRY, SECTIONS)


def main(argv, fv: flags.FlagValues = flags.FLAGS):
  """Runs the check, prints its digest, writes --output_json after each part; 1 when a check is off."""
  with cli.one_line_errors():
    if argv[1:]:
      raise cli.config_lib.ConfigError(f"unexpected arguments {argv[1:]}: gpu_check takes flags only")
    opts = cli.entry_from_flags(fv, ENTRY, SECTIONS)["gpu_check"]
    safety.check_output_file(fv.output_json, [], "--output_json")
  partial: dict = {}

  def save(name, result):
    partial[name] = result
    cli.write_report(fv, to_json(partial))

  hlo_dir = os.path.join(os.path.dirname(os.path.abspath(fv.output_json)), "gpu_check_hlo") if fv.output_json else None
  report = gpu_check.run_gpu_check(opts, on_part=save, hlo_dir=hlo_dir)
  print("\n".join(gpu_check_report.summary_lines(report)))
  cli.write_report(fv, to_json(report))
  return 0 if gpu_check.all_ok(report) else 1


def run(argv):
  """Parses `argv` into fresh flags and runs the check (for tests: no global flag state)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  cli.run_script(main, define_flags)
