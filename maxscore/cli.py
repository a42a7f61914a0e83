"""What every absl entry script shares: one-line errors with an exit code, quiet consoles (library INFO
logs to a file), flags defined from the one config system, and flag parsing for tests.

A script that builds a scorer or model takes configs/base.yml keys one way: as trailing `key=value`
arguments (the argv[1:] absl leaves once it has parsed the flags).

Each script's settings are typed sections (frozen dataclasses) documented key by key in
configs/<entry>.yml; `define_entry_flags` turns every key into the familiar absl flag (default and
help from the YAML, type from the dataclass) and `entry_from_flags` reads them back through the
same strict loader as configs/base.yml, so a flag and a YAML key are one setting.
"""

import collections
import contextlib
import json
import logging
import logging.handlers
import os
import pathlib
import re
import sys
import types
import typing
from typing import Any, Callable, Iterator, Literal, Mapping, NoReturn, Optional, Sequence

import yaml
from absl import app, flags
from absl import logging as absl_logging

from maxscore import config as config_lib
from maxscore import console, errors, interrupt
from maxscore.distributed import peers
from maxscore.files import safety


def fail(error: BaseException, code: int = 2) -> NoReturn:
  """Prints `error` as one line on stderr and exits with `code` (docs/ARCHITECTURE.md section 9)."""
  print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
  sys.exit(code)


def expected_errors() -> tuple[type[BaseException], ...]:
  """The documented input, file and format errors: each is a one-line message for the user, not a bug.

  Every maxscore error names the file or field; OSError names its path (missing file, a directory
  where a file is expected, permission denied). Anything else is a bug and keeps its traceback."""
  from layers.sharding import ShardingError
  from maxscore.bench.chips import TopologyError
  from maxscore.checkpoints.hf_config import ConversionError
  from maxscore.checkpoints.export import ExportError
  from maxscore.checkpoints.packaged import PackagedError
  from maxscore.checkpoints.storage import CheckpointError
  from maxscore.checkpoints.tokenizer import TokenizerError
  from maxscore.config import ConfigError
  from maxscore.distributed.mesh import MeshError
  from maxscore.errors import ResumeError, ScoreInputError, TrainError, UnsafeOutputError
  from maxscore.rerank.compare import CompareError
  from maxscore.rerank.plots import PlotError
  from maxscore.serving.config import ServeError
  from maxscore.checkpoints.adapters import LoraError
  return (ScoreInputError, UnsafeOutputError, ResumeError, ConfigError, CheckpointError, ConversionError, ExportError,
          MeshError, ShardingError, TrainError, TokenizerError, CompareError, PlotError, TopologyError, ServeError,
          LoraError, PackagedError, OSError)


@contextlib.contextmanager
def one_line_errors(code: int = 2) -> Iterator[None]:
  """Turns the expected errors raised inside the block into one line on stderr and exit `code`."""
  try:
    yield
  except expected_errors() as e:
    fail(e, code)


_EXPECTED_VALUE = {flags.EnumParser: lambda p: "one of " + ", ".join(p.enum_values),
                   flags.IntegerParser: lambda p: "an integer", flags.FloatParser: lambda p: "a number",
                   flags.BooleanParser: lambda p: "true or false (or --name / --noname)"}


def flag_error_message(error: flags.Error, fv: flags.FlagValues) -> str:
  """absl's flag-parsing error as maxscore's: the flag, the value given and what the flag takes."""
  m = re.match(r"flag --(\w+)=(.*?): ", str(error), re.S)
  if m and m.group(1) in fv:
    name, value, parser = m.group(1), m.group(2), fv[m.group(1)].parser
    expected = next((say(parser) for cls, say in _EXPECTED_VALUE.items() if isinstance(parser, cls)), None)
    if expected is not None:
      return f"--{name}={value} is not valid: --{name} takes {expected}"
  if isinstance(error, flags.UnrecognizedFlagError):
    return f"{error}; --help lists the flags"
  return str(error)


def parse_flags(fv: flags.FlagValues, argv: Sequence[str]) -> list[str]:
  """`fv(argv)`, with a flag that does not parse (an unknown flag, a bad enum or number) as one line
  `error: ...` and exit 2, as every other bad setting (docs/ARCHITECTURE.md section 9)."""
  try:
    return fv(list(argv))
  except flags.Error as e:
    fail(ValueError(flag_error_message(e, fv)))


def run_with_fresh_flags(define_flags: Callable[[flags.FlagValues], None],
                         main: Callable[[Sequence[str], flags.FlagValues], Any], argv: Sequence[str]) -> Any:
  """Parses `argv` into a new FlagValues and calls main (tests: no global flag state, no duplicate flags)."""
  fv = flags.FlagValues()
  define_flags(fv)
  return main(parse_flags(fv, argv), fv)


def _unwrap_optional(tp: Any) -> Any:
  if typing.get_origin(tp) in (typing.Union, types.UnionType):
    inner = [a for a in typing.get_args(tp) if a is not type(None)]
    return inner[0]
  return tp


def _define(fv: flags.FlagValues, name: str, tp: Any, default: Any, help_: str) -> None:
  base = _unwrap_optional(tp)
  origin = typing.get_origin(base)
  if origin is Literal:
    flags.DEFINE_enum(name, default, [str(a) for a in typing.get_args(base)], help_, flag_values=fv)
  elif origin is tuple:
    flags.DEFINE_list(name, None if default is None else [str(x) for x in default], help_, flag_values=fv)
  elif base is bool:
    flags.DEFINE_bool(name, default, help_, flag_values=fv)
  elif base is int:
    flags.DEFINE_integer(name, default, help_, flag_values=fv)
  elif base is float:
    flags.DEFINE_float(name, default, help_, flag_values=fv)
  elif base is str:
    flags.DEFINE_string(name, default, help_, flag_values=fv)
  else:
    raise TypeError(f"no flag type for config key {name}: {tp}")


def define_entry_flags(fv: flags.FlagValues, entry: str, sections: Mapping[str, type]) -> None:
  """One absl flag per key of configs/<entry>.yml: its default and one-line help from the YAML,
  its type from the section dataclass."""
  path = config_lib.CONFIG_DIR / f"{entry}.yml"
  defaults = yaml.safe_load(path.read_text()) or {}
  comments = config_lib.read_comments(path)
  keys = config_lib.entry_keys(sections)
  for key, section in keys.items():
    hint, metadata = config_lib.section_keys(sections[section])[key]
    allowed = metadata.get("choices")
    help_ = comments.get(key, "") + (f" (one of: {' | '.join(allowed)})" if allowed else "")
    _define(fv, key, hint, defaults.get(key), help_)
    fv.register_flag_by_module(sys.argv[0], fv[key])  # listed by the script's --help, as its own flags


def define_job_entry_flags(fv: flags.FlagValues, entry: str, sections: Mapping[str, type]) -> None:
  """The entry's keys as flags, and the multi-process flags (--coordinator_address, --num_processes,
  --process_id, ...)."""
  from maxscore.distributed import mesh as mesh_lib  # pylint: disable=import-outside-toplevel
  define_entry_flags(fv, entry, sections)
  mesh_lib.define_flags(fv)


def join_job(fv: flags.FlagValues) -> None:
  """Joins the jax.distributed job the flags describe (single-process when nothing is set; exit 1 when
  it cannot). Call it before any other JAX call."""
  from maxscore.distributed import mesh as mesh_lib  # pylint: disable=import-outside-toplevel
  try:
    mesh_lib.initialize_from_flags(fv)
  except mesh_lib.DistributedError as e:
    fail(e, 1)


def define_report_flags(fv: flags.FlagValues, entry: str, sections: Mapping[str, type]) -> None:
  """The entry's keys as flags, and --output_json: where a bench or check writes its full report."""
  define_entry_flags(fv, entry, sections)
  flags.DEFINE_string("output_json", None, "write the full report here", flag_values=fv)


def write_report(fv: flags.FlagValues, report: Any) -> None:
  """`report` as JSON to --output_json when it is set (a failed write is one line on stderr, exit 2)."""
  if fv.output_json:
    with one_line_errors():
      safety.atomic_write_text(fv.output_json, json.dumps(report, indent=1))


def _from_flag(tp: Any, value: Any) -> Any:
  """A flag's value in the form the config loader takes (list items parsed as YAML scalars; `null` for a key that
  may be None is None, as in the YAML files and the flags' help)."""
  base = _unwrap_optional(tp)
  if value == "null" and base is not tp:
    return None
  if value is not None and typing.get_origin(base) is tuple:
    item = typing.get_args(base)[0]
    return [yaml.safe_load(x) if item in (int, float) else x for x in value]
  return value


def entry_from_flags(fv: flags.FlagValues, entry: str, sections: Mapping[str, type]) -> dict[str, Any]:
  """The entry's sections from its flags, through the strict loader (ConfigError on a bad value)."""
  keys = config_lib.entry_keys(sections)
  hints = {k: config_lib.section_keys(sections[s])[k][0] for k, s in keys.items()}
  values = {k: _from_flag(hints[k], fv[k].value) for k in keys}
  return config_lib.load_entry(entry, sections, values)


def require(opts: Any, *keys: str) -> None:
  """ConfigError "--a and --b required" for the keys of `opts` left unset (the flags a script cannot run without)."""
  missing = [f"--{k}" for k in keys if not getattr(opts, k)]
  if missing:
    raise config_lib.ConfigError(f"{' and '.join(missing)} required")


class _LogFile(logging.handlers.WatchedFileHandler):
  """The log file; a write that fails (a full disk, a removed mount) is one line on stderr naming the
  path, once, and the file is no longer written, instead of a traceback per record."""

  broken = False

  def emit(self, record: logging.LogRecord) -> None:
    if not self.broken:
      super().emit(record)

  def handleError(self, record: logging.LogRecord) -> None:
    if self.broken:
      return
    self.broken = True
    error = sys.exc_info()[1]
    print(f"error: cannot write the log file {self.baseFilename}: {' '.join(str(error).split())}; "
          "library logs are no longer written to it", file=sys.stderr)
    with contextlib.suppress(Exception):
      self.close()


class _LogAfterClaim(logging.Handler):
  """Keeps the records in memory until this run claims the log's directory (`safety.claim`, after every
  check on its outputs passed), then writes them and every later one to the log file. A refused run
  thus never creates the directory nor touches an earlier run's log (docs/ARCHITECTURE.md section 9)."""

  def __init__(self, path: pathlib.Path, capacity: int = 100_000):
    super().__init__()
    self.path, self._directory, self._since = path, safety.resolve(path.parent), safety.claims_so_far()
    self._pending: collections.deque = collections.deque(maxlen=capacity)
    self._file: Optional[_LogFile] = None

  def emit(self, record: logging.LogRecord) -> None:
    if self._file is None:
      if not safety.is_claimed(self._directory, self._since):
        self._pending.append(record)
        return
      self._open()
    self._file.handle(record)

  def _open(self) -> None:
    self._file = _LogFile(self.path, encoding="utf-8", delay=True)
    self._file.setFormatter(absl_logging.PythonFormatter())
    while self._pending:
      self._file.handle(self._pending.popleft())

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
    super().close()

  def keep_if_owned(self) -> None:
    """Writes the lines held so far when the log's directory is maxscore's (a run stopped by Ctrl-C before
    its claim, e.g. while computing features: its log is kept); a directory of no run, or none, gets none."""
    if self._file is None and self._pending and safety.is_owned(self._directory):
      self._open()
      self._file.flush()


class _ProgressLines(logging.StreamHandler):
  """The progress lines of a quiet console (maxscore/console.py), plain on stderr; absl's handler shows the
  warnings and errors."""

  def __init__(self):
    super().__init__(sys.stderr)
    self.setLevel(logging.INFO)
    self.addFilter(lambda r: r.levelno < logging.WARNING and console.is_progress(r))

  def emit(self, record: logging.LogRecord) -> None:
    self.stream = sys.stderr  # the stderr of now (a test's capture replaces it)
    super().emit(record)


def console_logging(log_file: Optional[os.PathLike] = None, verbose: bool = False,
                    after_claim: bool = False) -> Optional[logging.Handler]:
  """Quiet consoles: stderr shows warnings and errors unless `verbose`; every INFO line (Orbax, absl, JAX and
  maxscore's own) goes to `log_file` either way: appended from the start (its directory created), or with
  `after_claim` held in memory until the run claims the file's directory. Returns the file handler."""
  absl_logging.use_absl_handler()  # (may reset the root level from --verbosity: first)
  root = logging.getLogger()
  if root.level == logging.NOTSET or root.level > logging.INFO:
    root.setLevel(logging.INFO)
  absl_logging.get_absl_handler().setLevel(logging.NOTSET if verbose else logging.WARNING)
  if not verbose and not any(isinstance(h, _ProgressLines) for h in root.handlers):
    root.addHandler(_ProgressLines())
  if log_file is None:
    return None
  path = pathlib.Path(log_file)
  if after_claim:
    handler: logging.Handler = _LogAfterClaim(path)
  else:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Watched: a script that clears its output directory (train --overwrite) gets the file back on the next line.
    handler = _LogFile(path, encoding="utf-8", delay=True)
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


HELP_FLAGS = ("--help", "-h", "-?", "--helpshort", "--helpfull", "--helpxml")


def run_script(main: Callable[[Sequence[str]], Any], define_flags: Optional[Callable[[flags.FlagValues], None]] = None,
               log_dir_flag: Optional[str] = None) -> None:
  """`app.run(main)` with quiet consoles: library INFO lines go to `<flag log_dir_flag>/<script>.log` (written
  only once the run has claimed that directory) and reach stderr only with --verbosity (or -v); warnings,
  errors, progress lines and the script's prints always show. --help exits 0. An int `main` returns is the
  exit status; anything else it returns (a report, for tests calling it directly) exits 0.

  Ctrl-C (maxscore/interrupt.py): a loop with safe points stops at the next one, anything else at once; either
  way one line on stderr, the log's held lines kept when its directory is maxscore's, and exit status 130."""
  interrupt.install()
  if define_flags is not None:
    define_flags(flags.FLAGS)
  script = pathlib.Path(sys.argv[0]).stem

  def quiet_main(argv):
    log_dir = getattr(flags.FLAGS, log_dir_flag) if log_dir_flag else None
    verbose = bool(flags.FLAGS["verbosity"].present) and flags.FLAGS.verbosity >= 0
    process = getattr(flags.FLAGS, "process_id", None) if "process_id" in flags.FLAGS else None
    name = f"{script}.process{process}.log" if process else f"{script}.log"  # one file per process
    log = console_logging(pathlib.Path(log_dir) / name if log_dir else None, verbose, after_claim=True)
    if isinstance(log, _LogAfterClaim):
      interrupt.at_stop(log.keep_if_owned)
    try:
      status = main(argv)
      interrupt.ignore_from_now()  # finished: a Ctrl-C while the interpreter winds down changes nothing
    except errors.Interrupted as e:  # stopped at a safe point: the work in flight is finished
      interrupt.exit_now(e.message())
    except KeyboardInterrupt:  # Ctrl-C with the handler not installed (a test's direct call)
      interrupt.exit_now("stopped (Ctrl-C)")
    except Exception:  # a collective that failed because a peer process died: named in one line, exit 75
      peers.stop_if_peer_lost()
      raise
    return status if isinstance(status, int) else None

  argv = _expand_bare_v(sys.argv)
  try:
    app.run(quiet_main, argv=argv, flags_parser=lambda args: parse_flags(flags.FLAGS, args))
  except SystemExit as e:
    if e.code == 1 and any(a.split("=")[0] in HELP_FLAGS for a in argv[1:]):
      sys.exit(0)  # absl exits 1 after printing the help that was asked for
    raise
