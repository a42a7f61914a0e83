"""What the dataset readers share about one JSONL record: its parse, its ids, a document's text, and the
message for a line that is not UTF-8. data.py (the loaders) and docstore.py (the corpus index) both read
corpus lines through these, so a record means the same to both."""

import json
from typing import Any, Optional


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
