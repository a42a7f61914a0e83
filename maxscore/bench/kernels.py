"""The attention-kernel microbenchmark: kernels alone on one packed row, and the block-skip counts of
the Pallas kernels (splash, pallas_gpu), which interpret mode on CPU cannot time."""

from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from layers.kernels import KernelOptions, SegmentLayout, get_kernel, pallas_gpu, splash
from maxscore.bench.measure import (
  CompileCounter,
  RssSampler,
  memory_stats,
  physical_memory_bytes,
  timed,
)
from maxscore.scoring.cost_model import attention_pairs


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


def run_kernels(opts, peak_flops: Optional[float]) -> dict[str, Any]:
  """shared_prefix vs reference (and any other named kernel) on one packed row at the given geometry."""
  p, n, l = opts.query_len + (1 if opts.separator is not None else 0), opts.num_items, opts.item_len
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
      best = min(timed(lambda: compiled(q, k, v, layout).block_until_ready()) for _ in range(opts.repeats))
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
