"""What every absl entry script shares: one-line errors with an exit code, and flag parsing for tests."""

import contextlib
import sys
from typing import Any, Callable, Iterator, NoReturn, Sequence

from absl import flags


def fail(error: BaseException, code: int = 2) -> NoReturn:
  """Prints `error` as one line on stderr and exits with `code` (DESIGN.md section 9)."""
  print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
  sys.exit(code)


def expected_errors() -> tuple[type[BaseException], ...]:
  """The documented input, file and format errors: each is a one-line message for the user, not a bug.

  Every maxscore error names the file or field; OSError names its path (missing file, a directory
  where a file is expected, permission denied). Anything else is a bug and keeps its traceback."""
  from layers.sharding import ShardingError
  from maxscore.checkpoints.convert import ConversionError
  from maxscore.checkpoints.storage import CheckpointError
  from maxscore.checkpoints.tokenizer import TokenizerError
  from maxscore.config import ConfigError
  from maxscore.distributed.mesh import MeshError
  from maxscore.errors import ResumeError, ScoreInputError, UnsafeOutputError
  from maxscore.heads.train import TrainError
  return (ScoreInputError, UnsafeOutputError, ResumeError, ConfigError, CheckpointError, ConversionError,
          MeshError, ShardingError, TrainError, TokenizerError, OSError)


@contextlib.contextmanager
def one_line_errors(code: int = 2) -> Iterator[None]:
  """Turns the expected errors raised inside the block into one line on stderr and exit `code`."""
  try:
    yield
  except expected_errors() as e:
    fail(e, code)


def run_with_fresh_flags(define_flags: Callable[[flags.FlagValues], None],
                         main: Callable[[Sequence[str], flags.FlagValues], Any], argv: Sequence[str]) -> Any:
  """Parses `argv` into a new FlagValues and calls main (tests: no global flag state, no duplicate flags)."""
  fv = flags.FlagValues()
  define_flags(fv)
  return main(fv(list(argv)), fv)
