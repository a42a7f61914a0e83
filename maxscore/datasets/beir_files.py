"""A BEIR directory's files one at a time: queries.jsonl, and corpus.jsonl read whole, streamed for the documents
needed, or through its document store (an offset index built once, maxscore/datasets/docstore.py) so memory
follows the documents asked for. The loaders (data.py), mining and the teachers read them here."""

import os
import pathlib
from typing import Optional

from maxscore.datasets import docstore
from maxscore.datasets.records import Problems, doc_text, json_records, record_id, text_lines
from maxscore.errors import DataError


def read_query_texts(path: pathlib.Path, problems: Problems) -> dict[str, str]:
  """queries.jsonl as {qid: text}, each bad line reported to `problems`; an empty file is a DataError saying so
  (rather than, later, a qrels line's unknown qid)."""
  out, lines = {}, {}
  for where, rec in json_records(path, problems):
    qid, text = record_id(rec.get("_id")), rec.get("text")
    if qid is None:
      problems("bad_records", where, f"_id={rec.get('_id')!r} must be a non-empty string without whitespace")
    elif not isinstance(text, str) or not text.strip():
      problems("empty_queries", where, f"query {qid!r} has empty text")
    elif qid in out:
      problems("duplicate_qids", where, f"query {qid!r} already appeared at line {lines[qid]}")
    else:
      out[qid], lines[qid] = text, where
  if not out and next(iter(text_lines(path)), None) is None:
    raise DataError(f'{path} is empty: it must hold the queries, one JSON record per line ({{"_id": ..., "text": ...}})')
  return out


def read_queries(path: os.PathLike) -> dict[str, str]:
  """queries.jsonl as {qid: text}; a malformed line is a DataError."""
  return read_query_texts(pathlib.Path(path), Problems(skip_bad=False))


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
  path, problems = pathlib.Path(path), Problems(skip_bad=False)
  texts: dict[str, str] = {}
  seen: set = set()
  for where, rec in json_records(path, problems):
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


def read_needed(corpus_path: pathlib.Path, needed: set, problems: Problems, judged: frozenset = frozenset()
                ) -> tuple[dict[str, str], set, set]:
  """({docid: text}, docids with empty text, the `judged` docids the corpus does not hold) of the needed
  documents, read through the corpus's document store (maxscore/datasets/docstore.py: an offset index built
  once); the corpus's problems are reported in file order, as reading the whole file reports them."""
  try:
    store = docstore.DocStore.open(corpus_path)
  except docstore.StoreError as e:
    raise DataError(str(e)) from None
  absent = store.absent(judged)
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
  return texts, empty, absent
