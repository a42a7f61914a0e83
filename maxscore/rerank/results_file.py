"""The eval's resume state, results.jsonl: its header (the run's fingerprint) and one record per finished query,
appended and flushed as each finishes, so a killed run loses nothing and a rerun skips what is there."""

import json
import os
import pathlib
from typing import Any, Mapping, Sequence

import jax
from absl import logging

from maxscore.rerank.eval_outputs import EvalReport, format_report  # noqa: F401  (this module's public face)
from maxscore import errors
from maxscore.distributed import mesh as mesh_lib
from maxscore.files import identity, safety

RESULTS_FILE = "results.jsonl"
RESTART = "pass --overwrite to start over, or use a new --output_dir"


def load_results(path: pathlib.Path, header: Mapping[str, Any]) -> dict[str, dict]:
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


def resume_state(header: Mapping[str, Any], queries, out: pathlib.Path, overwrite: bool, inputs: Sequence[Any],
                 output_files: Sequence[str]) -> dict[str, dict]:
  """Process 0's finished records from results.jsonl (after --overwrite, the header check against the run's
  fingerprint `header`, and the digest check of each query); `output_files` are the run's outputs in `out`."""
  safety.refuse_overlap([out / name for name in output_files], inputs, "an output file in --output_dir")
  safety.prepare_output_dir(out, "eval", inputs, "--output_dir")
  results_path = out / RESULTS_FILE
  if overwrite and results_path.exists():
    results_path.unlink()
  done = load_results(results_path, header)
  for q in queries:
    if q.qid in done and done[q.qid]["digest"] != q.digest():
      raise errors.ResumeError(f"{results_path} has query {q.qid!r} scored on other text or candidates "
                               f"(changed: data); {RESTART}")
  return done


def agreed_resume_state(header: Mapping[str, Any], queries, out: pathlib.Path, overwrite: bool,
                        inputs: Sequence[Any], output_files: Sequence[str]) -> dict[str, dict]:
  """`resume_state` on process 0 ({} on the others); an error there is raised in every process."""
  done, error = {}, None
  if jax.process_index() == 0:
    try:
      done = resume_state(header, queries, out, overwrite, inputs, output_files)
    except (errors.ResumeError, errors.UnsafeOutputError, OSError) as e:
      error = e
  message = mesh_lib.broadcast_from_process0(None if error is None else str(error))
  if error is not None:
    raise error
  if message is not None:  # the other processes stop with process 0's error
    raise errors.ResumeError(message)
  return done


def append_record(f, rec: dict, fsync: bool, path: pathlib.Path) -> None:
  """One finished query's record, flushed (a full disk is an error naming the file)."""
  try:
    f.write(json.dumps(rec, allow_nan=False) + "\n")
    f.flush()
    if fsync:
      os.fsync(f.fileno())
  except OSError as e:
    raise safety.with_path(e, path) from None
