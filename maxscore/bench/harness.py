"""Benchmark harness for scripts/bench.py: items/s, model FLOP/s against the measured matmul peak.

    opts = BenchOptions(query_len=2000, num_items=500, item_len=20, num_layers=2)
    report = run_benchmark(opts)          # {"peak": ..., "flops": ..., "rows": [...], ...}
    print(format_table(report["rows"], SCORE_COLUMNS))

Model FLOPs follow DESIGN.md section 3: dense `2 * non_embedding_params * tokens`, plus
useful attention (prefix causal + every item token against the prefix and its own causal
block), plus the lm_head at the scored rows only. Serial repeats the query per item, so its
own FLOPs are reported beside the request's. Compile time is excluded from the warm timings
and reported separately; the executables count comes from the runner's shape record and
from XLA compile events.
"""

import contextlib
import dataclasses
import math
import os
import pathlib
import resource
import tempfile
import threading
import time
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from layers.config import ModelConfig
from layers.kernels import KernelOptions, SegmentLayout, get_kernel
from layers.kernels import pallas_gpu, splash
from maxscore.config import Config, load_config, to_flat_dict
from maxscore.errors import ScoreInputError
from maxscore.scoring.cost_model import attention_pairs, model_flops
from maxscore.scoring.scorer import Scorer

MiB = 1 << 20
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_TRACE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration")


@dataclasses.dataclass(frozen=True)
class BenchOptions:
  """Everything scripts/bench.py's flags set; defaults are issue 5's reference workload."""
  mode: str = "score"                  # score | kernels
  model: str = "qwen3-0.6b"
  num_layers: Optional[int] = 2
  query_len: int = 2000
  num_items: int = 500
  item_len: int = 20
  separator_token_id: Optional[int] = 198  # P = query_len + 1, as in the kernel geometry P=2001
  algorithms: tuple[str, ...] = ("serial", "packed", "prefill_extend", "auto")
  kernels: Optional[tuple[str, ...]] = None  # None: shared_prefix (score), shared_prefix,reference (kernels)
  labels: tuple[int, ...] = (9454, 2753)
  repeats: int = 3
  serial_items: int = 20
  hf_baseline: bool = True
  hf_batch_size: int = 32
  hf_repeats: int = 1
  batch_requests: int = 0              # > 0: score this many requests of the geometry per score_batch call
  warmup_check: bool = False
  mixed_requests: int = 0              # > 0: a mixed-shape run of this many requests (executables vs buckets)
  num_heads: int = 16                  # kernels mode geometry
  num_kv_heads: int = 8
  head_dim: int = 128
  kernel_memory_fraction: float = 0.6  # kernels mode: do not run a kernel whose XLA temp exceeds this of RAM
  seed: int = 0
  overrides: tuple[str, ...] = ()      # key=value config overrides

  def kernel_list(self) -> tuple[str, ...]:
    if self.kernels:
      return tuple(self.kernels)
    return ("shared_prefix", "reference") if self.mode == "kernels" else ("shared_prefix",)


# --- machine -------------------------------------------------------------------------------

def physical_memory_bytes() -> int:
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def rss_bytes() -> int:
  """Current resident set size of this process."""
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def machine_info() -> dict[str, Any]:
  import platform
  return dict(cpu_count=os.cpu_count(), physical_memory_bytes=physical_memory_bytes(),
              backend=jax.default_backend(), devices=[str(d) for d in jax.devices()],
              jax_version=jax.__version__, processor=platform.processor() or platform.machine())


def measure_matmul_peak(sizes: Sequence[int] = (2048, 4096), repeats: int = 5) -> dict[str, Any]:
  """This machine's float32 matmul FLOP/s: a jitted [n, n] x [n, n] product, best of `repeats` per size."""
  by_size = {}
  for n in sizes:
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32)
    f = jax.jit(lambda x, y: jnp.dot(x, y, precision=jax.lax.Precision.HIGHEST))
    f(a, b).block_until_ready()
    best = min(_timed(lambda: f(a, b).block_until_ready()) for _ in range(repeats))
    by_size[str(n)] = 2 * n ** 3 / best
  return dict(flops_per_s=max(by_size.values()), by_size=by_size, repeats=repeats)


def _timed(fn: Callable[[], Any]) -> float:
  t0 = time.perf_counter()
  fn()
  return time.perf_counter() - t0


# --- instrumentation -----------------------------------------------------------------------

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


# --- requests ------------------------------------------------------------------------------

def make_requests(vocab_size: int, query_len: int, num_items: int, item_len: int, labels: Sequence[int],
                  num_requests: int = 1, seed: int = 0) -> list[dict[str, Any]]:
  """/v1/score-shaped requests with random token ids (distinct queries, so nothing is cached across them)."""
  rng = np.random.default_rng(seed)
  return [dict(query=rng.integers(0, vocab_size, query_len).tolist(),
               items=rng.integers(0, vocab_size, (num_items, item_len)).tolist(),
               label_token_ids=list(labels), apply_softmax=False) for _ in range(num_requests)]


def _subset(requests: list[dict], max_items: Optional[int]) -> list[dict]:
  """The first `max_items` items (over requests in order); whole requests where the count allows."""
  if max_items is None:
    return requests
  out, left = [], max_items
  for r in requests:
    if left <= 0:
      break
    out.append(dict(r, items=r["items"][:left]))
    left -= len(out[-1]["items"])
  return out


def _score(scorer: Scorer, requests: list[dict], algorithm: Optional[str]):
  scorer.prefix_cache.clear()  # every timed call pays for its prefill, as a fresh request would
  if len(requests) == 1:
    r = requests[0]
    return [scorer.score(r["query"], r["items"], r["label_token_ids"], r["apply_softmax"], algorithm=algorithm)]
  return scorer.score_batch(requests, algorithm=algorithm)


# --- one algorithm -------------------------------------------------------------------------

def run_algorithm(scorer: Scorer, request, algorithm: str, repeats: int, max_items: Optional[int] = None,
                  peak_flops: Optional[float] = None, separator: bool = True) -> dict[str, Any]:
  """Times `algorithm` on `request` (a /v1/score dict, or a list scored with score_batch).

  The first call (compile + run) is timed separately; then `repeats` warm calls, best kept.
  `max_items` scores only that many items (serial), scaled to items/s and flagged `subset`.
  """
  requests = [request] if isinstance(request, dict) else list(request)
  run_reqs = _subset(requests, max_items)
  items = sum(len(r["items"]) for r in run_reqs)
  all_items = sum(len(r["items"]) for r in requests)
  cfg = scorer.config.model
  flops = [model_flops(cfg, len(r["query"]), [len(x) for x in r["items"]], algorithm, separator) for r in run_reqs]
  own_flops = sum(f["total"] for f in flops)          # what this algorithm's forwards need for the timed items
  useful_flops = sum(f["shared_total"] for f in flops)  # the request's shared-prefix work for the same items
  scale = all_items / max(items, 1) / len(requests)     # timed items -> one whole request
  shapes0, cache0 = set(scorer.runner.compiled_shapes), jit_cache_size(scorer.runner)
  with RssSampler() as rss, record_model_calls(scorer.runner) as calls:
    with CompileCounter() as first:
      t0 = time.perf_counter()
      results = _score(scorer, run_reqs, algorithm)
      first_s = time.perf_counter() - t0
    times = []
    with CompileCounter() as warm:
      for _ in range(repeats):
        t0 = time.perf_counter()
        results = _score(scorer, run_reqs, algorithm)
        times.append(time.perf_counter() - t0)
  best = min(times) if times else first_s
  row = dict(name=algorithm, algorithm=algorithm, picked=sorted({r.algorithm for r in results}),
             items_timed=items, subset=items < all_items, repeats=repeats, best_s=best,
             median_s=float(np.median(times)) if times else first_s,
             first_call_s=first_s, compile_s=first.seconds, xla_compiles_first=first.compiles,
             xla_compiles_warm=warm.compiles, items_per_s=items / best,
             ms_per_request=1e3 * best * scale, flops_per_request=own_flops * scale,
             useful_flops_per_request=useful_flops * scale,
             flops_per_s=own_flops / best, useful_flops_per_s=useful_flops / best,
             model_executables=len(scorer.runner.compiled_shapes - shapes0),
             jit_executables=jit_cache_size(scorer.runner) - cache0,
             rss_peak_bytes=rss.peak, rss_delta_bytes=rss.peak - rss.base,
             ru_maxrss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
             memory=biggest_memory(calls))
  if len(requests) > 1:
    row["requests"] = len(run_reqs)
  if peak_flops:
    row["pct_peak"] = 100 * row["flops_per_s"] / peak_flops
    row["useful_pct_peak"] = 100 * row["useful_flops_per_s"] / peak_flops
  row["label_logprobs"] = [np.log(np.maximum(r.scores, np.finfo(np.float32).tiny)) for r in results]
  return row


# --- Hugging Face transformers baseline ----------------------------------------------------

def build_hf_model(model_cfg: ModelConfig, seed: int = 0):
  """A random float32 transformers Qwen3/Llama model with `model_cfg`'s dimensions (default HF init)."""
  import torch
  import transformers
  classes = {"qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
             "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM)}
  if model_cfg.family not in classes or model_cfg.rope_scaling_type is not None:
    raise ValueError(f"HF baseline supports unscaled {sorted(classes)} models, not {model_cfg.family} "
                     f"with rope_scaling_type={model_cfg.rope_scaling_type}")
  config_cls, model_cls = classes[model_cfg.family]
  config = config_cls(vocab_size=model_cfg.vocab_size, hidden_size=model_cfg.hidden_size,
                      intermediate_size=model_cfg.mlp_dim, num_hidden_layers=model_cfg.num_layers,
                      num_attention_heads=model_cfg.num_heads, num_key_value_heads=model_cfg.num_kv_heads,
                      head_dim=model_cfg.head_dim, rms_norm_eps=model_cfg.rms_norm_eps,
                      rope_theta=model_cfg.rope_theta, max_position_embeddings=model_cfg.max_position_embeddings,
                      tie_word_embeddings=model_cfg.tie_word_embeddings, attention_bias=model_cfg.attention_bias)
  torch.manual_seed(seed)
  return model_cls(config).eval()


def hf_label_logprobs(model, request: dict, batch_size: int, separator: Optional[int]) -> np.ndarray:
  """Label log-probs [N, K] the way a good transformers user computes them.

  Prefill Q + s once with use_cache=True; then batches of items (right-padded, attention
  mask over prefix + item) run against the prefix K/V expanded to the batch; the lm_head
  runs only at each item's last token; float32 log_softmax; pick the labels.
  """
  import torch
  from transformers import DynamicCache
  prefix = list(request["query"]) + ([separator] if separator is not None else [])
  items, labels = request["items"], torch.tensor(request["label_token_ids"])
  p = len(prefix)
  out = np.zeros((len(items), len(labels)), np.float32)
  with torch.inference_mode():  # no_grad, minus version-counter bookkeeping
    pre = model.model(input_ids=torch.tensor([prefix]), use_cache=True)
    kv = [(layer.keys, layer.values) for layer in pre.past_key_values.layers]
    last_prefix_D = pre.last_hidden_state[0, -1]
    for start in range(0, len(items), batch_size):
      chunk = items[start:start + batch_size]
      b, lens = len(chunk), torch.tensor([len(x) for x in chunk])
      l = int(lens.max())
      rows = last_prefix_D.expand(b, -1).clone()  # an empty item reads the prefix's last token
      if l:
        ids = torch.zeros((b, l), dtype=torch.long)
        for i, x in enumerate(chunk):
          ids[i, :len(x)] = torch.tensor(x, dtype=torch.long)
        mask = torch.cat([torch.ones((b, p), dtype=torch.long),
                          (torch.arange(l)[None, :] < lens[:, None]).long()], dim=1)
        cache = DynamicCache(ddp_cache_data=[(k.expand(b, -1, -1, -1), v.expand(b, -1, -1, -1)) for k, v in kv])
        h = model.model(input_ids=ids, attention_mask=mask, position_ids=(p + torch.arange(l)).expand(b, -1),
                        past_key_values=cache, use_cache=True).last_hidden_state
        has = lens > 0
        rows[has] = h[torch.arange(b)[has], lens[has] - 1]
      lp = torch.log_softmax(model.lm_head(rows).float(), dim=-1)[:, labels]
      out[start:start + b] = lp.numpy()
  return out


def run_hf_baseline(model, request: dict, batch_size: int, repeats: int, peak_flops: Optional[float],
                    flops_per_request: float, separator: Optional[int]) -> dict[str, Any]:
  """Times hf_label_logprobs (after one untimed warm-up batch) on the whole request."""
  import torch
  torch.set_num_threads(os.cpu_count())
  hf_label_logprobs(model, dict(request, items=request["items"][:batch_size]), batch_size, separator)
  times, lp = [], None
  with RssSampler() as rss:
    for _ in range(max(repeats, 1)):
      t0 = time.perf_counter()
      lp = hf_label_logprobs(model, request, batch_size, separator)
      times.append(time.perf_counter() - t0)
  best, n = min(times), len(request["items"])
  row = dict(name=f"hf_transformers(b={batch_size})", algorithm="hf_prefix_reuse", items_timed=n, subset=False,
             repeats=len(times), best_s=best, median_s=float(np.median(times)), items_per_s=n / best,
             ms_per_request=1e3 * best, flops_per_request=flops_per_request, useful_flops_per_request=flops_per_request,
             flops_per_s=flops_per_request / best, useful_flops_per_s=flops_per_request / best,
             rss_peak_bytes=rss.peak, rss_delta_bytes=rss.peak - rss.base, torch_threads=torch.get_num_threads(),
             attn_implementation=getattr(model.config, "_attn_implementation", None))
  if peak_flops:
    row["pct_peak"] = row["useful_pct_peak"] = 100 * row["flops_per_s"] / peak_flops
  row["label_logprobs"] = [lp]
  return row


def hf_scorer(model_cfg: ModelConfig, config: Config, workdir: pathlib.Path, seed: int):
  """(HF model, Scorer) on the same random weights: built in transformers, saved, converted."""
  import transformers
  from maxscore.checkpoints.convert import convert_hf_checkpoint
  transformers.utils.logging.disable_progress_bar()
  model = build_hf_model(model_cfg, seed)
  model.save_pretrained(workdir / "hf", safe_serialization=True)
  ckpt = convert_hf_checkpoint(workdir / "hf", workdir / "ckpt")
  model_keys = {f.name for f in dataclasses.fields(ModelConfig)}
  flat = {k: v for k, v in to_flat_dict(config).items() if k not in model_keys and k != "checkpoint_dir"}
  return model, Scorer.from_checkpoint(ckpt, **flat)


# --- warmup and mixed shapes ---------------------------------------------------------------

def _fresh(scorer: Scorer, **overrides: Any) -> Scorer:
  """A new Scorer (empty jit caches and prefix cache) on the same params, no reload or copy."""
  config = scorer.config.replace(**overrides) if overrides else scorer.config
  return Scorer(config, scorer.runner.params, scorer.tokenizer, scorer.model_name)


def _call_warmup(scorer: Scorer, request: dict):
  """Scorer.warmup for this request's geometry (query_len counting the separator, items, item length)."""
  sep = 1 if scorer.config.scoring.separator_token_id is not None else 0
  items = request["items"]
  geometry = (len(request["query"]) + sep, len(items), max((len(x) for x in items), default=0))
  return scorer.warmup([geometry])


def warmup_check(scorer: Scorer, request: dict) -> dict[str, Any]:
  """First-request latency of a fresh Scorer, cold and after Scorer.warmup (skipped if it does not exist)."""
  if not hasattr(Scorer, "warmup"):
    return dict(status="skipped: Scorer.warmup does not exist yet")
  jax.clear_caches()
  cold = _fresh(scorer)
  cold_s = _timed(lambda: _score(cold, [request], None))
  jax.clear_caches()
  warm = _fresh(scorer)
  try:
    warmup_s = _timed(lambda: _call_warmup(warm, request))
  except Exception as e:  # noqa: BLE001 -- report, do not abort the benchmark
    return dict(status=f"warmup failed: {type(e).__name__}: {e}", first_request_cold_s=cold_s)
  with CompileCounter() as cc:
    first_s = _timed(lambda: _score(warm, [request], None))
  second_s = _timed(lambda: _score(warm, [request], None))
  return dict(status="ok", first_request_cold_s=cold_s, warmup_s=warmup_s, first_request_after_warmup_s=first_s,
              second_request_s=second_s, compiles_after_warmup=cc.compiles)


def mixed_shape_run(scorer: Scorer, num_requests: int, query_len: int, num_items: int, item_len: int,
                    labels: Sequence[int], seed: int = 0) -> dict[str, Any]:
  """Requests of random geometry (query in [q/4, q], 1..N items of 1..L tokens), scored one by one.

  Runs on a fresh Scorer over the same params, and reports the distinct model shapes (buckets)
  it touched and the executables XLA compiled for them.
  """
  scorer = _fresh(scorer)
  rng = np.random.default_rng(seed)
  vocab = scorer.config.model.vocab_size
  shapes0, cache0 = set(scorer.runner.compiled_shapes), jit_cache_size(scorer.runner)
  items_total = 0
  with CompileCounter() as cc:
    t0 = time.perf_counter()
    for _ in range(num_requests):
      n = int(rng.integers(1, num_items + 1))
      items = [rng.integers(0, vocab, int(rng.integers(1, item_len + 1))).tolist() for _ in range(n)]
      query = rng.integers(0, vocab, int(rng.integers(max(1, query_len // 4), query_len + 1))).tolist()
      scorer.score(query, items, list(labels))
      items_total += n
    wall = time.perf_counter() - t0
  touched = scorer.runner.compiled_shapes - shapes0
  executables = jit_cache_size(scorer.runner) - cache0
  return dict(requests=num_requests, items=items_total, wall_s=wall, compile_s=cc.seconds,
              distinct_buckets=len(touched), model_executables=executables, xla_compiles=cc.compiles,
              executables_within_buckets=executables <= len(touched), buckets=sorted(map(str, touched)))


# --- kernels microbenchmark ----------------------------------------------------------------

def _causal_grid(t: int, block_q: int, block_kv: int) -> int:
  q_last = np.minimum(np.arange(-(-t // block_q)) * block_q + block_q, t) - 1
  return int((q_last // block_kv + 1).sum())


def kernel_block_stats(prefix_len: int, slot_len: int, num_slots: int) -> list[dict[str, Any]]:
  """Rows for splash (512/512, 128/128) and pallas_gpu (64/64, 128/128): blocks run vs the dense grids."""
  t = prefix_len + slot_len * num_slots
  rows = []
  for b in (512, 128):
    s = splash.block_skip_stats(prefix_len, slot_len, num_slots, b, b)
    rows.append(dict(name=f"splash({s['block_q']}/{s['block_kv']})", status="interpret-verified",
                     blocks_run=s["active_blocks"], blocks_full_grid=s["total_blocks"],
                     blocks_causal_grid=_causal_grid(s["padded_len"], s["block_q"], s["block_kv"]),
                     partial_blocks=s["partial_blocks"], grid_width=s["grid_width"]))
  for b in (64, 128):
    c = pallas_gpu.block_counts(prefix_len, slot_len, num_slots, b, b)
    nb = -(-t // b)
    rows.append(dict(name=f"pallas_gpu({b}/{b})", status="interpret-verified", blocks_run=c["visited_blocks"],
                     blocks_full_grid=nb * nb, blocks_causal_grid=c["total_blocks"]))
  for r in rows:
    r["run_fraction_of_causal"] = r["blocks_run"] / r["blocks_causal_grid"]
  return rows


def run_kernels(opts: BenchOptions, peak_flops: Optional[float]) -> dict[str, Any]:
  """shared_prefix vs reference (and any other named kernel) on one packed row at the given geometry."""
  p, n, l = opts.query_len + (1 if opts.separator_token_id is not None else 0), opts.num_items, opts.item_len
  t = p + n * l
  nh, kh, hd = opts.num_heads, opts.num_kv_heads, opts.head_dim
  keys = jax.random.split(jax.random.PRNGKey(opts.seed), 3)
  q = jax.random.normal(keys[0], (1, t, nh, hd), jnp.float32)
  k = jax.random.normal(keys[1], (1, t, kh, hd), jnp.float32)
  v = jax.random.normal(keys[2], (1, t, kh, hd), jnp.float32)
  layout = SegmentLayout(jnp.asarray([p], jnp.int32), jnp.full((1, n), l, jnp.int32), p, l, n)
  useful = 4 * nh * hd * attention_pairs(p, [l] * n)
  limit = opts.kernel_memory_fraction * physical_memory_bytes()
  rows, outputs = [], {}
  for name in opts.kernel_list():
    if name in ("splash", "pallas_gpu") and jax.default_backend() == "cpu":
      continue  # reported below from their block counts; interpret mode at this size would take hours
    fn = jax.jit(get_kernel(name, KernelOptions(max_reference_len=t + 1)).__call__)
    row: dict[str, Any] = dict(name=name, flops=useful, executed_flops=4 * nh * hd * t * t if name == "reference"
                               else useful)
    with CompileCounter() as cc:
      compiled = fn.lower(q, k, v, layout).compile()
    row.update(compile_s=cc.seconds, memory=memory_stats(compiled))
    need = row["memory"].get("temp_bytes", 0) + row["memory"].get("argument_bytes", 0)
    if need > limit:
      row.update(status=f"not run: XLA temp {need / 2**30:.1f} GiB > {opts.kernel_memory_fraction:.0%} of RAM")
      rows.append(row)
      continue
    with RssSampler() as rss:
      out = compiled(q, k, v, layout).block_until_ready()
      best = min(_timed(lambda: compiled(q, k, v, layout).block_until_ready()) for _ in range(opts.repeats))
    outputs[name] = np.asarray(out)
    row.update(status="run", best_s=best, flops_per_s=useful / best, rss_delta_bytes=rss.peak - rss.base)
    if peak_flops:
      row["pct_peak"] = 100 * row["flops_per_s"] / peak_flops
    rows.append(row)
  if "reference" in outputs:
    for name, out in outputs.items():
      if name != "reference":
        rows[[r["name"] for r in rows].index(name)]["max_abs_diff_vs_reference"] = float(
            np.abs(out - outputs["reference"]).max())
  rows += kernel_block_stats(p, l, n)
  return dict(geometry=dict(prefix_len=p, num_items=n, item_len=l, row_len=t, num_heads=nh, num_kv_heads=kh,
                            head_dim=hd), useful_attention_flops=useful, rows=rows)


# --- the whole run -------------------------------------------------------------------------

def bench_config(opts: BenchOptions) -> Config:
  over = [f"model_name={opts.model}", f"label_token_ids=[{','.join(map(str, opts.labels))}]"]
  if opts.num_layers:
    over.append(f"num_layers={opts.num_layers}")
  if opts.separator_token_id is not None:
    over.append(f"separator_token_id={opts.separator_token_id}")
  return load_config(over + list(opts.overrides))


def _max_diff(a: list, b: list, n_items: Optional[int] = None) -> float:
  a, b = np.concatenate(a), np.concatenate(b)
  n = min(len(a), len(b)) if n_items is None else n_items
  return float(np.abs(a[:n] - b[:n]).max()) if n else 0.0


def run_score(opts: BenchOptions, peak_flops: float) -> dict[str, Any]:
  """Every algorithm (and the HF baseline) on the workload; rows plus cross-checks of their scores."""
  config = bench_config(opts)
  separator = config.scoring.separator_token_id
  bad = [t for t in list(opts.labels) + [separator or 0] if not 0 <= t < config.model.vocab_size]
  if bad:
    raise ScoreInputError(f"token ids {bad} (labels / separator) are outside the vocabulary [0, "
                          f"{config.model.vocab_size}) of model {opts.model}")
  with tempfile.TemporaryDirectory(prefix="maxscore_bench_") as workdir:
    hf_model, hf_error = None, None
    if opts.hf_baseline:
      try:
        hf_model, scorer = hf_scorer(config.model, config, pathlib.Path(workdir), opts.seed)
      except (ValueError, ImportError) as e:  # unsupported family, or no torch/transformers installed
        hf_error = f"HF baseline not run: {type(e).__name__}: {e}"
    if hf_model is None:
      scorer = Scorer.from_config(config)
    requests = make_requests(config.model.vocab_size, opts.query_len, opts.num_items, opts.item_len, opts.labels,
                             max(opts.batch_requests, 1), opts.seed)
    request = requests if opts.batch_requests else requests[0]
    flops = model_flops(config.model, opts.query_len, [opts.item_len] * opts.num_items, "packed",
                        separator is not None)
    rows = []
    for kernel in opts.kernel_list():
      kscorer = scorer if kernel == scorer.config.kernel.attention else _fresh(scorer, attention=kernel)
      for alg in opts.algorithms:
        max_items = opts.serial_items if alg == "serial" else None
        try:
          row = run_algorithm(kscorer, request, alg, opts.repeats, max_items, peak_flops, separator is not None)
        except Exception as e:  # noqa: BLE001 -- e.g. the reference kernel refusing a long row
          row = dict(name=alg, algorithm=alg, error=f"{type(e).__name__}: {' '.join(str(e).split())}")
        row.update(kernel=kernel, name=f"{alg}[{kernel}]" + (f" x{opts.batch_requests}" if opts.batch_requests else ""))
        rows.append(row)
    hf = None
    if hf_model is not None:
      hf = run_hf_baseline(hf_model, requests[0], opts.hf_batch_size, opts.hf_repeats, peak_flops,
                           flops["total"], separator)
    checks = _cross_checks(rows, hf, opts.num_items)
    if hf_error:
      checks["hf_error"] = hf_error
    rows += [hf] if hf else []
    report = dict(workload=dict(query_len=opts.query_len, num_items=opts.num_items, item_len=opts.item_len,
                                separator_token_id=separator, labels=list(opts.labels),
                                batch_requests=opts.batch_requests, model=opts.model,
                                model_config=dataclasses.asdict(config.model),
                                non_embedding_params=config.model.non_embedding_params()),
                  flops=flops, rows=rows, checks=checks)
    _add_speedups(rows)
    if opts.warmup_check:
      report["warmup"] = warmup_check(scorer, requests[0])
    if opts.mixed_requests:
      report["mixed_shapes"] = mixed_shape_run(scorer, opts.mixed_requests, opts.query_len, opts.num_items,
                                               opts.item_len, opts.labels, opts.seed)
  for r in rows:
    r.pop("label_logprobs", None)
  return report


def _cross_checks(rows: list[dict], hf: Optional[dict], num_items: int) -> dict[str, Any]:
  """Max label log-prob differences: every algorithm vs serial (its items), transformers vs the first other."""
  checks: dict[str, Any] = {}
  ok = [r for r in rows if "label_logprobs" in r]
  if not ok:
    return checks
  ref = next((r for r in ok if r["algorithm"] == "serial"), ok[0])
  n_ref = sum(len(x) for x in ref["label_logprobs"])
  checks["max_abs_logprob_diff_vs_" + ref["name"]] = {
      r["name"]: _max_diff(r["label_logprobs"], ref["label_logprobs"], n_ref) for r in ok if r is not ref}
  if hf is not None:
    best = next((r for r in ok if r["algorithm"] != "serial"), ok[0])
    diff = _max_diff(hf["label_logprobs"], best["label_logprobs"][:1], min(num_items, best["items_timed"]))
    checks.update(hf_vs=best["name"], hf_max_abs_logprob_diff=diff, hf_agrees_1e4=diff <= 1e-4)
  return checks


def _add_speedups(rows: list[dict]) -> None:
  serial = next((r for r in rows if r.get("algorithm") == "serial" and "items_per_s" in r), None)
  hf = next((r for r in rows if r.get("algorithm") == "hf_prefix_reuse"), None)
  for r in rows:
    if "items_per_s" not in r:
      continue
    if serial:
      r["x_serial"] = r["items_per_s"] / serial["items_per_s"]
    if hf:
      r["x_hf"] = r["items_per_s"] / hf["items_per_s"]


def run_benchmark(opts: BenchOptions) -> dict[str, Any]:
  """The whole benchmark for `opts.mode`: machine, measured peak, rows (JSON-ready)."""
  report: dict[str, Any] = dict(mode=opts.mode, options=dataclasses.asdict(opts), machine=machine_info())
  report["peak"] = measure_matmul_peak()
  peak = report["peak"]["flops_per_s"]
  if opts.mode == "kernels":
    report.update(run_kernels(opts, peak))
  elif opts.mode == "score":
    report.update(run_score(opts, peak))
  else:
    raise ValueError(f"mode={opts.mode!r} is not one of ['score', 'kernels']")
  report["peak_end"] = measure_matmul_peak()  # a different figure at the end means a noisy machine
  return report


# --- output --------------------------------------------------------------------------------

def _fmt(value: Any, spec: str) -> str:
  if value is None or value == "":
    return ""
  if isinstance(value, (int, float)) and not isinstance(value, bool) and spec:
    return format(value, spec)
  return str(value)


# (header, getter, format)
SCORE_COLUMNS = (
    ("name", lambda r: r["name"], ""),
    ("items/s", lambda r: r.get("items_per_s"), ".1f"),
    ("ms/req", lambda r: r.get("ms_per_request"), ".1f"),
    ("GFLOP/req", lambda r: r.get("flops_per_request", 0) / 1e9 if "flops_per_request" in r else None, ".1f"),
    ("GFLOP/s", lambda r: r.get("flops_per_s", 0) / 1e9 if "flops_per_s" in r else None, ".1f"),
    ("%peak", lambda r: r.get("pct_peak"), ".1f"),
    ("useful%", lambda r: r.get("useful_pct_peak"), ".1f"),
    ("x_serial", lambda r: r.get("x_serial"), ".1f"),
    ("x_hf", lambda r: r.get("x_hf"), ".2f"),
    ("compile_s", lambda r: r.get("compile_s"), ".1f"),
    ("#exe", lambda r: r.get("model_executables"), "d"),
    ("temp_MiB", lambda r: r.get("memory", {}).get("temp_bytes", 0) / MiB if r.get("memory") else None, ".0f"),
    ("rss+MiB", lambda r: r["rss_delta_bytes"] / MiB if "rss_delta_bytes" in r else None, ".0f"),
    ("note", lambda r: _score_note(r), ""),
)

KERNEL_COLUMNS = (
    ("kernel", lambda r: r["name"], ""),
    ("status", lambda r: r.get("status"), ""),
    ("ms", lambda r: 1e3 * r["best_s"] if "best_s" in r else None, ".1f"),
    ("GFLOP", lambda r: r["flops"] / 1e9 if "flops" in r else None, ".2f"),
    ("GFLOP/s", lambda r: r["flops_per_s"] / 1e9 if "flops_per_s" in r else None, ".1f"),
    ("%peak", lambda r: r.get("pct_peak"), ".1f"),
    ("temp_MiB", lambda r: r["memory"].get("temp_bytes", 0) / MiB if r.get("memory") else None, ".0f"),
    ("rss+MiB", lambda r: r["rss_delta_bytes"] / MiB if "rss_delta_bytes" in r else None, ".0f"),
    ("diff_vs_ref", lambda r: r.get("max_abs_diff_vs_reference"), ".1e"),
    ("blocks run/causal/full", lambda r: (f"{r['blocks_run']}/{r['blocks_causal_grid']}/{r['blocks_full_grid']}"
                                          if "blocks_run" in r else None), ""),
)


def _score_note(r: dict) -> str:
  notes = []
  if r.get("error"):
    notes.append(r["error"][:80])
  if r.get("subset"):
    notes.append(f"subset: {r['items_timed']} items timed")
  if r.get("algorithm") == "auto" and r.get("picked"):
    notes.append("picked " + ",".join(r["picked"]))
  if r.get("xla_compiles_warm"):
    notes.append(f"{r['xla_compiles_warm']} compiles in warm runs")
  return "; ".join(notes)


def format_table(rows: Sequence[dict], columns=SCORE_COLUMNS) -> str:
  cells = [[h for h, _, _ in columns]] + [[_fmt(get(r), spec) for _, get, spec in columns] for r in rows]
  widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
  line = lambda row: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
  return "\n".join([line(cells[0]), "  ".join("-" * w for w in widths)] + [line(r) for r in cells[1:]])


def summary(report: dict[str, Any]) -> str:
  """The printed report: peak, FLOPs of the request, the table, cross-checks."""
  peak = report["peak"]["flops_per_s"]
  lines = [f"matmul peak (f32, best of {report['peak']['repeats']}): {peak / 1e9:.1f} GFLOP/s "
           f"({', '.join(f'n={k}: {v / 1e9:.1f}' for k, v in report['peak']['by_size'].items())}); "
           f"{report['machine']['cpu_count']} CPUs, {report['machine']['physical_memory_bytes'] / 2**30:.1f} GiB"]
  end = report.get("peak_end", {}).get("flops_per_s", peak)
  if abs(end / peak - 1) > 0.1:
    lines.append(f"WARNING: the matmul peak was {end / 1e9:.1f} GFLOP/s at the end of the run: the machine is noisy, "
                 f"do not quote these figures")
  if report["mode"] == "kernels":
    g = report["geometry"]
    lines.append(f"attention P={g['prefix_len']} N={g['num_items']} L={g['item_len']} (T={g['row_len']}), heads "
                 f"{g['num_heads']}/{g['num_kv_heads']}, head_dim {g['head_dim']}: useful attention "
                 f"{report['useful_attention_flops'] / 1e9:.2f} GFLOP")
    lines.append(format_table(report["rows"], KERNEL_COLUMNS))
    return "\n".join(lines)
  f, w = report["flops"], report["workload"]
  lines.append(f"workload: query {w['query_len']} (+sep: P={f['prefix_len']}), {w['num_items']} items x "
               f"{w['item_len']} tokens, {w['model']} with {w['model_config']['num_layers']} layers "
               f"({w['non_embedding_params'] / 1e6:.1f}M non-embedding params)"
               + (f", {w['batch_requests']} requests per score_batch" if w["batch_requests"] else ""))
  lines.append(f"model FLOPs/request: {f['total'] / 1e9:.2f} G = dense {f['dense'] / 1e9:.2f} + attention "
               f"{f['attention'] / 1e9:.2f} + lm_head {f['lm_head'] / 1e9:.2f}; serial {f['serial_total'] / 1e9:.2f} G "
               f"(x{f['flop_ratio']:.1f}); physical limit at peak: {peak / f['total']:.2f} req/s = "
               f"{w['num_items'] * peak / f['total']:.0f} items/s")
  lines.append(format_table(report["rows"], SCORE_COLUMNS))
  for key, value in report.get("checks", {}).items():
    lines.append(f"{key}: {value}")
  for key in ("warmup", "mixed_shapes"):
    if key in report:
      lines.append(f"{key}: " + ", ".join(f"{k}={v}" for k, v in report[key].items() if k != "buckets"))
  return "\n".join(lines)


def to_json(obj: Any) -> Any:
  """JSON-ready copy (numpy scalars and arrays to Python)."""
  if isinstance(obj, dict):
    return {str(k): to_json(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [to_json(v) for v in obj]
  if isinstance(obj, np.ndarray):
    return obj.tolist()
  if isinstance(obj, np.generic):
    return obj.item()
  if isinstance(obj, float) and not math.isfinite(obj):
    return str(obj)
  return obj
