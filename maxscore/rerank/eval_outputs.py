"""What an eval writes once its queries are scored: the run files, the metrics and the summary from the
records in results.jsonl (input order), and the few lines the terminal shows (maxscore/rerank/eval.py runs
the loop that writes those records)."""

import collections
import dataclasses
import json
import os
import pathlib
from typing import Any, Mapping, Optional, Sequence

import jax

from maxscore import console
from maxscore.config import to_flat_dict
from maxscore.datasets import data
from maxscore.datasets.data import RerankSet
from maxscore.files import safety
from maxscore.rerank import first_stage, fusion, metrics, stages
from maxscore.scoring.scorer import Scorer


@dataclasses.dataclass(frozen=True)
class EvalReport:
  """Aggregate metrics, per-query metrics and the run summary (also written to output_dir)."""
  metrics: dict[str, float]
  per_query: dict[str, dict[str, float]]
  summary: dict[str, Any]
  output_dir: pathlib.Path
  first_stage: dict[str, float] = dataclasses.field(default_factory=dict)  # baseline means, same queries
  comparison: Optional[stages.Stages] = None  # first stage, reranked, fused: means and tests



def write_json(path: pathlib.Path, obj: Any) -> None:
  safety.atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


def finalize(dataset: RerankSet, queries, done, cfg: Any, out: pathlib.Path,
              dev: Optional[stages.DevSplit] = None, key: str = "") -> EvalReport:
  """run.trec, first_stage.trec, fusion.trec, metrics_per_query.jsonl and metrics.json from the results,
  in input order."""
  run, lines = {}, []
  for q in queries:
    rec = done.get(q.qid)
    if rec is None or not rec["docids"]:
      continue
    run[q.qid] = dict(zip(rec["docids"], rec["scores"]))
    lines.extend(data.trec_lines(q.qid, rec["docids"], rec["scores"], cfg.run_tag))
  safety.atomic_write_text(out / "run.trec", "".join(l + "\n" for l in lines))
  per_query = metrics.evaluate(dataset.qrels, run, cfg.metrics)
  ordered = {q.qid: per_query[q.qid] for q in queries if q.qid in per_query}
  safety.atomic_write_text(out / "metrics_per_query.jsonl",
                           "".join(json.dumps({"qid": qid, **values}) + "\n" for qid, values in ordered.items()))
  names = [metrics.canonical_name(m) for m in cfg.metrics]
  means = metrics.aggregate(ordered) if ordered else {}
  means = {n: means[n] for n in dict.fromkeys(names) if n in means}
  base = first_stage.evaluate(dataset.qrels, queries, run, cfg.metrics)
  tmp = out / (first_stage.RUN_FILE + ".tmp")
  tmp.write_text("".join(l + "\n" for l in first_stage.trec_lines(base)), encoding="utf-8")
  os.replace(tmp, out / first_stage.RUN_FILE)
  compared = stages.evaluate(dataset.qrels, queries, run, ordered, base, cfg, dev)
  if compared.learned is not None:  # reusable: --fusion_learned=<this file> fuses without scoring dev again
    fusion.save_learned(out / fusion.LEARNED_FILE, compared.learned, key)
  if compared.fused_run is not None:
    safety.atomic_write_text(out / stages.RUN_FILE, "".join(
        l + "\n" for l in stages.trec_lines(compared.fused_run, [q.qid for q in queries])))
  write_json(out / "metrics.json", {"metrics": means, "num_queries": len(ordered), "first_stage": base.means,
                                     "delta": base.delta(means), **compared.to_json()})
  return EvalReport(means, ordered, {}, out, base.means, compared)


def summary(scorer: Scorer, dataset: RerankSet, queries, done, cfg: Any, label_ids, resumed: int,
             means: Mapping[str, float], evaluated: int, wall: float) -> dict[str, Any]:
  recs = [done[q.qid] for q in queries if q.qid in done]
  items = sum(len(r["docids"]) for r in recs)
  seconds = sum(r["seconds"] for r in recs)
  warm = [r for r in recs if not r["compiled"]]
  warm_items, warm_s = sum(len(r["docids"]) for r in warm), sum(r["seconds"] for r in warm)
  tokens = sum(r["prompt_tokens"] for r in recs)
  flat = {k: list(v) if isinstance(v, tuple) else v for k, v in to_flat_dict(scorer.config).items()}
  return {
      "model": scorer.model_name,
      "checkpoint_dir": scorer.config.runtime.checkpoint_dir,
      "head": scorer.head_fingerprint,
      "adapters": scorer.adapters,
      "quantization": _quantization(scorer),
      "backend": jax.default_backend(),
      "devices": [str(d) for d in jax.devices()],
      "data": dataset.source,
      "skipped": dataset.skipped,
      "eval_config": {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(cfg).items()},
      "label_ids": list(label_ids),
      "queries": len(queries),
      "queries_scored": len(recs),
      "queries_resumed": resumed,
      "queries_without_candidates": sum(not q.candidates for q in queries),
      "queries_evaluated": evaluated,
      "items": items,
      "prompt_tokens": tokens,
      "processed_tokens": sum(r["processed_tokens"] for r in recs),
      "listwise": _listwise_summary(cfg, recs),
      "algorithms": dict(sorted(collections.Counter(r["algorithm"] for r in recs).items())),
      "truncation": {"max_query_tokens": cfg.max_query_tokens,
                     "queries_truncated": sum(r["query_truncated"] for r in recs),
                     "max_item_tokens": cfg.max_item_tokens,
                     "items_truncated": sum(r["items_truncated"] for r in recs)},
      "scoring_seconds": seconds,
      "items_per_s": items / seconds if seconds else None,
      "tokens_per_s": tokens / seconds if seconds else None,
      "items_per_s_warm": warm_items / warm_s if warm_s else None,
      "queries_that_compiled": len(recs) - len(warm),
      "compiled_shapes": len(scorer.runner.compiled_shapes),
      "wall_seconds": wall,
      "metrics": dict(means),
      "config": flat,
  }


def _quantization(scorer: Scorer) -> str:
  """The weights' quantization as scored: "none", or the mode with its group size when grouped."""
  rt = scorer.config.runtime
  group = rt.quantization_group_size
  return rt.quantization if rt.quantization == "none" or not group else f"{rt.quantization} (groups of {group})"


def model_line(summary: Mapping[str, Any]) -> str:
  """The model as scored, for the console: the checkpoint's name, the adapters merged into it, a trained score
  head and the weights' quantization (an eval with any of them is not the base model's)."""
  line = summary["model"]
  adapters = summary.get("adapters")
  if adapters:
    line += f" + LoRA adapters {adapters['dir']} (rank {adapters['rank']})"
  head = summary.get("head")
  if head:
    line += f" + trained {head['config']['kind']} score head"
  quantization = summary.get("quantization", "none")
  if quantization != "none":
    line += f", {quantization} quantized"
  return line


def _listwise_summary(cfg: Any, recs: Sequence[Mapping[str, Any]]) -> Optional[dict[str, Any]]:
  """The listwise stage's settings and cost: forward sequences (one per window or set) and their tokens, in all
  and per query scored; None for reranker=pointwise."""
  if cfg.reranker == "pointwise":
    return None
  forwards = sum(r.get("listwise_forwards", 0) for r in recs)
  tokens = sum(r.get("listwise_tokens", 0) for r in recs)
  per = lambda x: x / len(recs) if recs else None
  return {"reranker": cfg.reranker, "window": cfg.listwise_window, "stride": cfg.listwise_stride,
          "top_k": cfg.listwise_top_k, "forwards": forwards, "tokens": tokens, "forwards_per_query": per(forwards),
          "tokens_per_query": per(tokens),
          "pointwise_tokens_per_query": per(sum(r["prompt_tokens"] for r in recs))}


def _first_stage_name(source: Mapping[str, Any]) -> str:
  """"first stage (<run file name>)" for a TREC run, "first stage (given order)" for the JSONL form."""
  run_file = source.get("run_file")
  return f"first stage ({pathlib.Path(run_file).stem})" if run_file else "first stage (given order)"


def format_report(report: EvalReport) -> str:
  """A few lines for the terminal: metrics, throughput, algorithms."""
  s = report.summary
  resumed = f" ({s['queries_resumed']} resumed from results.jsonl)" if s["queries_resumed"] else ""
  lines = [f"model {model_line(s)} on {s['backend']}: {s['queries_evaluated']} queries evaluated{resumed}, "
           f"{s['items']} candidates, outputs in {report.output_dir}"]
  lines += stages.table(report.comparison, _first_stage_name(s["data"]))
  rate = console.rate
  lines.append(f"  items/s {rate(s['items_per_s'])} (warm {rate(s['items_per_s_warm'])}), tokens/s "
               f"{rate(s['tokens_per_s'])}, wall {s['wall_seconds']:.1f} s, "
               f"{console.count(s['queries_that_compiled'], 'query', 'queries')} compiled")
  lines.append("  algorithm " + ", ".join(f"{k} x{v}" for k, v in s["algorithms"].items()))
  lw = s.get("listwise")
  if lw and lw["forwards_per_query"] is not None:
    lines.append(f"  {lw['reranker']} over the pointwise top {lw['top_k'] or 'all'}: {lw['forwards_per_query']:.1f} "
                 f"forwards and {lw['tokens_per_query']:,.0f} tokens per query (pointwise "
                 f"{lw['pointwise_tokens_per_query']:,.0f})")
  if "score_cache" in s:
    c = s["score_cache"]
    lines.append(f"  score cache: {c['hits']} pairs read, {c['misses']} scored and added ({c['dir']})")
  t = s["truncation"]
  if t["queries_truncated"] or t["items_truncated"]:
    lines.append(f"  truncated: {console.count(t['queries_truncated'], 'query', 'queries')} (> "
                 f"{t['max_query_tokens']} tokens), {console.count(t['items_truncated'], 'document', 'documents')} "
                 f"(> {t['max_item_tokens']} tokens)")
  if s["skipped"]:
    lines.append("  skipped input: " + ", ".join(f"{k} {v}" for k, v in s["skipped"].items()))
  return "\n".join(lines)
