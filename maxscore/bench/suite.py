"""The workload suite: named workloads (configs/bench.yml `suite_workloads`) benchmarked in one process
against one measured matmul peak, each with every algorithm, the selector's choice and its reason, and
the transformers baseline, so every ratio in the table is taken under the same load.

    report = run_suite(BenchOptions(suite=True), peak_flops, harness.run_score)
    print(report_lib.summary(report))     # each workload's table, then the suite table
"""

import dataclasses
import re
from typing import Any, Callable, Optional

_SPEC = re.compile(r"^([A-Za-z_][\w-]*)=(\d+)x(\d+)x(\d+)(?:x(\d+))?$")


@dataclasses.dataclass(frozen=True)
class Workload:
  """query tokens x items x item tokens; `batch_requests` > 0: that many such requests per score_batch."""
  name: str
  query_len: int
  num_items: int
  item_len: int
  batch_requests: int = 0

  @property
  def shape(self) -> str:
    base = f"{self.query_len}x{self.num_items}x{self.item_len}"
    return f"{self.batch_requests} x ({base})" if self.batch_requests else base


def parse_workloads(specs: tuple[str, ...], only: tuple[str, ...] = ()) -> list[Workload]:
  """`name=QxNxL[xR]` strings as Workloads, those named in `only` (all when empty), in order."""
  out = []
  for spec in specs:
    m = _SPEC.match(spec)
    if not m:
      raise ValueError(f"suite_workloads entry {spec!r} is not name=QUERYxITEMSxITEM_LEN[xREQUESTS] with "
                       f"positive integers, e.g. beir=32x100x256 or small=300x10x10x64")
    name, *dims = m.groups()
    q, n, l, r = (int(x) if x else 0 for x in dims)
    if min(q, n, l) < 1 or (dims[3] is not None and r < 1):
      raise ValueError(f"suite_workloads entry {spec!r}: every size must be >= 1")
    out.append(Workload(name, q, n, l, r))
  names = [w.name for w in out]
  if len(set(names)) != len(names):
    raise ValueError(f"suite_workloads names repeat: {names}")
  unknown = sorted(set(only) - set(names))
  if unknown:
    raise ValueError(f"suite_only names {unknown} are not suite_workloads names {names}")
  return [w for w in out if not only or w.name in only]


def run_suite(opts, peak_flops: float, run_score: Callable[[Any, float], dict]) -> dict[str, Any]:
  """`run_score` (harness.run_score) on every workload of `opts`, plus a summary per workload."""
  workloads = parse_workloads(opts.suite_workloads, opts.suite_only)
  results = []
  for w in workloads:
    w_opts = dataclasses.replace(opts, query_len=w.query_len, num_items=w.num_items, item_len=w.item_len,
                                 batch_requests=w.batch_requests)
    report = run_score(w_opts, peak_flops)
    report.update(name=w.name, shape=w.shape, summary=workload_summary(report))
    results.append(report)
  return dict(workloads=results)


def _best(rows: list[dict], pred: Callable[[dict], bool]) -> Optional[dict]:
  rows = [r for r in rows if "items_per_s" in r and pred(r)]
  return max(rows, key=lambda r: r["items_per_s"]) if rows else None


def workload_summary(report: dict[str, Any]) -> dict[str, Any]:
  """Best algorithm, the selector's pick (its row) and how far below the best it is, and the HF ratio."""
  rows = report["rows"]
  ours = lambda r: r.get("algorithm") not in ("hf_prefix_reuse", "serial")
  best = _best(rows, ours)
  sel = report.get("selector", {})
  picked = _best(rows, lambda r: r.get("algorithm") == sel.get("algorithm"))
  out: dict[str, Any] = dict(selector=sel.get("algorithm"), reason=sel.get("reason"))
  if best:
    out.update(best=best["name"], best_pct_peak=best.get("pct_peak"), best_x_hf=best.get("x_hf"),
               best_x_serial=best.get("x_serial"), best_rss_delta_bytes=best.get("rss_delta_bytes"))
  if best and picked:
    out.update(selector_pct_peak=picked.get("pct_peak"), selector_x_hf=picked.get("x_hf"),
               selector_vs_best=picked["items_per_s"] / best["items_per_s"])
  hf = _best(rows, lambda r: r.get("algorithm") == "hf_prefix_reuse")
  if hf:
    out.update(hf_batch_size=hf.get("batch_size"), hf_attn=hf.get("attn_implementation"))
  return out
