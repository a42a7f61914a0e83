"""Starting JAX in other processes (host devices, jax.distributed): the child's environment and XLA flags, a free
coordinator port, and N processes started together with their outputs collected. The tests and the training
benchmark start their children with these."""

import dataclasses
import os
import pathlib
import socket
import subprocess
import sys
import threading
import time
from typing import Callable, Mapping, Optional, Sequence

REPO = pathlib.Path(__file__).resolve().parents[2]


_DEVICE_COUNT = "--xla_force_host_platform_device_count"


def xla_flags(devices: int) -> str:
  """This process's XLA_FLAGS with the host device count set to `devices`: a child keeps the other flags (the
  test session's compile options), so its programs share the persistent compilation cache's keys."""
  kept = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(_DEVICE_COUNT + "=")]
  return " ".join(kept + [f"{_DEVICE_COUNT}={devices}"])


def subprocess_env(devices: int) -> dict:
  """The environment of a child JAX process with `devices` CPU devices (xla_flags), this checkout first on its
  path, and no inherited jax.distributed settings."""
  env = dict(os.environ, XLA_FLAGS=xla_flags(devices), JAX_PLATFORMS="cpu")
  env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
  for k in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
    env.pop(k, None)
  return env


# Sets SIGINT's action, then becomes the command (exec: the same process id, nothing of this Python left).
_SIGINT_THEN_EXEC = ("import os, signal, sys; signal.signal(signal.SIGINT, getattr(signal, sys.argv[1])); "
                     "os.execvp(sys.argv[2], sys.argv[2:])")


def with_sigint(command: Sequence[str], action: str = "SIG_DFL") -> list[str]:
  """`command`, started with SIGINT's `action` (SIG_DFL or SIG_IGN) whatever this process's is: a shell's
  background job inherits SIGINT ignored and a script keeps an ignored SIGINT ignored, so a test's Ctrl-C would
  not reach it. A short Python sets the action in the child and execs the command; a preexec_fn would do it in
  a fork of this multithreaded (JAX) process, running Python there before the exec."""
  if action not in ("SIG_DFL", "SIG_IGN"):
    raise ValueError(f"action={action!r}: SIG_DFL or SIG_IGN")
  return [sys.executable, "-c", _SIGINT_THEN_EXEC, action, *command]


def free_port() -> int:
  """A TCP port on 127.0.0.1 that was free a moment ago (for a jax.distributed coordinator)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@dataclasses.dataclass(frozen=True)
class Finished:
  """One process's exit status, what it printed, and when it ended (time.time())."""
  code: int
  stdout: str
  stderr: str
  ended: float


def coordinator_flags(port: int, count: int, index: int, heartbeat_timeout_s: int = 20) -> list[str]:
  """The scripts' multi-process flags for process `index` of `count` on 127.0.0.1:`port`."""
  return [f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={count}", f"--process_id={index}",
          f"--heartbeat_timeout_s={heartbeat_timeout_s}"]


def start_processes(command: Callable[[int], Sequence[str]], count: int, devices: int,
                    env: Optional[Mapping[str, str]] = None) -> list[subprocess.Popen]:
  """Starts `command(i)` for i in [0, count), each a child JAX process with `devices` CPU devices (subprocess_env,
  updated with `env`); their stdout and stderr are piped (collect reads them)."""
  child_env = {**subprocess_env(devices), **(env or {})}
  return [subprocess.Popen(list(command(i)), env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
          for i in range(count)]


def collect(procs: Sequence[subprocess.Popen], timeout_s: float = 600) -> list[Finished]:
  """Waits for every process (reading their pipes as they go, so none blocks on a full pipe) and returns how each
  ended; past `timeout_s` the ones still running are killed and reported as such (code -9)."""
  results: list[Optional[tuple[str, str, float]]] = [None] * len(procs)

  def read(i):
    results[i] = (*procs[i].communicate(), time.time())
  threads = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(len(procs))]
  for t in threads:
    t.start()
  deadline = time.monotonic() + timeout_s
  for t in threads:
    t.join(max(0.0, deadline - time.monotonic()))
  for p in procs:
    if p.poll() is None:
      p.kill()
  for t in threads:
    t.join()
  return [Finished(p.returncode, *r) for p, r in zip(procs, results)]


def run_processes(command: Callable[[int], Sequence[str]], count: int, devices: int, timeout_s: float = 600,
                  env: Optional[Mapping[str, str]] = None) -> list[Finished]:
  """start_processes, then collect: `count` processes of `devices` CPU devices each, run to their end."""
  return collect(start_processes(command, count, devices, env), timeout_s)
