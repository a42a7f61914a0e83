"""Cost per query of pointwise scoring, FIRST sliding windows and setwise on the same queries and candidates,
with the prefix cache on and off (scripts/bench_listwise_cost.py): forward sequences, prompt tokens, processed
tokens (what the scorer reports as run through the model), prefix-cache hits and seconds per query. Seconds are
the lower of two warm passes after one that compiles every shape. The listwise rows rerank the pointwise order
of each query's top_k candidates and do not include the pointwise pass that ranks them.
"""

import dataclasses
import time
from typing import Any, Optional

import numpy as np

from maxscore.datasets import data
from maxscore.rerank import eval as eval_lib, listwise, prompts
from maxscore.rerank import query_scoring
from maxscore.scoring import loading


@dataclasses.dataclass(frozen=True)
class ListwiseCostOptions:
  """scripts/bench_listwise_cost.py's settings (configs/bench_listwise.yml documents each key)."""
  checkpoint_dir: Optional[str] = None  # None: the embedded default model
  jsonl: Optional[str] = None           # None: the embedded data set
  split: str = "test"
  max_queries: int = 10                 # 0: all queries
  top_k: int = 24                       # candidates per query the listwise methods rerank; 0 = all
  window: int = 20                      # FIRST: passages per window
  stride: int = 10                      # FIRST: positions a window moves up
  set_size: int = 4                     # setwise: passages per set
  setwise_top_k: int = 10               # setwise: the best k sorted
  chat: bool = False                    # window prompts as a chat user turn

  def validate(self) -> "ListwiseCostOptions":
    for name in ("max_queries", "top_k", "setwise_top_k"):
      if getattr(self, name) < 0:
        raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
    return self


def _counting(scorer, counts: dict):
  """Wraps scorer.score_requests to add up its calls' processed tokens."""
  inner = scorer.score_requests

  def score_requests(reqs, *a, **kw):
    results = inner(reqs, *a, **kw)
    counts["processed"] += sum(r.usage.get("processed_tokens", 0) for r in results)
    return results
  scorer.score_requests = score_requests


def _pass(scorer, queries, cfg, opts, label_ids, builder, counts) -> dict:
  """One pass over the queries: per method, the means per query."""
  sums = {m: {"forwards": 0, "prompt_tokens": 0, "processed_tokens": 0, "cache_hits": 0, "seconds": 0.0}
          for m in ("pointwise", "first", "setwise")}
  first = listwise.ListwiseConfig("first", opts.window, opts.stride, 0, chat=opts.chat)
  setwise = listwise.ListwiseConfig("setwise", opts.set_size, top_k=opts.setwise_top_k, chat=opts.chat)
  for q in queries:
    prep = query_scoring.prepare_query(builder, q, cfg)
    counts["processed"], hits = 0, scorer.prefix_cache.stats.hits
    t = time.perf_counter()
    rec = query_scoring.score_prepared(scorer, prep, label_ids, cfg)  # clears the prefix cache first, as eval does
    s = sums["pointwise"]
    s["cache_hits"] += scorer.prefix_cache.stats.hits - hits
    s["seconds"] += time.perf_counter() - t
    s["forwards"] += 1
    s["prompt_tokens"] += rec["prompt_tokens"]
    s["processed_tokens"] += rec["processed_tokens"]
    order = sorted(range(len(rec["scores"])), key=lambda i: (-rec["scores"][i], i))[:opts.top_k or None]
    texts = [q.candidates[i][1] for i in order]
    for name, lw in (("first", first), ("setwise", setwise)):
      scorer.prefix_cache.clear()
      usage, counts["processed"], hits = listwise.Usage(), 0, scorer.prefix_cache.stats.hits
      t = time.perf_counter()
      listwise.listwise_rerank(scorer, [q.query], [texts], lw, usage)
      s = sums[name]
      s["seconds"] += time.perf_counter() - t
      s["forwards"] += usage.forwards
      s["prompt_tokens"] += usage.tokens
      s["processed_tokens"] += counts["processed"]
      s["cache_hits"] += scorer.prefix_cache.stats.hits - hits
  return {m: {k: v / len(queries) for k, v in s.items()} for m, s in sums.items()}



def run(opts: ListwiseCostOptions, overrides=()) -> dict[str, Any]:
  """The report: per prefix cache setting (on, off), per method, the means per query."""
  opts.validate()
  ds = data.load_jsonl(opts.jsonl or data.DEFAULT_JSONL, split=opts.split)
  queries = [q for q in ds.queries if q.candidates][:opts.max_queries or None]
  cfg = eval_lib.EvalConfig()
  out = {"queries": len(queries), "candidates_per_query": float(np.mean([len(q.candidates) for q in queries])),
         "options": dataclasses.asdict(opts), "overrides": list(overrides), "prefix_cache": {}}
  for cache_bytes in (1 << 30, 0):
    scorer = loading.build_scorer(opts.checkpoint_dir, [*overrides, f"prefix_cache_bytes={cache_bytes}"],
                                   use_head=False)
    label_ids = prompts.resolve_labels(scorer.tokenizer, cfg.labels or prompts.TEMPLATES[cfg.template].default_labels)
    builder = prompts.PromptBuilder(scorer.tokenizer, prompts.get_template(cfg.template), cfg.instruction,
                                    cfg.max_query_tokens, cfg.max_item_tokens)
    counts = {"processed": 0}
    _counting(scorer, counts)
    _pass(scorer, queries, cfg, opts, label_ids, builder, counts)  # compiles every shape
    # The machine may be shared: each method's seconds are the lower of two warm passes.
    runs = [_pass(scorer, queries, cfg, opts, label_ids, builder, counts) for _ in range(2)]
    best = {m: {**runs[0][m], "seconds": min(r[m]["seconds"] for r in runs)} for m in runs[0]}
    out["prefix_cache"]["on" if cache_bytes else "off"] = best
  return out


def summary(report: dict) -> str:
  """The report as a table, one row per prefix cache setting and method."""
  lines = [f"{report['queries']} queries, {report['candidates_per_query']:.1f} candidates each",
           f"{'method':10} {'cache':5} {'forwards/q':>10} {'prompt tok/q':>12} {'processed tok/q':>15} "
           f"{'cache hits/q':>12} {'s/q':>8}"]
  for cache, rows in report["prefix_cache"].items():
    for m, r in rows.items():
      lines.append(f"{m:10} {cache:5} {r['forwards']:10.1f} {r['prompt_tokens']:12.0f} {r['processed_tokens']:15.0f} "
                   f"{r['cache_hits']:12.1f} {r['seconds']:8.3f}")
  return "\n".join(lines) + "\n"
