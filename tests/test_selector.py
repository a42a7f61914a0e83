"""The selector's choices for the documented geometries, and the rules behind them."""

import pytest

from maxscore.config import load_config
from maxscore.scoring.selector import select

CFG = load_config(["model_name=qwen3-0.6b"])


def choose(query_len, item_lens, kernel="shared_prefix", item_first=False, cached=False, cfg=CFG, **overrides):
  cfg = cfg.replace(**overrides) if overrides else cfg
  return select(query_len, item_lens, item_first, kernel, cfg.kernel, cfg.scoring, cfg.buckets, prefix_cached=cached)


@pytest.mark.parametrize("query_len,num_items,item_len,algorithm", [
    (2000, 500, 20, "prefill_extend"),  # the reference workload: one row, but 8 extend chunks (CPU kernel)
    (100, 10, 100, "packed"),    # long items, few of them: one row
    (300, 10, 10, "packed"),     # short request: one row, batched with others by score_batch
    (33, 100, 256, "prefill_extend"),   # BEIR-like: 100 items span two chunks (one row would pad them to 128)
    (33, 100, 512, "prefill_extend"),   # long passages: one row would exceed max_tokens_per_forward
    (17, 1000, 96, "prefill_extend"),   # MS MARCO-like: likewise
])
def test_documented_geometries(query_len, num_items, item_len, algorithm):
  choice = choose(query_len, [item_len] * num_items)
  assert choice.algorithm == algorithm, choice.reason
  assert choice.reason


def test_rules():
  assert choose(10, [3], item_first=True).algorithm == "serial"
  assert choose(10, [3], algorithm="serial").algorithm == "serial"  # config wins
  assert choose(2000, [20] * 500, cached=True).algorithm == "prefill_extend"
  assert choose(2000, [20] * 3000).algorithm == "prefill_extend"  # several rows would recompute the query
  assert choose(2000, [20] * 500, kernel="reference").algorithm == "prefill_extend"  # T^2 mask too big
  small = choose(2000, [20] * 500, max_tokens_per_forward=8192)
  assert small.algorithm == "prefill_extend" and "max_tokens_per_forward" in small.reason
  assert choose(10, []).algorithm == "packed"


def test_cpu_kernel_prefers_chunks_once_items_span_more_than_one():
  """On the shared_prefix kernel one packed row loses to cache-sized extend chunks (BENCHMARKS.md)."""
  chunk = CFG.scoring.extend_batch_size
  assert choose(2000, [20] * chunk).algorithm == "packed"  # one chunk: extend would only add a dispatch
  many = choose(2000, [20] * (chunk + 1))
  assert many.algorithm == "prefill_extend" and many.kind == "chunks", many.reason
  assert choose(2000, [20] * 500, extend_batch_size=512).algorithm == "packed"
  for kernel in ("splash", "pallas_gpu"):  # unmeasured there: one packed row
    assert choose(2000, [20] * 500, kernel=kernel).algorithm == "packed"


@pytest.mark.parametrize("model,query_len,num_items,item_len,algorithm", [
    ("smollm2-135m", 71, 30, 80, "packed"),  # the embedded eval's shape: one row of 2,656 tokens
    ("smollm2-135m", 33, 100, 256, "prefill_extend"),
    ("smollm2-135m", 17, 1000, 96, "prefill_extend"),
    ("qwen3-0.6b", 33, 100, 256, "prefill_extend"),
])
def test_full_depth_suite_picks_the_measured_best(model, query_len, num_items, item_len, algorithm):
  """At full depth (30 and 28 layers) the bench measured these picks as the fastest algorithm on each workload
  (BENCHMARKS.md, "Real depths against transformers on CPU"); the rules do not depend on depth."""
  choice = choose(query_len, [item_len] * num_items, cfg=load_config([f"model_name={model}"]))
  assert choice.algorithm == algorithm, choice.reason
