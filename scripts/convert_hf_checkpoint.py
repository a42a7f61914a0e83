"""Converts a Hugging Face directory (config.json + safetensors) into a maxscore checkpoint.

  python scripts/convert_hf_checkpoint.py --hf_dir=Qwen3-0.6B --output_dir=ckpt/qwen3-0.6b [--dtype=bfloat16]
  python scripts/convert_hf_checkpoint.py --hf_dir=Qwen3-0.6B --output_dir=ckpt/qwen3-0.6b-int8 --quantize=int8

Every flag is a key of configs/convert.yml. --output_dir may not be the Hugging Face directory
(nor inside it). --overwrite replaces only a directory that maxscore wrote (it carries a
.maxscore-owned marker); anything else is refused.
"""

import maxscore  # first: importing the package installs the one-line Ctrl-C (maxscore/interrupt.py)
import dataclasses
from typing import Literal, Optional

from absl import flags, logging

from maxscore import cli, interrupt
from maxscore.checkpoints.convert import convert_hf_checkpoint


@dataclasses.dataclass(frozen=True)
class ConvertOptions:
  """What to convert and where (configs/convert.yml documents each key)."""
  hf_dir: Optional[str] = None
  output_dir: Optional[str] = None
  dtype: Literal["float32", "bfloat16"] = "float32"
  quantize: Literal["none", "int8"] = "none"
  quantize_group_size: int = 0
  keep_layers: int = 0
  overwrite: bool = False


ENTRY = "convert"
SECTIONS = {"convert": ConvertOptions}


def define_flags(fv: flags.FlagValues) -> None:
  cli.define_entry_flags(fv, ENTRY, SECTIONS)


def main(argv, fv: flags.FlagValues = flags.FLAGS):
  del argv
  with cli.one_line_errors():
    opts = cli.entry_from_flags(fv, ENTRY, SECTIONS)["convert"]
    cli.require(opts, "hf_dir", "output_dir")
    with interrupt.note(lambda: f"{opts.output_dir} is as it was"):  # Ctrl-C: no half-written output
      out = convert_hf_checkpoint(opts.hf_dir, opts.output_dir, opts.dtype, overwrite=opts.overwrite,
                                  quantize=opts.quantize, keep_layers=opts.keep_layers,
                                  quantize_group_size=opts.quantize_group_size)
  logging.info("wrote %s", out)
  print(out)


def run(argv):
  """Parses `argv` into fresh flags and calls main (tests: no global flag state)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  cli.run_script(main, define_flags)
