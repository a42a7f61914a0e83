"""Converts a GGUF file (llama.cpp's format, quantized or not) into a maxscore checkpoint.

  python scripts/convert_gguf_checkpoint.py --gguf=SmolLM2-135M-Instruct.Q4_1.gguf --output_dir=ckpt/smollm2 [--dtype=bfloat16]

Every flag is a key of configs/convert_gguf.yml. Tensors are dequantized to float32 exactly as llama.cpp's
reference dequantizers do (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K); the tokenizer
metadata becomes tokenizer.json with its chat template. --quantize=int8 stores the projections as int8 with
per-output-channel scales instead (Q8_0 ones keep their stored codes where a channel's blocks share one scale,
else are requantized per channel: maxscore/checkpoints/gguf_quants.py q8_0_per_channel); with
--quantize_group_size=32 the scales are per block of 32, and Q8_0 tensors load as stored, exactly (score
with quantization=int8_weights). --overwrite replaces
only a directory that maxscore wrote (it carries a .maxscore-owned marker).
"""

import maxscore  # first: importing the package installs the one-line Ctrl-C (maxscore/interrupt.py)
import dataclasses
from typing import Literal, Optional

from absl import flags, logging

from maxscore import cli, interrupt
from maxscore.checkpoints.convert import convert_gguf_checkpoint


@dataclasses.dataclass(frozen=True)
class GGUFConvertOptions:
  """What to convert and where (configs/convert_gguf.yml documents each key)."""
  gguf: Optional[str] = None
  output_dir: Optional[str] = None
  dtype: Literal["float32", "bfloat16"] = "float32"
  quantize: Literal["none", "int8"] = "none"
  quantize_group_size: int = 0
  keep_layers: int = 0
  overwrite: bool = False


ENTRY = "convert_gguf"
SECTIONS = {"convert_gguf": GGUFConvertOptions}


def define_flags(fv: flags.FlagValues) -> None:
  cli.define_entry_flags(fv, ENTRY, SECTIONS)


def main(argv, fv: flags.FlagValues = flags.FLAGS):
  del argv
  with cli.one_line_errors():
    opts = cli.entry_from_flags(fv, ENTRY, SECTIONS)["convert_gguf"]
    cli.require(opts, "gguf", "output_dir")
    with interrupt.note(lambda: f"{opts.output_dir} is as it was"):  # Ctrl-C: no half-written output
      out = convert_gguf_checkpoint(opts.gguf, opts.output_dir, opts.dtype, overwrite=opts.overwrite,
                                    quantize=opts.quantize, keep_layers=opts.keep_layers,
                                    quantize_group_size=opts.quantize_group_size)
  logging.info("wrote %s", out)
  print(out)


def run(argv):
  """Parses `argv` into fresh flags and calls main (tests: no global flag state)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  cli.run_script(main, define_flags)
