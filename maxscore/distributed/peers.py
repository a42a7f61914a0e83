"""A lost process, named (docs/ARCHITECTURE.md section 8).

Every process of a multi-process job beats a counter in the coordination service's key-value store once a
second, from a daemon thread, and reads every other process's counter. A counter that stands still for a third
of `heartbeat_timeout_s` means its process is lost: the watchdog prints one line naming it and saying that the same
command resumes, flushes the consoles and log files, and ends this process with LOST_PEER_EXIT_CODE.

Why not JAX's own detection: its coordination service declares a silent process dead after the whole
heartbeat timeout and then aborts every other process from C++ (SIGABRT, a fatal-error dump, no name), and
jaxlib's hook for that (`missed_heartbeat_callback`) cannot be used from Python: it fails converting the status
it passes. Deciding at a third of the timeout lets the watchdog speak first, with time to spare on a loaded host.

The service lives in process 0, so when process 0 itself is lost the others' runtime learns it at once, from C++
(the service's socket closes), before the watchdog could: by default it aborts them with a fatal-error dump. So
the others' clients get a `missed_heartbeat_callback` (`coordinator_hook`); calling it fails inside jaxlib with a
C++ std::bad_cast, which ends in std::terminate, and the terminate handler installed by `name_lost_coordinator`
checks that the coordinator no longer answers and then says the same one line, naming process 0. The error can
arrive while the dying process's listening socket still takes connections (the kernel closes its sockets one
after another), so that check waits a few seconds for the port to close before it calls the cause something else.

A process that ends normally marks its counter done (atexit), so the others never take an early finisher for
a lost one. Process 0, which holds the service, stops last: the others' runtime would abort them without it.
"""

import atexit
import contextlib
import ctypes
import logging
import os
import socket
import sys
import threading
import time
from typing import Any, Callable, Iterator, Optional, Sequence

# EX_TEMPFAIL: the job failed for a reason outside itself; running the same command again is the remedy.
LOST_PEER_EXIT_CODE = 75
_PREFIX = "maxscore_beat/"
_DONE = "done"
_STOPPING = "stopping"


def lost_message(lost: Sequence[int], count: int, stale_s: Optional[float]) -> str:
  """The one line a surviving process prints; `stale_s` None: the coordinator's service stopped answering."""
  who = ", ".join(str(p) for p in lost)
  why = "its coordination service closed" if stale_s is None else f"no heartbeat for {stale_s:g} s"
  return (f"error: process {who} of {count} stopped ({why}): the job cannot go on "
          f"without it, so this process stops too. Run the same command on every host to resume; finished work "
          f"is kept")


class Watchdog:
  """The beating and watching thread of one process (start with `start`)."""

  def __init__(self, client: Any, index: int, count: int, heartbeat_timeout_s: float):
    self.client, self.index, self.count = client, index, count
    self.stale_s = heartbeat_timeout_s / 3
    self.interval_s = min(1.0, self.stale_s / 5)
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, name="maxscore-peer-watchdog", daemon=True)

  def start(self) -> "Watchdog":
    self._beat(0)
    self._thread.start()
    atexit.register(self.finish)
    return self

  def finish(self) -> None:
    """This process ends normally: stop watching and mark it done, so no peer takes it for lost."""
    if self._stop.is_set():
      return
    self._stop.set()
    self._thread.join(timeout=5)
    try:
      self._beat(_DONE)
    except Exception:  # pylint: disable=broad-except  (the service may be gone already: nothing to tell)
      pass

  def await_verdict(self) -> None:
    """Gives the watchdog time to find a lost peer (it then ends this process); returns if it finds none."""
    self._stop.wait(self.decision_s + 1.0)

  @property
  def decision_s(self) -> float:
    """The longest a lost peer can go unnoticed: its counter's deadline plus two reads."""
    return self.stale_s + 2 * self.interval_s

  def _beat(self, value: Any) -> None:
    self.client.key_value_set(f"{_PREFIX}{self.index}", str(value), allow_overwrite=True)

  def _run(self) -> None:
    seen = {p: (None, time.monotonic()) for p in range(self.count) if p != self.index}
    beat, unreachable_since = 0, None
    while not self._stop.wait(self.interval_s):
      beat += 1
      now = time.monotonic()
      try:
        self._beat(beat)
        values = dict(self.client.key_value_dir_get(_PREFIX))
        unreachable_since = None
      except Exception:  # pylint: disable=broad-except  (the service does not answer: process 0 may be gone)
        unreachable_since = unreachable_since or now
        if now - unreachable_since > self.stale_s and not self._stop.is_set():
          self._lost([0])
        continue
      for p, (value, since) in seen.items():
        current = values.get(f"{_PREFIX}{p}")
        if current != value:
          seen[p] = (current, now)
      lost = [p for p, (value, since) in seen.items() if value not in (_DONE, _STOPPING) and now - since > self.stale_s]
      if lost and not self._stop.is_set():
        self._lost(lost)

  def _lost(self, lost: Sequence[int]) -> None:
    """Ends this process naming `lost`. Process 0 holds the coordination service, whose end stops every other
    process at once from C++: it goes last, once each other survivor has said it is stopping (or a deadline)."""
    line = lost_message(lost, self.count, self.stale_s)
    if self.index != 0:
      _say(line)
      try:
        self._beat(_STOPPING)
      finally:
        exit_now(LOST_PEER_EXIT_CODE)
      return
    deadline = time.monotonic() + 4 * self.interval_s  # they see the same counters stand still, a read apart
    others = {f"{_PREFIX}{p}" for p in range(1, self.count) if p not in lost}
    while time.monotonic() < deadline:
      try:
        values = dict(self.client.key_value_dir_get(_PREFIX))
      except Exception:  # pylint: disable=broad-except
        break
      if all(values.get(k) in (_DONE, _STOPPING) for k in others):
        time.sleep(self.interval_s)  # their exit follows their word
        break
      time.sleep(0.1)
    _say(line)
    exit_now(LOST_PEER_EXIT_CODE)


def _say(line: str) -> None:
  """Flushes the consoles and every log handler, then prints `line` on stderr."""
  try:
    sys.stdout.flush()
  except Exception:  # pylint: disable=broad-except
    pass
  for handler in logging.getLogger().handlers:
    try:
      handler.flush()
    except Exception:  # pylint: disable=broad-except
      pass
  try:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
  except Exception:  # pylint: disable=broad-except
    pass


def exit_now(code: int) -> None:
  """Ends the process at once: its main thread may be stuck in a collective that will never return, and an
  orderly exit would wait for the lost peer."""
  os._exit(code)  # pylint: disable=protected-access


_WATCHDOG: Optional[Watchdog] = None
_ON_TERMINATE: list[Any] = []  # the installed handler: ctypes must keep it alive as long as the process


@contextlib.contextmanager
def coordinator_hook(jax_lib: Any) -> Iterator[None]:
  """While active, each distributed-runtime client `jax_lib` (jaxlib's `_jax` module, as jax.distributed
  calls it) creates for a process other than 0 gets a `missed_heartbeat_callback`: where there is one, an
  error polled from the coordination service ends in std::terminate (see the module doc) instead of the
  runtime's fatal-error abort, and `name_lost_coordinator` can speak."""
  make = jax_lib.get_distributed_runtime_client

  def with_callback(*args, **kwargs):
    node_id = kwargs.get("node_id", args[1] if len(args) > 1 else 0)
    if node_id != 0:
      kwargs.setdefault("missed_heartbeat_callback", lambda *unused: None)
    return make(*args, **kwargs)
  jax_lib.get_distributed_runtime_client = with_callback
  try:
    yield
  finally:
    jax_lib.get_distributed_runtime_client = make


def _answers(address: str, timeout_s: float = 1.0) -> bool:
  """Whether a TCP connection to host:port opens."""
  host, _, port = address.rpartition(":")
  try:
    socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    return True
  except (OSError, ValueError):
    return False


def coordinator_gone(address: str, answers: Callable[[str], bool] = _answers, within_s: float = 5.0,
                     every_s: float = 0.1) -> bool:
  """Whether the coordinator at `address` stops answering within `within_s` (checked every `every_s`)."""
  deadline = time.monotonic() + within_s
  while answers(address):
    if time.monotonic() >= deadline:
      return False
    time.sleep(every_s)
  return True


def _terminating_type(libstdcxx: Any) -> str:
  """The mangled name of the C++ exception being handled ('' if none): the Itanium ABI's type_info holds a
  vtable pointer, then the name."""
  try:
    get = libstdcxx.__cxa_current_exception_type
    get.restype = ctypes.c_void_p
    info = get()
    if not info:
      return ""
    return ctypes.cast(info + ctypes.sizeof(ctypes.c_void_p), ctypes.POINTER(ctypes.c_char_p))[0].decode()
  except Exception:  # pylint: disable=broad-except  (not the Itanium ABI: an unknown cause)
    return ""


def name_lost_coordinator(address: str, index: int, count: int,
                          answers: Callable[[str], bool] = _answers) -> bool:
  """In process `index` (not 0) of `count`, whose client came from `coordinator_hook`: a std::terminate raised
  by that callback while the coordinator at `address` no longer answers prints the lost line naming process 0
  and ends the process with LOST_PEER_EXIT_CODE. Any other terminate goes to the handler there was before.
  Returns whether the handler was installed (libstdc++ found)."""
  if index == 0 or count < 2 or _ON_TERMINATE:
    return bool(_ON_TERMINATE)
  try:
    libstdcxx = ctypes.CDLL("libstdc++.so.6")
    set_terminate = libstdcxx._ZSt13set_terminatePFvvE  # std::set_terminate(void (*)())
  except (OSError, AttributeError):
    return False
  set_terminate.restype = ctypes.c_void_p
  set_terminate.argtypes = [ctypes.c_void_p]
  handler_type = ctypes.CFUNCTYPE(None)
  before: list[Any] = []

  def on_terminate():
    if _terminating_type(libstdcxx) == "St8bad_cast" and coordinator_gone(address, answers):
      _say(lost_message([0], count, None))
      exit_now(LOST_PEER_EXIT_CODE)
    if before and before[0]:
      handler_type(before[0])()  # the default: prints the exception and aborts
    os.abort()
  handler = handler_type(on_terminate)
  before.append(set_terminate(ctypes.cast(handler, ctypes.c_void_p)))
  _ON_TERMINATE.append(handler)
  return True


def watch(client: Any, index: int, count: int, heartbeat_timeout_s: float) -> Watchdog:
  """Starts this process's watchdog (once)."""
  global _WATCHDOG
  if _WATCHDOG is None:
    _WATCHDOG = Watchdog(client, index, count, heartbeat_timeout_s).start()
  return _WATCHDOG


def stop_if_peer_lost() -> None:
  """Called with an error in hand in a multi-process run: a collective that failed because a peer died raises
  here first. Waits for the watchdog's verdict (it ends the process, naming the peer); returns if every peer
  stays alive (the error is this process's own)."""
  if _WATCHDOG is not None:
    _WATCHDOG.await_verdict()
