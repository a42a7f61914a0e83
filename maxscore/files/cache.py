"""Where maxscore keeps what it can rebuild (compiled programs, document indexes): MAXSCORE_CACHE_DIR when set,
else $XDG_CACHE_HOME/maxscore, else ~/.cache/maxscore. Never inside a user's data or output directories.

Several processes on one host share it (the processes of a multi-process job, one per GPU or per CPU device
group), and may build the same entry at once: `building` gives each a private directory to build in and then
moves its files into the entry one by one, each in one rename, so a reader finds each file whole (one builder's or
another's: they build the same bytes) and the entry's key file, moved last, only once every other file is in.
An entry whose files differ from build to build (an Orbax checkpoint names its data files anew each time) is
`publishing`'s instead: the first builder's whole directory becomes the entry in one rename and stays, and the
others' are dropped, so a process reading it never has it replaced under it.
"""

import contextlib
import errno
import hashlib
import os
import pathlib
import platform
import shutil
import tempfile
import uuid
from typing import Iterator, Mapping

from maxscore import interrupt


def user_cache_dir(environ: Mapping[str, str] = os.environ) -> pathlib.Path:
  if environ.get("MAXSCORE_CACHE_DIR"):
    return pathlib.Path(environ["MAXSCORE_CACHE_DIR"])
  base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return pathlib.Path(base) / "maxscore"


def host_tag(cpuinfo: str = "/proc/cpuinfo") -> str:
  """A short digest of what a compiled CPU program depends on: the machine's architecture, CPU model and feature
  flags (the first CPU's in `cpuinfo`, where the system has one). JAX keys a persistent cache entry by the
  program, its options and XLA_FLAGS but not by the CPU it was compiled for, so a cache directory seen by several
  kinds of machine (a network home, a restored CI cache) is split by this: an AVX-512 program is never read on a
  machine without AVX-512."""
  fields = {}
  try:
    with open(cpuinfo, encoding="utf-8", errors="replace") as f:
      for line in f:
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("vendor_id", "model name", "flags", "Features", "CPU implementer", "CPU part"):
          fields.setdefault(key, " ".join(value.split()))
  except OSError:
    pass
  described = "\n".join([platform.machine()] + [f"{k}={fields[k]}" for k in sorted(fields)])
  return hashlib.sha256(described.encode()).hexdigest()[:12]


@contextlib.contextmanager
def _private_dir(entry: pathlib.Path) -> Iterator[pathlib.Path]:
  """A new directory beside `entry` that only this process writes, removed when the block ends (on an error, and
  also when Ctrl-C stops the process at once)."""
  entry.parent.mkdir(parents=True, exist_ok=True)
  private = pathlib.Path(tempfile.mkdtemp(prefix=f".{entry.name}.", suffix=".building", dir=entry.parent))
  try:
    with interrupt.removed_on_stop(private):
      yield private
  finally:
    shutil.rmtree(private, ignore_errors=True)


@contextlib.contextmanager
def building(entry: pathlib.Path, key_file: str) -> Iterator[pathlib.Path]:
  """A new private directory beside `entry` to write a cache entry's files into; when the block ends without
  error, each file moves to the same place under `entry` (os.replace, over an older one), `key_file` (the file
  readers check first) last, and the directory is removed; on an error it is removed and nothing moves."""
  with _private_dir(entry) as built:
    yield built
    key = pathlib.Path(key_file)
    files = sorted((p.relative_to(built) for p in built.rglob("*") if p.is_file()), key=lambda f: (f == key, f))
    if key not in files:
      raise FileNotFoundError(f"the cache entry built in {built} has no {key_file}")
    for rel in files:  # the key file last
      (entry / rel).parent.mkdir(parents=True, exist_ok=True)
      os.replace(built / rel, entry / rel)


@contextlib.contextmanager
def publishing(entry: pathlib.Path) -> Iterator[pathlib.Path]:
  """A path (not made yet) in a new private directory beside `entry`, to build a whole cache directory at. When
  the block ends without error it becomes `entry` in one rename, unless another process's build became `entry`
  first: then that one stays and this one is removed. On an error nothing moves."""
  with _private_dir(entry) as private:
    yield private / entry.name
    try:
      os.rename(private / entry.name, entry)
    except OSError as e:  # another process's entry is in place (a directory with files)
      if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
        raise


def set_aside(entry: pathlib.Path) -> None:
  """Deletes a damaged cache directory after one rename takes it out of `entry`'s place, so a new one can be
  published there; when another process has already set it aside there is nothing left to do."""
  aside = entry.parent / f".{entry.name}.damaged-{uuid.uuid4().hex[:8]}"
  try:
    os.rename(entry, aside)
  except FileNotFoundError:
    return
  shutil.rmtree(aside, ignore_errors=True)
