"""Cost per query of pointwise scoring, FIRST sliding windows and setwise on the same queries and candidates, with
the prefix cache on and off: forwards, prompt tokens, processed tokens (what the model ran after the prefix
cache) and seconds per query, from a second (warm) pass over the queries so compiling is not counted.

  python scripts/bench_listwise_cost.py --max_queries=10 --top_k=24 --window=20 --stride=10 --set_size=4 \\
      --setwise_top_k=10 --chat=false

The embedded default model and data unless --checkpoint_dir / --jsonl are given. The listwise rows rerank the
pointwise order of each query's top_k candidates and do not include the pointwise pass that ranks them.
"""

import argparse
import dataclasses
import json
import time

import numpy as np

from maxscore.rerank import data, eval as eval_lib, listwise, prompts


def _counting(scorer, counts: dict):
  """Wraps scorer.score_requests to add up its calls' processed tokens."""
  inner = scorer.score_requests

  def score_requests(reqs, *a, **kw):
    results = inner(reqs, *a, **kw)
    counts["processed"] += sum(r.usage.get("processed_tokens", 0) for r in results)
    return results
  scorer.score_requests = score_requests


def _pass(scorer, queries, cfg, args, label_ids, builder, counts) -> dict:
  """One pass over the queries: per method, the means per query."""
  sums = {m: {"forwards": 0, "prompt_tokens": 0, "processed_tokens": 0, "cache_hits": 0, "seconds": 0.0}
          for m in ("pointwise", "first", "setwise")}
  first = listwise.ListwiseConfig("first", args.window, args.stride, 0, chat=args.chat)
  setwise = listwise.ListwiseConfig("setwise", args.set_size, top_k=args.setwise_top_k, chat=args.chat)
  for q in queries:
    prep = eval_lib.prepare_query(builder, q, cfg)
    counts["processed"], hits = 0, scorer.prefix_cache.stats.hits
    t = time.perf_counter()
    rec = eval_lib.score_prepared(scorer, prep, label_ids, cfg)  # clears the prefix cache first, as eval does
    s = sums["pointwise"]
    s["cache_hits"] += scorer.prefix_cache.stats.hits - hits
    s["seconds"] += time.perf_counter() - t
    s["forwards"] += 1
    s["prompt_tokens"] += rec["prompt_tokens"]
    s["processed_tokens"] += rec["processed_tokens"]
    order = sorted(range(len(rec["scores"])), key=lambda i: (-rec["scores"][i], i))[:args.top_k or None]
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


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--checkpoint_dir", default=None)
  ap.add_argument("--jsonl", default=None)
  ap.add_argument("--split", default="test")
  ap.add_argument("--max_queries", type=int, default=10)
  ap.add_argument("--top_k", type=int, default=24, help="candidates per query the listwise methods rerank")
  ap.add_argument("--window", type=int, default=20)
  ap.add_argument("--stride", type=int, default=10)
  ap.add_argument("--set_size", type=int, default=4)
  ap.add_argument("--setwise_top_k", type=int, default=10)
  ap.add_argument("--algorithm", default="auto", help="the scorer's algorithm (configs/base.yml): auto | packed | "
                  "prefill_extend | serial; the prefix cache holds prefix states of prefill_extend")
  ap.add_argument("--chat", type=lambda s: s.lower() in ("1", "true", "yes"), default=False)
  args = ap.parse_args()
  ds = data.load_jsonl(args.jsonl or data.DEFAULT_JSONL, split=args.split)
  queries = [q for q in ds.queries if q.candidates][:args.max_queries]
  cfg = eval_lib.EvalConfig()
  out = {"queries": len(queries), "candidates_per_query": float(np.mean([len(q.candidates) for q in queries])),
         "args": vars(args), "prefix_cache": {}}
  for cache_bytes in (1 << 30, 0):
    scorer = eval_lib.build_scorer(args.checkpoint_dir, [f"prefix_cache_bytes={cache_bytes}",
                                                                f"algorithm={args.algorithm}"], use_head=False)
    label_ids = prompts.resolve_labels(scorer.tokenizer, cfg.labels or prompts.TEMPLATES[cfg.template].default_labels)
    builder = prompts.PromptBuilder(scorer.tokenizer, prompts.get_template(cfg.template), cfg.instruction,
                                    cfg.max_query_tokens, cfg.max_item_tokens)
    counts = {"processed": 0}
    _counting(scorer, counts)
    _pass(scorer, queries, cfg, args, label_ids, builder, counts)  # compiles every shape
    # The machine may be shared: each method's seconds are the lower of two warm passes.
    runs = [_pass(scorer, queries, cfg, args, label_ids, builder, counts) for _ in range(2)]
    best = {m: {**runs[0][m], "seconds": min(r[m]["seconds"] for r in runs)} for m in runs[0]}
    out["prefix_cache"]["on" if cache_bytes else "off"] = best
  print(json.dumps(out, indent=2))
  print(f"{'method':10} {'cache':5} {'forwards/q':>10} {'prompt tok/q':>12} {'processed tok/q':>15} "
        f"{'cache hits/q':>12} {'s/q':>8}")
  for cache, rows in out["prefix_cache"].items():
    for m, r in rows.items():
      print(f"{m:10} {cache:5} {r['forwards']:10.1f} {r['prompt_tokens']:12.0f} {r['processed_tokens']:15.0f} "
            f"{r['cache_hits']:12.1f} {r['seconds']:8.3f}")


if __name__ == "__main__":
  main()
