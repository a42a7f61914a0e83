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
from typing import Any, Iterator, Literal, Optional, Sequence

import numpy as np
from absl import logging

from maxscore.datasets import docstore
from maxscore.datasets.records import doc_text, not_utf8_message, parse_json_record, record_id
from maxscore.errors import ScoreInputError

DEFAULT_DIR = pathlib.Path(__file__).resolve().parent.parent / "assets" / "default"
DEFAULT_CHECKPOINT = DEFAULT_DIR / "pydoc-tiny-qwen3"
DEFAULT_JSONL = DEFAULT_DIR / "pydoc_rerank.jsonl"
DEFAULT_BEIR_DIR = DEFAULT_DIR / "pydoc_beir"        # the same queries over the whole corpus (BEIR layout)
DEFAULT_RUN = DEFAULT_BEIR_DIR / "bm25.trec"          # its BM25 first stage (maxscore/lm/default_set.py)
DEFAULT_DOCS_DIR = DEFAULT_DIR / "python_docs_beir"   # the held-out set: the Python docs' section titles (maxscore/lm/docs_set.py)
DEFAULT_DOCS_RUN = DEFAULT_DOCS_DIR / "bm25.trec"

Qrels = dict[str, dict[str, int]]


class DataError(ScoreInputError):
  """A dataset file is malformed; the message starts with `file:line` where there is one."""


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


SKIP_HINT = " (pass --skip_bad to skip and count such input)"


class _Problems:
  """Raises DataError for a bad input, or counts it under `reason` when skipping is on."""

  def __init__(self, skip_bad: bool):
    self.skip_bad = skip_bad
    self.counts: dict[str, int] = {}

  def __call__(self, reason: str, where: str, message: str) -> None:
    if not self.skip_bad:
      raise DataError(f"{where}: {message}{SKIP_HINT}")
    if self.counts.get(reason, 0) < 3:
      logging.warning("skipping %s: %s", where, message)
    self.counts[reason] = self.counts.get(reason, 0) + 1


def _lines(path: pathlib.Path) -> Iterator[tuple[int, str]]:
  """(1-based line number, line without newline) of the non-blank lines of a UTF-8 text file."""
  if not path.exists():
    raise DataError(f"{path}: file does not exist")
  if not path.is_file():
    raise DataError(f"{path}: is a directory, not a file")
  with open(path, "rb") as f:
    for number, raw in enumerate(f, 1):
      try:
        line = raw.decode("utf-8").rstrip("\r\n")
      except UnicodeDecodeError as e:
        raise DataError(f"{path}:{number}: {not_utf8_message(raw, e)}") from None
      if line.strip():
        yield number, line




def _json_records(path: pathlib.Path, problems: _Problems) -> Iterator[tuple[str, dict]]:
  """("file:line", object) for each line that parses as a JSON object of valid Unicode text."""
  for number, line in _lines(path):
    where = f"{path}:{number}"
    record, problem = parse_json_record(line)
    if problem is not None:
      problems("bad_json_lines", where, problem)
      continue
    yield where, record




def _grade(value: Any) -> Optional[int]:
  if isinstance(value, bool):
    return None
  if isinstance(value, int):
    return value
  if isinstance(value, str):
    try:
      return int(value)
    except ValueError:
      return None
  if isinstance(value, float) and value.is_integer():
    return int(value)
  return None


# --- JSONL form ----------------------------------------------------------------------------
def load_jsonl(path: os.PathLike, split: Optional[str] = "test", top_k: int = 0,
               skip_bad: bool = False) -> RerankSet:
  """Loads the JSONL form. Records with a `split` field are kept when it equals `split`
  (`split=None` or "all" keeps every record); records without one belong to every split.
  `top_k > 0` keeps the first top_k candidates of each query."""
  path = pathlib.Path(path)
  problems = _Problems(skip_bad)
  queries, qrels, seen = [], {}, {}  # seen: qid -> "file:line"
  kept_split = not split or split == "all"
  for where, rec in _json_records(path, problems):
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
      if _grade(g) is None:
        problems("bad_qrels", where, f"qrels[{docid!r}]={g!r} of qid {qid!r} must be an integer grade")
        continue
      grades[str(docid)] = _grade(g)
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
def _read_queries(path: pathlib.Path, problems: _Problems) -> dict[str, str]:
  """{qid: text}; an empty file is a DataError saying so (rather than, later, a qrels line's unknown qid)."""
  out, lines = {}, {}
  for where, rec in _json_records(path, problems):
    qid, text = record_id(rec.get("_id")), rec.get("text")
    if qid is None:
      problems("bad_records", where, f"_id={rec.get('_id')!r} must be a non-empty string without whitespace")
    elif not isinstance(text, str) or not text.strip():
      problems("empty_queries", where, f"query {qid!r} has empty text")
    elif qid in out:
      problems("duplicate_qids", where, f"query {qid!r} already appeared at line {lines[qid]}")
    else:
      out[qid], lines[qid] = text, where
  if not out and next(iter(_lines(path)), None) is None:
    raise DataError(f'{path} is empty: it must hold the queries, one JSON record per line ({{"_id": ..., "text": ...}})')
  return out


def read_qrels(path: pathlib.Path, problems: Optional[_Problems] = None, known_qids=None) -> Qrels:
  """BEIR qrels TSV (`query-id corpus-id score`, an optional header line); or TREC `qid 0 docid grade`.
  Without `problems`, a malformed line raises DataError."""
  problems = problems or _Problems(skip_bad=False)
  qrels: Qrels = {}
  for number, line in _lines(path):
    where = f"{path}:{number}"
    cols = line.split("\t") if "\t" in line else line.split()
    if len(cols) == 4:  # TREC qrels: qid iteration docid grade
      cols = [cols[0], cols[2], cols[3]]
    if number == 1 and len(cols) == 3 and _grade(cols[2].strip()) is None:
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
    if _grade(grade) is None:
      problems("bad_qrels", where, f"score {grade!r} must be an integer grade")
      continue
    if known_qids is not None and qid not in known_qids:
      problems("bad_qrels", where, f"query-id {qid!r} is not in queries.jsonl")
      continue
    qrels.setdefault(qid, {})[docid] = _grade(grade)
  return qrels


def read_trec_run(path: os.PathLike) -> dict[str, dict[str, float]]:
  """A TREC run file as {qid: {docid: score}} (for checks and re-evaluation)."""
  path = pathlib.Path(path)
  run: dict[str, dict[str, float]] = {}
  for number, line in _lines(path):
    cols = line.split()
    if len(cols) != 6:
      raise DataError(f"{path}:{number}: expected 6 columns 'qid Q0 docid rank score tag', got {len(cols)}")
    try:
      run.setdefault(cols[0], {})[cols[2]] = float(cols[4])
    except ValueError:
      raise DataError(f"{path}:{number}: score {cols[4]!r} is not a number") from None
  return run


def _read_run(path: pathlib.Path, qrels: Qrels, queries: dict[str, str], top_k: int,
              problems: _Problems, other_splits: frozenset = frozenset()
              ) -> tuple[dict[str, list[tuple[str, str, float]]], int]:
  """({qid: [(docid, 'file:line', score)]} in rank order, top_k per query, for queries of the split; the
  number of lines passed over because their query is judged only in another split, `other_splits`)."""
  ranked: dict[str, list[tuple[int, float, str, str]]] = {}
  passed_over = 0
  seen: dict[tuple[str, str], str] = {}
  for number, line in _lines(path):
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
  problems = _Problems(skip_bad)
  queries = _read_queries(data_dir / "queries.jsonl", problems)
  qrels_path = data_dir / "qrels" / f"{split}.tsv"
  qrels = read_qrels(qrels_path, problems, known_qids=queries)
  run, other_lines = _read_run(run_file, qrels, queries, top_k, problems, _judged_elsewhere(qrels_path))
  needed = {docid for rows in run.values() for docid, _, _ in rows}
  corpus_path = data_dir / "corpus.jsonl"
  texts, empty = _read_needed(corpus_path, needed, problems)
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
  source = {"format": "beir", "data_dir": str(data_dir), "run_file": str(run_file), "split": split,
            "top_k": top_k, "judged_queries_without_candidates": missing,
            "run_lines_of_other_splits": other_lines}
  return RerankSet(out, {q: qrels[q] for q in run}, source, problems.counts)


def _read_needed(corpus_path: pathlib.Path, needed: set, problems: _Problems) -> tuple[dict[str, str], set]:
  """({docid: text}, docids with empty text) of the needed documents, read through the corpus's document store
  (maxscore/datasets/docstore.py: an offset index built once); the corpus's problems are reported in file order,
  as reading the whole file reports them."""
  try:
    store = docstore.DocStore.open(corpus_path)
  except docstore.StoreError as e:
    raise DataError(str(e)) from None
  found = store.get(needed)
  texts, empty, found_problems = {}, set(), []
  for docid, (line, rec) in found.items():
    text = doc_text(rec)
    if text.strip():
      texts[docid] = text
    else:
      empty.add(docid)
      found_problems.append(("empty_texts", f"{corpus_path}:{line}", f"document {docid!r} has empty title and text"))
  line_of = lambda p: int(p[1].rsplit(":", 1)[1])  # noqa: E731
  # A repeated docid matters only when the run needs it (as reading the whole file kept only needed texts).
  reported = [p[:3] for p in store.problems if p[0] != "duplicate_docids" or p[3] in needed]
  for reason, where, message in sorted(reported + found_problems, key=line_of):
    if reason == "fatal":
      raise DataError(f"{where}: {message}")
    problems(reason, where, message)
  return texts, empty


def _judged_elsewhere(qrels_path: pathlib.Path) -> frozenset:
  """Query ids judged in the other qrels files beside `qrels_path` (read leniently: their bad lines
  are that split's problem, skipped here)."""
  return frozenset(qid for other in sorted(qrels_path.parent.glob("*.tsv")) if other.name != qrels_path.name
                   for qid in read_qrels(other, _Problems(skip_bad=True)))


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
  the held-out python-docs set with its BM25 run (what `make eval` evaluates), training reads the first set's
  JSONL form (whose `split` fields hold train and dev)."""
  if jsonl or data_dir or run_file:
    return jsonl, data_dir, run_file
  return ((None, str(DEFAULT_DOCS_DIR), str(DEFAULT_DOCS_RUN)) if use == "eval"
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


# --- BEIR files one at a time (mining, teachers) --------------------------------------------
text_lines = _lines  # (line number, line) of a UTF-8 file's non-blank lines; DataError when it is not one
def read_queries(path: os.PathLike) -> dict[str, str]:
  """queries.jsonl as {qid: text}; a malformed line is a DataError."""
  return _read_queries(pathlib.Path(path), _Problems(skip_bad=False))


def document_reader(path: os.PathLike):
  """get(docids) -> {docid: "title text"} of a corpus.jsonl, each call reading only those documents through the
  corpus's document store (an offset index built once), so memory follows the documents asked for. A corpus line
  that is not a record is a DataError at once; an asked-for docid repeated with other text, at the call. A
  document with empty text is left out."""
  path = pathlib.Path(path)
  try:
    store = docstore.DocStore.open(path)
  except docstore.StoreError as e:
    raise DataError(str(e)) from None
  repeated = {}
  for p in store.problems:
    if p[0] == "duplicate_docids":
      repeated.setdefault(p[3], p)
    else:
      raise DataError(f"{p[1]}: {p[2]}")

  def get(docids) -> dict[str, str]:
    docids = set(docids)
    bad = sorted(d for d in docids if d in repeated)
    if bad:
      raise DataError(f"{repeated[bad[0]][1]}: {repeated[bad[0]][2]}")
    texts = {d: doc_text(rec) for d, (_, rec) in store.get(docids).items()}
    return {d: t for d, t in texts.items() if t.strip()}
  return get


def read_corpus(path: os.PathLike, needed: Optional[set] = None) -> dict[str, str]:
  """corpus.jsonl as {docid: "title text"}, streamed: with `needed`, only those documents are kept, so memory
  grows with them, not with the corpus. A malformed line, an empty document or a docid repeated with other
  text is a DataError."""
  path, problems = pathlib.Path(path), _Problems(skip_bad=False)
  texts: dict[str, str] = {}
  seen: set = set()
  for where, rec in _json_records(path, problems):
    docid = record_id(rec.get("_id"))
    if docid is None:
      problems("bad_records", where, f"_id={rec.get('_id')!r} must be a non-empty string without whitespace")
    if needed is not None and docid not in needed:
      continue
    text = doc_text(rec)
    if not text.strip():
      problems("empty_texts", where, f"document {docid!r} has empty title and text")
    if docid in seen and texts[docid] != text:
      problems("duplicate_docids", where, f"_id {docid!r} appeared before with other text")
    texts[docid] = text
    seen.add(docid)
  return texts
