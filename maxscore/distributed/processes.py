"""Starting JAX in other processes (host devices, jax.distributed): the child's environment and XLA flags, a free
coordinator port. The tests and the training benchmark start their children with these."""

import os
import pathlib
import socket

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


def free_port() -> int:
  """A TCP port on 127.0.0.1 that was free a moment ago (for a jax.distributed coordinator)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]
