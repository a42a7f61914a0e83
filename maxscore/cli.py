"""What every absl entry script shares: one-line errors with an exit code, and flag parsing for tests."""

import sys
from typing import Any, Callable, NoReturn, Sequence

from absl import flags


def fail(error: BaseException, code: int = 2) -> NoReturn:
  """Prints `error` as one line on stderr and exits with `code` (DESIGN.md section 9)."""
  print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
  sys.exit(code)


def run_with_fresh_flags(define_flags: Callable[[flags.FlagValues], None],
                         main: Callable[[Sequence[str], flags.FlagValues], Any], argv: Sequence[str]) -> Any:
  """Parses `argv` into a new FlagValues and calls main (tests: no global flag state, no duplicate flags)."""
  fv = flags.FlagValues()
  define_flags(fv)
  return main(fv(list(argv)), fv)
