"""What benchmarks measure: the machine, its matmul peak, compile counts and time, resident memory,
and the memory analysis of the executables a run compiled."""

import contextlib
import os
import platform
import threading
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

MiB = 1 << 20
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_TRACE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration")


def physical_memory_bytes() -> int:
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def rss_bytes() -> int:
  """Current resident set size of this process."""
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def machine_info() -> dict[str, Any]:
  return dict(cpu_count=os.cpu_count(), physical_memory_bytes=physical_memory_bytes(),
              backend=jax.default_backend(), devices=[str(d) for d in jax.devices()],
              jax_version=jax.__version__, processor=platform.processor() or platform.machine())


def measure_matmul_peak(sizes: Sequence[int] = (2048, 4096), repeats: int = 5,
                        dtype: str = "float32") -> dict[str, Any]:
  """This machine's matmul FLOP/s in `dtype` (the compute dtype the scorer runs in): a jitted
  [n, n] x [n, n] product, best of `repeats` per size; float32 at HIGHEST precision (no TF32)."""
  by_size = {}
  precision = jax.lax.Precision.HIGHEST if dtype == "float32" else None
  for n in sizes:
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dtype)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), dtype)
    f = jax.jit(lambda x, y: jnp.dot(x, y, precision=precision))
    f(a, b).block_until_ready()
    best = min(timed(lambda: f(a, b).block_until_ready()) for _ in range(repeats))
    by_size[str(n)] = 2 * n ** 3 / best
  return dict(flops_per_s=max(by_size.values()), by_size=by_size, repeats=repeats, dtype=dtype)


def check_peak_sizes(sizes: Sequence[int]) -> None:
  """A ValueError unless `sizes` (measure_matmul_peak's) names one or more sizes >= 1."""
  if not sizes or any(n < 1 for n in sizes):
    raise ValueError(f"peak_sizes={list(sizes)} must be one or more sizes >= 1")


def timed(fn: Callable[[], Any]) -> float:
  t0 = time.perf_counter()
  fn()
  return time.perf_counter() - t0


def time_call(fn: Callable, args: Sequence[Any], repeats: int, inner: int) -> float:
  """Seconds per call of the jitted `fn(*args)`: the best of `repeats` rounds of `inner` calls, dispatched
  back to back and waited for once (so per-call dispatch overlaps the device's work, as in a model)."""
  jax.block_until_ready(fn(*args))
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    out = None
    for _ in range(inner):
      out = fn(*args)
    jax.block_until_ready(out)
    best = min(best, (time.perf_counter() - t0) / inner)
  return best


class CompileCounter:
  """Counts XLA compilations and sums compile time (trace + lower + backend) while active."""

  def __init__(self):
    self.compiles, self.seconds = 0, 0.0

  def _listener(self, event: str, duration: float, **_) -> None:
    if event == _COMPILE_EVENT:
      self.compiles += 1
      self.seconds += duration
    elif event in _TRACE_EVENTS:
      self.seconds += duration

  def __enter__(self) -> "CompileCounter":
    jax.monitoring.register_event_duration_secs_listener(self._listener)
    return self

  def __exit__(self, *exc) -> None:
    jax.monitoring.unregister_event_duration_listener(self._listener)


class RssSampler:
  """Peak resident set size while active, sampled every `interval` seconds on a thread."""

  def __init__(self, interval: float = 0.02):
    self.interval, self.base, self.peak = interval, 0, 0
    self._stop = threading.Event()

  def _run(self) -> None:
    while not self._stop.wait(self.interval):
      self.peak = max(self.peak, rss_bytes())

  def __enter__(self) -> "RssSampler":
    self.base = self.peak = rss_bytes()
    self._thread = threading.Thread(target=self._run, daemon=True)
    self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._stop.set()
    self._thread.join()
    self.peak = max(self.peak, rss_bytes())


class _RecordingFn:
  """A jitted entry point that remembers the first arguments of each distinct input signature."""

  def __init__(self, fn, name: str, kernel: str, calls: dict):
    self._fn, self._name, self._kernel, self._calls = fn, name, kernel, calls

  def __call__(self, *args):
    leaves = jax.tree_util.tree_leaves(args[1:])  # args[0] is the params
    sig = tuple((np.shape(x), np.result_type(x).name) for x in leaves)
    self._calls.setdefault((self._name, self._kernel, sig), (self._fn, args))
    return self._fn(*args)

  def __getattr__(self, attr):  # lower, eval_shape, _cache_size, ... go to the jitted function
    return getattr(self._fn, attr)


@contextlib.contextmanager
def record_model_calls(runner):
  """Records the first arguments of every distinct (entry point, shapes) call of a ModelRunner.

  Yields a dict key -> (jitted fn, args) for `biggest_memory`, which re-lowers them (XLA's
  in-process cache makes that free after the call) to read each executable's memory analysis.
  Hooks the runner's private `_jit`; calls served by ahead-of-time executables are not seen.
  """
  calls: dict[tuple, tuple] = {}
  original = runner._jit
  runner._jit = lambda name, kernel, build: _RecordingFn(original(name, kernel, build), name, kernel, calls)
  try:
    yield calls
  finally:
    del runner._jit  # back to the class method


def memory_stats(compiled) -> dict[str, int]:
  m = compiled.memory_analysis()
  if m is None:
    return {}
  return dict(temp_bytes=int(m.temp_size_in_bytes), argument_bytes=int(m.argument_size_in_bytes),
              output_bytes=int(m.output_size_in_bytes), peak_bytes=int(getattr(m, "peak_memory_in_bytes", 0)))


def biggest_memory(calls: dict) -> dict[str, Any]:
  """Memory analysis of the recorded executable with the largest temp allocation."""
  best: dict[str, Any] = {}
  for (name, kernel, _), (fn, args) in calls.items():
    try:
      stats = memory_stats(fn.lower(*args).compile())
    except Exception as e:  # noqa: BLE001 -- memory analysis is best effort, the timing is what matters
      stats = dict(error=f"{type(e).__name__}: {e}")
    if stats.get("temp_bytes", -1) >= best.get("temp_bytes", -1):
      best = dict(stats, executable=f"{name}[{kernel}]")
  return best


def jit_cache_size(runner) -> int:
  """Executables the runner holds (what XLA actually compiled for the model)."""
  if hasattr(runner, "num_executables"):
    return runner.num_executables
  return sum(getattr(f, "_cache_size", lambda: 0)() for f in getattr(runner, "_jits", {}).values())
