"""Score requests: validation into token ids, and the sglang multi-item format parser.

Everything a caller can get wrong is checked here, once, and raised as ScoreInputError
naming the field, the offending value and the limit (DESIGN.md section 9).
"""

import dataclasses
import numbers
from typing import Any, Optional, Sequence

import numpy as np

from maxscore.errors import ScoreInputError


@dataclasses.dataclass(frozen=True)
class TokenRequest:
  """A validated request in token space. `prefix` is Q + [s] (or Q + [] without separator)."""
  query: tuple[int, ...]
  items: tuple[tuple[int, ...], ...]
  label_ids: tuple[int, ...]
  apply_softmax: bool
  item_first: bool
  separator: Optional[int]

  @property
  def prefix(self) -> tuple[int, ...]:
    return self.query + ((self.separator,) if self.separator is not None else ())

  def serial_sequence(self, i: int) -> tuple[int, ...]:
    """seq_i of DESIGN.md section 1 (item-first puts the item before the separator and query)."""
    sep = (self.separator,) if self.separator is not None else ()
    if self.item_first:
      return self.items[i] + sep + self.query
    return self.prefix + self.items[i]

  @property
  def num_tokens(self) -> int:
    return len(self.prefix) + sum(len(x) for x in self.items)


def _is_int(x: Any) -> bool:
  return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _check_ids(field: str, ids: Sequence[Any], vocab_size: int) -> tuple[int, ...]:
  """Vectorized check of a token-id list; the error names the first bad position."""
  arr = np.asarray(ids) if len(ids) else np.zeros((0,), np.int64)
  if arr.ndim != 1 or arr.dtype.kind not in "iu":
    for j, t in enumerate(ids):
      if not _is_int(t):
        raise ScoreInputError(f"{field}[{j}]={t!r} must be an integer token id")
  bad = np.flatnonzero((arr < 0) | (arr >= vocab_size))
  if bad.size:
    j = int(bad[0])
    raise ScoreInputError(f"{field}[{j}]={ids[j]} is outside the vocabulary [0, {vocab_size})")
  return tuple(arr.tolist())


def _encode(field: str, value: Any, tokenizer, vocab_size: int) -> tuple[int, ...]:
  if isinstance(value, str):
    if tokenizer is None:
      raise ScoreInputError(f"{field} is text but this scorer has no tokenizer; pass token ids or set "
                            f"tokenizer_path")
    return _check_ids(field, tokenizer.encode(value), vocab_size)
  if isinstance(value, (list, tuple)) or (hasattr(value, "tolist") and getattr(value, "ndim", 0) == 1):
    return _check_ids(field, list(value.tolist() if hasattr(value, "tolist") else value), vocab_size)
  raise ScoreInputError(f"{field} must be text or a list of token ids, got {type(value).__name__}")


def make_request(query: Any, items: Any, label_token_ids: Optional[Sequence[int]], apply_softmax: bool,
                 item_first: bool, separator: Optional[int], vocab_size: int, tokenizer=None,
                 max_tokens: int = 1 << 62, max_prefix_tokens: int = 1 << 62,
                 max_item_tokens: int = 1 << 62) -> TokenRequest:
  """Validates one /v1/score-shaped request and converts it to token ids."""
  q = _encode("query", query, tokenizer, vocab_size)
  if not q:
    raise ScoreInputError("query is empty; a score needs at least one query token")
  if isinstance(items, str):
    items = [items]
  elif hasattr(items, "tolist") and not isinstance(items, (list, tuple)):
    items = items.tolist()
  if not isinstance(items, (list, tuple)):
    raise ScoreInputError(f"items must be a text, a list of texts or a list of token-id lists, "
                          f"got {type(items).__name__}")
  if items and all(_is_int(x) for x in items):
    raise ScoreInputError("items is a flat list of ints; pass a list of token-id lists (one per item)")
  kinds = {isinstance(x, str) for x in items}
  if len(kinds) > 1:
    raise ScoreInputError("items mixes text and token ids; use one kind for all items")
  toks = tuple(_encode(f"items[{i}]", x, tokenizer, vocab_size) for i, x in enumerate(items))
  if label_token_ids is None or len(label_token_ids) == 0:
    raise ScoreInputError("label_token_ids is empty; pass at least one label token id (or set it in the config)")
  labels = _check_ids("label_token_ids", list(label_token_ids), vocab_size)
  if separator is not None:
    separator = _check_ids("separator_token_id", [separator], vocab_size)[0]
  req = TokenRequest(q, toks, labels, bool(apply_softmax), bool(item_first), separator)
  if len(req.prefix) > max_prefix_tokens:
    raise ScoreInputError(f"query is {len(req.prefix)} tokens with the separator, above the largest prefix "
                          f"bucket {max_prefix_tokens}; raise prefix_buckets or truncate the query")
  for i, item in enumerate(toks):
    if len(item) > max_item_tokens:
      raise ScoreInputError(f"items[{i}] is {len(item)} tokens, above the largest item bucket {max_item_tokens}; "
                            f"raise item_buckets or truncate the item")
  if req.num_tokens > max_tokens:
    raise ScoreInputError(f"request has {req.num_tokens} tokens (query + separator + items), above "
                          f"max_request_tokens={max_tokens}")
  return req


def parse_multi_item_sequence(tokens: Sequence[int], delimiter: int) -> tuple[list[int], list[list[int]]]:
  """Splits sglang's `Q d I1 d I2 ... d In d` into (query, items); the trailing d is optional.

  Score it with separator_token_id=d to reproduce sglang's sequences `Q d I_i`.
  """
  tokens = list(tokens)
  if delimiter not in tokens:
    raise ScoreInputError(f"multi-item sequence has no delimiter token {delimiter}; expected Q d I1 d ... In d")
  first = tokens.index(delimiter)
  if first == 0:
    raise ScoreInputError("multi-item sequence has an empty query (it starts with the delimiter)")
  query, rest = tokens[:first], tokens[first + 1:]
  if rest and rest[-1] == delimiter:
    rest = rest[:-1]
  items: list[list[int]] = [[]]
  for t in rest:
    if t == delimiter:
      items.append([])
    else:
      items[-1].append(t)
  if not rest and tokens[-1] == delimiter and len(tokens) == first + 1:
    items = []  # "Q d": no items
  return query, items
