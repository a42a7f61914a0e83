"""Builds the embedded default under maxscore/assets/default/: a small reranker that has learned local text.

  python scripts/build_default_assets.py          # about 28 min on 2 CPU cores; resumes where a killed run stopped
  python scripts/build_default_assets.py --data_only   # just the rerank set and its BEIR layout (seconds)
  python scripts/build_default_assets.py --recipe_only # the fine-tuning recipe from the shipped model (minutes)
  make docs-source && python scripts/build_default_assets.py --data_only --docs_html=out/python-docs/usr/share/doc/python3.11/html

The steps (rerank set, pretraining, fine-tuning pairs, two fine-tuning stages, manifest) are
maxscore/lm/assets.py's; every flag is a key of configs/assets.yml. Prints the manifest JSON.
"""

import maxscore  # first: importing the package installs the one-line Ctrl-C (maxscore/interrupt.py)
import json

from absl import flags

from maxscore import cli
from maxscore.lm import assets
from maxscore.lm import default_set

ENTRY = "assets"
SECTIONS = {"assets": assets.AssetOptions}


def define_flags(fv: flags.FlagValues) -> None:
  """Every key of configs/assets.yml as a flag."""
  cli.define_entry_flags(fv, ENTRY, SECTIONS)


def main(argv, fv: flags.FlagValues = flags.FLAGS):
  del argv
  with cli.one_line_errors():
    options = cli.entry_from_flags(fv, ENTRY, SECTIONS)["assets"]
  if options.data_only:
    jsonl = assets.write_rerank_data_only(options)
    print(f"wrote {jsonl} and {jsonl.parent / default_set.BEIR_DIR}")
    return
  with cli.one_line_errors():
    assets.prepare_directories(options)
  if options.recipe_only:
    print(json.dumps(assets.build_recipe_only(options), indent=2))
    return
  print(json.dumps(assets.build(options), indent=2))


if __name__ == "__main__":
  cli.run_script(main, define_flags)  # quiet console: library INFO with -v only (no log file inside the output)
