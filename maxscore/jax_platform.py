"""The JAX platform, decided once before JAX starts: a clean console on a machine without a TPU.

The `libtpu` wheel (pulled in by the test extra, for compiling TPU programs on a CPU host) makes JAX try a
TPU at start-up and print several lines of libtpu errors when there is none. When libtpu is installed but
this machine has no TPU device (libtpu looks for /dev/accel* and /dev/vfio), and the user has not set
JAX_PLATFORMS, JAX is pointed at the machine's GPU (when one and its plugin are there) and the CPU. A real
TPU VM, and any JAX_PLATFORMS the user sets, are left as they are. This module never imports JAX.
"""

import glob
import importlib.util
import os
from typing import Callable, Mapping, MutableMapping, Optional


def _installed(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is not None
  except (ImportError, ValueError):
    return False


def _gpu_platforms() -> list[str]:
  cuda = any(_installed(m) for m in ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_plugins.xla_cuda12"))
  return ["cuda"] if cuda and glob.glob("/dev/nvidia[0-9]*") else []


def tpu_device_present() -> bool:
  return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/*"))


def choose_platforms(environ: Mapping[str, str], libtpu_installed: bool, tpu_present: bool,
                     gpu_platforms: Callable[[], list[str]] = _gpu_platforms) -> Optional[str]:
  """The JAX_PLATFORMS value to default to, or None to leave JAX's own choice (the user's, or a TPU's)."""
  if "JAX_PLATFORMS" in environ or not libtpu_installed or tpu_present:
    return None
  return ",".join(gpu_platforms() + ["cpu"])


def default_jax_platforms(environ: MutableMapping[str, str] = os.environ) -> Optional[str]:
  """Sets JAX_PLATFORMS in `environ` when `choose_platforms` picks one (before JAX is imported)."""
  chosen = choose_platforms(environ, _installed("libtpu"), tpu_device_present())
  if chosen is not None:
    environ["JAX_PLATFORMS"] = chosen
  return chosen
