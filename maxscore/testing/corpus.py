"""The embedded rerank set's texts, for the real-weights tests' tokenizer and logit checks."""

import json

from maxscore.rerank import data


def records(split: str = "test") -> list[dict]:
  return [r for r in map(json.loads, data.DEFAULT_JSONL.read_text().splitlines()) if r["split"] == split]


def paragraphs() -> list[str]:
  """Every distinct paragraph of the embedded corpus, in file order."""
  seen = {}
  for r in map(json.loads, data.DEFAULT_JSONL.read_text().splitlines()):
    for c in r["candidates"]:
      seen.setdefault(c["docid"], c["text"])
  return list(seen.values())


def queries() -> list[str]:
  """Every query of the embedded set (all splits), in file order."""
  return [json.loads(line)["query"] for line in data.DEFAULT_JSONL.read_text().splitlines()]
