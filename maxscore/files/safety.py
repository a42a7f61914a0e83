"""Writing outputs without ever losing a user's file.

- `atomic_output` / `atomic_write_text`: write under a temporary name in the same directory and
  rename into place, so a killed process leaves the old file (or none), never a truncated one.
- `refuse_overlap`: an output equal to or inside an input (symlinks resolved) is refused before
  anything is opened for writing.
- `mark_owned` / `remove_owned` / `replace_dir` / `prepare_output_dir`: directories maxscore
  creates carry a marker file; only a directory with the marker is ever removed or replaced.
"""

import contextlib
import json
import os
import pathlib
import shutil
import tempfile
import uuid
from typing import IO, Iterable, Iterator, Mapping, Optional

from maxscore import interrupt
from maxscore.errors import UnsafeOutputError

MARKER = ".maxscore-owned"
_UMASK = os.umask(0)
os.umask(_UMASK)


def resolve(path: os.PathLike) -> pathlib.Path:
  """The absolute path with every symlink resolved (also for paths that do not exist yet)."""
  return pathlib.Path(os.path.expanduser(os.fspath(path))).resolve()


def refuse_overlap(outputs: Iterable[Optional[os.PathLike]], inputs: Iterable[Optional[os.PathLike]],
                   what: str = "output") -> None:
  """Raises UnsafeOutputError when an output is an input, lies inside an input directory, or is a
  directory that holds an input (writing or replacing it could change or remove that input)."""
  ins = [(i, resolve(i)) for i in inputs if i not in (None, "", "-")]
  for o in outputs:
    if o in (None, "", "-"):
      continue
    ro = resolve(o)
    for i, ri in ins:
      if ro == ri or ri in ro.parents or ro in ri.parents:
        where = "is" if ro == ri else "is inside" if ri in ro.parents else "contains"
        raise UnsafeOutputError(f"{what} {o} {where} the input {i} (after resolving links); "
                                f"choose an output path outside the inputs")


def refuse_same(outputs: Mapping[str, Optional[os.PathLike]]) -> None:
  """Raises UnsafeOutputError when two outputs (by flag name) are one path: one would replace the other."""
  seen: dict[pathlib.Path, str] = {}
  for name, o in outputs.items():
    if o in (None, "", "-"):
      continue
    ro = resolve(o)
    if ro in seen:
      raise UnsafeOutputError(f"{name} and {seen[ro]} are the same path {o}; one would replace the other: "
                              f"give each its own path")
    seen[ro] = name


def with_path(error: OSError, path: os.PathLike) -> OSError:
  """`error` naming `path` when it names no file (a full disk's ENOSPC names none)."""
  if error.filename is None and error.errno is not None:
    return type(error)(error.errno, error.strerror, os.fspath(path))
  return error


# --- claimed directories ----------------------------------------------------------------------------
# Directories whose run has passed every check on its outputs: what waited for that (the run's log file,
# cli.py) may now be written there. Nothing is created before (docs/ARCHITECTURE.md section 9).
_CLAIMED: dict[pathlib.Path, int] = {}  # directory -> the number of its latest claim
_CLAIMS = [0]


def claim(directory: os.PathLike) -> None:
  """Records that every check on this run's outputs in `directory` has passed."""
  _CLAIMS[0] += 1
  _CLAIMED[resolve(directory)] = _CLAIMS[0]


def claims_so_far() -> int:
  """A mark to pass to `is_claimed`: only claims made after it count (a run started after an earlier
  one in the same process must claim the directory again)."""
  return _CLAIMS[0]


def is_claimed(directory: os.PathLike, since: int = 0) -> bool:
  return _CLAIMED.get(resolve(directory), 0) > since


@contextlib.contextmanager
def atomic_output(path: os.PathLike, mode: str = "w", fsync: bool = False) -> Iterator[IO]:
  """A file object for `path` that replaces it only when the block finishes without error."""
  path = pathlib.Path(path)
  if path.is_dir():
    raise IsADirectoryError(f"{path} is a directory; expected a file path")
  if not path.parent.is_dir():
    raise FileNotFoundError(f"cannot write {path}: its directory {path.parent} does not exist")
  fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
  done = False
  try:
    os.fchmod(fd, 0o666 & ~_UMASK)
    with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f, interrupt.removed_on_stop(tmp):
      yield f
      f.flush()
      if fsync:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    done = True
  except OSError as e:
    raise with_path(e, path) from None
  finally:
    if not done:
      with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)


def atomic_write_text(path: os.PathLike, text: str) -> None:
  with atomic_output(path) as f:
    f.write(text)


# --- directories maxscore owns ---------------------------------------------------------------------
def mark_owned(directory: os.PathLike, kind: str, **info) -> None:
  """Writes the marker that lets a later --overwrite remove or replace `directory`."""
  atomic_write_text(pathlib.Path(directory) / MARKER,
                    json.dumps({"written_by": "maxscore", "kind": kind, **info}, sort_keys=True) + "\n")


def owner(directory: os.PathLike) -> Optional[dict]:
  """The marker's contents, or None when `directory` has no readable marker."""
  try:
    meta = json.loads((pathlib.Path(directory) / MARKER).read_text(encoding="utf-8"))
  except (OSError, ValueError):
    return None
  return meta if isinstance(meta, dict) and meta.get("written_by") == "maxscore" else None


def is_owned(directory: os.PathLike, kind: Optional[str] = None) -> bool:
  meta = owner(directory)
  return meta is not None and (kind is None or meta.get("kind") == kind)


def _foreign_entries(directory: pathlib.Path) -> list[pathlib.Path]:
  return list(directory.iterdir())


def _not_owned(directory: pathlib.Path, what: str) -> UnsafeOutputError:
  return UnsafeOutputError(f"{what} {directory} exists and was not written by maxscore (it has no {MARKER} "
                           f"marker); it is left untouched: choose a new path, or remove it yourself")


def remove_owned(directory: os.PathLike, what: str = "directory") -> None:
  """Deletes `directory` only when it carries maxscore's marker; refuses anything else."""
  directory = resolve(directory)
  if not directory.exists():
    return
  if not directory.is_dir() or not (is_owned(directory) or not _foreign_entries(directory)):
    raise _not_owned(directory, what)
  shutil.rmtree(directory)


def check_output_dir(directory: os.PathLike, kind: str, inputs: Iterable[Optional[os.PathLike]] = (),
                     what: str = "output directory") -> None:
  """Refuses (without creating anything) an output directory that is, holds or lies inside an input, is a
  file, lies under a file, or holds files of someone else (no marker) or another kind of maxscore output."""
  directory = pathlib.Path(directory)
  refuse_overlap([directory], inputs, what)
  if directory.exists() and not directory.is_dir():
    raise NotADirectoryError(f"{what} {directory} is a file, not a directory")
  for parent in directory.parents:
    if parent.exists():
      if not parent.is_dir():
        raise NotADirectoryError(f"{what} {directory} lies under {parent}, which is a file")
      if not directory.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(f"{what} {directory} cannot be created: {parent} is not writable")
      break
  meta = owner(directory) if directory.is_dir() else None
  if meta is None and directory.is_dir() and _foreign_entries(directory):
    raise _not_owned(directory, what)
  if meta is not None and meta.get("kind") != kind:
    raise UnsafeOutputError(f"{what} {directory} holds a maxscore {meta.get('kind')} output, not a {kind}; "
                            f"choose another path")


def check_output_file(path: Optional[os.PathLike], inputs: Iterable[Optional[os.PathLike]] = (),
                      what: str = "output", overwrite: Optional[bool] = None) -> None:
  """Refuses, before any work, an output file that is, lies inside or holds an input, is a directory, or
  lies under a file; its directory is created when it is written. A script with an --overwrite flag passes
  its value: an existing file is then refused without it (None: the script replaces its output freely)."""
  if path in (None, "", "-"):
    return
  path = pathlib.Path(path)
  refuse_overlap([path], inputs, what)
  if path.is_dir():
    raise IsADirectoryError(f"{what} {path} is a directory; expected a file path")
  if overwrite is False and path.exists():
    raise FileExistsError(f"{what} {path} exists; pass --overwrite to replace it")
  for parent in path.parents:
    if parent.exists():
      if not parent.is_dir():
        raise NotADirectoryError(f"{what} {path} lies under {parent}, which is a file")
      break


def prepare_output_dir(directory: os.PathLike, kind: str, inputs: Iterable[Optional[os.PathLike]] = (),
                       what: str = "output directory") -> pathlib.Path:
  """A run's output directory: created (and marked) when new or empty, reused when it carries the
  marker of the same kind; refused (check_output_dir) before anything is created otherwise."""
  directory = pathlib.Path(directory)
  check_output_dir(directory, kind, inputs, what)
  meta = owner(directory) if directory.is_dir() else None
  directory.mkdir(parents=True, exist_ok=True)
  if meta is None:
    mark_owned(directory, kind)
  return directory


def exported_by(export_dir: os.PathLike, workdir: os.PathLike) -> bool:
  """Whether `export_dir` is the export an earlier (or killed) run of `workdir` wrote."""
  return (owner(export_dir) or {}).get("workdir") == str(workdir)


def check_export_dir(export_dir: os.PathLike, workdir: os.PathLike, inputs: Iterable[Optional[os.PathLike]],
                     overwrite: bool, kind: str = "checkpoint", flag: str = "--export_dir") -> None:
  """Before a run that writes `workdir` does any work: its `export_dir` is no input, neither is nor
  holds nor lies inside the workdir (--overwrite removes that), and an existing one is replaced only
  when maxscore wrote it as a `kind` output, with `overwrite` or when this workdir's earlier run wrote it.
  `flag` names the export in the errors (--export_dir, --adapters_dir)."""
  refuse_overlap([export_dir], inputs, flag)
  export, work = resolve(export_dir), resolve(workdir)
  if export == work or work in export.parents or export in work.parents:
    raise UnsafeOutputError(f"{flag} {export_dir} would replace the --workdir {workdir} or lie inside it; "
                            f"choose an export path outside it (beside it, for example)")
  if not export.exists():
    return
  if not export.is_dir() or not is_owned(export, kind):
    raise UnsafeOutputError(f"{flag} {export_dir} exists and was not written by maxscore as a {kind} (no {MARKER} "
                            f"marker of that kind); it is left untouched: choose a new path")
  if not (overwrite or exported_by(export, work)):
    raise UnsafeOutputError(f"{flag} {export_dir} already exists; pass --overwrite to replace it")


def swap_dir(tmp: pathlib.Path, target: pathlib.Path) -> None:
  """Renames the finished directory `tmp` to `target`; an old `target` is moved aside first and deleted
  after, so `target` is always either the old or the new directory, never a half-written one."""
  if target.exists():
    old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
    os.rename(target, old)
    os.rename(tmp, target)
    shutil.rmtree(old)
  else:
    os.rename(tmp, target)


@contextlib.contextmanager
def replace_dir(directory: os.PathLike, kind: str, overwrite: bool = False,
                inputs: Iterable[Optional[os.PathLike]] = (), what: str = "output directory",
                **info) -> Iterator[pathlib.Path]:
  """Yields an empty temporary directory beside `directory`; when the block succeeds it is marked
  and renamed into place (replacing an old maxscore directory only with `overwrite`)."""
  target = resolve(directory)
  inputs = [i for i in inputs if i not in (None, "", "-")]
  refuse_overlap([target], inputs, what)
  for i in inputs:  # replacing target would delete an input that lies inside it
    if target in resolve(i).parents:
      raise UnsafeOutputError(f"{what} {directory} contains the input {i}; choose another path")
  if target.exists():
    if not target.is_dir() or not is_owned(target):
      raise _not_owned(target, what)
    if not is_owned(target, kind):
      raise UnsafeOutputError(f"{what} {target} holds a maxscore {owner(target).get('kind')} output, not a "
                              f"{kind}; choose another path")
    if not overwrite:
      raise UnsafeOutputError(f"{what} {target} already exists; pass --overwrite (overwrite=True) to replace it")
  target.parent.mkdir(parents=True, exist_ok=True)
  tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
  try:
    with interrupt.removed_on_stop(tmp):
      yield tmp
      interrupt.planted("replace_dir")  # a test's Ctrl-C with the new directory written, not yet in place
    mark_owned(tmp, kind, **info)
    os.chmod(tmp, 0o777 & ~_UMASK)
    swap_dir(tmp, target)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
