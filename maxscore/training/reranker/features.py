"""What a score head reads during training: the frozen backbone's features, or (a training backbone) the
packed forward that is differentiable in the backbone; sources.py puts the two behind one interface.

Frozen: each query's features are computed ONCE, without gradients, by the scorer's own fast path
(`Scorer.hidden_states_requests`, one query per call as eval does): the hidden states h [N, D] at the
score positions and, from them and the lm_head, the label log-probs lp [N, K]. They are stacked to
[queries, N_max, ...] with masks, kept in memory and, with a cache path, in an npz file that a later
run (same model, prompts and data) reads instead.

A training backbone: every query in one packed row of a fixed (P, L, N) geometry per split (docs/ARCHITECTURE.md
section 2), through a Decoder whose layers may be rematerialized (`Decoder(remat=True)`).
"""

import dataclasses
import functools
import hashlib
import json
import os
import pathlib
import time
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from layers.decoder import Decoder
from layers.kernels import SegmentLayout
from maxscore import console, interrupt
from maxscore.datasets.data import RerankSet
from maxscore.errors import UnsafeOutputError
from maxscore.files import identity, safety
from maxscore.rerank import prompts
from maxscore.scoring.layout import PackedBatch, RowSpec, bucket, pack_rows
from maxscore.scoring.requests import TokenRequest
from maxscore.scoring.runner import label_logprobs, packed_hidden
from maxscore.scoring.scorer import Scorer

FORMAT_VERSION = 1  # of the feature cache


# --- examples and features ------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Examples:
  """One split's queries as token requests, with grades per item."""
  qids: tuple[str, ...]
  docids: tuple[tuple[str, ...], ...]
  requests: tuple[TokenRequest, ...]
  grades: tuple[tuple[int, ...], ...]
  qrels: dict
  teacher: Optional[tuple[tuple[float, ...], ...]] = None  # a teacher's score per item (distillation)

  @property
  def max_items(self) -> int:
    return max((len(r.items) for r in self.requests), default=0)

  def grid(self) -> tuple[np.ndarray, np.ndarray]:
    """grades [Q, N_max] (float32) and mask [Q, N_max]."""
    q, n = len(self.requests), self.max_items
    grades, mask = np.zeros((q, n), np.float32), np.zeros((q, n), bool)
    for i, g in enumerate(self.grades):
      grades[i, :len(g)], mask[i, :len(g)] = g, True
    return grades, mask

  def teacher_grid(self) -> Optional[np.ndarray]:
    """The teacher's scores [Q, N_max] (float32, 0 on padding), or None without them."""
    if self.teacher is None:
      return None
    out = np.zeros((len(self.requests), self.max_items), np.float32)
    for i, t in enumerate(self.teacher):
      out[i, :len(t)] = t
    return out

  def digest(self) -> str:
    h = hashlib.sha256()
    for qid, docids, r, g in zip(self.qids, self.docids, self.requests, self.grades):
      h.update(json.dumps([qid, docids, r.query, r.items, r.label_ids, r.separator, g]).encode())
    if self.teacher is not None:
      h.update(json.dumps(self.teacher).encode())
    return h.hexdigest()[:16]


def make_examples(scorer: Scorer, dataset: RerankSet, prompt: prompts.PromptConfig,
                  label_ids: Sequence[int]) -> Examples:
  """Token requests for every query with candidates, built as eval builds them."""
  template = prompts.get_template(prompt.template)
  builder = prompts.PromptBuilder(scorer.tokenizer, template, prompt.instruction, prompt.max_query_tokens,
                                  prompt.max_item_tokens)
  queries = [q for q in dataset.queries if q.candidates]
  reqs = []
  for q in queries:
    query_ids, _ = builder.query(q.query)
    reqs.append(scorer.make_request(query_ids, [builder.item(text)[0] for _, text in q.candidates],
                                    label_token_ids=label_ids, apply_softmax=False))
  grades = tuple(tuple(int(dataset.qrels.get(q.qid, {}).get(d, 0)) for d, _ in q.candidates) for q in queries)
  teacher = None
  if dataset.teacher_scores is not None:
    teacher = tuple(tuple(float(dataset.teacher_scores[q.qid][d]) for d, _ in q.candidates) for q in queries)
  return Examples(tuple(q.qid for q in queries), tuple(tuple(d for d, _ in q.candidates) for q in queries),
                  tuple(reqs), grades, {q.qid: dataset.qrels.get(q.qid, {}) for q in queries}, teacher)


@dataclasses.dataclass
class Features:
  """Frozen-backbone features of one split: hidden [Q, N, D], label log-probs [Q, N, K] (float32)."""
  hidden: np.ndarray
  logprobs: np.ndarray
  seconds: float = 0.0
  cached: bool = False


def extract_features(scorer: Scorer, examples: Examples, algorithm: Optional[str] = None,
                     progress: bool = False) -> Features:
  """h and lp for every query, one scorer forward per query (no gradients), padded to [Q, N_max]."""
  start = time.perf_counter()
  q, n, d = len(examples.requests), examples.max_items, scorer.config.model.hidden_size
  k = len(examples.requests[0].label_ids) if examples.requests else 0
  hidden, lps = np.zeros((q, n, d), np.float32), np.zeros((q, n, k), np.float32)
  for i, req in enumerate(examples.requests):
    scorer.prefix_cache.clear()  # as eval does: the algorithm depends on the query's geometry only
    h = scorer.hidden_states_requests([req], algorithm)[0]
    hidden[i, :len(h)] = h
    lps[i, :len(h)] = scorer.label_logprobs(h, req.label_ids)
    if progress and ((i + 1) % 20 == 0 or i + 1 == q):
      logging.info("features: %d/%d queries", i + 1, q, extra=console.PROGRESS)
    interrupt.planted(f"features:{i + 1}")  # a test's Ctrl-C while features are computed
  return Features(hidden, lps, time.perf_counter() - start)


def _features_fingerprint(scorer: Scorer, examples: dict[str, Examples], algorithm: Optional[str]) -> str:
  key = {"version": FORMAT_VERSION, "scorer": identity.scorer_identity(scorer), "algorithm": algorithm,
         "splits": {k: v.digest() for k, v in sorted(examples.items())}}
  return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def load_or_extract(scorer: Scorer, examples: dict[str, Examples], cache: Optional[os.PathLike],
                    algorithm: Optional[str] = None, progress: bool = False) -> dict[str, Features]:
  """Features per split, read from the npz `cache` when it was written for the same model, prompts
  and data, else computed (and written there when `cache` is set). No pickle: plain arrays only."""
  fingerprint = _features_fingerprint(scorer, examples, algorithm)
  path = pathlib.Path(cache) if cache else None
  if path is not None and path.exists():
    try:
      with np.load(path, allow_pickle=False) as f:
        stored = str(f["fingerprint"])
        if stored == fingerprint:
          logging.info("features: read %s", path)
          return {s: Features(f[f"{s}_hidden"], f[f"{s}_logprobs"], 0.0, True) for s in examples}
    except (OSError, ValueError, KeyError) as e:  # not an npz maxscore wrote: never replace it
      raise UnsafeOutputError(f"--feature_cache {path} is not a maxscore feature cache ({type(e).__name__}); "
                              f"left untouched: choose another path") from None
    logging.warning("features: %s was written for another model, prompt or data; recomputing", path)
  out = {s: extract_features(scorer, ex, algorithm, progress) for s, ex in examples.items()}
  if path is not None:
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {f"{s}_{name}": getattr(f, name) for s, f in out.items() for name in ("hidden", "logprobs")}
    with safety.atomic_output(path, "wb") as f:
      np.savez(f, fingerprint=np.asarray(fingerprint), **arrays)
  return out


# --- a training backbone: the packed forward with gradients ---------------------------------------------
@dataclasses.dataclass(frozen=True)
class PackedPlan:
  """One packed batch (a row per query) and where each (query, item) lands in its [B*N] score rows."""
  batch: dict                        # tokens, positions, layout, score_index (device-ready)
  gather_QxN: np.ndarray
  mask_QxN: np.ndarray
  packed: PackedBatch                # the same rows on the host
  whole: bool                        # every request packs all its items, in order (no columns chosen)


def packed_geometry(scorer: Scorer, examples: Examples) -> tuple[int, int, int]:
  """(P, L, N) buckets that hold every query of `examples` in one row: one compiled shape per split."""
  bk = scorer.config.buckets
  p = max(len(r.prefix) for r in examples.requests)
  l = max((len(x) for r in examples.requests for x in r.items), default=1)
  return (bucket(p, bk.prefix_buckets, "query (with separator)"), bucket(max(l, 1), bk.item_buckets, "item"),
          bucket(examples.max_items, bk.item_count_buckets, "item count"))


def plan_packed(reqs: Sequence[Optional[TokenRequest]], geometry: tuple[int, int, int],
                columns: Optional[Sequence[Sequence[int]]] = None, num_columns: Optional[int] = None) -> PackedPlan:
  """Each request in one packed row of the fixed geometry (None = an empty padding row). With `columns`,
  request i packs only its items columns[i] (e.g. the ones a training group drew), and the gather is
  [len(reqs), num_columns] over the requests' item indices, 0 where an item was not packed."""
  p, l, n = geometry
  picked = [() if r is None else range(len(r.items)) if columns is None else [int(c) for c in columns[i]]
            for i, r in enumerate(reqs)]
  rows = [RowSpec(i, r.prefix, tuple(picked[i]), tuple(r.items[c] for c in picked[i]), l)
          for i, r in enumerate(reqs) if r is not None]
  pb = pack_rows(rows, p, l, n, len(reqs))
  layout = SegmentLayout(jnp.asarray(pb.prefix_valid_B), jnp.asarray(pb.slot_valid_BxN), p, l, n)
  width = n if num_columns is None else num_columns
  gather = np.zeros((len(reqs), width), np.int32)
  mask = np.zeros((len(reqs), width), bool)
  for b, j in zip(*np.nonzero(pb.item_BxN >= 0)):
    gather[pb.request_BxN[b, j], pb.item_BxN[b, j]] = b * n + j
    mask[pb.request_BxN[b, j], pb.item_BxN[b, j]] = True
  batch = {"tokens": jnp.asarray(pb.tokens_BxT), "positions": jnp.asarray(pb.positions_BxT), "layout": layout,
           "score_index": jnp.asarray(pb.score_index_BxN)}
  return PackedPlan(batch, gather, mask, pb, columns is None)


def match_targets(plan: PackedPlan, reqs: Sequence[Optional[TokenRequest]]) -> tuple[np.ndarray, ...]:
  """The targets of the auxiliary match losses (a training backbone's) of the requests `plan` packs: per packed
  token, whether its id is one of its query's (the separator left out) [B, T] and whether it is a candidate
  token [B, T]; per candidate, the share of the query's distinct ids it holds [Q, N]. Row b holds request b
  (plan_packed packs one request per row)."""
  if not plan.whole:
    raise ValueError("match targets cover every item of a request: they cannot be planned for chosen columns")
  pb = plan.packed
  candidate = np.zeros(pb.tokens_BxT.shape, bool)
  match = np.zeros(pb.tokens_BxT.shape, np.float32)
  coverage = np.zeros((len(reqs), pb.num_slots), np.float32)
  for b, r in enumerate(reqs):
    if r is None:
      continue
    for n in range(pb.num_slots):
      start = pb.prefix_len + n * pb.slot_len
      candidate[b, start:start + pb.slot_valid_BxN[b, n]] = True
    match[b] = np.isin(pb.tokens_BxT[b], np.asarray(r.query, np.int32)) & candidate[b]
    if r.query:
      query = set(r.query)
      coverage[b, :len(r.items)] = [len(query.intersection(item)) / len(query) for item in r.items]
  return match, candidate, coverage


def packed_features(decoder: Decoder, backbone, batch: dict, gather_QxN, labels_K, residuals: bool = False):
  """h [Q, N, D] and label log-probs [Q, N, K] of one packed forward (differentiable in `backbone`);
  with `residuals`, also every packed token's residual stream after each layer [layers, B, T, D]."""
  out = packed_hidden(decoder, backbone, batch["tokens"], batch["positions"], batch["layout"], batch["score_index"],
                      residuals=residuals)
  h_BxNxD = out[0] if residuals else out
  h_QxNxD = h_BxNxD.reshape(-1, h_BxNxD.shape[-1])[gather_QxN].astype(jnp.float32)
  features = h_QxNxD, label_logprobs(decoder, backbone, h_QxNxD, labels_K)
  return (*features, out[1]) if residuals else features


def backbone_features(decoder: Decoder, backbone, examples: Examples, geometry, labels_K, batch_size: int):
  """Features of every query through the current (trained) backbone, `batch_size` queries per forward."""
  reqs = list(examples.requests)
  hs, lps = [], []
  for start in range(0, len(reqs), batch_size):
    chunk = reqs[start:start + batch_size]
    plan = plan_packed(chunk + [None] * (batch_size - len(chunk)), geometry)
    h, lp = _packed_jit(decoder)(backbone, plan.batch, plan.gather_QxN[:, :examples.max_items], labels_K)
    hs.append(np.asarray(h)[:len(chunk)])
    lps.append(np.asarray(lp)[:len(chunk)])
  return np.concatenate(hs), np.concatenate(lps)


@functools.lru_cache(maxsize=None)
def _packed_jit(decoder: Decoder):
  return jax.jit(functools.partial(packed_features, decoder))
