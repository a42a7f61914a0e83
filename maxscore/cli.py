"""What every absl entry script shares: one-line errors with an exit code, quiet consoles (library INFO logs
to a file), and flag parsing for tests."""

import logging
import logging.handlers
import os
import pathlib
import sys
from typing import Any, Callable, NoReturn, Optional, Sequence

from absl import app, flags
from absl import logging as absl_logging


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


def console_logging(log_file: Optional[os.PathLike] = None, verbose: bool = False) -> Optional[logging.Handler]:
  """Quiet consoles: stderr shows warnings and errors unless `verbose`; every INFO line (Orbax, absl, JAX and
  maxscore's own) goes to `log_file` (appended, its directory created) either way. Returns the file handler."""
  absl_logging.use_absl_handler()  # (may reset the root level from --verbosity: first)
  root = logging.getLogger()
  if root.level == logging.NOTSET or root.level > logging.INFO:
    root.setLevel(logging.INFO)
  absl_logging.get_absl_handler().setLevel(logging.NOTSET if verbose else logging.WARNING)
  if log_file is None:
    return None
  path = pathlib.Path(log_file)
  path.parent.mkdir(parents=True, exist_ok=True)
  # Watched: a script that clears its output directory (train --overwrite) gets the file back on the next line.
  handler = logging.handlers.WatchedFileHandler(path, encoding="utf-8", delay=True)
  handler.setFormatter(absl_logging.PythonFormatter())
  root.addHandler(handler)
  return handler


def _expand_bare_v(argv: Sequence[str]) -> list[str]:
  """`-v` alone (not followed by a level) means --verbosity=1."""
  out = []
  for i, a in enumerate(argv):
    following = argv[i + 1] if i + 1 < len(argv) else ""
    out.append("--verbosity=1" if a == "-v" and not following.lstrip("-").isdigit() else a)
  return out


def run_script(main: Callable[[Sequence[str]], Any], define_flags: Optional[Callable[[flags.FlagValues], None]] = None,
               log_dir_flag: Optional[str] = None) -> None:
  """`app.run(main)` with quiet consoles: library INFO lines go to `<flag log_dir_flag>/<script>.log` and reach
  stderr only with --verbosity (or -v); warnings, errors, the progress bar and the script's prints always show."""
  if define_flags is not None:
    define_flags(flags.FLAGS)
  script = pathlib.Path(sys.argv[0]).stem

  def quiet_main(argv):
    log_dir = getattr(flags.FLAGS, log_dir_flag) if log_dir_flag else None
    verbose = bool(flags.FLAGS["verbosity"].present) and flags.FLAGS.verbosity >= 0
    process = getattr(flags.FLAGS, "process_id", None) if "process_id" in flags.FLAGS else None
    name = f"{script}.process{process}.log" if process else f"{script}.log"  # one file per process
    console_logging(pathlib.Path(log_dir) / name if log_dir else None, verbose)
    return main(argv)

  app.run(quiet_main, argv=_expand_bare_v(sys.argv))
