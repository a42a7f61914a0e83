"""Training groups: the group JSONL of FlagEmbedding and sentence-transformers (scripts/mine_negatives.py
writes it) as a rerank set to train on (the per-step draw of a group from a query's candidates is the reranker
recipe's: maxscore/training/reranker/batches.py).

    {"query": "...", "pos": ["..."], "neg": ["...", ...], "pos_scores": [...], "neg_scores": [...]}

`pos_scores`/`neg_scores` (a teacher's scores, scripts/score_teacher.py's or any other) are kept as the
set's teacher scores, which `loss=distill` trains toward. Documents are named by `pos_ids`/`neg_ids` when
the record has them (mining writes them), else by their position in the record.
"""

import json
import os
import pathlib

from absl import logging

from maxscore.datasets import data, records
from maxscore.errors import DataError


def read_groups(path: os.PathLike) -> list[dict]:
  """A group JSONL (this module's output, or FlagEmbedding's form) checked: each line a JSON object with a
  non-empty `query` string and lists of strings `pos` (non-empty) and `neg`; optional `pos_scores`/`neg_scores`
  as long as their lists. A bad line is a DataError naming it."""
  path = pathlib.Path(path)
  out = []
  for number, line in records.text_lines(path):
    where = f"{path}:{number}"
    try:
      rec = json.loads(line)
    except json.JSONDecodeError as e:
      raise DataError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(rec, dict) or not isinstance(rec.get("query"), str) or not rec["query"].strip():
      raise DataError(f"{where}: expected an object with a non-empty 'query' string")
    for key in ("pos", "neg"):
      value = rec.get(key)
      if not isinstance(value, list) or not all(isinstance(t, str) and t.strip() for t in value):
        raise DataError(f"{where}: '{key}' must be a list of non-empty strings")
    if not rec["pos"]:
      raise DataError(f"{where}: 'pos' is empty: a group needs a positive")
    for key, texts in (("pos_scores", "pos"), ("neg_scores", "neg")):
      if key in rec and (not isinstance(rec[key], list) or len(rec[key]) != len(rec[texts])
                         or not all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in rec[key])):
        raise DataError(f"{where}: '{key}' must be a list of {len(rec[texts])} numbers, one per '{texts}' entry")
    out.append(rec)
  if not out:
    raise DataError(f"{path}: no groups")
  logging.info("read %d groups from %s", len(out), path)
  return out


def _ids(rec: dict, key: str, prefix: str, n: int) -> list[str]:
  ids = rec.get(key)
  if isinstance(ids, list) and len(ids) == n and all(isinstance(d, str) and d and not any(c.isspace() for c in d)
                                                     for d in ids):
    return ids
  return [f"{prefix}{i}" for i in range(n)]


def load_groups(path: os.PathLike) -> data.RerankSet:
  """A group JSONL as a rerank set: per record one query whose candidates are its positives (grade 1) then
  its negatives (grade 0), with the teacher's scores when every record has them. Query ids: the record's
  `qid` if unique, else `g<line>`; a document id that would name two texts within a query is refused."""
  path = pathlib.Path(path)
  groups = read_groups(path)
  queries, qrels, teacher = [], {}, {}
  with_scores = all("pos_scores" in r and "neg_scores" in r for r in groups)
  if not with_scores and any("pos_scores" in r or "neg_scores" in r for r in groups):
    logging.warning("%s: only some groups have pos_scores/neg_scores; the teacher scores are not used", path)
  seen = set()
  for n, rec in enumerate(groups, 1):
    qid = rec.get("qid") if isinstance(rec.get("qid"), str) and rec.get("qid") not in seen else f"g{n}"
    seen.add(qid)
    pos_ids = _ids(rec, "pos_ids", "p", len(rec["pos"]))
    neg_ids = _ids(rec, "neg_ids", "n", len(rec["neg"]))
    docids = pos_ids + neg_ids
    if len(set(docids)) != len(docids):
      raise DataError(f"{path}: group {qid!r} names a document twice among its positives and negatives")
    queries.append(data.RerankQuery(qid, rec["query"], tuple(zip(docids, rec["pos"] + rec["neg"]))))
    qrels[qid] = {**{d: 1 for d in pos_ids}, **{d: 0 for d in neg_ids}}
    if with_scores:
      teacher[qid] = dict(zip(docids, map(float, rec["pos_scores"] + rec["neg_scores"])))
  source = {"format": "groups", "path": str(path), "groups": len(groups), "teacher_scores": with_scores}
  return data.RerankSet(queries, qrels, source, teacher_scores=teacher if with_scores else None)
