"""maxscore: fast LLM reranker scoring in JAX (docs/ARCHITECTURE.md describes the design)."""

from maxscore import interrupt as _interrupt
from maxscore import jax_platform as _platform

_platform.default_jax_platforms()  # before anything imports JAX: no libtpu noise on a machine without a TPU
_interrupt.install_for_entry_script()  # an entry script's Ctrl-C is one line from here on (maxscore/interrupt.py)

# pylint: disable=g-import-not-at-top,wrong-import-position

from maxscore.config import Config, ConfigError, load_config
from maxscore.errors import ResumeError, ScoreInputError, UnsafeOutputError
from maxscore.scoring.requests import parse_multi_item_sequence
from maxscore.scoring.scorer import Scorer, ScoreResult

__all__ = ["Config", "ConfigError", "ResumeError", "ScoreInputError", "ScoreResult", "Scorer", "UnsafeOutputError",
           "load_config", "parse_multi_item_sequence"]
