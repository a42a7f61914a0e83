"""Rerank datasets: the BEIR layout plus a first-stage TREC run, or one JSONL record per query.

Both load into a `RerankSet`: queries in input order, each with its candidates (docid, text)
in first-stage order, plus graded qrels. Malformed input raises `DataError` whose message
starts with `file:line`; with `skip_bad=True` the bad line (or candidate, or query) is
skipped instead and counted in `RerankSet.skipped` under a fixed reason name.

    BEIR:   <data_dir>/corpus.jsonl   {"_id", "title"?, "text"}
            <data_dir>/queries.jsonl  {"_id", "text"}
            <data_dir>/qrels/<split>.tsv  query-id <tab> corpus-id <tab> score (header line)
            run file                  qid Q0 docid rank score tag  (top-k per query by rank)
    JSONL:  {"qid", "query", "candidates": [{"docid", "text"}], "qrels": {docid: grade}, "split"?}

Only corpus documents that some kept candidate needs are held in memory, and only those are
checked for empty text (real BEIR corpora hold a few empty documents nobody retrieves).
"""

import dataclasses
import hashlib
import json
import os
import pathlib
from typing import Any, Literal, Optional, Sequence

import numpy as np
from absl import logging

from maxscore.datasets import beir_files
from maxscore.datasets.records import Problems, json_records, parse_grade, record_id, text_lines
from maxscore.errors import DataError

DEFAULT_DIR = pathlib.Path(__file__).resolve().parent.parent / "assets" / "default"
DEFAULT_CHECKPOINT = DEFAULT_DIR / "pydoc-tiny-qwen3"
DEFAULT_JSONL = DEFAULT_DIR / "pydoc_rerank.jsonl"
DEFAULT_BEIR_DIR = DEFAULT_DIR / "pydoc_beir"        # the same queries over the whole corpus (BEIR layout)
DEFAULT_RUN = DEFAULT_BEIR_DIR / "bm25.trec"          # its BM25 first stage (maxscore/lm/default_set.py)
DEFAULT_DOCS_DIR = DEFAULT_DIR / "python_docs_beir"   # the held-out set: the Python docs' section titles (maxscore/lm/docs_set.py)
DEFAULT_DOCS_RUN = DEFAULT_DOCS_DIR / "bm25.trec"
DEFAULT_EVAL_DIR = DEFAULT_DIR / "perlfaq_beir"       # the natural-question test set (maxscore/lm/perlfaq_set.py)
DEFAULT_EVAL_RUN = DEFAULT_EVAL_DIR / "bm25.trec"     # what `make eval` and eval_rerank.py without arguments rerank

Qrels = dict[str, dict[str, int]]


@dataclasses.dataclass(frozen=True)
class RerankQuery:
  """One query to rerank: its text and candidates (docid, text) in first-stage order, with the first
  stage's scores where the input has them (a TREC run; () for the JSONL form). Fusion reads the scores;
  the reranker's scores do not depend on them, so the digest leaves them out."""
  qid: str
  query: str
  candidates: tuple[tuple[str, str], ...]
  scores: tuple[float, ...] = ()

  def digest(self) -> str:
    """Identifies the query's content (text, docids and candidate texts) for resumed runs."""
    h = hashlib.sha256(json.dumps([self.qid, self.query, self.candidates]).encode())
    return h.hexdigest()[:16]


@dataclasses.dataclass
class RerankSet:
  """Queries in input order, graded qrels, where they came from and what was skipped."""
  queries: list[RerankQuery]
  qrels: Qrels
  source: dict[str, Any]
  skipped: dict[str, int] = dataclasses.field(default_factory=dict)
  teacher_scores: Optional[dict[str, dict[str, float]]] = None  # {qid: {docid: score}}: a teacher's, for distillation

  @property
  def num_candidates(self) -> int:
    return sum(len(q.candidates) for q in self.queries)


# --- JSONL form ----------------------------------------------------------------------------
def load_jsonl(path: os.PathLike, split: Optional[str] = "test", top_k: int = 0,
               skip_bad: bool = False) -> RerankSet:
  """Loads the JSONL form. Records with a `split` field are kept when it equals `split`
  (`split=None` or "all" keeps every record); records without one belong to every split.
  `top_k > 0` keeps the first top_k candidates of each query."""
  path = pathlib.Path(path)
  problems = Problems(skip_bad)
  queries, qrels, seen = [], {}, {}  # seen: qid -> "file:line"
  kept_split = not split or split == "all"
  for where, rec in json_records(path, problems):
    missing = [k for k in ("qid", "query", "candidates", "qrels") if k not in rec]
    if missing:
      problems("bad_records", where, f"missing field(s) {missing}; a record is "
               '{"qid", "query", "candidates": [{"docid", "text"}], "qrels": {docid: grade}}')
      continue
    qid = record_id(rec["qid"])
    if qid is None:
      problems("bad_records", where, f"qid={rec['qid']!r} must be a non-empty string without whitespace")
      continue
    if "split" in rec and not kept_split and rec["split"] != split:
      continue
    if qid in seen:
      problems("duplicate_qids", where, f"qid {qid!r} already appeared at {seen[qid]}")
      continue
    if not isinstance(rec["query"], str) or not rec["query"].strip():
      problems("empty_queries", where, f"query of qid {qid!r} is empty or not a string")
      continue
    judged = rec["qrels"]
    if not isinstance(judged, dict):
      problems("bad_records", where, f"qrels of qid {qid!r} must be an object {{docid: grade}}")
      continue
    grades = {}
    for docid, g in judged.items():
      if parse_grade(g) is None:
        problems("bad_qrels", where, f"qrels[{docid!r}]={g!r} of qid {qid!r} must be an integer grade")
        continue
      grades[str(docid)] = parse_grade(g)
    cands = rec["candidates"]
    if not isinstance(cands, list):
      problems("bad_records", where, f"candidates of qid {qid!r} must be a list of {{docid, text}}")
      continue
    kept: dict[str, str] = {}
    for j, c in enumerate(cands):
      at = f"candidates[{j}] of qid {qid!r}"
      docid = record_id(c.get("docid")) if isinstance(c, dict) else None
      if docid is None:
        problems("bad_candidates", where, f"{at} needs a docid (non-empty, no whitespace) and a text")
        continue
      text = c.get("text")
      if not isinstance(text, str) or not text.strip():
        problems("empty_texts", where, f"{at} (docid {docid!r}) has empty text")
        continue
      if docid in kept:
        problems("duplicate_docids", where, f"{at}: docid {docid!r} appears twice")
        continue
      kept[docid] = text
    seen[qid] = where
    items = tuple(kept.items())
    queries.append(RerankQuery(qid, rec["query"], items[:top_k] if top_k > 0 else items))
    qrels[qid] = grades
  _check_nonempty(queries, f"{path} (split={split!r})")
  return RerankSet(queries, qrels, {"format": "jsonl", "path": str(path), "split": split, "top_k": top_k},
                   problems.counts)


# --- BEIR layout + TREC run ------------------------------------------------------------------


def read_qrels(path: pathlib.Path, problems: Optional[Problems] = None, known_qids=None) -> Qrels:
  """BEIR qrels TSV (`query-id corpus-id score`, an optional header line); or TREC `qid 0 docid grade`.
  Without `problems`, a malformed line raises DataError."""
  problems = problems or Problems(skip_bad=False)
  qrels: Qrels = {}
  for number, line in text_lines(path):
    where = f"{path}:{number}"
    cols = line.split("\t") if "\t" in line else line.split()
    if len(cols) == 4:  # TREC qrels: qid iteration docid grade
      cols = [cols[0], cols[2], cols[3]]
    if number == 1 and len(cols) == 3 and parse_grade(cols[2].strip()) is None:
      continue  # header
    if len(cols) != 3:
      problems("bad_qrels", where, f"expected 3 tab-separated columns query-id, corpus-id, score; got {len(cols)}")
      continue
    qid, docid, grade = (c.strip() for c in cols)
    if not qid:
      problems("bad_qrels", where, "missing query-id")
      continue
    if not docid:
      problems("bad_qrels", where, f"missing corpus-id for query {qid!r}")
      continue
    if parse_grade(grade) is None:
      problems("bad_qrels", where, f"score {grade!r} must be an integer grade")
      continue
    if known_qids is not None and qid not in known_qids:
      problems("bad_qrels", where, f"query-id {qid!r} is not in queries.jsonl")
      continue
    qrels.setdefault(qid, {})[docid] = parse_grade(grade)
  return qrels


def read_trec_run(path: os.PathLike) -> dict[str, dict[str, float]]:
  """A TREC run file as {qid: {docid: score}} (for checks and re-evaluation)."""
  path = pathlib.Path(path)
  run: dict[str, dict[str, float]] = {}
  for number, line in text_lines(path):
    cols = line.split()
    if len(cols) != 6:
      raise DataError(f"{path}:{number}: expected 6 columns 'qid Q0 docid rank score tag', got {len(cols)}")
    try:
      run.setdefault(cols[0], {})[cols[2]] = float(cols[4])
    except ValueError:
      raise DataError(f"{path}:{number}: score {cols[4]!r} is not a number") from None
  return run


def _read_run(path: pathlib.Path, qrels: Qrels, queries: dict[str, str], top_k: int,
              problems: Problems, other_splits: frozenset = frozenset()
              ) -> tuple[dict[str, list[tuple[str, str, float]]], int]:
  """({qid: [(docid, 'file:line', score)]} in rank order, top_k per query, for queries of the split; the
  number of lines passed over because their query is judged only in another split, `other_splits`)."""
  ranked: dict[str, list[tuple[int, float, str, str]]] = {}
  passed_over = 0
  seen: dict[tuple[str, str], str] = {}
  for number, line in text_lines(path):
    where = f"{path}:{number}"
    cols = line.split()
    if len(cols) != 6:
      problems("bad_run_lines", where, f"expected 6 columns 'qid Q0 docid rank score tag', got {len(cols)}")
      continue
    qid, _, docid, rank, score, _ = cols
    try:
      rank_i, score_f = int(rank), float(score)
    except ValueError:
      problems("bad_run_lines", where, f"rank {rank!r} must be an integer and score {score!r} a number")
      continue
    if qid not in queries:
      problems("unknown_qids", where, f"query {qid!r} is not in queries.jsonl")
      continue
    if qid not in qrels:
      if qid in other_splits:
        passed_over += 1
        continue
      problems("qids_not_in_qrels", where, f"query {qid!r} has no judgments in the qrels of this split")
      continue
    if (qid, docid) in seen:
      problems("duplicate_docids", where, f"docid {docid!r} already ranked for query {qid!r} at {seen[qid, docid]}")
      continue
    seen[qid, docid] = where
    ranked.setdefault(qid, []).append((rank_i, -score_f, docid, where))
  out = {}
  for qid, rows in ranked.items():
    rows.sort()
    out[qid] = [(docid, where, -neg) for _, neg, docid, where in (rows[:top_k] if top_k > 0 else rows)]
  return out, passed_over


def load_beir(data_dir: os.PathLike, run_file: os.PathLike, split: str = "test", top_k: int = 100,
              skip_bad: bool = False) -> RerankSet:
  """Loads a BEIR directory and the run to rerank; queries keep the run file's order.

  The queries evaluated are the run's queries that have judgments in qrels/<split>.tsv; one run
  may cover several splits (train, dev, test): lines of queries judged only in another
  qrels/*.tsv are passed over. A run line for a query judged in no split, a qrels line for a
  query absent from queries.jsonl, or a run docid absent from the corpus is an error (or skipped
  and counted with skip_bad)."""
  data_dir, run_file = pathlib.Path(data_dir), pathlib.Path(run_file)
  problems = Problems(skip_bad)
  queries = beir_files.read_query_texts(data_dir / "queries.jsonl", problems)
  qrels_path = data_dir / "qrels" / f"{split}.tsv"
  qrels = read_qrels(qrels_path, problems, known_qids=queries)
  run, other_lines = _read_run(run_file, qrels, queries, top_k, problems, _judged_elsewhere(qrels_path))
  needed = {docid for rows in run.values() for docid, _, _ in rows}
  corpus_path = data_dir / "corpus.jsonl"
  judged = frozenset(docid for qid in run for docid in qrels[qid])
  texts, empty, unheld = beir_files.read_needed(corpus_path, needed, problems, judged)
  out = []
  for qid, rows in run.items():
    cands, scores = [], []
    for docid, where, score in rows:
      if docid in texts:
        cands.append((docid, texts[docid]))
        scores.append(score)
      elif docid not in empty:
        problems("unknown_docids", where, f"docid {docid!r} is not in {corpus_path}")
    out.append(RerankQuery(qid, queries[qid], tuple(cands), tuple(scores)))
  _check_nonempty(out, f"{run_file} with {data_dir}/qrels/{split}.tsv")
  missing = len(set(qrels) - set(run))
  if missing:
    logging.info("%d judged queries of split %r have no candidates in %s and are not evaluated",
                 missing, split, run_file)
  unfindable = _warn_judged_not_in_corpus(unheld, {q: qrels[q] for q in run}, corpus_path)
  source = {"format": "beir", "data_dir": str(data_dir), "run_file": str(run_file), "split": split,
            "top_k": top_k, "judged_queries_without_candidates": missing,
            "run_lines_of_other_splits": other_lines, "judged_docids_not_in_corpus": len(unheld),
            "queries_whose_relevant_documents_are_not_in_corpus": unfindable}
  return RerankSet(out, {q: qrels[q] for q in run}, source, problems.counts)


def _warn_judged_not_in_corpus(unheld: set, qrels: Qrels, corpus_path: pathlib.Path) -> int:
  """Warns of judged documents the corpus does not hold (no run can rank them: a query all of whose relevant
  documents are among them scores 0 in every run) and returns how many evaluated queries that leaves with no
  relevant document to find."""
  if not unheld:
    return 0
  unfindable = [q for q, grades in qrels.items()
                if any(g > 0 for g in grades.values()) and all(d in unheld for d, g in grades.items() if g > 0)]
  example = next((q, d) for q, grades in qrels.items() for d in grades if d in unheld)
  logging.warning("%d judged documents of the evaluated queries are not in %s (for example %r, judged for query "
                  "%r): no run can rank them; %d queries have no relevant document there and score 0 in every "
                  "run", len(unheld), corpus_path, example[1], example[0], len(unfindable))
  return len(unfindable)


def _judged_elsewhere(qrels_path: pathlib.Path) -> frozenset:
  """Query ids judged in the other qrels files beside `qrels_path` (read leniently: their bad lines
  are that split's problem, skipped here)."""
  return frozenset(qid for other in sorted(qrels_path.parent.glob("*.tsv")) if other.name != qrels_path.name
                   for qid in read_qrels(other, Problems(skip_bad=True)))


def _check_nonempty(queries: Sequence[RerankQuery], what: str) -> None:
  if not queries:
    raise DataError(f"{what}: no queries to rerank")


def load_rerank_set(jsonl: Optional[os.PathLike] = None, data_dir: Optional[os.PathLike] = None,
                    run_file: Optional[os.PathLike] = None, split: str = "test", top_k: int = 100,
                    skip_bad: bool = False) -> RerankSet:
  """Either form, from the eval script's flags: `jsonl`, or `data_dir` with `run_file`."""
  if jsonl and (data_dir or run_file):
    raise DataError("pass either --jsonl or --data_dir with --run_file, not both")
  if jsonl:
    return load_jsonl(jsonl, split, top_k, skip_bad)
  if not data_dir or not run_file:
    raise DataError("a BEIR dataset needs both --data_dir and --run_file (the first-stage run to rerank)")
  return load_beir(data_dir, run_file, split, top_k, skip_bad)


def sources_or_default(jsonl: Optional[str], data_dir: Optional[str], run_file: Optional[str],
                       use: Literal["eval", "train"]) -> tuple[Optional[str], Optional[str], Optional[str]]:
  """(jsonl, data_dir, run_file) as given, or the embedded default sets' when none is given: the eval reranks
  the Perl FAQ test set with its BM25 run (what `make eval` evaluates), training reads the first set's JSONL
  form (whose `split` fields hold train and dev)."""
  if jsonl or data_dir or run_file:
    return jsonl, data_dir, run_file
  return ((None, str(DEFAULT_EVAL_DIR), str(DEFAULT_EVAL_RUN)) if use == "eval"
          else (str(DEFAULT_JSONL), None, None))


def input_paths(rset: RerankSet) -> list[str]:
  """The files and directories a rerank set was read from (outputs may not overwrite them)."""
  return [rset.source[k] for k in ("path", "data_dir", "run_file") if rset.source.get(k)]


def format_score(score: float) -> str:
  """The shortest text that reads back as the same float32 (ranking and ties survive a re-read)."""
  return str(np.float32(score))


def trec_lines(qid: str, docids: Sequence[str], scores: Sequence[float], tag: str) -> list[str]:
  """TREC run lines of one query, ranked as trec_eval ranks them: score desc, then docid desc."""
  order = sorted(zip(scores, docids), reverse=True)
  return [f"{qid} Q0 {d} {rank} {format_score(s)} {tag}" for rank, (s, d) in enumerate(order, 1)]


