"""Score requests: validation into token ids, and the sglang multi-item format parser.

Everything a caller can get wrong is checked here, once, and raised as ScoreInputError
naming the field, the offending value and the limit (docs/ARCHITECTURE.md section 9).
"""

import dataclasses
import json
import numbers
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from maxscore.errors import RequestTooLargeError, ScoreInputError


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
    """seq_i of docs/ARCHITECTURE.md section 1 (item-first puts the item before the separator and query)."""
    sep = (self.separator,) if self.separator is not None else ()
    if self.item_first:
      return self.items[i] + sep + self.query
    return self.prefix + self.items[i]

  @property
  def num_tokens(self) -> int:
    return len(self.prefix) + sum(len(x) for x in self.items)


def _is_int(x: Any) -> bool:
  return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def _is_bool(x: Any) -> bool:
  return isinstance(x, (bool, np.bool_))


def short(value: Any, limit: int = 40) -> str:
  """`value` as a request gives it, in JSON (null, true, "text", [1, 2]), where it has a JSON form, else its
  repr (a NumPy array); cut to `limit` characters (an error names the value, not a megabyte of it)."""
  try:
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    text.encode("utf-8")
  except UnicodeEncodeError:  # a lone surrogate: escaped, so that the error itself can be sent as UTF-8
    text = json.dumps(value, allow_nan=False)
  except (TypeError, ValueError):
    text = repr(value)
  return text if len(text) <= limit else text[:limit - 3] + "..."


_JSON_KINDS = ((bool, "boolean"), (numbers.Integral, "integer"), (numbers.Number, "non-integer number"),
               (str, "string"), (Mapping, "object"), ((list, tuple), "array"))


def kind(value: Any) -> str:
  """The JSON name of `value`'s type (null, boolean, integer or non-integer number, string, object, array), else
  its Python name."""
  if value is None:
    return "null"
  return next((name for types, name in _JSON_KINDS if isinstance(value, types)), type(value).__name__)


def _is_array(value: Any) -> bool:
  return isinstance(value, np.ndarray) or (hasattr(value, "__array__") and hasattr(value, "dtype"))


def _check_ids(field: str, ids: Any, vocab_size: int) -> tuple[int, ...]:
  """A token-id list as a tuple: ints (not bools, floats or strings) in [0, vocab_size)."""
  if _is_array(ids):
    arr = np.asarray(ids)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
      raise ScoreInputError(f"{field} must be a 1-D integer array of token ids, got dtype {arr.dtype} "
                            f"shape {arr.shape}")
  else:
    for j, t in enumerate(ids):
      if type(t) is not int and not _is_int(t):
        raise ScoreInputError(f"{field}[{j}]={short(t)} must be an integer token id, not {kind(t)}")
    try:
      arr = np.asarray(ids, np.int64) if len(ids) else np.zeros((0,), np.int64)
    except OverflowError:
      j = next(j for j, t in enumerate(ids) if not -2**63 <= t < 2**63)
      raise ScoreInputError(f"{field}[{j}]={short(ids[j])} is outside the vocabulary [0, {vocab_size})") from None
  bad = np.flatnonzero((arr < 0) | (arr >= vocab_size))
  if bad.size:
    j = int(bad[0])
    raise ScoreInputError(f"{field}[{j}]={int(arr[j])} is outside the vocabulary [0, {vocab_size})")
  return tuple(arr.tolist())


def _encode(field: str, value: Any, tokenizer, vocab_size: int) -> tuple[int, ...]:
  """Text (tokenized) or a list of token ids; anything else is a ScoreInputError naming `field`."""
  if isinstance(value, str):
    if tokenizer is None:
      raise ScoreInputError(f"{field} is text but this scorer has no tokenizer; pass token ids or set "
                            f"tokenizer_path")
    try:
      value.encode("utf-8")
    except UnicodeEncodeError as e:
      raise ScoreInputError(f"{field} holds a lone surrogate {short(value[e.start])} at character {e.start}; "
                            f"text must be valid Unicode") from None
    return _check_ids(field, tokenizer.encode(value), vocab_size)
  if isinstance(value, (list, tuple)) or (_is_array(value) and np.ndim(value) == 1):
    return _check_ids(field, value, vocab_size)
  raise ScoreInputError(f"{field}={short(value)} must be text or a list of token ids, not {kind(value)}")


def _items(value: Any) -> list:
  """`items` as a list of texts or of token-id lists, not mixed."""
  if isinstance(value, str):
    return [value]
  if _is_array(value) and not isinstance(value, (list, tuple)):
    if np.ndim(value) != 2:
      raise ScoreInputError(f"items as an array must be 2-D [items, tokens], got shape {np.shape(value)}")
    return list(np.asarray(value))
  if not isinstance(value, (list, tuple)):
    raise ScoreInputError(f"items={short(value)} must be a text, a list of texts or a list of token-id lists, "
                          f"not {kind(value)}")
  if value and all(_is_int(x) for x in value):
    raise ScoreInputError("items is a flat list of ints; pass a list of token-id lists (one per item)")
  if len({isinstance(x, str) for x in value}) > 1:
    raise ScoreInputError("items mixes text and token ids; use one kind for all items")
  return list(value)


def _flag(field: str, value: Any) -> bool:
  if not _is_bool(value):
    raise ScoreInputError(f"{field}={short(value)} must be a boolean (JSON true or false), not {kind(value)}")
  return bool(value)


def _labels(value: Any, vocab_size: int) -> tuple[int, ...]:
  if value is None or (isinstance(value, (list, tuple)) and len(value) == 0) or (_is_array(value) and np.size(value) == 0):
    raise ScoreInputError("label_token_ids is empty; pass at least one label token id (or set it in the config)")
  if not isinstance(value, (list, tuple)) and not (_is_array(value) and np.ndim(value) == 1):
    raise ScoreInputError(f"label_token_ids={short(value)} must be a non-empty list of integer token ids, "
                          f"not {kind(value)}")
  return _check_ids("label_token_ids", value, vocab_size)


def make_request(query: Any, items: Any, label_token_ids: Optional[Sequence[int]], apply_softmax: bool,
                 item_first: bool, separator: Optional[int], vocab_size: int, tokenizer=None,
                 max_tokens: int = 1 << 62, max_prefix_tokens: int = 1 << 62,
                 max_item_tokens: int = 1 << 62) -> TokenRequest:
  """Validates one /v1/score-shaped request and converts it to token ids.

  An empty query is valid (seq_i = [s] + I_i, docs/ARCHITECTURE.md section 1); only a sequence with no token at
  all is refused. Every violation is a ScoreInputError naming the field, the value and what is allowed."""
  q = _encode("query", query, tokenizer, vocab_size)
  toks = tuple(_encode(f"items[{i}]", x, tokenizer, vocab_size) for i, x in enumerate(_items(items)))
  labels = _labels(label_token_ids, vocab_size)
  if separator is not None:
    if not _is_int(separator):
      raise ScoreInputError(f"separator_token_id={short(separator)} must be an integer token id or null")
    separator = _check_ids("separator_token_id", [separator], vocab_size)[0]
  req = TokenRequest(q, toks, labels, _flag("apply_softmax", apply_softmax), _flag("item_first", item_first),
                     separator)
  if not req.prefix:
    for i, item in enumerate(toks):
      if not item:
        raise ScoreInputError(f"items[{i}] is empty and so is the query, with no separator: a scored sequence "
                              f"needs at least one token")
  if len(req.prefix) > max_prefix_tokens:
    raise RequestTooLargeError(f"query is {len(req.prefix)} tokens with the separator, above the largest prefix "
                          f"bucket {max_prefix_tokens}; raise prefix_buckets or truncate the query")
  for i, item in enumerate(toks):
    if len(item) > max_item_tokens:
      raise RequestTooLargeError(f"items[{i}] is {len(item)} tokens, above the largest item bucket {max_item_tokens}; "
                            f"raise item_buckets or truncate the item")
  if req.num_tokens > max_tokens:
    raise RequestTooLargeError(f"request has {req.num_tokens} tokens (query + separator + items), above "
                          f"max_request_tokens={max_tokens}")
  return req


def validate_request(request: Any, fields: frozenset) -> dict[str, Any]:
  """The arguments of a /v1/score-shaped dict for make_request: unknown fields refused, and a
  present apply_softmax / item_first must be a JSON boolean (absent = the default)."""
  if not isinstance(request, Mapping):
    raise ScoreInputError(f"a request must be a JSON object, got {kind(request)}")
  unknown = set(request) - fields
  if unknown:
    raise ScoreInputError(f"unknown fields {json.dumps(sorted(map(str, unknown))[:8])}; allowed: "
                          f"{json.dumps(sorted(fields))}")
  for name in ("query", "items"):
    if name not in request:
      raise ScoreInputError(f"{name} is missing; a request is {{query, items, label_token_ids?, apply_softmax?, "
                            f"item_first?}}")
  for name in ("apply_softmax", "item_first"):
    if name in request:
      _flag(name, request[name])
  if "model" in request and not isinstance(request["model"], str):
    raise ScoreInputError(f"model={short(request['model'])} must be a string")
  return {"query": request["query"], "items": request["items"], "label_token_ids": request.get("label_token_ids"),
          "apply_softmax": request.get("apply_softmax"), "item_first": request.get("item_first", False)}


def validate_batch(requests: Any, validate) -> list[TokenRequest]:
  """`validate` applied to each request of a list; errors name the request's index."""
  if isinstance(requests, (str, bytes, Mapping)) or not isinstance(requests, Sequence):
    raise ScoreInputError(f"requests must be a list of request objects, not {kind(requests)}")
  out = []
  for i, r in enumerate(requests):
    try:
      out.append(validate(r))
    except ScoreInputError as e:
      raise ScoreInputError(f"requests[{i}]: {e}") from None
  return out


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
