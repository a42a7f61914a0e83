"""Where the time goes in a packed forward: its parts timed alone, as shares of the whole.

  python scripts/profile_shares.py                    # reference workload, Qwen3-0.6B dims, 2 layers
  python scripts/profile_shares.py --query_len=32 --num_items=64 --item_len=256   # one BEIR-like extend chunk
  python scripts/profile_shares.py --repeats=5
  python scripts/profile_shares.py --model=smollm2-135m --num_layers=4 --query_len=70 --num_items=30 --item_len=80 \
      --hf_profile                                    # transformers' own profile of the same workload beside it

What each part is: maxscore/bench/profile.py. Every flag is a key of configs/profile.yml. The load
average is printed before and after the timed runs.
"""

import maxscore  # first: importing the package installs the one-line Ctrl-C (maxscore/interrupt.py)
import os

from absl import flags

from maxscore import cli
from maxscore.bench import profile

ENTRY = "profile"
SECTIONS = {"profile": profile.ProfileOptions}


def define_flags(fv: flags.FlagValues) -> None:
  """Every key of configs/profile.yml as a flag."""
  cli.define_entry_flags(fv, ENTRY, SECTIONS)


def main(argv, fv: flags.FlagValues = flags.FLAGS) -> dict:
  """Times every part, prints each one's share of the full forward; returns part -> best seconds."""
  del argv
  with cli.one_line_errors():
    opts = cli.entry_from_flags(fv, ENTRY, SECTIONS)["profile"]
    todo = profile.parts(opts)
  print(f"load average before: {os.getloadavg()}", flush=True)
  times = profile.time_parts(todo, opts.repeats)
  print(f"load average after: {os.getloadavg()}")
  best = {name: min(ts) for name, ts in times.items()}
  whole = next(iter(best.values()))
  for name, s in list(best.items()) + list(profile.derived_shares(best).items()):
    print(f"{name:66s} best {s:8.3f} s   {s / whole:6.1%} of the full forward")
  if opts.hf_profile:
    hf = profile.hf_profile(opts)
    print(f"load average after transformers: {os.getloadavg()}")
    for name, s in hf.items():
      print(f"{name:66s}      {s:8.3f} s   {s / whole:6.1%} of maxscore's full forward")
    best.update(hf)
  return best


def run(argv) -> dict:
  """Parses `argv` into fresh flags and runs the profile (for tests: no global flag state)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  cli.run_script(main, define_flags)
