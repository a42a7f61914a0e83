"""A document store over a BEIR corpus.jsonl: an offset index built once (streaming), then only the documents a run
needs are read, so start-up and memory follow the run, not the corpus.

    store = DocStore.open("beir/msmarco/corpus.jsonl")     # builds or checks the index
    records = store.get({"d1", "d7"})                      # {docid: (line number, the corpus record)}
    store.problems                                         # what the build found: bad lines, duplicate ids

The index lives in the per-user cache (maxscore/files/cache.py), in docstore/<digest of the corpus's absolute
path>/, never beside the user's data: `meta.json` and four arrays, read memory-mapped: the 64-bit BLAKE2 hash
of each docid (sorted), the record's byte offset, its length and its line number. A lookup hashes the wanted ids, finds them by
binary search and reads each line with one positioned read; the record's own `_id` is checked, so a hash
collision cannot return another document. Memory: the arrays are mapped, not loaded (20 bytes per document on
disk), plus the records read.

The index is checked against its corpus before every use: size, modification time and a digest of sampled
blocks (the first and last 64 KiB and 14 blocks between). A changed corpus rebuilds the index. The build
records, with their `file:line`, what the eval's loader reports for a corpus (lines that are not JSON objects,
records without a usable `_id`, an `_id` repeated with other text), so loading through the store reports them
exactly as reading the whole file does; of a repeated `_id` with the same text the first record is kept.
"""

import array
import dataclasses
import hashlib
import json
import os
import pathlib
import time
from typing import Any, Iterable, Optional

import numpy as np
from absl import logging

from maxscore.datasets.records import doc_text, not_utf8_message, parse_json_record, record_id
from maxscore.files import cache

INDEX_VERSION = 1
_SAMPLE_BLOCK = 1 << 16
_SAMPLES = 14


class StoreError(ValueError):
  """The corpus cannot be indexed or read (a non-UTF-8 line, an unreadable file)."""


def _hash(docid: str) -> int:
  return int.from_bytes(hashlib.blake2b(docid.encode("utf-8"), digest_size=8).digest(), "little")


def corpus_signature(path: pathlib.Path) -> dict[str, Any]:
  """Size, modification time and a digest of sampled blocks: what says the corpus is the one indexed."""
  st = path.stat()
  h = hashlib.sha256()
  with open(path, "rb") as f:
    points = {0, max(0, st.st_size - _SAMPLE_BLOCK)}
    points |= {st.st_size * (i + 1) // (_SAMPLES + 1) for i in range(_SAMPLES)}
    for at in sorted(points):
      f.seek(at)
      h.update(f.read(_SAMPLE_BLOCK))
  return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sample_sha256": h.hexdigest()}


def _index_dir(corpus: pathlib.Path) -> pathlib.Path:
  key = hashlib.sha256(str(corpus.resolve()).encode()).hexdigest()[:24]
  return cache.user_cache_dir() / "docstore" / key


@dataclasses.dataclass
class DocStore:
  corpus: pathlib.Path
  index_dir: pathlib.Path
  meta: dict
  keys: np.ndarray      # uint64 [n], sorted
  offsets: np.ndarray   # uint64 [n]
  lengths: np.ndarray   # uint32 [n]
  lines: np.ndarray     # uint32 [n], 1-based line numbers
  built_seconds: Optional[float] = None  # set when this open built the index

  @property
  def problems(self) -> list[tuple]:
    """(reason, "file:line", message) of each problem the build found, in file order; a repeated docid's ends
    with the docid."""
    return [tuple(p) for p in self.meta["problems"]]

  @classmethod
  def open(cls, corpus: os.PathLike, index_dir: Optional[os.PathLike] = None) -> "DocStore":
    """The store of `corpus`, its index built (or rebuilt, when the corpus changed) first."""
    corpus = pathlib.Path(corpus)
    if not corpus.is_file():
      raise StoreError(f"{corpus}: file does not exist" if not corpus.exists() else f"{corpus}: is not a file")
    where = pathlib.Path(index_dir) if index_dir else _index_dir(corpus)
    signature = corpus_signature(corpus)
    meta_path = where / "meta.json"
    built = None
    try:
      meta = json.loads(meta_path.read_text())
      fresh = meta.get("version") == INDEX_VERSION and meta.get("corpus") == signature
    except (OSError, ValueError):
      fresh = False
    if not fresh:
      built = build_index(corpus, where, signature)
      meta = json.loads(meta_path.read_text())
    arrays = [np.load(where / f"{name}.npy", mmap_mode="r") for name in ("keys", "offsets", "lengths", "lines")]
    return cls(corpus, where, meta, *arrays, built_seconds=built)

  def __len__(self) -> int:
    return len(self.keys)

  def absent(self, docids: Iterable[str]) -> set[str]:
    """The ids whose hash the index does not hold: certainly not in the corpus, found without reading a record
    (an absent id whose 64-bit hash equals a present one's would be missed)."""
    wanted = sorted(set(docids))
    if not wanted:
      return set()
    hashes = np.asarray([_hash(d) for d in wanted], np.uint64)
    at = np.minimum(np.searchsorted(self.keys, hashes), max(len(self.keys) - 1, 0))
    held = (self.keys[at] == hashes) if len(self.keys) else np.zeros(len(wanted), bool)
    return {d for d, h in zip(wanted, held) if not h}

  def get(self, docids: Iterable[str]) -> dict[str, tuple[int, dict]]:
    """{docid: (line number, the corpus record)} of the wanted ids the corpus holds (the first record of a
    repeated id)."""
    wanted = sorted(set(docids))
    if not wanted:
      return {}
    hashes = np.asarray([_hash(d) for d in wanted], np.uint64)
    lo = np.searchsorted(self.keys, hashes, side="left")
    hi = np.searchsorted(self.keys, hashes, side="right")
    out = {}
    fd = os.open(self.corpus, os.O_RDONLY)
    try:
      for docid, a, b in zip(wanted, lo, hi):
        for i in range(a, b):  # equal hashes: normally one; a collision holds several ids
          raw = os.pread(fd, int(self.lengths[i]), int(self.offsets[i]))
          rec = json.loads(raw)
          if str(rec.get("_id")) == docid:
            out[docid] = (int(self.lines[i]), rec)
            break
    finally:
      os.close(fd)
    return out


def build_index(corpus: pathlib.Path, where: pathlib.Path, signature: dict) -> float:
  """Streams the corpus once and writes the index; returns the seconds it took. Memory: 24 bytes per document
  (compact arrays), not the documents."""
  start = time.perf_counter()
  logging.info("indexing %s (%.1f MB) for the document store", corpus, signature["size"] / 1e6)
  keys, offsets, lengths, lines = array.array("Q"), array.array("Q"), array.array("I"), array.array("I")
  problems = []
  offset = 0
  with open(corpus, "rb") as f:
    for number, raw in enumerate(f, 1):
      at, offset = offset, offset + len(raw)
      problem = _check_line(raw)
      if problem is None:
        continue  # a blank line
      if isinstance(problem, tuple):
        problems.append((problem[0], f"{corpus}:{number}", problem[1]))
        continue
      keys.append(_hash(problem))
      offsets.append(at)
      lengths.append(len(raw))
      lines.append(number)
  keys_np = np.frombuffer(keys, np.uint64) if len(keys) else np.zeros(0, np.uint64)
  order = np.argsort(keys_np, kind="stable")  # equal hashes keep file order
  arrays = {"keys": keys_np[order], "offsets": np.frombuffer(offsets, np.uint64)[order] if len(keys) else keys_np,
            "lengths": np.frombuffer(lengths, np.uint32)[order] if len(keys) else np.zeros(0, np.uint32),
            "lines": np.frombuffer(lines, np.uint32)[order] if len(keys) else np.zeros(0, np.uint32)}
  keep, repeats = _repeats(corpus, arrays)
  problems += repeats
  problems.sort(key=lambda p: int(p[1].rsplit(":", 1)[1]))
  meta = {"version": INDEX_VERSION, "corpus": signature, "documents": int(keep.sum()), "problems": problems}
  with cache.building(where, "meta.json") as built:  # other processes may build it at once: each file moves whole
    for name, values in arrays.items():
      np.save(built / f"{name}.npy", values[keep])
    (built / "meta.json").write_text(json.dumps(meta) + "\n")  # moved last: an index without its meta is never used
  seconds = time.perf_counter() - start
  logging.info("indexed %d documents of %s in %.1f s", int(keep.sum()), corpus, seconds)
  return seconds


def _check_line(raw: bytes):
  """A corpus line's docid; (reason, message) when the loader would report it; None for a blank line."""
  try:
    line = raw.decode("utf-8").rstrip("\r\n")
  except UnicodeDecodeError as e:
    return ("fatal", not_utf8_message(raw, e))
  if not line.strip():
    return None
  rec, problem = parse_json_record(line)
  if problem is not None:
    return ("bad_json_lines", problem)
  docid = record_id(rec.get("_id"))
  if docid is None:
    return ("bad_records", f"_id={rec.get('_id')!r} must be a non-empty string without whitespace")
  return docid


def _repeats(corpus: pathlib.Path, arrays: dict) -> tuple[np.ndarray, list]:
  """(which sorted entries to keep, the problems of repeated docids): of a docid repeated with the same text the
  first record is kept; one repeated with other text is reported (the first kept). Only runs of equal hashes are
  read again (repeats and the rare hash collision)."""
  keys = arrays["keys"]
  keep = np.ones(len(keys), bool)
  problems = []
  if len(keys) < 2:
    return keep, problems
  same = np.nonzero(keys[1:] == keys[:-1])[0]
  if not len(same):
    return keep, problems
  fd = os.open(corpus, os.O_RDONLY)
  try:
    run_starts = sorted(set(int(i) for i in same if i == 0 or keys[i - 1] != keys[i]))
    for a in run_starts:
      b = a
      while b + 1 < len(keys) and keys[b + 1] == keys[a]:
        b += 1
      first: dict[str, tuple[str, int]] = {}  # docid -> (text, line) of its first record
      for i in range(a, b + 1):  # file order within the run (stable sort)
        rec = json.loads(os.pread(fd, int(arrays["lengths"][i]), int(arrays["offsets"][i])))
        docid, text, line = record_id(rec.get("_id")), doc_text(rec), int(arrays["lines"][i])
        if docid in first:
          keep[i] = False
          if first[docid][0] != text:  # which text was meant is unknown: the loader refuses (or skips) it
            problems.append(("duplicate_docids", f"{corpus}:{line}",
                             f"_id {docid!r} already appeared at {corpus}:{first[docid][1]} with other text", docid))
        else:
          first[docid] = (text, line)
  finally:
    os.close(fd)
  return keep, problems
