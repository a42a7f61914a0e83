"""pallas_gpu's settings swept on one packed row: block sizes, warps and pipelining stages (gpu_check's
`attention` part).

The row is the scorer's own packed layout for a workload "QxNxL" (the prefix and the item count padded to
their buckets, every item its full length), at a model's head counts and head_dim, in the compute dtype. Each
setting is timed alone (measure.time_call: the best of `repeats` rounds of `inner` back-to-back calls) and its
output compared with the first setting's, the kernel's default; the useful FLOPs are those of the visible
(query, key) pairs.

    rows = sweep(("64x64x8x2", "128x64x8x2"), workload, heads=16, kv_heads=8, head_dim=128, dtype="bfloat16")
"""

import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from layers.kernels import pallas_gpu
from layers.kernels.base import KernelOptions, SegmentLayout
from maxscore.bench.measure import time_call
from maxscore.bench.suite import Workload
from maxscore.config import BucketConfig
from maxscore.scoring.layout import bucket


def parse_setting(setting: str) -> dict[str, int]:
  """"BQxBKxWARPSxSTAGES" as KernelOptions fields; a ValueError naming the form otherwise."""
  parts = setting.split("x")
  if len(parts) != 4 or not all(p.isdigit() for p in parts):
    raise ValueError(f"attention setting {setting!r} is not BLOCK_QxBLOCK_KVxWARPSxSTAGES (e.g. 64x64x8x2)")
  bq, bk, warps, stages = map(int, parts)
  return dict(gpu_block_q=bq, gpu_block_kv=bk, gpu_num_warps=warps, gpu_num_stages=stages)


def seed_layout(w: Workload, buckets: BucketConfig = BucketConfig()) -> SegmentLayout:
  """One packed row of `w` as the scorer lays it out: prefix (query + separator), slots and item count bucketed."""
  p_real, n_real = w.query_len + 1, w.num_items
  p = bucket(p_real, buckets.prefix_buckets, "prefix")
  n = bucket(n_real, buckets.item_count_buckets, "item count")
  l = bucket(w.item_len, buckets.item_buckets, "item")
  slots = np.zeros((1, n), np.int32)
  slots[0, :n_real] = w.item_len
  return SegmentLayout(jnp.asarray([p_real], jnp.int32), jnp.asarray(slots), p, l, n)


def visible_pairs(w: Workload) -> int:
  """(query, key) pairs the mask lets through: the prefix causally, each item token the prefix and its own
  item up to itself."""
  p = w.query_len + 1
  return p * (p + 1) // 2 + w.num_items * (w.item_len * p + w.item_len * (w.item_len + 1) // 2)


def sweep(settings: Sequence[str], w: Workload, heads: int, kv_heads: int, head_dim: int, dtype: str,
          interpret: bool = False, repeats: int = 5, inner: int = 10) -> list[dict[str, Any]]:
  """Each setting's time, TFLOP/s of useful work and max abs difference from the first setting's output."""
  layout = seed_layout(w)
  rng = np.random.default_rng(0)
  normal = lambda n: jnp.asarray(rng.normal(size=(1, layout.row_len, n, head_dim)), dtype)
  q, k, v = normal(heads), normal(kv_heads), normal(kv_heads)
  flops = 4 * heads * head_dim * visible_pairs(w)
  rows, first = [], None
  for setting in settings:
    row: dict[str, Any] = dict(setting=setting)
    try:
      options = KernelOptions(kernel_interpret=interpret, **parse_setting(setting))
      fn = jax.jit(lambda q_, k_, v_, o=options: pallas_gpu.attend(q_, k_, v_, layout, None, options=o))
      t0 = time.perf_counter()
      out = jax.block_until_ready(fn(q, k, v))
      row["compile_s"] = time.perf_counter() - t0
      best = time_call(fn, (q, k, v), repeats, inner)
      out = np.asarray(out.astype(jnp.float32))
      first = out if first is None else first
      row.update(ms=best * 1e3, tflop_s=flops / best / 1e12,
                 max_abs_diff_vs_first=float(np.abs(out - first).max()), finite=bool(np.isfinite(out).all()))
    except Exception as e:  # noqa: BLE001 -- a setting Triton cannot compile is a finding, not a stop
      row["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:1000]}"
    rows.append(row)
  return rows


def best_setting(rows: Sequence[dict[str, Any]], tolerance: float) -> dict[str, Any]:
  """The fastest row that ran, is finite and agrees with the first within `tolerance` (the first if none)."""
  good = [r for r in rows if "ms" in r and r["finite"] and r["max_abs_diff_vs_first"] <= tolerance]
  return min(good, key=lambda r: r["ms"]) if good else rows[0]
