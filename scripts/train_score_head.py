"""The former name of scripts/train_reranker.py (same flags, same configs/train.yml): kept as an alias."""

import maxscore  # first: importing the package installs the one-line Ctrl-C (maxscore/interrupt.py)
import importlib.util
import pathlib

from maxscore import cli

_spec = importlib.util.spec_from_file_location("train_reranker", pathlib.Path(__file__).with_name("train_reranker.py"))
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
ENTRY, SECTIONS = _module.ENTRY, _module.SECTIONS
define_flags, main, run = _module.define_flags, _module.main, _module.run

if __name__ == "__main__":
  cli.run_script(main, define_flags, log_dir_flag="workdir")
