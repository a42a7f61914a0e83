"""Where maxscore keeps what it can rebuild (compiled programs, document indexes): MAXSCORE_CACHE_DIR when set,
else $XDG_CACHE_HOME/maxscore, else ~/.cache/maxscore. Never inside a user's data or output directories."""

import os
import pathlib
from typing import Mapping


def user_cache_dir(environ: Mapping[str, str] = os.environ) -> pathlib.Path:
  if environ.get("MAXSCORE_CACHE_DIR"):
    return pathlib.Path(environ["MAXSCORE_CACHE_DIR"])
  base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return pathlib.Path(base) / "maxscore"
