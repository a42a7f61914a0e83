"""Reranker evaluation: score every query's candidates, write a reranked run and trec_eval metrics.

    scorer = loading.build_scorer(None, [])              # maxscore/scoring/loading.py
    report = run_eval(scorer, data.load_jsonl(data.DEFAULT_JSONL), EvalConfig(), "out/eval")

One `Scorer.score` call per query scores all its candidates with the scorer's fast path.
Each finished query is appended to `<output_dir>/results.jsonl` and flushed, so a killed run
loses nothing: started again, it skips the queries already there. The final files are
written from results.jsonl in input order, so they are byte-identical to an uninterrupted
run's. The prefix cache is cleared before each query, so the algorithm the selector picks
(and with it every float) depends only on the query's geometry, never on what ran before.

Outputs in `output_dir`: results.jsonl (resume state), run.trec (reranked TREC run),
first_stage.trec (the ranking it started from, same queries and depth), fusion.trec (the two fused,
unless fusion=none), metrics_per_query.jsonl, metrics.json (means over evaluated queries: reranked,
first stage, fused, the deltas and the paired tests against the first stage; maxscore/rerank/stages.py),
summary.json (written by maxscore/rerank/eval_outputs.py, which also formats the terminal's report).

`score_jsonl` is the batch form of the /v1/score API behind scripts/score.py.
"""

import contextlib
import dataclasses
import os
import pathlib
import time
from typing import Any, Literal, Optional, Sequence

import jax
from absl import logging
from tqdm import tqdm

from maxscore.checkpoints import packaged
from maxscore.datasets import data
from maxscore.rerank import (eval_outputs, first_stage, fusion, listwise, pipeline, prompts, query_scoring,
                             results_file, stages)
from maxscore.rerank.eval_outputs import EvalReport, format_report  # noqa: F401  (this module's public face)
from maxscore import console, errors, interrupt
from maxscore.datasets.data import RerankSet
from maxscore.distributed import mesh as mesh_lib
from maxscore.errors import DataError
from maxscore.files import identity, safety
from maxscore.rerank.score_cache import ScoreCache, scorer_key
from maxscore.scoring.scorer import Scorer

OUTPUT_FILES = (results_file.RESULTS_FILE, "run.trec", "metrics_per_query.jsonl", "metrics.json", "summary.json",
                first_stage.RUN_FILE, stages.RUN_FILE)
FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class EvalConfig(prompts.PromptConfig):
  """The eval's own knobs: its prompts, plus the run file's tag and a query limit (the scorer's
  knobs come from configs/base.yml)."""
  run_tag: str = "maxscore"                # last column of run.trec
  max_queries: int = 0                     # evaluate only the first N queries; 0 = all
  fusion: Literal["none", "interpolate", "rrf", "learned"] = "rrf"  # fusion.trec: the reranked run fused with the first stage
  fusion_alpha: str = "dev"                # interpolate's weight of the reranker: a number in [0, 1], or "dev" (tuned)
  rrf_k: float = 60.0                      # rrf's k
  fusion_learned: str = ""                 # fusion=learned: a learned_fusion.json an eval wrote, used instead of tuning on dev
  passage_tokens: int = 0                  # split documents into passages of this many tokens; 0 = whole documents
  passage_stride: int = 0                  # a passage starts every this many tokens; 0 = passage_tokens (no overlap)
  aggregate: Literal["maxp", "firstp", "sump"] = "maxp"  # a document's score from its passages' ranking scores
  reranker: Literal["pointwise", "first", "setwise"] = "pointwise"  # a listwise stage after the pointwise scores
  listwise_window: int = 20                # first: passages per window; setwise: passages per set
  listwise_stride: int = 10                # first: positions a window moves up
  listwise_top_k: int = 20                 # the listwise stage reranks the pointwise top k (0 = all)
  listwise_passage_tokens: int = 128       # each passage in a window is cut to this many tokens
  listwise_window_tokens: int = 4096       # a window prompt's token budget (passages cut further to fit); 0 = none
  listwise_chat: Optional[bool] = None     # the window prompt is a chat user turn; None: when the tokenizer has a template

  def listwise(self) -> Optional[listwise.ListwiseConfig]:
    """The listwise stage's settings (None for reranker=pointwise); it sorts the whole head it is given."""
    if self.reranker == "pointwise":
      return None
    return listwise.ListwiseConfig(self.reranker, self.listwise_window, self.listwise_stride, 0,
                                   max_passage_tokens=self.listwise_passage_tokens,
                                   max_window_tokens=self.listwise_window_tokens, chat=self.listwise_chat,
                                   max_query_tokens=self.max_query_tokens)

  def validate(self) -> "EvalConfig":
    super().validate()
    if self.reranker not in ("pointwise", *listwise.LISTWISE_TEMPLATES):
      raise DataError(f"reranker={self.reranker!r} is not one of ['pointwise', "
                           f"{', '.join(repr(k) for k in listwise.LISTWISE_TEMPLATES)}]")
    if not 2 <= self.listwise_window <= len(listwise.LETTERS):
      raise DataError(f"listwise_window={self.listwise_window} must be in [2, {len(listwise.LETTERS)}] (one "
                      "identifier A..Z per passage; a window of one passage orders nothing)")
    if self.listwise_stride < 1 or (self.reranker == "first" and self.listwise_stride > self.listwise_window):
      raise DataError(f"listwise_stride={self.listwise_stride} must be in [1, {self.listwise_window}] (at most "
                      f"listwise_window={self.listwise_window}: reranker=first moves windows that overlap or touch)")
    for name in ("listwise_top_k", "listwise_passage_tokens", "listwise_window_tokens"):
      if getattr(self, name) < 0:
        raise DataError(f"{name}={getattr(self, name)} must be >= 0")
    if self.passage_tokens < 0 or self.passage_stride < 0:
      raise DataError(f"passage_tokens={self.passage_tokens} and passage_stride={self.passage_stride} must be "
                           ">= 0")
    if self.passage_stride and not self.passage_tokens:
      raise DataError(f"passage_stride={self.passage_stride} needs passage_tokens > 0")
    if self.passage_stride > self.passage_tokens:
      raise DataError(f"passage_stride={self.passage_stride} above passage_tokens={self.passage_tokens} would "
                           "skip text between passages")
    if self.aggregate not in query_scoring.AGGREGATES:
      raise DataError(f"aggregate={self.aggregate!r} is not one of {sorted(query_scoring.AGGREGATES)}")
    try:
      fusion.check(self.fusion, self.fusion_alpha, self.rrf_k)
      if self.fusion_learned:
        if self.fusion != "learned":
          raise fusion.FusionError(f"fusion_learned={self.fusion_learned!r} is read by fusion=learned only "
                                   f"(fusion={self.fusion!r})")
        fusion.load_learned(self.fusion_learned)
    except fusion.FusionError as e:
      raise DataError(str(e)) from None
    if self.max_queries < 0:
      raise DataError(f"max_queries={self.max_queries} must be >= 0")
    if not self.run_tag or any(c.isspace() for c in self.run_tag):
      raise DataError(f"run_tag={self.run_tag!r} must be one word")
    return self


# How a document's ranking score comes from its passages' (passage_tokens > 0): BERT-MaxP / FirstP / SumP.


@dataclasses.dataclass(frozen=True)
class EvalRun:
  """What scripts/eval_rerank.py reads and writes (configs/eval.yml documents each key)."""
  checkpoint_dir: Optional[str] = None     # None = the embedded default model; "none" = random init
  adapters_dir: Optional[str] = None       # LoRA adapters saved beside checkpoint_dir, merged into it on load
  packaged_reranker: Optional[str] = None  # a packaged reranker (maxscore/checkpoints/packaged.py): its adapters and
                                           # head on a base converted from a registry package's GGUF, cached per user
  jsonl: Optional[str] = None
  data_dir: Optional[str] = None
  run_file: Optional[str] = None
  split: str = "test"
  rerank_top_k: int = 100                  # 0 = all
  skip_bad: bool = False
  output_dir: str = "out/eval"
  overwrite: bool = False
  use_head: bool = True
  progress: bool = True
  plot: bool = True
  fsync: bool = False
  gather_every: int = 1
  score_cache: Optional[str] = None        # a persistent score cache directory shared by runs; None = none

  def validate(self) -> "EvalRun":
    if self.rerank_top_k < 0:
      raise DataError(f"rerank_top_k={self.rerank_top_k} must be >= 0")
    if self.gather_every < 1:
      raise DataError(f"gather_every={self.gather_every} must be >= 1")
    if self.packaged_reranker and (self.checkpoint_dir or self.adapters_dir):
      raise DataError(f"packaged_reranker={self.packaged_reranker} names its own base and adapters: give it "
                           "without checkpoint_dir and adapters_dir")
    return self


def model_dirs(run: EvalRun, cfg: EvalConfig) -> tuple[Optional[str], Optional[str]]:
  """(checkpoint_dir, adapters_dir) to score with: as given, or a packaged reranker's cached base and its
  adapters, every shipped file and the prompt settings checked against its manifest."""
  if not run.packaged_reranker:
    return run.checkpoint_dir, run.adapters_dir
  _, meta = packaged.read_manifest(run.packaged_reranker)
  packaged.check_prompt(run.packaged_reranker, meta, dataclasses.asdict(cfg))
  base, adapters = packaged.resolve(run.packaged_reranker)
  return str(base), str(adapters)


def load_data(run: EvalRun, cfg: EvalConfig) -> tuple[RerankSet, Optional[RerankSet]]:
  """(the split to evaluate, the dev split when fusion_alpha=dev tunes on it) from the run's inputs; none
  given = the embedded default (its BEIR layout and BM25 run)."""
  sources = data.sources_or_default(run.jsonl, run.data_dir, run.run_file, "eval")
  dataset = data.load_rerank_set(*sources, run.split, run.rerank_top_k, run.skip_bad)
  if not fusion.needs_dev(cfg.fusion, cfg.fusion_alpha, cfg.fusion_learned):
    return dataset, None
  what = "fusion=learned" if cfg.fusion == "learned" else "fusion_alpha=dev"
  if run.split in ("dev", "all"):
    raise DataError(f"{what} tunes on the dev split, so --split={run.split} cannot be evaluated "
                         "with it; give a number or evaluate another split")
  try:
    return dataset, data.load_rerank_set(*sources, "dev", run.rerank_top_k, run.skip_bad)
  except DataError as e:
    raise DataError(f"{what} needs a dev split: {e}") from None


def resolve_listwise(cfg: EvalConfig, scorer: Scorer) -> EvalConfig:
  """`cfg` with the listwise prompt's form decided for this tokenizer (listwise_chat unset: chat when it has a
  template), its window prompts built once so that a tokenizer that cannot give them is refused before
  anything is written; the log names the form."""
  if cfg.reranker == "pointwise":
    return cfg
  chat = listwise.resolve_chat(scorer.tokenizer, cfg.listwise_chat)
  why = ("listwise_chat unset: the tokenizer has " + ("a" if chat else "no") + " chat template"
         if cfg.listwise_chat is None else f"listwise_chat={str(chat).lower()}")
  cfg = dataclasses.replace(cfg, listwise_chat=chat)
  listwise.window_prompts(scorer.tokenizer, cfg.listwise())
  if jax.process_index() == 0:
    logging.info("eval: the %s prompts are %s (%s)", cfg.reranker, listwise.prompt_form(chat), why)
  return cfg


# --- resume state ------------------------------------------------------------------------------
def score_fingerprint(scorer: Scorer, cfg: EvalConfig, label_ids: Sequence[int]) -> dict[str, Any]:
  """What a ranking score depends on besides the query and document texts (maxscore/files/identity.py): a
  restarted run must match it to reuse results, and the score cache keys on it. The data is checked per query
  (RerankQuery.digest in every record). Passage settings are named only when documents are split, so the
  fingerprint of a run without them is what it was before passages existed."""
  out = {
      "format_version": FORMAT_VERSION,
      "scorer": identity.scorer_identity(scorer),
      "template": cfg.template,
      "instruction": cfg.instruction,
      "label_ids": list(label_ids),
      "score_mode": cfg.score_mode,
      "max_tokens": [cfg.max_query_tokens, cfg.max_item_tokens],
  }
  if cfg.passage_tokens:
    out["passages"] = [cfg.passage_tokens, cfg.passage_stride, cfg.aggregate]
  return out


def run_fingerprint(scorer: Scorer, cfg: EvalConfig, label_ids: Sequence[int]) -> dict[str, Any]:
  """What a finished query's record depends on: the score fingerprint (the pointwise scores, which the score
  cache holds), and the listwise stage's settings when there is one (its order is not a per-pair score)."""
  out = score_fingerprint(scorer, cfg, label_ids)
  if getattr(cfg, "reranker", "pointwise") != "pointwise":
    out["listwise"] = {k: getattr(cfg, k) for k in ("reranker", "listwise_window", "listwise_stride", "listwise_top_k",
                                                     "listwise_passage_tokens", "listwise_window_tokens",
                                                     "listwise_chat")}
  return out




def run_eval(scorer: Scorer, dataset: RerankSet, cfg: EvalConfig, output_dir: os.PathLike, *,
             overwrite: bool = False, progress: bool = True, fsync: bool = False,
             gather_every: int = 1, dev: Optional[RerankSet] = None,
             score_cache: Optional[os.PathLike] = None, pipelined: bool = True) -> Optional[EvalReport]:
  """Scores every query not already in output_dir/results.jsonl, then writes the final outputs.

  Multi-process (docs/ARCHITECTURE.md section 8): every process calls this with the same arguments; process 0
  owns results.jsonl and the outputs, each data group scores a strided slice of the remaining
  queries, and records reach process 0 every `gather_every` queries.

  Args:
    scorer: the model that scores each query's candidates (one `Scorer.score` call per query).
    dataset: the queries, their first-stage candidates and qrels.
    cfg: prompts, labels, score mode, metrics, fusion and the query limit.
    output_dir: where results.jsonl (the resume state) and the outputs go; a directory of maxscore's own.
    overwrite: start over instead of resuming from results.jsonl.
    progress: show a progress bar (process 0).
    fsync: fsync results.jsonl after every query (its records then survive power loss).
    gather_every: queries each data group scores between gathers to process 0.
    dev: the dev split for fusion_alpha=dev: its queries are scored into the same results.jsonl and only
      tune the fusion's alpha; the reported metrics are `dataset`'s alone.
    score_cache: a score cache directory (maxscore/rerank/score_cache.py): pairs it holds are not scored
      again, new ones are added; None = no cache.
    pipelined: tokenize ahead and write behind in worker threads (docs/ARCHITECTURE.md section 11); False
      does each query's host and model work in turn (the benchmark's comparison).

  Returns:
    On process 0 the EvalReport (mean and per-query metrics, summary, first-stage and fused comparison);
    None on the other processes.

  Raises:
    ResumeError: results.jsonl was written by a different eval (scorer, prompts or data).
    UnsafeOutputError: output_dir is not maxscore's, or an output would overwrite an input.
    ScoreInputError: a query cannot be scored (named, with the flags that cut it).
  """
  cfg = resolve_listwise(cfg.validate(), scorer)
  wall_start = time.perf_counter()
  out = pathlib.Path(output_dir)
  lead = jax.process_index() == 0
  group = mesh_lib.my_group(scorer.config.mesh)
  builder, label_ids = prompts.prompt_and_labels(scorer.tokenizer, cfg.template, cfg.labels, cfg.instruction,
                                                 cfg.max_query_tokens, cfg.max_item_tokens)
  key = scorer_key(score_fingerprint(scorer, cfg, label_ids))
  if cfg.fusion_learned and lead:
    _check_fusion_scorer(cfg.fusion_learned, key)
  queries = dataset.queries[:cfg.max_queries] if cfg.max_queries else dataset.queries
  dev_queries = stages.dev_queries(queries, dev, cfg.fusion, cfg.fusion_alpha, cfg.max_queries,
                                   cfg.fusion_learned)
  inputs = [*data.input_paths(dataset), scorer.config.runtime.checkpoint_dir, getattr(scorer.tokenizer, "path", None)]
  done = results_file.agreed_resume_state(run_fingerprint(scorer, cfg, label_ids), queries + dev_queries, out,
                                          overwrite, inputs, OUTPUT_FILES)
  safety.claim(out)  # every check passed: the run's log may now be written there
  done_ids = set(mesh_lib.broadcast_from_process0(sorted(done) if lead else None))
  todo = [q for q in queries + dev_queries if q.qid not in done_ids and q.candidates]
  resumed = sum(q.qid in done_ids for q in queries + dev_queries)
  if lead:
    _log_start(queries, resumed, todo, out, group, label_ids, cfg)
  cache = ScoreCache.open(score_cache, score_fingerprint(scorer, cfg, label_ids)) if score_cache else None
  mesh_lib.sync("eval: score cache loaded")  # every process loads it before any writes: all decide alike
  loop = _Loop(scorer, builder, label_ids, cfg, cache, group, out, fsync, gather_every, pipelined, progress and lead)
  _score_all(loop, todo, resumed, done)
  if cache is not None:
    cache.close()
  if interrupt.requested():  # during the last query: every record is written, the outputs are left to a rerun
    raise errors.Interrupted(f"stopped (Ctrl-C) after {len(done)} of {len(todo) + resumed} queries; "
                             f"{stop_note(out)}")
  if not lead:
    return None
  report = eval_outputs.finalize(dataset, queries, done, cfg, out, stages.dev_split(dev, dev_queries, done), key)
  summary = eval_outputs.summary(scorer, dataset, queries, done, cfg, label_ids, resumed, report.metrics,
                                len(report.per_query), time.perf_counter() - wall_start)
  _complete_summary(summary, report, len(dev_queries), cache, group.count)
  eval_outputs.write_json(out / "summary.json", summary)
  logging.info("eval: wrote %s", ", ".join(str(out / n) for n in
                                          ("run.trec", "metrics.json", "metrics_per_query.jsonl", "summary.json")))
  return dataclasses.replace(report, summary=summary)


def _check_fusion_scorer(fusion_learned: str, key: str) -> None:
  """Warns when a learned fusion's weights were tuned on another scorer's scores (they fit that scorer's)."""
  if fusion.learned_scorer_key(fusion_learned) not in ("", key):
    logging.warning("fusion_learned=%s was tuned on the scores of another scorer (model, tokenizer, head, dtypes, "
                    "scoring or kernel settings differ from this run's): its weights fit that scorer's scores",
                    fusion_learned)


def _log_start(queries, resumed: int, todo, out: pathlib.Path, group: mesh_lib.DataGroup, label_ids,
               cfg: EvalConfig) -> None:
  """Process 0's opening lines: what there is to score, after a warning when the data group's batch axes span
  several devices (an eval call holds one query's few rows, which those axes replicate unless they divide)."""
  n = group.batch_devices
  if n > 1:
    logging.warning("eval: each data group splits a call's rows over data x fsdp = %d devices, and an eval call "
                    "holds one query's few rows: rows that do not divide %d are computed on each of those devices "
                    "(up to %dx the work). For throughput give each device (or tensor-parallel set) its own "
                    "process and put the data axis across processes (docs/pods-and-gpus.md)", n, n, n)
  logging.info("eval: %d queries (%d candidates), %d already in %s, %d to score over %d data group(s); "
               "labels %s, template %s", len(queries), sum(len(q.candidates) for q in queries), resumed,
               out / results_file.RESULTS_FILE, len(todo), group.count, list(label_ids), cfg.template)


@dataclasses.dataclass
class _Loop:
  """What scoring the remaining queries needs: the scorer and its prompts, this process's data group, and where
  and how finished records go (process 0 appends them to results.jsonl in `out`)."""
  scorer: Scorer
  builder: prompts.PromptBuilder
  label_ids: Sequence[int]
  cfg: EvalConfig
  cache: Optional[ScoreCache]
  group: Any
  out: pathlib.Path
  fsync: bool
  gather_every: int
  pipelined: bool
  progress: bool


def _score_all(loop: _Loop, todo: Sequence[data.RerankQuery], resumed: int, done: dict[str, dict]) -> None:
  """Scores this data group's strided slice of `todo`; every `gather_every` queries the records reach process 0,
  which appends them in order to results.jsonl and adds them to `done`. Ctrl-C stops at the next gather, the
  records before it written (maxscore/interrupt.py).

  Pipelined (maxscore/rerank/pipeline.py): one thread tokenizes the next queries, another appends finished
  records in order, while this one runs the model."""
  lead, group, cfg = jax.process_index() == 0, loop.group, loop.cfg
  results_path = loop.out / results_file.RESULTS_FILE
  mine = [todo[i] for i in mesh_lib.query_slice(len(todo), group.index, group.count)]
  items_done, seconds = 0, 0.0
  prepare = lambda q: query_scoring.prepare_query(loop.builder, q, cfg)
  prepared = pipeline.prefetched(prepare, mine, depth=2) if loop.pipelined else map(prepare, mine)
  with interrupt.stop_points(), open(results_path, "a", encoding="utf-8") if lead else contextlib.nullcontext() as f, \
      tqdm(total=len(todo) + resumed, initial=resumed, unit="query", disable=not loop.progress,
           dynamic_ncols=True, desc="eval") as bar, pipeline.OrderedWriter(
          lambda rec: results_file.append_record(f, rec, loop.fsync, results_path),
          threaded=loop.pipelined) as writer, \
          contextlib.closing(prepared) if loop.pipelined else contextlib.nullcontext():
    for r0 in range(0, mesh_lib.num_rounds(len(todo), group.count), loop.gather_every):
      if interrupt.requested():  # a safe point: the records before are written (the writer finishes them)
        raise errors.Interrupted(f"stopped (Ctrl-C) after {len(done)} of {len(todo) + resumed} queries; "
                                 f"{stop_note(loop.out)}")
      recs = []
      for begun, _ in enumerate(mine[r0:r0 + loop.gather_every], r0 + 1):
        interrupt.planted(f"query:{begun}")  # a test's signal as this process's begun-th query starts
        t0 = time.perf_counter()
        prep = next(prepared)
        rec = query_scoring.score_prepared(loop.scorer, prep, loop.label_ids, cfg, loop.cache,
                                           write_cache=group.is_leader)
        # the loop's time for this query: waiting for its prepared ids (0 when they came ahead) plus the call
        rec["seconds"] = time.perf_counter() - t0
        recs.append(rec)
      for rec in mesh_lib.gather_to_process0(recs, contribute=group.is_leader) or []:
        writer.submit(rec)
        done[rec["qid"]] = rec
        items_done, seconds = items_done + len(rec["docids"]), seconds + rec["seconds"]
        bar.set_postfix_str(f"{console.rate(items_done / max(seconds, 1e-9))} items/s, {rec['algorithm']}",
                            refresh=False)
        bar.update(1)
        interrupt.planted(f"eval:{len(done)}")  # a test's Ctrl-C once this many queries are done


def _complete_summary(summary: dict[str, Any], report: EvalReport, dev_queries: int, cache: Optional[ScoreCache],
                      data_groups: int) -> None:
  """Adds to summary.json's contents the first-stage comparison, the dev queries scored, the score cache's counts
  (this process's: process 0's data group) and the run's processes."""
  summary["first_stage_metrics"] = report.first_stage
  summary["delta"] = {n: v - report.first_stage[n] for n, v in report.metrics.items() if n in report.first_stage}
  summary |= report.comparison.to_json()
  summary["dev_queries_scored"] = dev_queries
  if cache is not None:
    summary["score_cache"] = cache.report()
  summary["data_groups"] = data_groups
  summary["processes"] = jax.process_count()


def stop_note(output_dir: os.PathLike) -> str:
  """Where an eval stopped by Ctrl-C stands (maxscore/interrupt.py): what its results.jsonl keeps."""
  path = pathlib.Path(output_dir) / results_file.RESULTS_FILE
  if not path.is_file():
    return f"nothing was written to {output_dir}"
  return f"{path} keeps every query scored: run the same command to resume"


