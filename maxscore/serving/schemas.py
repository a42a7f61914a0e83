"""Request checks and response bodies of the HTTP API.

/v1/score is sglang's schema (the fields Scorer.validate checks); /v1/rerank is the Cohere/Jina one:
{model?, query, documents: [str | {"text": str}], top_n?, return_documents?} ->
{results: [{index, relevance_score, document?}], model, usage}. Every refusal is an `ApiError`
whose body is OpenAI-style {"error": {"message", "type", "param", "code"}}: the message names the
field and the limit, `param` the field.
"""

import dataclasses
import json
import math
import re
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from maxscore.errors import RequestTooLargeError, ScoreInputError, UnknownModelError
from maxscore.scoring import model_names
from maxscore.scoring.requests import kind, short

RERANK_FIELDS = frozenset({"model", "query", "documents", "top_n", "return_documents"})
_FIELD_NAMES = ("query", "items", "label_token_ids", "apply_softmax", "item_first", "model", "documents", "top_n",
                "return_documents", "requests")
_TYPES = {400: "invalid_request_error", 404: "not_found_error", 413: "request_too_large", 503: "service_unavailable",
          504: "timeout", 500: "internal_error"}
_FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclasses.dataclass
class ApiError(Exception):
  """An HTTP error with an OpenAI-style body."""
  status: int
  message: str
  param: Optional[str] = None
  headers: Optional[dict[str, str]] = None

  def body(self) -> dict[str, Any]:
    return {"error": {"message": self.message, "type": _TYPES.get(self.status, "invalid_request_error"),
                      "param": self.param, "code": self.status}}


def param_of(message: str) -> Optional[str]:
  """The field a ScoreInputError message starts with (`items[3] is ...` -> "items[3]"), if it names one."""
  m = re.match(r"(?:requests\[\d+\]: )?([a-z_]+)(\[\d+\])?", message)
  return m.group(1) + (m.group(2) or "") if m and m.group(1) in _FIELD_NAMES else None


def from_input_error(error: ScoreInputError) -> ApiError:
  """400 for a bad field, 413 for a request above a size limit."""
  message = " ".join(str(error).split())
  status = 404 if isinstance(error, UnknownModelError) else 413 if isinstance(error, RequestTooLargeError) else 400
  return ApiError(status, message, param_of(message))


def parse_json(body: bytes) -> dict[str, Any]:
  """The request body as a JSON object, or a 400 saying why not."""
  try:
    value = json.loads(body)
  except (ValueError, RecursionError) as e:
    raise ApiError(400, f"the request body is not valid JSON: {' '.join(str(e).split())}") from None
  if not isinstance(value, dict):
    raise ApiError(400, f"the request body must be a JSON object, not {kind(value)}")
  return value


def check_model(body: Mapping[str, Any], served: Sequence[str]) -> None:
  """A request may name a served model (or leave `model` out); a name that is not a string is a 400, any other
  name a 404 (maxscore/scoring/model_names.py: scripts/score.py applies the same rule)."""
  try:
    model_names.check_model(body, served)
  except ScoreInputError as e:
    raise from_input_error(e) from None


def check_items(count: int, max_items: int, field: str) -> None:
  if count > max_items:
    raise ApiError(413, f"{field} has {count} entries, above the server's max_items={max_items}", field)


@dataclasses.dataclass(frozen=True)
class RerankRequest:
  query: str
  documents: tuple[str, ...]
  top_n: Optional[int]
  return_documents: bool


def rerank_request(body: Mapping[str, Any], max_items: int) -> RerankRequest:
  """Checks a /v1/rerank body (the model name is checked by check_model)."""
  unknown = set(body) - RERANK_FIELDS
  if unknown:
    raise ApiError(400, f"unknown fields {json.dumps(sorted(unknown)[:8])}; allowed: "
                        f"{json.dumps(sorted(RERANK_FIELDS))}")
  query = body.get("query")
  if not isinstance(query, str):
    raise ApiError(400, f"query={short(query)} must be a string", "query")
  docs = body.get("documents")
  if not isinstance(docs, list) or not docs:
    raise ApiError(400, f"documents={short(docs)} must be a non-empty list of strings or {{\"text\": string}} "
                        f"objects", "documents")
  check_items(len(docs), max_items, "documents")
  texts = []
  for i, d in enumerate(docs):
    text = d.get("text") if isinstance(d, dict) and set(d) <= {"text"} else d
    if not isinstance(text, str):
      raise ApiError(400, f"documents[{i}]={short(d)} must be a string or {{\"text\": string}}", f"documents[{i}]")
    texts.append(text)
  top_n = body.get("top_n")
  if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
    raise ApiError(400, f"top_n={short(top_n)} must be a positive integer or null", "top_n")
  ret = body.get("return_documents", True)
  if not isinstance(ret, bool):
    raise ApiError(400, f"return_documents={short(ret)} must be a boolean (JSON true or false)", "return_documents")
  return RerankRequest(query, tuple(texts), top_n, ret)


def _finite(x: float) -> float:
  """JSON has no infinity: a log-odds of +-inf (a label probability of 0) is sent as +-float32 max."""
  return x if math.isfinite(x) else math.copysign(_FLOAT32_MAX, x)


def rerank_response(req: RerankRequest, ranking: Sequence[float], model: str, prompt_tokens: int) -> dict[str, Any]:
  """Results by descending score (ties: input order), cut to top_n."""
  order = sorted(range(len(ranking)), key=lambda i: (-ranking[i], i))[:req.top_n]
  results = []
  for i in order:
    r = {"index": i, "relevance_score": _finite(float(ranking[i]))}
    if req.return_documents:
      r["document"] = {"text": req.documents[i]}
    results.append(r)
  return {"model": model, "results": results,
          "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}
