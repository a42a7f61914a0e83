"""The persistent compilation cache kept between runs (the suite's test-jax/<host tag>, the eval's jax/<host tag>):
a damaged, stale or foreign entry never changes a result, and the host tag keeps CPU kinds apart."""

import os
import subprocess
import sys

import pytest

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


def test_compilation_cache_is_per_user_by_default_and_off_with_one_key(tmp_path):
  from maxscore.scoring.scorer import compilation_cache_path  # pylint: disable=import-outside-toplevel
  from maxscore.files import cache  # pylint: disable=import-outside-toplevel
  tag = cache.host_tag()  # programs compiled for one CPU kind are kept apart from another's
  env = {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path / "home")}
  assert compilation_cache_path("user", env) == str(tmp_path / "xdg" / "maxscore" / "jax" / tag)
  assert compilation_cache_path("user", {"HOME": str(tmp_path / "home")}) == os.path.join(
      os.path.expanduser("~"), ".cache", "maxscore", "jax", tag)
  assert compilation_cache_path("none", env) is None and compilation_cache_path(None, env) is None
  assert compilation_cache_path("/some/dir", env) == "/some/dir"
  assert compilation_cache_path("user", dict(env, JAX_COMPILATION_CACHE_DIR="/x")) is None  # the user's own wins
  assert compilation_cache_path("user", dict(env, MAXSCORE_CACHE_DIR="/m")) == f"/m/jax/{tag}"


@pytest.mark.slow
def test_a_second_eval_reads_its_programs_from_the_user_cache(tmp_path):
  """Two evals of one query in fresh processes, with the per-user cache of the defaults: the first writes
  programs into $XDG_CACHE_HOME/maxscore/jax/<host tag>, the second reads them back; compilation_cache_dir=none writes none."""
  from maxscore.distributed.processes import REPO, subprocess_env  # pylint: disable=import-outside-toplevel
  env = subprocess_env(1)
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  env.pop("MAXSCORE_CACHE_DIR", None)
  env.update(XDG_CACHE_HOME=str(tmp_path / "xdg"), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  from maxscore.files.cache import host_tag  # pylint: disable=import-outside-toplevel
  cache = tmp_path / "xdg" / "maxscore" / "jax" / host_tag()

  def run(name, *extra):
    cmd = [sys.executable, str(REPO / "scripts" / "eval_rerank.py"), "--max_queries=1", "--fusion=none",
           f"--output_dir={tmp_path / name}", "--noprogress", *extra]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
  run("off", "compilation_cache_dir=none")
  assert not cache.exists()
  run("first")
  entries = {p.name for p in cache.iterdir()}
  assert entries
  run("second")
  assert {p.name for p in cache.iterdir()} == entries  # nothing new: every program was read back
