"""The eval loop against the model's own steady state: the same queries scored by `run_eval` (pipelined,
and with each query's host and model work in turn) and by `score_prepared` on ids tokenized beforehand; and,
with `hf_baseline`, by transformers on the same ids (the checkpoint exported to a transformers directory,
each query's prefix K/V reused over batches of its items: maxscore/bench/hf_baseline.py).

    report = run(EvalBenchOptions(max_queries=40))
    report = run(EvalBenchOptions(checkpoint_dir="ckpt/smollm2", modes=("pipelined",), hf_baseline=True))

Every mode runs once untimed first (compiles), then `repeats` times interleaved, best kept, in one process,
so the ratios hold on a noisy machine. Items/s is each mode's scoring-loop time (the loop's per-query
seconds summed; the final metrics and files are timed apart as `finalize_s`).
"""

import dataclasses
import json
import os
import pathlib
import tempfile
import time
from typing import Any, Optional

import numpy as np

from maxscore.rerank import eval as eval_lib
from maxscore.rerank import prompts
from maxscore.rerank import query_scoring
from maxscore.rerank import results_file
from maxscore.scoring import loading

MODES = {"pipelined": "eval, pipelined", "in_turn": "eval, host and model in turn",
         "direct": "model alone (ids tokenized beforehand)"}
HF_MODE = "transformers (same ids, prefix reused)"


@dataclasses.dataclass(frozen=True)
class EvalBenchOptions:
  """scripts/bench_eval.py's settings (configs/bench_eval.yml documents each key)."""
  checkpoint_dir: Optional[str] = None  # None: the embedded default model (and its data when jsonl is None)
  jsonl: Optional[str] = None           # a JSONL rerank set; None: the embedded data set
  max_queries: int = 0                  # 0: all queries
  repeats: int = 3                      # timed runs of each mode (best kept)
  modes: tuple[str, ...] = tuple(MODES)  # which of maxscore's modes to time (MODES)
  hf_baseline: bool = False             # also transformers on the same ids (the model without a score head)
  hf_batch_size: int = 16               # items per transformers forward

  def validate(self) -> "EvalBenchOptions":
    if self.max_queries < 0 or self.repeats < 1 or self.hf_batch_size < 1:
      raise ValueError(f"max_queries={self.max_queries} must be >= 0, repeats={self.repeats} and hf_batch_size="
                       f"{self.hf_batch_size} >= 1")
    bad = [m for m in self.modes if m not in MODES]
    if bad or len(set(self.modes)) != len(self.modes) or not (self.modes or self.hf_baseline):
      raise ValueError(f"modes={list(self.modes)} must name each of {list(MODES)} at most once (at least one, "
                       "unless hf_baseline)")
    return self


def run(opts: EvalBenchOptions, overrides=()) -> dict[str, Any]:
  opts.validate()
  run_cfg = eval_lib.EvalRun(checkpoint_dir=opts.checkpoint_dir, jsonl=opts.jsonl)
  cfg = eval_lib.EvalConfig(max_queries=opts.max_queries, fusion="none")
  dataset, _ = eval_lib.load_data(run_cfg, cfg.validate())
  # transformers has no score head: against it, maxscore scores with the model's own label log-probs too.
  scorer = loading.build_scorer(opts.checkpoint_dir, list(overrides),
                                 use_head=run_cfg.use_head and not opts.hf_baseline)
  builder, label_ids = prompts.prompt_and_labels(scorer.tokenizer, cfg.template, cfg.labels, cfg.instruction,
                                                 cfg.max_query_tokens, cfg.max_item_tokens)
  queries = [q for q in (dataset.queries[:cfg.max_queries] if cfg.max_queries else dataset.queries) if q.candidates]
  items = sum(len(q.candidates) for q in queries)
  prepared = [query_scoring.prepare_query(builder, q, cfg) for q in queries]
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
      query_scoring.score_prepared(scorer, p, label_ids, cfg)
    return dict(loop_s=time.perf_counter() - t0)

  every = {"pipelined": lambda: eval_mode(True), "in_turn": lambda: eval_mode(False), "direct": direct}
  modes = {MODES[m]: every[m] for m in opts.modes}
  hf_check = None
  with tempfile.TemporaryDirectory(prefix="maxscore-eval-bench-hf-") as hf_dir:
    if opts.hf_baseline:
      model, hf_check = _hf_model(scorer, pathlib.Path(hf_dir), prepared[0] if prepared else None, label_ids,
                                  opts.hf_batch_size)
      modes[HF_MODE] = lambda: _hf_mode(model, prepared, label_ids, opts.hf_batch_size,
                                        scorer.config.scoring.separator_token_id)
    report = _time(modes, opts.repeats, items)
  return dict(queries=len(queries), items=items, host_tokenize_s=host_s, hf_check=hf_check, **report)


def _time(modes: dict, repeats: int, items: int) -> dict[str, Any]:
  """Each mode once untimed (compiles, warm-up), then `repeats` rounds of all of them interleaved, best kept."""
  load_before = os.getloadavg()
  for fn in modes.values():
    fn()  # compiles every program the queries need
  runs = {name: [] for name in modes}
  for _ in range(repeats):
    for name, fn in modes.items():
      runs[name].append(fn())
  rows = {}
  for name, rs in runs.items():
    best = min(rs, key=lambda r: r["loop_s"])
    rows[name] = dict(best, items_per_s=items / best["loop_s"], loop_s_all=[r["loop_s"] for r in rs])
  model = rows.get(MODES["direct"], {}).get("items_per_s")
  for row in rows.values():
    row["of_model_alone"] = row["items_per_s"] / model if model else None
  if HF_MODE in rows:
    for row in rows.values():
      row["x_transformers"] = row["items_per_s"] / rows[HF_MODE]["items_per_s"]
  return dict(rows=rows, load_before=load_before, load_after=os.getloadavg(), repeats=repeats)


def _request(prep, label_ids) -> dict:
  """A prepared query as one score request: its query ids, every candidate's item ids, the labels."""
  return dict(query=prep.query_ids, items=[ids for doc in prep.items for ids, _ in doc],
              label_token_ids=list(label_ids))


def _hf_model(scorer, directory: pathlib.Path, first, label_ids, batch_size: int):
  """The scorer's checkpoint as a transformers model (float32, exported without any score head), and its label
  log-probs against the scorer's on the first query (max abs difference)."""
  import torch  # pylint: disable=import-outside-toplevel  (a benchmark-only dependency)
  import transformers  # pylint: disable=import-outside-toplevel
  from maxscore.bench import hf_baseline  # pylint: disable=import-outside-toplevel  (imports torch)
  from maxscore.checkpoints.export import export_hf_checkpoint  # pylint: disable=import-outside-toplevel
  if not scorer.config.runtime.checkpoint_dir:
    raise ValueError("hf_baseline needs a checkpoint (checkpoint_dir), which it exports for transformers")
  export_hf_checkpoint(scorer.config.runtime.checkpoint_dir, directory / "hf", drop_head=True)
  torch.set_num_threads(os.cpu_count())
  model = transformers.AutoModelForCausalLM.from_pretrained(directory / "hf", dtype=torch.float32).eval()
  if first is None:
    return model, None
  separator = scorer.config.scoring.separator_token_id
  want = hf_baseline.hf_label_logprobs(model, _request(first, label_ids), batch_size, separator)
  scorer.prefix_cache.clear()
  request = _request(first, label_ids)
  got = np.log(scorer.score(request["query"], request["items"], label_token_ids=request["label_token_ids"],
                            apply_softmax=False).scores)
  return model, dict(max_abs_label_logprob_diff=float(np.abs(got - want).max()), queries=1)


def _hf_mode(model, prepared, label_ids, batch_size: int, separator) -> dict[str, float]:
  from maxscore.bench import hf_baseline  # pylint: disable=import-outside-toplevel  (imports torch)
  t0 = time.perf_counter()
  for p in prepared:
    hf_baseline.hf_label_logprobs(model, _request(p, label_ids), batch_size, separator)
  return dict(loop_s=time.perf_counter() - t0)


def _records(report) -> list[dict]:
  path = report.output_dir / results_file.RESULTS_FILE
  return [json.loads(line) for line in path.read_text().splitlines()[1:]]


def summary(report: dict[str, Any]) -> str:
  lines = [f"{report['queries']} queries, {report['items']} items; tokenizing them alone: "
           f"{report['host_tokenize_s']:.2f} s; load average before {report['load_before']}, after "
           f"{report['load_after']}; best of {report['repeats']}"]
  for name, r in report["rows"].items():
    fin = f", final outputs {r['finalize_s']:.2f} s" if "finalize_s" in r else ""
    alone = f"  {r['of_model_alone']:6.1%} of the model alone" if r["of_model_alone"] is not None else ""
    hf = f"  {r['x_transformers']:.2f}x transformers" if "x_transformers" in r else ""
    lines.append(f"{name:42s} {r['items_per_s']:8.1f} items/s{alone}{hf}  (loop {r['loop_s']:.2f} s{fin})")
  if report.get("hf_check"):
    lines.append(f"transformers' label log-probs against maxscore's on the first query: max |diff| "
                 f"{report['hf_check']['max_abs_label_logprob_diff']:.2e}")
  return "\n".join(lines) + "\n"
