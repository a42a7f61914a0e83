"""Hard-negative mining: per training query, negatives drawn from a first stage's ranking, written as the
group JSONL that FlagEmbedding and sentence-transformers train rerankers on.

    {"query": "...", "pos": ["..."], "neg": ["...", ...], "qid": "q1", "pos_ids": [...], "neg_ids": [...]}

(plus "prompt" when one is given). The first stage is BM25 over the whole corpus (bm25s, the eval's own
BM25) or any TREC run file, e.g. the run.trec of `eval_rerank.py` with a maxscore checkpoint (its own
scores). Per query:
- the candidates are the first stage's ranks [range_min, range_max) (0-based);
- a judged-relevant document (grade >= min_relevance) is never a negative (counted as a false negative
  caught), and neither, with `margin` set, is one the first stage scores at or above the lowest-scored
  positive minus `margin` (a likely unjudged positive, as sentence-transformers' absolute margin);
- `num_negatives` of those that remain: the best-ranked ones (sampling=top) or a random draw (sampling=random,
  seeded by `seed` and the qid, so a query's negatives do not depend on the other queries or their order).

Every judged-relevant document with text in the corpus is a positive. A query with no positive text, or left
with no negative, is skipped and counted. It streams: each query reads only the documents its record can name,
through the corpus's document store (maxscore/datasets/docstore.py), and is written before the next; the BM25
index is built once per corpus and memory-mapped after (BM25Index.for_corpus).
"""

import dataclasses
import hashlib
import json
import pathlib
from typing import Callable, Iterable, Iterator, Literal, Optional

import numpy as np

from maxscore.datasets import beir_files, data
from maxscore.datasets.bm25 import BM25Index
from maxscore.errors import ScoreInputError


class MiningError(ScoreInputError):
  """Mining settings or inputs that cannot be used (one line, exit 2)."""


@dataclasses.dataclass(frozen=True)
class MiningConfig:
  """scripts/mine_negatives.py's settings (configs/mine.yml documents each key)."""
  data_dir: Optional[str] = None
  split: str = "train"
  run_file: Optional[str] = None
  output: Optional[str] = None
  range_min: int = 0
  range_max: int = 100
  num_negatives: int = 15
  sampling: Literal["top", "random"] = "random"
  margin: Optional[float] = None
  min_relevance: int = 1
  prompt: Optional[str] = None
  seed: int = 0
  overwrite: bool = False

  def validate(self) -> "MiningConfig":
    if not 0 <= self.range_min < self.range_max:
      raise MiningError(f"range_min={self.range_min} and range_max={self.range_max} must satisfy "
                        f"0 <= range_min < range_max")
    if self.num_negatives < 1:
      raise MiningError(f"num_negatives={self.num_negatives} must be >= 1")
    if self.margin is not None and not np.isfinite(self.margin):
      raise MiningError(f"margin={self.margin} must be a finite number (or null: no margin filter)")
    return self


@dataclasses.dataclass
class MiningCounts:
  """What mining did, for the summary: queries written and skipped, and the documents kept out."""
  queries: int = 0
  written: int = 0
  negatives: int = 0
  short: int = 0                     # written with fewer than num_negatives negatives
  skipped_no_positive: int = 0       # no judged-relevant document with text in the corpus
  skipped_no_negative: int = 0       # nothing left in the rank range
  skipped_no_candidates: int = 0     # the first stage ranked nothing for the query
  false_negatives_caught: int = 0    # judged-relevant documents in the rank range
  margin_dropped: int = 0            # candidates within the margin of a positive
  margin_unchecked: int = 0          # queries whose positives the first stage does not score (margin not applied)


def select_negatives(ranked: list[tuple[str, float]], relevant: set, positive_scores: list[float],
                     cfg: MiningConfig, qid: str, counts: MiningCounts) -> list[tuple[str, float]]:
  """The negatives of one query from its first-stage ranking (best first), as (docid, score)."""
  window = ranked[cfg.range_min:cfg.range_max]
  eligible = []
  floor = min(positive_scores) - cfg.margin if cfg.margin is not None and positive_scores else None
  if cfg.margin is not None and not positive_scores:
    counts.margin_unchecked += 1
  for docid, score in window:
    if docid in relevant:
      counts.false_negatives_caught += 1
    elif floor is not None and score >= floor:
      counts.margin_dropped += 1
    else:
      eligible.append((docid, score))
  if cfg.sampling == "top" or len(eligible) <= cfg.num_negatives:
    return eligible[:cfg.num_negatives]
  rng = np.random.default_rng([cfg.seed, int.from_bytes(hashlib.sha256(qid.encode()).digest()[:8], "little")])
  keep = np.sort(rng.choice(len(eligible), cfg.num_negatives, replace=False))  # first-stage order kept
  return [eligible[i] for i in keep]


def _run_rankings(path: pathlib.Path, qids: set, depth: int) -> dict[str, list[tuple[str, float]]]:
  """The run's ranking of each query in `qids`, cut to `depth`: by score, best first (ties: the file's order)."""
  run = data.read_trec_run(path)
  out = {}
  for qid in qids & set(run):
    items = sorted(run[qid].items(), key=lambda kv: -kv[1])  # stable: equal scores keep the file's order
    out[qid] = items[:depth]
  return out


def mine(cfg: MiningConfig, on_query: Callable[[], None] = lambda: None) -> tuple[Iterator[dict], MiningCounts]:
  """The records of cfg.split's judged queries, in queries.jsonl order, and the counts (filled as the records are
  consumed). `on_query` is called once per judged query as it is done, skipped ones included."""
  cfg = cfg.validate()
  if not cfg.data_dir:
    raise MiningError("data_dir is required: a BEIR directory (corpus.jsonl, queries.jsonl, qrels/<split>.tsv)")
  root = pathlib.Path(cfg.data_dir)
  queries = beir_files.read_queries(root / "queries.jsonl")
  qrels = data.read_qrels(root / "qrels" / f"{cfg.split}.tsv", known_qids=queries)
  qids = [q for q in queries if q in qrels]
  if not qids:
    raise MiningError(f"{root}/qrels/{cfg.split}.tsv judges none of the queries in {root}/queries.jsonl")
  relevant = {q: {d for d, g in qrels[q].items() if g >= cfg.min_relevance} for q in qids}
  counts = MiningCounts(queries=len(qids))
  read = beir_files.document_reader(root / "corpus.jsonl")  # per query: only the documents its record names
  if cfg.run_file:
    rankings = _run_rankings(pathlib.Path(cfg.run_file), set(qids), cfg.range_max)
    ranking_of = lambda q: rankings.get(q, [])  # noqa: E731
    scores_of = lambda q, docs: [s for d, s in rankings.get(q, []) if d in docs]  # noqa: E731
  else:  # BM25 over the whole corpus: saved once by bm25s, memory-mapped after
    index, docids = BM25Index.for_corpus(root / "corpus.jsonl")
    position = {d: i for i, d in enumerate(docids)}

    def ranking_of(q):
      return [(docids[i], s) for i, s in index.top_k(queries[q], cfg.range_max)]

    def scores_of(q, docs):
      all_scores = index.scores(queries[q])
      return [float(all_scores[position[d]]) for d in docs if d in position]

  def record_of(qid: str) -> Optional[dict]:
    ranked = ranking_of(qid)
    texts = read(set(relevant[qid]) | {d for d, _ in ranked[cfg.range_min:cfg.range_max]})
    pos_ids = [d for d in sorted(relevant[qid]) if d in texts]
    if not pos_ids:
      counts.skipped_no_positive += 1
      return None
    if not ranked:
      counts.skipped_no_candidates += 1
      return None
    negatives = select_negatives(ranked, relevant[qid], scores_of(qid, set(pos_ids)), cfg, qid, counts)
    negatives = [(d, s) for d, s in negatives if d in texts]
    if not negatives:
      counts.skipped_no_negative += 1
      return None
    counts.written += 1
    counts.negatives += len(negatives)
    counts.short += len(negatives) < cfg.num_negatives
    record = {"query": queries[qid], "pos": [texts[d] for d in pos_ids], "neg": [texts[d] for d, _ in negatives],
              "qid": qid, "pos_ids": pos_ids, "neg_ids": [d for d, _ in negatives]}
    if cfg.prompt:
      record["prompt"] = cfg.prompt
    return record

  def records() -> Iterator[dict]:
    for qid in qids:
      record = record_of(qid)
      on_query()  # written or skipped, the query is done: a progress bar over counts.queries reaches its total
      if record is not None:
        yield record
  return records(), counts


def write_records(records: Iterable[dict], out) -> int:
  """Writes each record as one JSON line; returns how many."""
  n = 0
  for record in records:
    out.write(json.dumps(record, ensure_ascii=False) + "\n")
    n += 1
  return n
