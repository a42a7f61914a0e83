"""The embedded rerank set's texts, for the real-weights tests' tokenizer and logit checks, and its splits cut
short for small training runs."""

import json

from maxscore.datasets import data


def records(split: str = "test") -> list[dict]:
  return [r for r in map(json.loads, data.DEFAULT_JSONL.read_text().splitlines()) if r["split"] == split]


def split(name: str, n: int) -> data.RerankSet:
  """The embedded rerank set's split `name`, cut to its first `n` queries (small training runs)."""
  s = data.load_jsonl(data.DEFAULT_JSONL, split=name)
  s.queries = s.queries[:n]
  return s


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


def logits_against_transformers(scorer, model, ids, points):
  """Per (length, keep) of `points`: (length, max |maxscore - transformers| over the last `keep` positions' logits
  of ids[:length], the tolerance max(1e-4, 1e-5 x max |logit|), the share of positions with the same argmax),
  float32; transformers computes only the kept positions' lm_head rows. Each row is printed."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  rows = []
  for t, keep in points:
    tokens = ids[:t]
    got = scorer.logits(tokens)[-keep:]
    with torch.no_grad():
      want = model(torch.tensor([tokens]), logits_to_keep=keep).logits[0].float().numpy()
    tolerance = max(1e-4, 1e-5 * float(np.abs(want).max()))
    err = float(np.abs(got - want).max())
    print(f"{t} tokens: max |logit| {np.abs(want).max():.2f}, max error {err:.2e} (tolerance {tolerance:.1e})")
    rows.append((t, err, tolerance, float((got.argmax(-1) == want.argmax(-1)).mean())))
  return rows
