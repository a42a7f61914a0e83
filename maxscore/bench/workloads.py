"""Benchmark workloads: random /v1/score requests, one algorithm timed on them, warmup latency and
mixed shapes. Model FLOPs come from the cost model (docs/ARCHITECTURE.md section 3); serial repeats the query
per item, so its own FLOPs are reported beside the request's. Compile time is excluded from the warm
timings and reported separately."""

import resource
import time
from typing import Any, Optional, Sequence

import jax
import numpy as np

from maxscore.bench.measure import (
  CompileCounter,
  RssSampler,
  biggest_memory,
  jit_cache_size,
  record_model_calls,
  timed,
)
from maxscore.scoring.cost_model import model_flops
from maxscore.scoring.scorer import Scorer


def make_requests(vocab_size: int, query_len: int, num_items: int, item_len: int, labels: Sequence[int],
                  num_requests: int = 1, seed: int = 0, apply_softmax: bool = False) -> list[dict[str, Any]]:
  """/v1/score-shaped requests with random token ids (distinct queries, so nothing is cached across them)."""
  rng = np.random.default_rng(seed)
  return [dict(query=rng.integers(0, vocab_size, query_len).tolist(),
               items=rng.integers(0, vocab_size, (num_items, item_len)).tolist(),
               label_token_ids=list(labels), apply_softmax=apply_softmax) for _ in range(num_requests)]


def lm_head_cols(request: dict[str, Any]) -> Optional[int]:
  """The lm_head columns a request's scores compute (cost_model): its K labels with apply_softmax
  (no vocabulary normalizer needed), else None = the full vocabulary."""
  return len(request["label_token_ids"]) if request["apply_softmax"] else None


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
  flops = [model_flops(cfg, len(r["query"]), [len(x) for x in r["items"]], algorithm, separator, lm_head_cols(r))
           for r in run_reqs]
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
             lm_head=flops[0]["lm_head_mode"] if flops else None, items_timed=items, subset=items < all_items,
             repeats=repeats, best_s=best,
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




def fresh_scorer(scorer: Scorer, **overrides: Any) -> Scorer:
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
  cold = fresh_scorer(scorer)
  cold_s = timed(lambda: _score(cold, [request], None))
  jax.clear_caches()
  warm = fresh_scorer(scorer)
  try:
    warmup_s = timed(lambda: _call_warmup(warm, request))
  except Exception as e:  # noqa: BLE001 -- report, do not abort the benchmark
    return dict(status=f"warmup failed: {type(e).__name__}: {e}", first_request_cold_s=cold_s)
  with CompileCounter() as cc:
    first_s = timed(lambda: _score(warm, [request], None))
  second_s = timed(lambda: _score(warm, [request], None))
  return dict(status="ok", first_request_cold_s=cold_s, warmup_s=warmup_s, first_request_after_warmup_s=first_s,
              second_request_s=second_s, compiles_after_warmup=cc.compiles)


def mixed_shape_run(scorer: Scorer, num_requests: int, query_len: int, num_items: int, item_len: int,
                    labels: Sequence[int], seed: int = 0) -> dict[str, Any]:
  """Requests of random geometry (query in [q/4, q], 1..N items of 1..L tokens), scored one by one.

  Runs on a fresh Scorer over the same params, and reports the distinct model shapes (buckets)
  it touched and the executables XLA compiled for them.
  """
  scorer = fresh_scorer(scorer)
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
