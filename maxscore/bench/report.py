"""Benchmark output: the printed tables and summary, and a JSON-ready copy of the report."""

import math
from typing import Any, Callable, Sequence

import numpy as np

from maxscore.bench.measure import MiB


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
    ("lm_head", lambda r: r.get("lm_head"), ""),
    ("useful%", lambda r: r.get("useful_pct_peak"), ".1f"),
    ("x_serial", lambda r: r.get("x_serial"), ".1f"),
    ("x_hf", lambda r: r.get("x_hf"), ".2f"),
    ("x_float", lambda r: r.get("x_float"), ".2f"),
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
  lines = [f"matmul peak ({report['peak'].get('dtype', 'float32')}, best of {report['peak']['repeats']}): {peak / 1e9:.1f} GFLOP/s "
           f"({', '.join(f'n={k}: {v / 1e9:.1f}' for k, v in report['peak']['by_size'].items())}); "
           f"{report['machine']['cpu_count']} CPUs, {report['machine']['physical_memory_bytes'] / 2**30:.1f} GiB"]
  end = report.get("peak_end", {}).get("flops_per_s", peak)
  if "load_before" in report:
    fmt = lambda load: " ".join(f"{x:.2f}" for x in load)
    lines.append(f"load average (1/5/15 min) before: {fmt(report['load_before'])}, after: "
                 f"{fmt(report['load_after'])}; peak at the end {end / 1e9:.1f} GFLOP/s")
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
  if "workloads" in report:  # the suite: each workload's table, then one line per workload
    lines.append(suite_summary(report, lambda w: "\n".join(score_lines(w, peak))))
    return "\n".join(lines)
  return "\n".join(lines + score_lines(report, peak))


def score_lines(report: dict[str, Any], peak: float) -> list[str]:
  """One workload's lines: its FLOPs and physical limit, the selector's choice, the table, cross-checks."""
  lines = []
  f, w = report["flops"], report["workload"]
  lines.append(f"workload: query {w['query_len']} (+sep: P={f['prefix_len']}), {w['num_items']} items x "
               f"{w['item_len']} tokens, {w['model']} with {w['model_config']['num_layers']} layers "
               f"({w['non_embedding_params'] / 1e6:.1f}M non-embedding params)"
               + (f", {w['batch_requests']} requests per score_batch" if w["batch_requests"] else ""))
  lines.append(f"model FLOPs/request: {f['total'] / 1e9:.2f} G = dense {f['dense'] / 1e9:.2f} + attention "
               f"{f['attention'] / 1e9:.2f} + lm_head {f['lm_head'] / 1e9:.2f} ({f.get('lm_head_mode', 'vocabulary')}); "
               f"serial {f['serial_total'] / 1e9:.2f} G "
               f"(x{f['flop_ratio']:.1f}); physical limit at peak: {peak / f['total']:.2f} req/s = "
               f"{w['num_items'] * peak / f['total']:.0f} items/s")
  if "selector" in report:
    lines.append(f"auto would pick {report['selector']['algorithm']}: {report['selector']['reason']}")
  lines.append(format_table(report["rows"], SCORE_COLUMNS))
  for key, value in report.get("checks", {}).items():
    lines.append(f"{key}: {value}")
  for key in ("warmup", "mixed_shapes"):
    if key in report:
      lines.append(f"{key}: " + ", ".join(f"{k}={v}" for k, v in report[key].items() if k != "buckets"))
  return lines


SUITE_COLUMNS = (
    ("workload", lambda s: s["name"], ""),
    ("shape", lambda s: s["shape"], ""),
    ("best", lambda s: s["summary"].get("best"), ""),
    ("%peak", lambda s: s["summary"].get("best_pct_peak"), ".1f"),
    ("x_serial", lambda s: s["summary"].get("best_x_serial"), ".1f"),
    ("x_hf", lambda s: s["summary"].get("best_x_hf"), ".2f"),
    ("auto picks", lambda s: s["summary"].get("selector"), ""),
    ("auto/best", lambda s: s["summary"].get("selector_vs_best"), ".3f"),
    ("hf b", lambda s: s["summary"].get("hf_batch_size"), ""),
    ("rss+MiB", lambda s: (s["summary"]["best_rss_delta_bytes"] / 2 ** 20
                           if s["summary"].get("best_rss_delta_bytes") is not None else None), ".0f"),
    ("auto's reason", lambda s: s["summary"].get("reason"), ""),
)


def suite_summary(report: dict[str, Any], score_table: Callable[[dict], str]) -> str:
  """Each workload's own table (`score_table`), then the suite table."""
  lines = []
  for w in report["workloads"]:
    lines += ["", f"== {w['name']}: {w['shape']} ==", score_table(w)]
  lines += ["", "== suite ==", format_table(report["workloads"], SUITE_COLUMNS)]
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
