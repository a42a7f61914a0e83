"""Ctrl-C as a flag, not an exception (docs/ARCHITECTURE.md section 9).

Every entry script installs one SIGINT handler (`install`, from cli.run_script). It never raises: a
KeyboardInterrupt can land anywhere, inside JAX's gc callback (where Python prints it as ignored and the run
goes on) or half-way through a bookkeeping update. Instead:

- Inside `with stop_points():` the first Ctrl-C only records the request; the loop there asks `requested()`
  at its safe points (between training steps, after the first step's compile, after a checkpoint save,
  between eval queries) and stops with one line (an `Interrupted`, which cli.run_script reports).
- Outside such a block nothing would look at the flag, so the first Ctrl-C stops at once; a second Ctrl-C
  stops at once anywhere. Stopping at once removes what `removed_on_stop` names (a half-written temporary
  output), writes one line and leaves by `os._exit(130)`, without running Python's finalization while XLA's or
  a checkpointer's threads are still working. An Orbax save then in flight is abandoned in its temporary
  directory; the last complete checkpoint is what a rerun resumes from.

A process whose SIGINT is ignored (a background job of a non-interactive shell) keeps it ignored.
"""

import contextlib
import logging
import os
import pathlib
import shutil
import signal
import sys
import threading
import time
from typing import Callable, Iterator

EXIT_CODE = 130  # 128 + SIGINT, as shells report a Ctrl-C
# Test-only, not settings: `planted` sends a signal to this process at the point TEST_SIGNAL_AT_ENV names (tests
# plant a Ctrl-C during a compile, between steps, inside a checkpoint save, while an output is written, and a
# SIGKILL as a query or a step begins, the lost process of the pod tests). TEST_SIGNAL_ENV picks the signal:
# SIGINT (unset) or SIGKILL. Nothing else sets them.
TEST_SIGNAL_AT_ENV = "MAXSCORE_TEST_SIGNAL_AT"
TEST_SIGNAL_ENV = "MAXSCORE_TEST_SIGNAL"
KILLED_AT = "planted SIGKILL at"  # on stderr before a planted SIGKILL, then the time.time() of the kill

_requested = threading.Event()
_points = [0]  # how many `stop_points` blocks are open
_notes: list[Callable[[], str]] = []  # what a stop at once says, innermost last
_on_stop: list[Callable[[], None]] = []  # run before a stop at once, innermost first
_installed = [False]
_SCRIPTS_DIR = pathlib.Path(__file__).resolve().parent.parent / "scripts"
_exiting = threading.Lock()  # one exit writes its line; a second Ctrl-C meanwhile waits for it
_elsewhere = [0]  # how many `handled_elsewhere` blocks are open


def install() -> bool:
  """Installs the handler (from the main thread), unless SIGINT is ignored or has someone else's handler.
  Returns whether it is installed.

  The Python-level handler does nothing: Python runs it only when the main thread is between bytecodes, not
  while it waits in XLA (a compile, a step) or on a lock. The signal's number also reaches a pipe
  (signal.set_wakeup_fd), written by the C-level handler at once, and a watcher thread acts on it there."""
  if _installed[0]:
    return True
  if threading.current_thread() is not threading.main_thread():
    return False
  if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
    return False
  read_fd, write_fd = os.pipe()
  os.set_blocking(write_fd, False)
  try:
    previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
  except ValueError:
    previous = None
  if previous != -1:  # not the main thread's to set, or someone else's (an event loop's): left as it was
    if previous is not None:
      signal.set_wakeup_fd(previous)
    os.close(read_fd)
    os.close(write_fd)
    return False
  signal.signal(signal.SIGINT, lambda *_: None)
  threading.Thread(target=_watch, args=(read_fd,), name="ctrl-c", daemon=True).start()
  _installed[0] = True
  return True


def install_for_entry_script() -> bool:
  """`install` when this process runs one of the repository's entry scripts (scripts/*.py), from the package's
  first import on: Ctrl-C during the imports (seconds on a busy machine) is one line too. A program that only
  imports maxscore keeps its own SIGINT handling."""
  main = getattr(sys.modules.get("__main__"), "__file__", None)
  if main and pathlib.Path(main).resolve().parent == _SCRIPTS_DIR:
    return install()
  return False


def _watch(read_fd: int) -> None:
  while True:
    try:
      received = os.read(read_fd, 64)
    except InterruptedError:
      continue
    if not received:
      return
    for _ in range(received.count(bytes([signal.SIGINT]))):
      _on_sigint()


def ignore_from_now() -> None:
  """The run's work is done: SIGINT is ignored while the process exits. The interpreter's teardown (XLA's and
  Orbax's threads) can take seconds, and Python puts a Python-level handler back to the default during it, so a
  Ctrl-C then would go unseen or kill the finished process by the signal; ignored, the process exits with the
  run's own status."""
  if threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def installed() -> bool:
  return _installed[0]


def requested() -> bool:
  """Whether Ctrl-C was pressed (the loops inside `stop_points` ask this at their safe points)."""
  return _requested.is_set()


def reset() -> None:
  """Forgets a request (a test running several loops in one process)."""
  _requested.clear()


@contextlib.contextmanager
def stop_points() -> Iterator[None]:
  """Marks a block that asks `requested()` at its safe points: a first Ctrl-C inside it waits for one."""
  _points[0] += 1
  try:
    yield
  finally:
    _points[0] -= 1


@contextlib.contextmanager
def handled_elsewhere() -> Iterator[None]:
  """A block whose Ctrl-C is someone else's to handle (the HTTP server's drain): the watcher ignores it."""
  _elsewhere[0] += 1
  try:
    yield
  finally:
    _elsewhere[0] -= 1


@contextlib.contextmanager
def note(describe: Callable[[], str]) -> Iterator[None]:
  """What a stop at once inside the block says after "stopped (Ctrl-C)": `describe()` is called then (where
  the run stands, what a rerun does)."""
  _notes.append(describe)
  try:
    yield
  finally:
    _notes.remove(describe)


@contextlib.contextmanager
def removed_on_stop(path: os.PathLike) -> Iterator[None]:
  """A temporary file or directory being written in the block, removed when Ctrl-C stops the process at once
  (its block's own cleanup does not run then)."""
  def remove():
    if os.path.isdir(path):
      shutil.rmtree(path, ignore_errors=True)
    else:
      with contextlib.suppress(OSError):
        os.unlink(path)
  _on_stop.append(remove)
  try:
    yield
  finally:
    _on_stop.remove(remove)


def at_stop(fn: Callable[[], None]) -> None:
  """Runs `fn` before any exit by Ctrl-C (cli: the log file's pending lines)."""
  _on_stop.insert(0, fn)


def _say(line: str) -> None:
  # os.write, not print: the main thread may be half-way through a write to sys.stderr.
  with contextlib.suppress(Exception):
    sys.stdout.flush()
  with contextlib.suppress(Exception):
    sys.stderr.flush()
  with contextlib.suppress(OSError):
    os.write(2, (line.rstrip("\n") + "\n").encode("utf-8", "replace"))


def exit_now(line: str) -> None:
  """Runs the stop callbacks, writes `line`, flushes the logs and leaves with status 130 (no Python
  finalization). Any thread may call it."""
  if not _exiting.acquire(blocking=False):
    threading.Event().wait()  # another thread is exiting
  for fn in reversed(list(_on_stop)):
    with contextlib.suppress(Exception):
      fn()
  _say(line)
  with contextlib.suppress(Exception):
    logging.shutdown()
  os._exit(EXIT_CODE)


def _stop_line() -> str:
  if not _notes:
    return "stopped (Ctrl-C)"
  try:
    return f"stopped (Ctrl-C); {_notes[-1]()}"
  except Exception:  # pylint: disable=broad-except  (the line must still be written)
    return "stopped (Ctrl-C)"


def planted(point: str) -> None:
  """A test's signal at a named point of the work: when TEST_SIGNAL_AT_ENV names `point`, SIGINT to this process,
  returning once the watcher has taken it (inside `stop_points`; elsewhere the process ends meanwhile), or with
  TEST_SIGNAL_ENV=SIGKILL, a line with the time on stderr and SIGKILL (a lost process: nothing after it runs).
  Points are counted in the work, not in time, so a signal lands at the same place however loaded the machine.

  Points: compile (the first training step starts compiling), step:N (step N done), begin:N (step N begins),
  save:N (step N's checkpoint in flight), features:N, eval:N (N queries of the eval written), query:N (this
  process's N-th query begins), replace_dir (a new output directory written, not yet in place)."""
  if os.environ.get(TEST_SIGNAL_AT_ENV) != point:
    return
  if os.environ.get(TEST_SIGNAL_ENV, "SIGINT") == "SIGKILL":
    sys.stdout.flush()
    sys.stderr.write(f"{KILLED_AT} {time.time()}\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)
  os.kill(os.getpid(), signal.SIGINT)
  deadline = time.monotonic() + 10
  while not _requested.is_set() and time.monotonic() < deadline:
    time.sleep(0.005)


def _on_sigint() -> None:
  if _elsewhere[0]:
    return
  if _requested.is_set() or not _points[0]:
    exit_now(_stop_line())
  _requested.set()
