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
import json
import os
import pathlib
import time
from typing import Any, Literal, Mapping, Optional, Sequence

import jax
import numpy as np
from absl import logging
from tqdm import tqdm

from maxscore.checkpoints import packaged
from maxscore.datasets import data
from maxscore.rerank import eval_outputs, first_stage, fusion, listwise, pipeline, prompts, stages
from maxscore.rerank.eval_outputs import EvalReport, format_report  # noqa: F401  (this module's public face)
from maxscore import errors, interrupt
from maxscore.datasets.data import RerankSet
from maxscore.distributed import mesh as mesh_lib
from maxscore.files import identity, safety
from maxscore.rerank.score_cache import ScoreCache, scorer_key
from maxscore.scoring.scorer import Scorer

RESULTS_FILE = "results.jsonl"
OUTPUT_FILES = (RESULTS_FILE, "run.trec", "metrics_per_query.jsonl", "metrics.json", "summary.json",
                first_stage.RUN_FILE, stages.RUN_FILE)
FORMAT_VERSION = 1


RESTART = "pass --overwrite to start over, or use a new --output_dir"


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
      raise data.DataError(f"reranker={self.reranker!r} is not one of ['pointwise', "
                           f"{', '.join(repr(k) for k in listwise.LISTWISE_TEMPLATES)}]")
    smallest = 2 if self.reranker == "setwise" else 1
    if not smallest <= self.listwise_window <= len(listwise.LETTERS):
      raise data.DataError(f"listwise_window={self.listwise_window} must be in [{smallest}, {len(listwise.LETTERS)}] "
                           "(one identifier A..Z per passage)")
    if self.listwise_stride < 1 or (self.reranker == "first" and self.listwise_stride > self.listwise_window):
      raise data.DataError(f"listwise_stride={self.listwise_stride} must be in [1, listwise_window] (reranker=first "
                           "moves windows that overlap or touch)")
    for name in ("listwise_top_k", "listwise_passage_tokens", "listwise_window_tokens"):
      if getattr(self, name) < 0:
        raise data.DataError(f"{name}={getattr(self, name)} must be >= 0")
    if self.passage_tokens < 0 or self.passage_stride < 0:
      raise data.DataError(f"passage_tokens={self.passage_tokens} and passage_stride={self.passage_stride} must be "
                           ">= 0")
    if self.passage_stride and not self.passage_tokens:
      raise data.DataError(f"passage_stride={self.passage_stride} needs passage_tokens > 0")
    if self.passage_stride > self.passage_tokens:
      raise data.DataError(f"passage_stride={self.passage_stride} above passage_tokens={self.passage_tokens} would "
                           "skip text between passages")
    if self.aggregate not in AGGREGATES:
      raise data.DataError(f"aggregate={self.aggregate!r} is not one of {sorted(AGGREGATES)}")
    try:
      fusion.check(self.fusion, self.fusion_alpha, self.rrf_k)
      if self.fusion_learned:
        if self.fusion != "learned":
          raise fusion.FusionError(f"fusion_learned={self.fusion_learned!r} is read by fusion=learned only "
                                   f"(fusion={self.fusion!r})")
        fusion.load_learned(self.fusion_learned)
    except fusion.FusionError as e:
      raise data.DataError(str(e)) from None
    if self.max_queries < 0:
      raise data.DataError(f"max_queries={self.max_queries} must be >= 0")
    if not self.run_tag or any(c.isspace() for c in self.run_tag):
      raise data.DataError(f"run_tag={self.run_tag!r} must be one word")
    return self


# How a document's ranking score comes from its passages' (passage_tokens > 0): BERT-MaxP / FirstP / SumP.
AGGREGATES = {"maxp": max, "firstp": lambda scores: scores[0], "sump": sum}


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
      raise data.DataError(f"rerank_top_k={self.rerank_top_k} must be >= 0")
    if self.gather_every < 1:
      raise data.DataError(f"gather_every={self.gather_every} must be >= 1")
    if self.packaged_reranker and (self.checkpoint_dir or self.adapters_dir):
      raise data.DataError(f"packaged_reranker={self.packaged_reranker} names its own base and adapters: give it "
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
    raise data.DataError(f"{what} tunes on the dev split, so --split={run.split} cannot be evaluated "
                         "with it; give a number or evaluate another split")
  try:
    return dataset, data.load_rerank_set(*sources, "dev", run.rerank_top_k, run.skip_bad)
  except data.DataError as e:
    raise data.DataError(f"{what} needs a dev split: {e}") from None


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


def _load_results(path: pathlib.Path, header: Mapping[str, Any]) -> dict[str, dict]:
  """Finished queries from results.jsonl (its first line is the header); a torn last line
  (the previous run was killed while writing it) is cut off."""
  header_line = json.dumps({"header": header}, sort_keys=True) + "\n"
  raw = path.read_bytes() if path.exists() else b""
  if b"\n" not in raw:  # new, or killed before the header was complete
    path.write_text(header_line, encoding="utf-8")
    return {}
  lines = raw.split(b"\n")
  try:
    stored = json.loads(lines[0]).get("header")
  except (ValueError, AttributeError, RecursionError):  # not JSON, not UTF-8, not an object
    stored = None
  if stored is not None and stored != header and not raw[len(lines[0]) + 1:].strip():
    # An eval of other settings that stopped before its first result: nothing of it is lost by starting anew.
    logging.info("%s: holds no result of the run it was started for (other settings); starting this one", path)
    path.write_text(header_line, encoding="utf-8")
    return {}
  identity.check_same(stored, header, path, RESTART)
  done, good_bytes = {}, len(lines[0]) + 1
  for i, line in enumerate(lines[1:], 2):
    last = i == len(lines)  # the text after the final newline: empty unless a write was cut short
    if not last and not line.strip():
      good_bytes += len(line) + 1
      continue
    try:
      rec = None if last else json.loads(line)
      if rec is not None and not (isinstance(rec, dict) and {"qid", "digest", "docids", "scores"} <= set(rec)):
        raise ValueError("not a result record")
    except (ValueError, RecursionError):
      raise errors.ResumeError(f"{path}:{i}: corrupt line in the middle of the results; {RESTART}") from None
    if rec is not None:
      done[rec["qid"]] = rec
      good_bytes += len(line) + 1
  if good_bytes < len(raw):
    logging.warning("%s: dropping a torn last line (the previous run was killed while writing it)", path)
    with open(path, "r+b") as f:
      f.truncate(good_bytes)
  return done


# --- the eval loop -------------------------------------------------------------------------------
def _model_scores(scorer: Scorer, query_ids, item_ids, label_ids, cfg: prompts.PromptConfig, qid: str):
  """(ranking scores float32 [N], ScoreResult) of one score call over the items."""
  apply_softmax, rank_fn = prompts.SCORE_MODES[cfg.score_mode]
  scorer.prefix_cache.clear()
  try:
    if apply_softmax is None:
      result = scorer.label_logits(query_ids, item_ids, label_token_ids=label_ids)
    else:
      result = scorer.score(query_ids, item_ids, label_token_ids=label_ids, apply_softmax=apply_softmax)
  except errors.ScoreInputError as e:  # the eval's own prompt: name the query, and the flags that cut it
    raise errors.ScoreInputError(f"query {qid!r}: {e} (the eval cuts queries to --max_query_tokens="
                                 f"{cfg.max_query_tokens} and items to --max_item_tokens={cfg.max_item_tokens} "
                                 f"tokens; lower those, or raise the buckets)") from None
  if not np.isfinite(np.asarray(result.scores)).all():
    raise errors.ScoreInputError(f"query {qid!r}: the model produced non-finite scores (NaN or Inf); "
                                 f"check the checkpoint {scorer.config.runtime.checkpoint_dir} for non-finite weights")
  ranking = np.asarray(rank_fn(result.scores), np.float32)
  if np.isnan(ranking).any():
    raise errors.ScoreInputError(f"query {qid!r}: the ranking scores of score_mode={cfg.score_mode} are NaN")
  return ranking, result


@dataclasses.dataclass
class PreparedQuery:
  """A query's host work, done before its model work: token ids of the query and of every candidate's
  items (its passages, or itself), ready for one score call."""
  query: data.RerankQuery
  query_ids: list
  query_truncated: bool
  texts: list
  items: list       # per candidate: [(item token ids, truncated), ...]
  seconds: float    # the host work's own time


def prepare_query(builder: prompts.PromptBuilder, q: data.RerankQuery, cfg: prompts.PromptConfig) -> PreparedQuery:
  """Tokenizes the query and its candidates (the host half of score_query; safe in a worker thread)."""
  start = time.perf_counter()
  query_ids, query_truncated = builder.query(q.query)
  texts = [text for _, text in q.candidates]
  passage_tokens, aggregate = getattr(cfg, "passage_tokens", 0), getattr(cfg, "aggregate", "maxp")
  if passage_tokens:  # each document as its passages, scored as items of the query
    units = [builder.passages(text, passage_tokens, cfg.passage_stride, first_only=aggregate == "firstp")
             for text in texts]
  else:
    units = [[text] for text in texts]
  items = [[builder.item(u) for u in doc] for doc in units]
  return PreparedQuery(q, query_ids, query_truncated, texts, items, time.perf_counter() - start)


def score_prepared(scorer: Scorer, prep: PreparedQuery, label_ids, cfg: prompts.PromptConfig,
                   cache: Optional[ScoreCache] = None, write_cache: bool = True) -> dict[str, Any]:
  """One query's record for results.jsonl from its prepared ids: ranking scores of all its candidates from one
  score call (of the candidates `cache` does not hold; those it holds are its scores, and the new ones are
  added to it when `write_cache`). `seconds` is the host work plus this call."""
  start = time.perf_counter()
  q, items, texts = prep.query, prep.items, prep.texts
  aggregate = getattr(cfg, "aggregate", "maxp")
  compiled_before = len(scorer.runner.compiled_shapes)
  scores = cache.get(q.query, texts) if cache is not None else [None] * len(items)
  missing = [i for i, s in enumerate(scores) if s is None]
  algorithm, prompt_tokens, processed_tokens = "cache", 0, 0
  if missing:
    item_ids = [ids for i in missing for ids, _ in items[i]]
    ranking, result = _model_scores(scorer, prep.query_ids, item_ids, label_ids, cfg, q.qid)
    at = 0
    for i in missing:
      n = len(items[i])
      part = [float(s) for s in ranking[at:at + n]]
      scores[i] = part[0] if n == 1 else float(np.float32(AGGREGATES[aggregate](part)))
      at += n
    algorithm, prompt_tokens = result.algorithm, result.usage["prompt_tokens"]
    processed_tokens = result.usage["processed_tokens"]
    if cache is not None and write_cache:
      cache.put(q.query, [texts[i] for i in missing], [scores[i] for i in missing])
  usage = listwise.Usage()
  lw = cfg.listwise() if hasattr(cfg, "listwise") else None
  if lw is not None:
    scores = listwise_stage(scorer, q, scores, lw, cfg.listwise_top_k, usage)
  return {
      "qid": q.qid,
      "digest": q.digest(),
      "docids": [d for d, _ in q.candidates],
      "scores": scores,
      "algorithm": algorithm,
      "prompt_tokens": prompt_tokens,
      "processed_tokens": processed_tokens,
      "query_truncated": prep.query_truncated,
      "items_truncated": sum(t for doc in items for _, t in doc),
      "passages": sum(len(doc) for doc in items),
      "seconds": prep.seconds + time.perf_counter() - start,
      "compiled": len(scorer.runner.compiled_shapes) > compiled_before,
      "cached": len(items) - len(missing),
      "listwise_forwards": usage.forwards,
      "listwise_tokens": usage.tokens,
  }


def score_query(scorer: Scorer, builder: prompts.PromptBuilder, q: data.RerankQuery, label_ids,
                cfg: prompts.PromptConfig, cache: Optional[ScoreCache] = None,
                write_cache: bool = True) -> dict[str, Any]:
  """prepare_query then score_prepared: one query's record for results.jsonl, host and model work in turn."""
  return score_prepared(scorer, prepare_query(builder, q, cfg), label_ids, cfg, cache, write_cache)


def listwise_stage(scorer: Scorer, q: data.RerankQuery, scores: Sequence[float], cfg: listwise.ListwiseConfig,
                   top_k: int, usage: listwise.Usage) -> list[float]:
  """The query's candidates with the pointwise top `top_k` (0 = all) reordered by the listwise stage.

  A listwise stage gives an order, not scores: every candidate's score becomes n - rank (n candidates; the best
  n, the last 1), the listwise order over the head and the pointwise order below it (equal pointwise scores
  in first-stage order), so run.trec, the metrics and the fusion read it as any reranked run. The stage reads
  the model's label log-probs, never a trained score head's."""
  n = len(scores)
  pointwise = sorted(range(n), key=lambda i: (-scores[i], i))
  head = pointwise[:top_k] if top_k > 0 else pointwise
  backbone = getattr(scorer, "scorer", scorer)  # HeadScorer: its backbone
  backbone.prefix_cache.clear()
  (order,) = listwise.listwise_rerank(backbone, [q.query], [[q.candidates[i][1] for i in head]], cfg, usage)
  final = [head[i] for i in order] + pointwise[len(head):]
  out = [0.0] * n
  for rank, i in enumerate(final):
    out[i] = float(n - rank)
  return out


def _resume_state(scorer, cfg, label_ids, queries, out: pathlib.Path, overwrite: bool,
                  inputs: Sequence[Any]) -> dict[str, dict]:
  """Process 0's finished records from results.jsonl (after --overwrite and the digest check)."""
  safety.refuse_overlap([out / name for name in OUTPUT_FILES], inputs, "an output file in --output_dir")
  safety.prepare_output_dir(out, "eval", inputs, "--output_dir")
  results_path = out / RESULTS_FILE
  if overwrite and results_path.exists():
    results_path.unlink()
  done = _load_results(results_path, run_fingerprint(scorer, cfg, label_ids))
  for q in queries:
    if q.qid in done and done[q.qid]["digest"] != q.digest():
      raise errors.ResumeError(f"{results_path} has query {q.qid!r} scored on other text or candidates "
                               f"(changed: data); {RESTART}")
  return done


def _agreed_resume_state(scorer, cfg, label_ids, queries, out: pathlib.Path, overwrite: bool,
                         inputs: Sequence[Any]) -> dict[str, dict]:
  """`_resume_state` on process 0 ({} on the others); an error there is raised in every process."""
  done, error = {}, None
  if jax.process_index() == 0:
    try:
      done = _resume_state(scorer, cfg, label_ids, queries, out, overwrite, inputs)
    except (errors.ResumeError, errors.UnsafeOutputError, OSError) as e:
      error = e
  message = mesh_lib.broadcast_from_process0(None if error is None else str(error))
  if error is not None:
    raise error
  if message is not None:  # the other processes stop with process 0's error
    raise errors.ResumeError(message)
  return done


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
  results_path = out / RESULTS_FILE
  lead = jax.process_index() == 0
  group = mesh_lib.my_group(scorer.config.mesh)
  template = prompts.get_template(cfg.template)
  label_ids = prompts.resolve_labels(scorer.tokenizer, cfg.labels or template.default_labels)
  builder = prompts.PromptBuilder(scorer.tokenizer, template, cfg.instruction, cfg.max_query_tokens,
                                  cfg.max_item_tokens)
  key = scorer_key(score_fingerprint(scorer, cfg, label_ids))
  if cfg.fusion_learned and lead and fusion.learned_scorer_key(cfg.fusion_learned) not in ("", key):
    logging.warning("fusion_learned=%s was tuned on the scores of another scorer (model, tokenizer, head, dtypes, "
                    "scoring or kernel settings differ from this run's): its weights fit that scorer's scores",
                    cfg.fusion_learned)
  queries = dataset.queries[:cfg.max_queries] if cfg.max_queries else dataset.queries
  dev_queries = stages.dev_queries(queries, dev, cfg.fusion, cfg.fusion_alpha, cfg.max_queries,
                                   cfg.fusion_learned)
  inputs = [*data.input_paths(dataset), scorer.config.runtime.checkpoint_dir, getattr(scorer.tokenizer, "path", None)]
  done = _agreed_resume_state(scorer, cfg, label_ids, queries + dev_queries, out, overwrite, inputs)
  safety.claim(out)  # every check passed: the run's log may now be written there
  done_ids = set(mesh_lib.broadcast_from_process0(sorted(done) if lead else None))
  todo = [q for q in queries + dev_queries if q.qid not in done_ids and q.candidates]
  resumed = sum(q.qid in done_ids for q in queries + dev_queries)
  if lead:
    logging.info("eval: %d queries (%d candidates), %d already in %s, %d to score over %d data group(s); "
                 "labels %s, template %s", len(queries), sum(len(q.candidates) for q in queries), resumed,
                 results_path, len(todo), group.count, list(label_ids), cfg.template)
  mine = [todo[i] for i in mesh_lib.query_slice(len(todo), group.index, group.count)]
  cache = ScoreCache.open(score_cache, score_fingerprint(scorer, cfg, label_ids)) if score_cache else None
  mesh_lib.sync("eval: score cache loaded")  # every process loads it before any writes: all decide alike
  items_done, seconds = 0, 0.0
  # Pipelined (maxscore/rerank/pipeline.py): one thread tokenizes the next queries, another appends finished
  # records in order, while this one runs the model.
  prepare = lambda q: prepare_query(builder, q, cfg)
  prepared = pipeline.prefetched(prepare, mine, depth=2) if pipelined else map(prepare, mine)
  with interrupt.stop_points(), open(results_path, "a", encoding="utf-8") if lead else contextlib.nullcontext() as f, \
      tqdm(total=len(todo) + resumed, initial=resumed, unit="query", disable=not (progress and lead),
           dynamic_ncols=True, desc="eval") as bar, pipeline.OrderedWriter(
          lambda rec: _append(f, rec, fsync, results_path), threaded=pipelined) as writer, \
          contextlib.closing(prepared) if pipelined else contextlib.nullcontext():
    for r0 in range(0, mesh_lib.num_rounds(len(todo), group.count), gather_every):
      if interrupt.requested():  # a safe point: the records before are written (the writer finishes them)
        raise errors.Interrupted(f"stopped (Ctrl-C) after {len(done)} of {len(todo) + resumed} queries; "
                                 f"{stop_note(out)}")
      recs = []
      for _ in mine[r0:r0 + gather_every]:
        t0 = time.perf_counter()
        prep = next(prepared)
        rec = score_prepared(scorer, prep, label_ids, cfg, cache, write_cache=group.is_leader)
        # the loop's time for this query: waiting for its prepared ids (0 when they came ahead) plus the call
        rec["seconds"] = time.perf_counter() - t0
        recs.append(rec)
      for rec in mesh_lib.gather_to_process0(recs, contribute=group.is_leader) or []:
        writer.submit(rec)
        done[rec["qid"]] = rec
        items_done, seconds = items_done + len(rec["docids"]), seconds + rec["seconds"]
        bar.set_postfix_str(f"{items_done / max(seconds, 1e-9):.0f} items/s, {rec['algorithm']}", refresh=False)
        bar.update(1)
        interrupt.planted(f"eval:{len(done)}")  # a test's Ctrl-C once this many queries are done
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
  summary["first_stage_metrics"] = report.first_stage
  summary["delta"] = {n: v - report.first_stage[n] for n, v in report.metrics.items() if n in report.first_stage}
  summary |= report.comparison.to_json()
  summary["dev_queries_scored"] = len(dev_queries)
  if cache is not None:  # this process's counts (process 0's data group)
    summary["score_cache"] = cache.report()
  summary["data_groups"] = group.count
  summary["processes"] = jax.process_count()
  eval_outputs.write_json(out / "summary.json", summary)
  logging.info("eval: wrote %s", ", ".join(str(out / n) for n in
                                          ("run.trec", "metrics.json", "metrics_per_query.jsonl", "summary.json")))
  return dataclasses.replace(report, summary=summary)


def stop_note(output_dir: os.PathLike) -> str:
  """Where an eval stopped by Ctrl-C stands (maxscore/interrupt.py): what its results.jsonl keeps."""
  path = pathlib.Path(output_dir) / RESULTS_FILE
  if not path.is_file():
    return f"nothing was written to {output_dir}"
  return f"{path} keeps every query scored: run the same command to resume"


def _append(f, rec: dict, fsync: bool, path: pathlib.Path) -> None:
  """One finished query's record, flushed (a full disk is an error naming the file)."""
  try:
    f.write(json.dumps(rec, allow_nan=False) + "\n")
    f.flush()
    if fsync:
      os.fsync(f.fileno())
  except OSError as e:
    raise safety.with_path(e, path) from None
