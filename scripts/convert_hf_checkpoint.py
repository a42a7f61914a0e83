"""Converts a Hugging Face Llama/Qwen3 directory (config.json + safetensors) into a maxscore checkpoint.

  python scripts/convert_hf_checkpoint.py --hf_dir=Qwen3-0.6B --output_dir=ckpt/qwen3-0.6b [--dtype=bfloat16]

--output_dir may not be the Hugging Face directory (nor inside it). --overwrite replaces only a
directory that maxscore wrote (it carries a .maxscore-owned marker); anything else is refused.
"""

from absl import app, flags, logging

from maxscore import cli
from maxscore.checkpoints.convert import convert_hf_checkpoint


def define_flags(fv: flags.FlagValues) -> None:
  flags.DEFINE_string("hf_dir", None, "Hugging Face model directory", flag_values=fv)
  flags.DEFINE_string("output_dir", None, "where to write the maxscore checkpoint", flag_values=fv)
  flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "parameter dtype to store", flag_values=fv)
  flags.DEFINE_bool("overwrite", False, "replace an existing output_dir that maxscore wrote", flag_values=fv)


def main(argv, fv: flags.FlagValues = flags.FLAGS):
  del argv
  if not fv.hf_dir or not fv.output_dir:
    cli.fail(ValueError("--hf_dir and --output_dir are required"))
  with cli.one_line_errors():
    out = convert_hf_checkpoint(fv.hf_dir, fv.output_dir, fv.dtype, overwrite=fv.overwrite)
  logging.info("wrote %s", out)
  print(out)


def run(argv):
  """Parses `argv` into fresh flags and calls main (tests: no global flag state)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  define_flags(flags.FLAGS)
  app.run(main)
