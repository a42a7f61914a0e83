"""Converts a Hugging Face Llama/Qwen3 directory (config.json + safetensors) into a maxscore checkpoint.

  python scripts/convert_hf_checkpoint.py --hf_dir=Qwen3-0.6B --output_dir=ckpt/qwen3-0.6b [--dtype=bfloat16]
"""


from absl import flags, logging

from maxscore import cli
from maxscore.checkpoints.convert import ConversionError, convert_hf_checkpoint
from maxscore.checkpoints.storage import CheckpointError

FLAGS = flags.DEFINE_string("hf_dir", None, "Hugging Face model directory", required=True)
OUTPUT = flags.DEFINE_string("output_dir", None, "where to write the maxscore checkpoint", required=True)
DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "parameter dtype to store")
OVERWRITE = flags.DEFINE_bool("overwrite", False, "replace an existing output_dir")


def main(argv):
  del argv
  try:
    out = convert_hf_checkpoint(FLAGS.value, OUTPUT.value, DTYPE.value, overwrite=OVERWRITE.value)
  except (ConversionError, CheckpointError) as e:
    cli.fail(e)
  logging.info("wrote %s", out)
  print(out)


if __name__ == "__main__":
  cli.run_script(main)  # quiet console: library INFO with -v only (no log file inside the output)
