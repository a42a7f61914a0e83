"""The public entry: `Scorer` computes docs/ARCHITECTURE.md section 1's scores with any algorithm.

    scorer = Scorer.from_checkpoint("ckpt/")             # or Scorer.from_config(load_config(...))
    result = scorer.score("what is jax?", ["doc a", "doc b"], label_token_ids=[9454, 2753])
    result.scores                                         # [[p_yes, p_no], [p_yes, p_no]]
"""

import contextlib
import dataclasses
import functools
import os
import pathlib
import threading
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import numpy as np
from absl import logging

from layers import sharding
from layers.decoder import Decoder, init_params
from layers.kernels import get_kernel
from maxscore.checkpoints import adapters as adapters_lib
from maxscore.checkpoints import storage as checkpointing
from maxscore.checkpoints.tokenizer import Tokenizer, load_tokenizer
from maxscore.config import Config, from_flat_dict, load_config, to_flat_dict
from maxscore.distributed import mesh as mesh_lib
from maxscore.errors import ScoreInputError
from maxscore.files import cache, identity
from maxscore.scoring import selector
from maxscore.scoring.algorithms import ALGORITHMS, AlgorithmContext
from maxscore.scoring.prefix_cache import PrefixCache
from maxscore.scoring.requests import TokenRequest, make_request, validate_batch, validate_request
from maxscore.scoring.runner import ModelRunner, NotCompiled, label_logprobs

REQUEST_FIELDS = frozenset({"query", "items", "label_token_ids", "apply_softmax", "item_first", "model"})


def compilation_cache_path(setting: Optional[str], environ=os.environ) -> Optional[str]:
  """The persistent compilation cache directory a `compilation_cache_dir` setting names: "user" = jax/<host tag>
  in the per-user cache (maxscore/files/cache.py: MAXSCORE_CACHE_DIR, else $XDG_CACHE_HOME/maxscore, else
  ~/.cache/maxscore; the tag names the CPU kind, cache.host_tag), None or "none" = off, else the directory given.
  An explicit JAX_COMPILATION_CACHE_DIR in the environment wins (None: leave JAX's own setting)."""
  if environ.get("JAX_COMPILATION_CACHE_DIR") or setting in (None, "", "none"):
    return None
  if setting == "user":
    return str(cache.user_cache_dir(environ) / "jax" / cache.host_tag())
  return setting


def use_compilation_cache(setting: Optional[str]) -> None:
  """Points JAX's persistent compilation cache at the setting's directory (compilation_cache_path) and keeps every
  program there, however quickly it compiled (JAX keeps only those above 1 s by default, which makes a second
  run's start depend on how loaded the machine was during the first; JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS
  in the environment wins). A directory that cannot be made is a warning, and compiles are then not kept."""
  path = compilation_cache_path(setting)
  if path is None:
    return
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    logging.warning("compilation_cache_dir=%s: cannot use %s (%s); compiled programs are not kept", setting, path, e)
    return
  jax.config.update("jax_compilation_cache_dir", path)
  if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


@dataclasses.dataclass(frozen=True)
class ScoreResult:
  """Scores [N, K] (float32) for one request, the algorithm that computed them and token usage."""
  scores: np.ndarray
  algorithm: str
  usage: Mapping[str, int]

  def to_response(self, model: str) -> dict[str, Any]:
    """The sglang /v1/score response body."""
    return {"scores": self.scores.tolist(), "model": model, "usage": dict(self.usage), "object": "scoring"}


def finalize_scores(label_logprobs: np.ndarray, apply_softmax: bool) -> np.ndarray:
  """softmax over the label log-probs (rows sum to 1), or their exp (full-vocabulary probabilities)."""
  lp = np.asarray(label_logprobs, np.float32)
  if apply_softmax:
    if lp.size == 0:
      return lp
    e = np.exp(lp - lp.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)
  return np.exp(lp).astype(np.float32)


def checkpoint_config(metadata: checkpointing.CheckpointMetadata, overrides: Mapping[str, Any]) -> Config:
  """The scoring config of a checkpoint: base.yml, then `overrides` (flat config keys, parsed values), then the
  checkpoint's model config and directory. A checkpoint stored quantized (int8) scores with
  quantization=int8_weights unless the overrides say int8."""
  flat = to_flat_dict(load_config())
  if metadata.quantization != "none":  # int8 weights as stored, float dots, unless the overrides ask for int8
    flat["quantization"] = "int8_weights"
  flat.update(overrides)
  flat.update(dataclasses.asdict(metadata.model))
  flat["checkpoint_dir"] = str(metadata.directory)
  return from_flat_dict(flat, where="overrides")


def checkpoint_tokenizer(config: Config, metadata: checkpointing.CheckpointMetadata) -> Optional[Tokenizer]:
  """The config's tokenizer_path, else the checkpoint's tokenizer; None when neither names one."""
  path = config.runtime.tokenizer_path or metadata.tokenizer_path
  return load_tokenizer(path) if path else None


def load_for_scoring(checkpoint_dir: os.PathLike, mesh: Any = "auto", overrides: Optional[Mapping[str, Any]] = None,
                     adapters_dir: Optional[os.PathLike] = None,
                     overrides_for: Optional[Callable[..., Mapping[str, Any]]] = None,
                     ) -> tuple[Config, Any, adapters_lib.LoadedCheckpoint]:
  """(config, mesh, loaded): a checkpoint, with the adapters in `adapters_dir` when given, read once
  (checkpoints/adapters.py's load_checkpoint), the scoring config of its metadata and `overrides`
  (checkpoint_config; then those `overrides_for(metadata, adapters)` returns, when given: settings that depend on
  what was read) and the mesh ("auto": the config's default scoring mesh) its params were restored onto. On a mesh
  each parameter is read straight into its NamedSharding (each host reads its shards), after the mesh is checked to
  divide the model."""
  placed = {}

  def shardings(metadata, adapters):
    extra = overrides_for(metadata, adapters) if overrides_for else {}
    config = checkpoint_config(metadata, {**(overrides or {}), **extra})
    on = mesh_lib.default_scoring_mesh(config.mesh) if isinstance(mesh, str) else mesh
    sharding.check_divisible(config.model, on)
    placed.update(config=config, mesh=on)
    return None if on is None else sharding.model_param_shardings(
        config.model, on, quantization=metadata.quantization, quantization_group=metadata.quantization_group_size)

  loaded = adapters_lib.load_checkpoint(checkpoint_dir, adapters_dir, shardings=shardings)
  return placed["config"], placed["mesh"], loaded


def score_output(apply_softmax: bool) -> str:
  """The runner output (runner.OUTPUTS) a score needs: label logits alone (the K label rows of the lm_head)
  when the labels' softmax is taken, else the full-vocabulary label log-probs (docs/ARCHITECTURE.md section 3)."""
  return "logits" if apply_softmax else "logprobs"


class Scorer:
  """Scores items for queries with one model; holds params, tokenizer, compiled functions and caches."""

  # A plain scorer applies no score head (scoring/head_scorer.py's HeadScorer: the head's config and params digest).
  head_fingerprint: Optional[dict[str, Any]] = None

  def __init__(self, config: Config, params: Any, tokenizer: Optional[Tokenizer] = None,
               model_name: str = "maxscore", mesh: Any = "auto", params_digest: Optional[str] = None,
               adapters: Optional[Mapping[str, Any]] = None):
    """`mesh`: "auto" = this process's data-group mesh from config.mesh when there are several devices
    (maxscore/distributed/mesh.py), None = one device, or a jax.sharding.Mesh with axes (data, fsdp, tensor).
    `params_digest`: the checkpoint's stored content digest; None = hashed from `params` when asked.
    `adapters`: the LoRA adapters already merged into `params` (maxscore/checkpoints/adapters.py's
    Adapters.info: their directory and settings), kept as `self.adapters` for what reports the model; None: none.
    `params` may be abstract (ShapeDtypeStructs, with a mesh): such a Scorer only compiles, through warmup
    (maxscore/bench/compile_report.py compiles for TPU topologies this way)."""
    self.config = config
    self._params_digest = params_digest
    self.tokenizer = tokenizer
    self.model_name = model_name
    self.adapters: Optional[dict[str, Any]] = None if adapters is None else dict(adapters)
    use_compilation_cache(config.runtime.compilation_cache_dir)
    checkpointing.check_params(params, config.model)
    self.mesh = mesh_lib.default_scoring_mesh(config.mesh) if isinstance(mesh, str) else mesh
    sharding.check_divisible(config.model, self.mesh)  # before anything is placed or compiled
    self.runner = ModelRunner(config.model, config.runtime, config.kernel, params, mesh=self.mesh)
    self.prefix_cache = PrefixCache(config.scoring.prefix_cache_bytes)
    self._dry = threading.local()  # a dry run's own prefix cache, on the thread that runs it
    self._warned_item_first = False
    self._label_logprobs = None  # jitted on first use (label_logprobs)

  @property
  def prefix_cache(self) -> PrefixCache:
    """The PrefixStates kept across calls (a dry run on this thread sees a fresh one of its own)."""
    cache = getattr(self._dry, "cache", None)
    return self._prefix_cache if cache is None else cache

  @prefix_cache.setter
  def prefix_cache(self, cache: PrefixCache) -> None:
    self._prefix_cache = cache

  @contextlib.contextmanager
  def _dry_run(self, mode: str) -> Iterator[None]:
    """On this thread only: the runner probes or compiles instead of running, against a fresh prefix
    cache (as a call that starts with a cleared cache sees; its zero states never reach the shared one)."""
    self._dry.cache = PrefixCache(self.config.scoring.prefix_cache_bytes)
    setattr(self.runner, mode, True)
    try:
      yield
    finally:
      setattr(self.runner, mode, False)
      self._dry.cache = None

  def is_compiled(self, call: Callable[[], Any]) -> bool:
    """Whether `call()` (scoring calls of this scorer, as they would run after `prefix_cache.clear()`) needs
    only executables already built. Runs no forward and compiles nothing: the host-side layout work only."""
    with self._dry_run("probing"):
      try:
        call()
      except NotCompiled:
        return False
    return True

  def compile_for(self, call: Callable[[], Any]) -> None:
    """Builds every executable `call()` would run (lower + compile; no forward runs and no cached prefix
    changes), so that running it afterwards, after `prefix_cache.clear()`, compiles nothing. Safe beside
    another thread that scores (the server compiles a new shape this way beside its batches)."""
    with self._dry_run("compile_only"):
      call()

  @property
  def params_digest(self) -> str:
    """Content digest of the parameters (resume identity, maxscore/files/identity.py)."""
    if self._params_digest is None:
      self._params_digest = identity.tree_digest(self.runner.params)
    return self._params_digest

  # --- the model as this scorer holds it (what training reads) ----------------------------------------
  @property
  def params(self) -> Any:
    """The model's params as scoring holds them: cast to weight_dtype, quantized, placed on the scorer's mesh
    (ShapeDtypeStructs when `abstract`). Read, never changed: a trainer copies what it trains."""
    return self.runner.params

  @property
  def abstract(self) -> bool:
    """True when the params are ShapeDtypeStructs: the scorer compiles programs and runs none."""
    return self.runner.abstract

  @property
  def quantization(self) -> str:
    """How the params hold the weights: none, int8_weights or int8 (layers/quantization.py)."""
    return self.runner.quantization

  @property
  def quantization_group(self) -> Optional[int]:
    """The int8 scales' group size along each weight's input axis (None: one scale per output channel)."""
    return self.runner.quantization_group

  @property
  def platform(self) -> str:
    """Where the scorer's programs run or are compiled for (cpu, gpu, tpu)."""
    return self.runner.platform

  def label_logprobs(self, hidden_NxD: Any, label_ids: Sequence[int]) -> np.ndarray:
    """The full-vocabulary log-softmax of the lm_head at hidden states [..., D], read at `label_ids`: [..., K]
    (a frozen backbone's label log-probs, which a score head trains on)."""
    if self._label_logprobs is None:
      decoder = self.runner.decoder(self.runner.default_kernel)
      self._label_logprobs = jax.jit(functools.partial(label_logprobs, decoder))
    return np.asarray(self._label_logprobs(self.runner.params, hidden_NxD, np.asarray(label_ids, np.int32)))

  # --- construction ------------------------------------------------------------------
  @classmethod
  def from_config(cls, config: Config, tokenizer: Optional[Tokenizer] = None, mesh: Any = "auto") -> "Scorer":
    """Random-init params from `config.runtime.init_seed` (tests, demos), or the checkpoint it names."""
    if config.runtime.checkpoint_dir:
      return cls.from_checkpoint(config.runtime.checkpoint_dir, mesh=mesh, **to_flat_dict(config))
    mesh = mesh_lib.default_scoring_mesh(config.mesh) if isinstance(mesh, str) else mesh
    sharding.check_divisible(config.model, mesh)  # a bad mesh fails before init compiles anything
    decoder = Decoder(config.model, get_kernel("reference"))
    params = nn.unbox(init_params(decoder, jax.random.PRNGKey(config.runtime.init_seed)))
    if tokenizer is None and config.runtime.tokenizer_path:
      tokenizer = load_tokenizer(config.runtime.tokenizer_path)
    return cls(config, params, tokenizer, model_name=config.runtime.model_name, mesh=mesh)

  @classmethod
  def from_checkpoint(cls, checkpoint_dir: os.PathLike, mesh: Any = "auto", **overrides: Any) -> "Scorer":
    """Loads a converted checkpoint; `overrides` are flat config keys with parsed values (model keys come from the
    checkpoint). A checkpoint stored quantized (int8) scores with quantization=int8_weights unless the overrides
    say int8.

    The checkpoint is read once (load_for_scoring); on a mesh each parameter is read straight into its
    NamedSharding (each host reads its shards).
    """
    config, mesh, loaded = load_for_scoring(checkpoint_dir, mesh, overrides)
    return cls(config, loaded.params, checkpoint_tokenizer(config, loaded.metadata),
               model_name=pathlib.Path(checkpoint_dir).name, mesh=mesh, params_digest=loaded.metadata.digest)

  # --- raw model ---------------------------------------------------------------------
  def logits(self, token_ids: Sequence[int]) -> np.ndarray:
    """Next-token logits [T, V] (float32) for one sequence; used by parity checks."""
    ids = make_request(token_ids, [], [0], False, False, None, self.config.model.vocab_size).query
    if not ids:
      raise ScoreInputError("token_ids is empty; logits need at least one token")
    return self.runner.logits(np.asarray(ids, np.int32))

  # --- scoring -----------------------------------------------------------------------
  def make_request(self, query: Any, items: Any, label_token_ids: Optional[Sequence[int]] = None,
                   apply_softmax: Optional[bool] = None, item_first: bool = False,
                   separator_token_id: Any = "config") -> TokenRequest:
    """Validates one request, filling label ids, apply_softmax and separator from the config."""
    sc = self.config.scoring
    labels = sc.label_token_ids if label_token_ids is None else label_token_ids
    sep = sc.separator_token_id if separator_token_id == "config" else separator_token_id
    return make_request(query, items, labels, sc.apply_softmax if apply_softmax is None else apply_softmax,
                        item_first, sep, self.config.model.vocab_size, self.tokenizer, sc.max_request_tokens,
                        self.config.buckets.prefix_buckets[-1], self.config.buckets.item_buckets[-1])

  def score(self, query: Any, items: Any, label_token_ids: Optional[Sequence[int]] = None,
            apply_softmax: Optional[bool] = None, item_first: bool = False, algorithm: Optional[str] = None,
            separator_token_id: Any = "config") -> ScoreResult:
    """Scores `items` for `query`: the label tokens' probabilities after each seq_i = Q + [s] + I_i
    (docs/ARCHITECTURE.md section 1).

    Args:
      query: the query Q, as text (through the tokenizer) or a list of token ids.
      items: the N items I_i, each text or a list of token ids.
      label_token_ids: the K token ids whose probabilities are the scores; None = the config's.
      apply_softmax: True normalizes over the K labels (each row sums to 1), False gives the full-vocabulary
        probabilities; None = the config's.
      item_first: score I_i + [s] + Q instead (nothing is shared between items: computed serially).
      algorithm: serial, packed, prefill_extend or auto; None = the config's. They agree to 1e-5.
      separator_token_id: the token [s] between query and item; None for none, "config" = the config's.

    Returns:
      ScoreResult: scores [N, K] float32, the algorithm that computed them, and token usage (prompt_tokens,
      processed_tokens, total_tokens).

    Raises:
      ScoreInputError: a field is invalid or the request is too large (the message names the field).
    """
    req = self.make_request(query, items, label_token_ids, apply_softmax, item_first, separator_token_id)
    return self.score_requests([req], algorithm=algorithm)[0]

  def validate(self, request: Mapping[str, Any]) -> TokenRequest:
    """A /v1/score-shaped dict ({query, items, label_token_ids, apply_softmax, item_first}) as a TokenRequest."""
    return self.make_request(**validate_request(request, REQUEST_FIELDS))

  def score_batch(self, requests: Sequence[Mapping[str, Any]], algorithm: Optional[str] = None) -> list[ScoreResult]:
    """Scores many /v1/score-shaped requests; requests with equal shapes share forwards.

    Args:
      requests: dicts {query, items, label_token_ids?, apply_softmax?, item_first?} as in `score` (absent
        fields take the config's values).
      algorithm: serial, packed, prefill_extend or auto for every request; None = the config's.

    Returns:
      One ScoreResult per request, in order, as `score` returns it.

    Raises:
      ScoreInputError: a request is invalid (the message names its index and field); nothing is scored.
    """
    return self.score_requests(validate_batch(requests, self.validate), algorithm=algorithm)

  def choose(self, req: TokenRequest, algorithm: Optional[str] = None) -> selector.Choice:
    """The algorithm for `req`: the call's, else the config's, else the selector's."""
    if algorithm is not None and algorithm not in ALGORITHMS and algorithm != "auto":
      raise ScoreInputError(f"algorithm={algorithm!r} is not one of {sorted(ALGORITHMS) + ['auto']}")
    scoring = self.config.scoring
    if algorithm is not None:
      scoring = dataclasses.replace(scoring, algorithm=algorithm)
    if req.item_first and scoring.algorithm not in ("auto", "serial") and not self._warned_item_first:
      logging.warning("item_first=True is computed with the serial algorithm (requested %s)", scoring.algorithm)
      self._warned_item_first = True
    kernel = self.runner.default_kernel
    p = len(req.prefix)
    cached = self.prefix_cache.has_prefix(req.prefix)
    return selector.select(p, [len(x) for x in req.items], req.item_first, kernel, self.config.kernel, scoring,
                           self.config.buckets, prefix_cached=cached)

  def _run(self, reqs: Sequence[TokenRequest], algorithm: Optional[str], output: str) -> list[tuple[np.ndarray, str]]:
    """(per-request outputs, algorithm name), grouping requests that share an algorithm into the same forwards."""
    choices = [self.choose(r, algorithm) for r in reqs]
    for r, c in zip(reqs, choices):
      selector.log_choice(c, len(r.prefix), len(r.items))
    results: list = [None] * len(reqs)
    for name in sorted({c.algorithm for c in choices}):
      idx = [i for i, c in enumerate(choices) if c.algorithm == name]
      ctx = AlgorithmContext(self.runner, self.runner.default_kernel, self.config.buckets, self.config.scoring,
                             self.prefix_cache, self.config.scoring.max_tokens_per_forward,
                             selector.max_stacked_tokens(self.config.scoring, self.runner.platform), output=output)
      for i, out in zip(idx, ALGORITHMS[name](ctx, [reqs[i] for i in idx])):
        results[i] = (out, name)
    return results

  def score_requests(self, reqs: Sequence[TokenRequest], algorithm: Optional[str] = None) -> list[ScoreResult]:
    """Scores validated requests, grouping those that share an algorithm (and score output) into the same forwards.

    apply_softmax requests read only the label logits (score_output): the softmax over the labels of
    the log-probs is that of the logits, the vocabulary log-sum-exp cancels."""
    out: list = [None] * len(reqs)
    for output in sorted({score_output(r.apply_softmax) for r in reqs}):
      idx = [i for i, r in enumerate(reqs) if score_output(r.apply_softmax) == output]
      for i, (lp, name) in zip(idx, self._run([reqs[i] for i in idx], algorithm, output)):
        out[i] = ScoreResult(finalize_scores(lp, reqs[i].apply_softmax), name, self._usage(reqs[i], name))
    return out

  def warmup(self, geometries: Sequence[Sequence[int]], algorithm: Optional[str] = None,
             num_labels: Optional[int] = None) -> dict[str, float]:
    """Compiles ahead of time (lower + compile, nothing runs) what requests of these geometries will use.

    Each geometry is (query_len, num_items, item_len[, batch]): `batch` requests of that shape scored
    together (score_batch) -- 1 by default -- with the config's apply_softmax. query_len counts the
    separator. Returns the number of new executables and the seconds spent.
    """
    import time
    k = num_labels or len(self.config.scoring.label_token_ids) or 2
    start, before = time.perf_counter(), self.runner.num_executables
    saved_cache, self.prefix_cache = self.prefix_cache, PrefixCache(0)  # no dummy state may be cached
    self.runner.compile_only = True
    try:
      for geometry in geometries:
        q_len, n, l, b = (tuple(geometry) + (1,))[:4]
        req = make_request([1] * q_len, [[1] * l] * n, list(range(k)), False, False, None,
                           self.config.model.vocab_size)
        self._run([req] * b, algorithm, score_output(self.config.scoring.apply_softmax))
    finally:
      self.runner.compile_only = False
      self.prefix_cache = saved_cache
    return {"executables": self.runner.num_executables - before, "seconds": time.perf_counter() - start}

  def label_logits(self, query: Any, items: Any, label_token_ids: Optional[Sequence[int]] = None,
                   item_first: bool = False, algorithm: Optional[str] = None,
                   separator_token_id: Any = "config") -> ScoreResult:
    """Like `score`, but the scores [N, K] are the raw lm_head logits of the labels (score mode raw_logit).

    FlagEmbedding-style LLM rerankers rank by the logit of "Yes". A ranking by raw logit can differ
    from one by probability: the vocabulary log-sum-exp that turns a logit into a log-probability
    differs per item.
    """
    req = self.make_request(query, items, label_token_ids, False, item_first, separator_token_id)
    return self.label_logits_requests([req], algorithm)[0]

  def label_logits_requests(self, reqs: Sequence[TokenRequest], algorithm: Optional[str] = None) -> list[ScoreResult]:
    """label_logits for many validated requests (shared forwards where shapes allow)."""
    return [ScoreResult(np.asarray(lg, np.float32), name, self._usage(r, name))
            for r, (lg, name) in zip(reqs, self._run(reqs, algorithm, "logits"))]

  def hidden_states(self, query: Any, items: Any, algorithm: Optional[str] = None,
                    separator_token_id: Any = "config") -> np.ndarray:
    """Final-norm hidden states [N, D] (float32) at each item's score position: what score heads read."""
    req = self.make_request(query, items, [0], False, False, separator_token_id)
    return self.hidden_states_requests([req], algorithm)[0]

  def hidden_states_requests(self, reqs: Sequence[TokenRequest], algorithm: Optional[str] = None) -> list[np.ndarray]:
    """hidden_states for many validated requests (shared forwards where shapes allow)."""
    return [h for h, _ in self._run(reqs, algorithm, "hidden")]

  @staticmethod
  def _usage(req: TokenRequest, algorithm: str) -> dict[str, int]:
    """Tokens of the request, and tokens the algorithm ran through the model (serial repeats the query)."""
    if algorithm == "serial":
      processed = sum(len(req.serial_sequence(i)) for i in range(len(req.items)))
    else:
      processed = req.num_tokens if req.items else 0
    return {"prompt_tokens": req.num_tokens, "processed_tokens": processed, "total_tokens": req.num_tokens}
