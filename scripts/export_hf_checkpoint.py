"""Exports a maxscore checkpoint as a Hugging Face transformers directory (config.json + model.safetensors).

  python scripts/export_hf_checkpoint.py --checkpoint_dir=ckpt/qwen3-0.6b --output_dir=out/hf-qwen3-0.6b \
      [--dtype=bfloat16] [--adapters_dir=out/lora]

Every flag is a key of configs/export_hf.yml. LoRA adapters given by --adapters_dir are merged in. A trained
score head (head/) is no part of a causal LM: a checkpoint holding one is refused unless --drop_head. The
directory loads with transformers.AutoModelForCausalLM.from_pretrained and serves with vLLM, TEI or sglang.
"""

import maxscore  # first: importing the package installs the one-line Ctrl-C (maxscore/interrupt.py)
import dataclasses
from typing import Literal, Optional

from absl import flags, logging

from maxscore import cli, interrupt
from maxscore.checkpoints.export import export_hf_checkpoint


@dataclasses.dataclass(frozen=True)
class ExportOptions:
  """What to export and where (configs/export_hf.yml documents each key)."""
  checkpoint_dir: Optional[str] = None
  output_dir: Optional[str] = None
  dtype: Literal["float32", "bfloat16"] = "float32"
  adapters_dir: Optional[str] = None
  drop_head: bool = False
  overwrite: bool = False


ENTRY = "export_hf"
SECTIONS = {"export": ExportOptions}


def define_flags(fv: flags.FlagValues) -> None:
  cli.define_entry_flags(fv, ENTRY, SECTIONS)


def main(argv, fv: flags.FlagValues = flags.FLAGS):
  del argv
  with cli.one_line_errors():
    opts = cli.entry_from_flags(fv, ENTRY, SECTIONS)["export"]
    cli.require(opts, "checkpoint_dir", "output_dir")
    with interrupt.note(lambda: f"{opts.output_dir} is as it was"):  # Ctrl-C: no half-written output
      out = export_hf_checkpoint(opts.checkpoint_dir, opts.output_dir, opts.dtype, adapters_dir=opts.adapters_dir,
                                 overwrite=opts.overwrite, drop_head=opts.drop_head)
  logging.info("wrote %s", out)
  print(out)


def run(argv):
  """Parses `argv` into fresh flags and calls main (tests: no global flag state)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  cli.run_script(main, define_flags)
