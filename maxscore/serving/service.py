"""The scoring side of the server: requests into TokenRequests, one batched model call per gathered
batch, warmup. No HTTP here (maxscore/serving/app.py puts this behind FastAPI).

/v1/score requests are checked by the Scorer's own validation (Scorer.validate: the same
ScoreInputError messages as scripts/score.py) and scored as Scorer.score scores them. /v1/rerank
builds its prompts with the eval's PromptBuilder, labels and SCORE_MODES (maxscore/rerank/prompts.py),
and, as the eval does, clears the prefix cache before each model call, so the algorithm (and every
float) depends only on the requests' geometry: the server ranks as eval_rerank.py ranks.
"""

import dataclasses
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

from maxscore.errors import ScoreInputError
from maxscore.rerank import prompts
from maxscore.scoring import model_names
from maxscore.scoring.requests import TokenRequest, validate_request
from maxscore.scoring.scorer import REQUEST_FIELDS, ScoreResult
from maxscore.serving import batching, schemas
from maxscore.serving.config import RerankPrompt, ServeConfig, ServeError
from maxscore.serving.metrics import ServerMetrics


@dataclasses.dataclass(frozen=True)
class Work:
  """One request for the worker: `raw` = the labels' raw logits (score mode raw_logit), else scores."""
  request: TokenRequest
  raw: bool = False


class ScoringService:
  """A scorer (Scorer or HeadScorer), its batch queue, the rerank prompt and the metrics."""

  def __init__(self, scorer: Any, cfg: ServeConfig, prompt: RerankPrompt = RerankPrompt()):
    self.scorer, self.cfg, self.prompt = scorer, cfg.validate(), prompt.validate()
    try:
      self.model_names = model_names.served_names(cfg.served_model_name, scorer.model_name)
    except ValueError as e:
      raise ServeError(str(e)) from None
    self.model_name = self.model_names[0]  # what responses report (vLLM's rule for several served names)
    self.apply_softmax, self.rank_fn = prompts.SCORE_MODES[prompt.score_mode]
    if self.apply_softmax is None and getattr(scorer, "head_config", None) is not None:
      raise ServeError("score_mode=raw_logit ranks by the backbone's raw label logits, which a score head does not "
                       "produce; start with --nouse_head or score_mode=p_first/log_odds")
    prompts.get_template(prompt.template)  # an unknown template is refused even where no prompt is built
    self.builder, self.label_ids = None, None
    if scorer.tokenizer is not None:  # without one, /v1/rerank answers 400 (it needs text)
      try:
        self.builder, self.label_ids = prompts.prompt_and_labels(
            scorer.tokenizer, prompt.template, prompt.labels, prompt.instruction, prompt.max_query_tokens,
            prompt.max_item_tokens)
      except ScoreInputError as e:
        raise ServeError(f"the rerank prompt cannot be built: {e}") from None
    self.metrics = ServerMetrics(lambda: self.queue.depth, lambda: scorer.runner.num_executables)
    self.queue = batching.BatchQueue(self.run_batch, cfg.max_batch_requests, cfg.max_batch_wait_ms / 1000,
                                     cfg.max_queue, on_batch=self.metrics.batch_requests.observe,
                                     is_warm=self.is_warm, compile=self.compile, split=self.split, merge=self.merge)

  # --- the worker thread -----------------------------------------------------------------------
  def _score(self, works: Sequence[Work]) -> list[ScoreResult]:
    out: list = [None] * len(works)
    for raw in (False, True):
      idx = [i for i, w in enumerate(works) if w.raw == raw]
      if not idx:
        continue
      reqs = [works[i].request for i in idx]
      results = self.scorer.label_logits_requests(reqs) if raw else self.scorer.score_requests(reqs)
      for i, res in zip(idx, results):
        out[i] = res
    return out

  def is_warm(self, works: Sequence[Work]) -> bool:
    """Whether run_batch(works) compiles nothing (a probe: host-side layouts only, no forward)."""
    return self.scorer.is_compiled(lambda: self._score(works))

  def compile(self, works: Sequence[Work]) -> None:
    """Builds what run_batch(works) runs, without running it; on the compiler thread, beside the worker."""
    self.scorer.compile_for(lambda: self._score(works))

  def split(self, work: Work) -> list[Work]:
    """A request of more than max_items_per_run items as parts of that many (the last one shorter), each with
    the whole query: the batch worker runs them in turns with other requests (batching.BatchQueue)."""
    n, items = self.cfg.max_items_per_run, work.request.items
    if not n or len(items) <= n:
      return [work]
    return [dataclasses.replace(work, request=dataclasses.replace(work.request, items=items[i:i + n]))
            for i in range(0, len(items), n)]

  @staticmethod
  def merge(work: Work, parts: Sequence[ScoreResult]) -> ScoreResult:
    """The parts' scores in item order; usage as one request (processed_tokens counts the query once per part)."""
    algorithms = list(dict.fromkeys(p.algorithm for p in parts))
    processed = sum(p.usage["processed_tokens"] for p in parts)
    usage = {"prompt_tokens": work.request.num_tokens, "processed_tokens": processed,
             "total_tokens": work.request.num_tokens}
    return ScoreResult(np.concatenate([p.scores for p in parts]), "+".join(algorithms), usage)

  def run_batch(self, works: Sequence[Work]) -> list[ScoreResult]:
    """Scores gathered requests with as few forwards as their shapes allow (Scorer.score_requests)."""
    start = time.perf_counter()
    self.scorer.prefix_cache.clear()  # as the eval: the algorithm depends on the geometry alone
    out = self._score(works)
    for w in works:
      self.metrics.items.inc(len(w.request.items))
      self.metrics.tokens.inc(w.request.num_tokens)
    self.metrics.batch_seconds.observe(time.perf_counter() - start)
    return out

  def warm(self, works: Sequence[Work]) -> None:
    """Runs each work stacked at every batch size the worker can gather (the batch buckets below
    max_batch_requests, and max_batch_requests), compiling what batches of that shape run."""
    limit = self.cfg.max_batch_requests
    for b in sorted({b for b in self.scorer.config.buckets.batch_buckets if b < limit} | {limit}):
      for work in works:
        self.run_batch([work] * b)

  def warmup(self, log: Optional[Callable[[str], None]] = None) -> dict[str, float]:
    """Runs the serving path once per configured geometry and batch bucket up to max_batch_requests,
    for both score outputs (/v1/rerank's and /v1/score's default apply_softmax=false), so requests of
    those shapes compile nothing. (Scorer.warmup compiles one output and no score head; running the
    path compiles exactly what requests run.) A geometry in buckets already warmed compiles nothing.
    `log` gets one progress line per geometry. Returns the executables built and the seconds spent."""
    start, before = time.perf_counter(), self.scorer.runner.num_executables
    labels = self.label_ids or (0, 1)
    kinds = {(self.apply_softmax is None, bool(self.apply_softmax)), (False, False)}
    shapes = [(q, n, length) for q in self.cfg.warmup_query_tokens for n in self.cfg.warmup_items
              for length in self.cfg.warmup_item_tokens if n and q + length]
    for i, (q, n, length) in enumerate(shapes, 1):
      t0, e0 = time.perf_counter(), self.scorer.runner.num_executables
      self.warm([Work(self.scorer.make_request([1] * q, [[1] * length] * n, labels, softmax and not raw), raw)
                 for raw, softmax in sorted(kinds)])
      if log is not None:
        log(f"warmup {i}/{len(shapes)}: query {q} tokens, {n} items of {length} tokens: "
            f"{self.scorer.runner.num_executables - e0} executables in {time.perf_counter() - t0:.1f} s")
    return {"executables": self.scorer.runner.num_executables - before, "seconds": time.perf_counter() - start}

  # --- requests (on the event loop) ---------------------------------------------------------------
  def score_work(self, body: dict[str, Any]) -> Work:
    """A /v1/score body as Work, with the Scorer's validation (and a score head's labels when none given)."""
    schemas.check_model(body, self.model_names)
    try:
      args = validate_request(body, REQUEST_FIELDS)
      if args["label_token_ids"] is None and getattr(self.scorer, "head_config", None) is not None:
        args["label_token_ids"] = self.scorer.head_config.label_token_ids  # as HeadScorer.score
      if isinstance(args["items"], list):
        schemas.check_items(len(args["items"]), self.cfg.max_items, "items")
      return Work(self.scorer.make_request(**args))
    except ScoreInputError as e:
      raise schemas.from_input_error(e) from None

  def rerank_work(self, body: dict[str, Any]) -> tuple[schemas.RerankRequest, Work]:
    """A /v1/rerank body as Work: the eval's prompt, labels and score mode (maxscore/rerank/eval.py)."""
    schemas.check_model(body, self.model_names)
    req = schemas.rerank_request(body, self.cfg.max_items)
    if self.builder is None:
      raise schemas.ApiError(400, "query and documents are text but this checkpoint has no tokenizer; /v1/rerank "
                                  "needs one (start the server with tokenizer_path=...)", "query")
    try:
      query_ids, _ = self.builder.query(req.query)
      items = [self.builder.item(text)[0] for text in req.documents]
      token_req = self.scorer.make_request(query_ids, items, self.label_ids, bool(self.apply_softmax))
    except ScoreInputError as e:
      raise schemas.from_input_error(e) from None
    return req, Work(token_req, raw=self.apply_softmax is None)

  def ranking(self, result: ScoreResult) -> np.ndarray:
    """The eval's ranking score of each document (SCORE_MODES)."""
    ranking = np.asarray(self.rank_fn(result.scores), np.float32)
    if np.isnan(ranking).any():
      raise schemas.ApiError(500, "the model produced NaN scores")
    return ranking

  def models(self) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "maxscore",
                                        "max_items": self.cfg.max_items} for name in self.model_names]}

  def health(self) -> dict[str, Any]:
    return {"status": "ok", "model": self.model_name, "queue_depth": self.queue.depth}


def check_single_process(process_count: Optional[int] = None) -> None:
  """The server runs in one process (on all of its host's devices); multi-host serving is refused."""
  import jax  # pylint: disable=import-outside-toplevel
  count = jax.process_count() if process_count is None else process_count
  if count > 1:
    raise ServeError(f"serve.py runs in one process, but jax.distributed started {count}; start it without "
                     f"--num_processes/--coordinator_address (multi-host serving is not supported)")
