"""The eval loop against the model's own steady state: the same queries scored by `run_eval` (pipelined,
and with each query's host and model work in turn) and by `score_prepared` on ids tokenized beforehand.

    report = run(EvalBenchOptions(max_queries=40))

Every mode runs once untimed first (compiles), then `repeats` times interleaved, best kept, in one process,
so the ratios hold on a noisy machine. Items/s is each mode's scoring-loop time (the loop's per-query
seconds summed; the final metrics and files are timed apart as `finalize_s`).
"""

import dataclasses
import json
import os
import tempfile
import time
from typing import Any, Optional

from maxscore.rerank import eval as eval_lib
from maxscore.rerank import prompts


@dataclasses.dataclass(frozen=True)
class EvalBenchOptions:
  """scripts/bench_eval.py's settings (configs/bench_eval.yml documents each key)."""
  checkpoint_dir: Optional[str] = None  # None: the embedded default model (and its data when jsonl is None)
  jsonl: Optional[str] = None           # a JSONL rerank set; None: the embedded data set
  max_queries: int = 0                  # 0: all queries
  repeats: int = 3                      # timed runs of each mode (best kept)

  def validate(self) -> "EvalBenchOptions":
    if self.max_queries < 0 or self.repeats < 1:
      raise ValueError(f"max_queries={self.max_queries} must be >= 0 and repeats={self.repeats} >= 1")
    return self


def run(opts: EvalBenchOptions, overrides=()) -> dict[str, Any]:
  opts.validate()
  run_cfg = eval_lib.EvalRun(checkpoint_dir=opts.checkpoint_dir, jsonl=opts.jsonl)
  cfg = eval_lib.EvalConfig(max_queries=opts.max_queries, fusion="none")
  dataset, _ = eval_lib.load_data(run_cfg, cfg.validate())
  scorer = eval_lib.build_scorer(opts.checkpoint_dir, list(overrides), use_head=run_cfg.use_head)
  template = prompts.get_template(cfg.template)
  label_ids = prompts.resolve_labels(scorer.tokenizer, cfg.labels or template.default_labels)
  builder = prompts.PromptBuilder(scorer.tokenizer, template, cfg.instruction, cfg.max_query_tokens,
                                  cfg.max_item_tokens)
  queries = [q for q in (dataset.queries[:cfg.max_queries] if cfg.max_queries else dataset.queries) if q.candidates]
  items = sum(len(q.candidates) for q in queries)
  prepared = [eval_lib.prepare_query(builder, q, cfg) for q in queries]
  host_s = sum(p.seconds for p in prepared)

  def eval_mode(pipelined: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="maxscore-eval-bench-") as out:
      t0 = time.perf_counter()
      report = eval_lib.run_eval(scorer, dataset, cfg, out, progress=False, pipelined=pipelined)
      wall = time.perf_counter() - t0
      loop = sum(r["seconds"] for r in _records(report))
    return dict(loop_s=loop, finalize_s=wall - loop)

  def direct() -> dict[str, float]:
    t0 = time.perf_counter()
    for p in prepared:
      eval_lib.score_prepared(scorer, p, label_ids, cfg)
    return dict(loop_s=time.perf_counter() - t0)

  modes = {"eval, pipelined": lambda: eval_mode(True), "eval, host and model in turn": lambda: eval_mode(False),
           "model alone (ids tokenized beforehand)": direct}
  load_before = os.getloadavg()
  for fn in modes.values():
    fn()  # compiles every program the queries need
  runs = {name: [] for name in modes}
  for _ in range(opts.repeats):
    for name, fn in modes.items():
      runs[name].append(fn())
  rows = {}
  for name, rs in runs.items():
    best = min(rs, key=lambda r: r["loop_s"])
    rows[name] = dict(best, items_per_s=items / best["loop_s"], loop_s_all=[r["loop_s"] for r in rs])
  model = rows["model alone (ids tokenized beforehand)"]["items_per_s"]
  for row in rows.values():
    row["of_model_alone"] = row["items_per_s"] / model
  return dict(queries=len(queries), items=items, host_tokenize_s=host_s, rows=rows, load_before=load_before,
              load_after=os.getloadavg(), repeats=opts.repeats)


def _records(report) -> list[dict]:
  path = report.output_dir / eval_lib.RESULTS_FILE
  return [json.loads(line) for line in path.read_text().splitlines()[1:]]


def summary(report: dict[str, Any]) -> str:
  lines = [f"{report['queries']} queries, {report['items']} items; tokenizing them alone: "
           f"{report['host_tokenize_s']:.2f} s; load average before {report['load_before']}, after "
           f"{report['load_after']}; best of {report['repeats']}"]
  for name, r in report["rows"].items():
    fin = f", final outputs {r['finalize_s']:.2f} s" if "finalize_s" in r else ""
    lines.append(f"{name:42s} {r['items_per_s']:8.1f} items/s  {r['of_model_alone']:6.1%} of the model alone  "
                 f"(loop {r['loop_s']:.2f} s{fin})")
  return "\n".join(lines) + "\n"
