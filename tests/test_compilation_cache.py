"""The persistent compilation cache kept between runs (the suite's test-jax/<host tag>, the eval's jax/<host tag>):
a damaged, stale or foreign entry never changes a result, and the host tag keeps CPU kinds apart."""

import os
import subprocess
import sys

from maxscore.distributed import processes
from maxscore.files import cache

# One small program whose constant comes from argv: a changed constant is a changed program body.
_PROGRAM = ("import sys, jax, jax.numpy as jnp, numpy as np\n"
            "c = float(sys.argv[1])\n"
            "f = jax.jit(lambda x: jnp.tanh(x @ x.T * c).sum(axis=1))\n"
            "print(np.asarray(f(jnp.arange(64.0).reshape(8, 8) / 64)).tobytes().hex())\n")


def _run(cache_dir, constant, xla_flags=None):
  env = dict(processes.subprocess_env(1), JAX_COMPILATION_CACHE_DIR=str(cache_dir),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
  if xla_flags is not None:
    env["XLA_FLAGS"] = xla_flags
  r = subprocess.run([sys.executable, "-c", _PROGRAM, str(constant)], env=env, capture_output=True, text=True,
                     timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  return r.stdout.strip(), r.stderr


def _entries(cache_dir):
  return {p.name for p in cache_dir.iterdir() if p.is_file()}


def test_a_damaged_entry_is_compiled_again_and_gives_the_same_result(tmp_path):
  cold, _ = _run(tmp_path / "cold", 1.5)
  shared = tmp_path / "shared"
  assert _run(shared, 1.5)[0] == cold
  written = _entries(shared)
  assert written  # the program was kept
  assert _run(shared, 1.5)[0] == cold  # read back
  for i, name in enumerate(sorted(written)):  # every entry damaged: garbage in one half, a cut-off file in the other
    path = shared / name
    body = path.read_bytes()
    path.write_bytes(os.urandom(len(body)) if i % 2 == 0 else body[:len(body) // 3])
  result, stderr = _run(shared, 1.5)
  assert result == cold
  assert "Error reading persistent compilation cache entry" in stderr  # the damaged entry was read, and refused


def test_a_changed_program_or_changed_flags_never_read_the_old_entry(tmp_path):
  shared = tmp_path / "shared"
  first, _ = _run(shared, 1.5)
  before = _entries(shared)
  changed, _ = _run(shared, 2.5)  # another program body under the same cache
  assert changed == _run(tmp_path / "cold", 2.5)[0] and changed != first
  assert _entries(shared) > before  # its own entry, beside the old one
  flags = processes.xla_flags(1) + " --xla_cpu_max_isa=AVX2"
  before = _entries(shared)
  capped, _ = _run(shared, 1.5, xla_flags=flags)
  assert capped == _run(tmp_path / "cold-capped", 1.5, xla_flags=flags)[0]
  assert _entries(shared) > before  # XLA_FLAGS are in the key: the first program's entry was not reused


def test_the_host_tag_names_the_cpu_kind(tmp_path):
  def tag(text):
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    return cache.host_tag(str(path))
  avx2 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse avx2\n\n"
  avx512 = avx2.replace("avx2", "avx2 avx512f")
  assert tag(avx2) == tag(avx2 + avx2.replace(": 0", ": 1"))  # the first CPU's fields: one per machine
  assert tag(avx2) != tag(avx512)
  assert tag(avx2) != tag(avx2.replace("AMD EPYC", "Intel Xeon"))
  assert len(cache.host_tag(str(tmp_path / "absent"))) == 12  # no /proc/cpuinfo: the architecture alone
  assert cache.host_tag() == cache.host_tag()
