"""What the dataset readers share: a text file's lines, one JSONL record (its parse, its ids, a document's text,
the message for a line that is not UTF-8), a qrels grade, and `Problems`, which raises or counts (--skip_bad)
each bad input. data.py (the loaders), beir_files.py (corpus and queries files) and docstore.py (the corpus index)
all read through these, so a record means the same to each."""

import json
import pathlib
from typing import Any, Iterator, Optional

from absl import logging

from maxscore.errors import DataError


def not_utf8_message(raw: bytes, error: UnicodeDecodeError) -> str:
  """Why a raw line is not text: the first bad byte and its column."""
  return f"not UTF-8 text (byte {raw[error.start]:#04x} at column {error.start + 1})"


def parse_json_record(line: str) -> tuple[Optional[dict], Optional[str]]:
  """(the JSON object a line holds, None), or (None, why it is not one: a bad_json_lines message)."""
  try:
    record = json.loads(line)
  except json.JSONDecodeError as e:
    return None, f"invalid JSON ({e.msg} at column {e.colno})"
  except RecursionError:
    return None, "JSON nested too deeply"
  if not isinstance(record, dict):
    return None, f"expected a JSON object, got {type(record).__name__}"
  if "\\u" in line and not _valid_unicode(record):
    return None, "text holds a lone UTF-16 surrogate escape (e.g. \\ud800), not valid Unicode"
  return record, None


def _valid_unicode(record: dict) -> bool:
  try:
    json.dumps(record, ensure_ascii=False).encode("utf-8")
  except UnicodeEncodeError:
    return False
  return True


def record_id(value: Any) -> Optional[str]:
  """A qid/docid as text: strings and integers are accepted, whitespace is not (TREC columns)."""
  if isinstance(value, bool) or not isinstance(value, (str, int)):
    return None
  value = str(value)
  return value if value and not any(c.isspace() for c in value) else None


def doc_text(rec: dict) -> str:
  """A corpus record's text: "title text" when it has a title, else the text; "" when either is not a string."""
  title, text = rec.get("title") or "", rec.get("text") or ""
  if not isinstance(title, str) or not isinstance(text, str):
    return ""
  return f"{title} {text}".strip() if title.strip() else text


SKIP_HINT = " (pass --skip_bad to skip and count such input)"


class Problems:
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


def text_lines(path: pathlib.Path) -> Iterator[tuple[int, str]]:
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


def json_records(path: pathlib.Path, problems: Problems) -> Iterator[tuple[str, dict]]:
  """("file:line", object) for each line that parses as a JSON object of valid Unicode text."""
  for number, line in text_lines(path):
    where = f"{path}:{number}"
    record, problem = parse_json_record(line)
    if problem is not None:
      problems("bad_json_lines", where, problem)
      continue
    yield where, record


def parse_grade(value: Any) -> Optional[int]:
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
