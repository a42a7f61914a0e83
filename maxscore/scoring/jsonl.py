"""A JSONL file of /v1/score requests scored into a JSONL file of responses (scripts/score.py).

One response line per request line, in order (blank lines are skipped, as JSONL readers do); a bad
line gets `{"error": ...}` on its own line and the others are scored. A request may name a served model
(`model`, maxscore/scoring/model_names.py: the server's rule); another name is an error line.
"""

import contextlib
import json
import sys
from typing import Any, Optional, Sequence

import numpy as np

from maxscore.errors import ScoreInputError
from maxscore.files import safety
from maxscore.scoring import model_names
from maxscore.scoring.scorer import Scorer


def _parse_request(scorer: Scorer, line: Any, number: int, names: Sequence[str]):
  """A validated TokenRequest from one JSONL line (bytes or text); ScoreInputError naming the line otherwise."""
  try:
    text = line.decode("utf-8") if isinstance(line, bytes) else line
    text = text.rstrip("\r\n")  # a line's end is not part of its JSON: an error past it names this line's column
    r = json.loads(text)
  except UnicodeDecodeError as e:
    raise ScoreInputError(f"line {number}: not UTF-8 text (byte {line[e.start]:#04x} at column {e.start + 1})") from None
  except json.JSONDecodeError as e:
    cut = "; the line ends there, cut short" if e.pos >= len(text) else ""
    raise ScoreInputError(f"line {number}: invalid JSON ({e.msg} at column {e.colno}{cut})") from None
  except RecursionError:
    raise ScoreInputError(f"line {number}: JSON nested too deeply") from None
  try:
    if isinstance(r, dict):
      model_names.check_model(r, names)
    return scorer.validate(r)
  except ScoreInputError as e:
    raise ScoreInputError(f"line {number}: {e}") from None


def _score_lines(scorer: Scorer, lines: Sequence[tuple[int, Any]], raw_logits: bool = False,
                 names: Sequence[str] = ()) -> list[dict]:
  """Responses (or {"error"}) for a batch of lines, in order; one forward group for the valid ones.
  A line's answer never depends on the others: a bad line gets its own error and the rest are scored.

  With `raw_logits` the scores are the labels' raw lm_head logits (apply_softmax is then moot). `names`: the
  served model names (() = the scorer's); responses report the first."""
  names = tuple(names) or (scorer.model_name,)
  score_requests = scorer.label_logits_requests if raw_logits else scorer.score_requests
  out: list[Optional[dict]] = [None] * len(lines)
  reqs = {}
  for i, (number, line) in enumerate(lines):
    try:
      reqs[i] = _parse_request(scorer, line, number, names)
    except ScoreInputError as e:
      out[i] = {"error": str(e)}
  try:
    results = dict(zip(reqs, score_requests(list(reqs.values())))) if reqs else {}
  except ScoreInputError:  # a limit hit inside an algorithm (e.g. a bucket): find the request one by one
    results = {}
    for i, req in reqs.items():
      try:
        results[i] = score_requests([req])[0]
      except ScoreInputError as e:
        out[i] = {"error": f"line {lines[i][0]}: {e}"}
  for i, res in results.items():
    if np.isfinite(np.asarray(res.scores, np.float64)).all():
      out[i] = res.to_response(names[0])
    else:  # NaN is not JSON, and a score the model cannot give is no answer
      out[i] = {"error": f"line {lines[i][0]}: the model produced non-finite scores (NaN or Inf); check the "
                         f"checkpoint for non-finite weights"}
  return out


def score_jsonl(scorer: Scorer, input_path: str, output_path: str, batch_size: int = 16,
                raw_logits: bool = False, served_names: Sequence[str] = ()) -> dict[str, int]:
  """Scores a JSONL file of /v1/score requests into a JSONL of responses (one line per request line; blank
  lines are skipped); returns {"ok", "errors"} counts. "-" is stdin / stdout. `served_names`: the model
  names a request may give (() = the scorer's name); responses report the first.

  The output may not be the input (links resolved); it is written under a temporary name and renamed
  into place at the end, so a killed run leaves any previous output file as it was."""
  safety.refuse_overlap([output_path], [input_path], "--output")
  counts = {"ok": 0, "errors": 0}
  with contextlib.ExitStack() as stack:
    src = sys.stdin.buffer if input_path == "-" else stack.enter_context(open(input_path, "rb"))
    dst = sys.stdout if output_path == "-" else stack.enter_context(safety.atomic_output(output_path))
    batch: list[tuple[int, bytes]] = []

    def flush():
      for resp in _score_lines(scorer, batch, raw_logits, served_names):
        dst.write(json.dumps(resp, allow_nan=False) + "\n")
        counts["errors" if "error" in resp else "ok"] += 1
      dst.flush()
      batch.clear()
    for number, line in enumerate(src, 1):
      if not line.strip():  # a blank line is no request (as JSONL readers skip it)
        continue
      batch.append((number, line))
      if len(batch) >= max(batch_size, 1):
        flush()
    flush()
  return counts
