"""Where the time goes in the reference packed forward: its parts timed alone, as shares of the whole.

  python scripts/profile_shares.py                    # reference workload, Qwen3-0.6B dims, 2 layers
  python scripts/profile_shares.py --repeats=5

What each part is: maxscore/bench/profile.py. Every flag is a key of configs/profile.yml. The load
average is printed before and after the timed runs.
"""

import os

from absl import flags

from maxscore import cli
from maxscore.bench import profile

ENTRY = "profile"
SECTIONS = {"profile": profile.ProfileOptions}


def define_flags(fv: flags.FlagValues) -> None:
  """Every key of configs/profile.yml as a flag."""
  cli.define_entry_flags(fv, ENTRY, SECTIONS)


def main(argv, fv: flags.FlagValues = flags.FLAGS) -> None:
  del argv
  with cli.one_line_errors():
    opts = cli.entry_from_flags(fv, ENTRY, SECTIONS)["profile"]
  todo = profile.parts(opts.num_layers)
  print(f"load average before: {os.getloadavg()}", flush=True)
  times = profile.time_parts(todo, opts.repeats)
  print(f"load average after: {os.getloadavg()}")
  whole = min(next(iter(times.values())))
  for name, ts in times.items():
    print(f"{name:56s} best {min(ts):8.3f} s   {min(ts) / whole:6.1%} of the full forward")


if __name__ == "__main__":
  cli.run_script(main, define_flags)
