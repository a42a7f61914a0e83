"""Prompt templates for reranking: a query side (the shared prefix) and an item side.

Everything that depends only on the query sits in the query side, so a query's candidates
share one prefix (DESIGN.md section 1: seq_i = Q + I_i). Each side is a list of segments,
each tokenized on its own and concatenated: that reproduces how reference implementations
tokenize (Qwen3-Reranker encodes its system prefix, the `<Instruct>...<Document>: doc` pair
and its assistant suffix separately). The split between sides sits before the space that
precedes the document, so byte-level BPE tokenizers produce the same " word" token as they
would for the joined text.

Truncation is token-level on the fields: a query or document longer than its limit is cut
to its first `max_*_tokens` tokens (decoded back to text) before it is put in the template.
"""

import dataclasses
import functools
from typing import Optional, Sequence

from maxscore.errors import ScoreInputError
from maxscore.checkpoints.tokenizer import Tokenizer

DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


@dataclasses.dataclass(frozen=True)
class Template:
  """Query-side segments (may use {query} and {instruction}) and item-side segments ({doc})."""
  query_segments: tuple[str, ...]
  item_segments: tuple[str, ...]
  default_labels: tuple[str, ...]


_QWEN3_SYSTEM = ('<|im_start|>system\nJudge whether the Document meets the requirements based on the Query '
                 'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
                 '<|im_start|>user\n')
_QWEN3_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"

TEMPLATES: dict[str, Template] = {
    # Qwen3-Reranker's chat template; it reads p("yes") vs p("no") after the empty think block.
    "qwen3_reranker": Template(
        query_segments=(_QWEN3_SYSTEM, "<Instruct>: {instruction}\n<Query>: {query}\n<Document>:"),
        item_segments=(" {doc}", _QWEN3_SUFFIX),
        default_labels=("yes", "no")),
    # A plain prompt for base models and the embedded default model.
    "plain": Template(
        query_segments=("Query: {query}\nDocument:",),
        item_segments=(" {doc}\nRelevant:",),
        default_labels=("Yes", "No")),
}


def get_template(name: str) -> Template:
  if name not in TEMPLATES:
    raise ScoreInputError(f"template={name!r} is not one of {sorted(TEMPLATES)}")
  return TEMPLATES[name]


def resolve_labels(tokenizer: Optional[Tokenizer], labels: Sequence[str | int]) -> tuple[int, ...]:
  """Label token ids: integers (or all-digit strings) are ids, other strings go through label_id."""
  ids = []
  for label in labels:
    if isinstance(label, int) or (isinstance(label, str) and label.isdigit()):
      ids.append(int(label))
    elif tokenizer is None:
      raise ScoreInputError(f"label {label!r} is text but the model has no tokenizer; pass token ids")
    else:
      ids.append(tokenizer.label_id(label))
  if not ids:
    raise ScoreInputError("labels is empty; pass at least one label (e.g. Yes,No)")
  return tuple(ids)


class PromptBuilder:
  """Token ids of a template's query side and item side, with counted truncation."""

  def __init__(self, tokenizer: Tokenizer, template: Template, instruction: str = DEFAULT_INSTRUCTION,
               max_query_tokens: int = 0, max_item_tokens: int = 0, cache_size: int = 1 << 16):
    if tokenizer is None:
      raise ScoreInputError("prompt templates need a tokenizer; the checkpoint has none and tokenizer_path is unset")
    self.tokenizer = tokenizer
    self.template = template
    self.instruction = instruction
    self.max_query_tokens = max_query_tokens
    self.max_item_tokens = max_item_tokens
    # Documents recur across queries in first-stage runs; their item tokens are computed once.
    self.item = functools.lru_cache(maxsize=cache_size)(self._item)

  def _truncate(self, text: str, limit: int) -> tuple[str, bool]:
    if limit <= 0:
      return text, False
    ids = self.tokenizer.encode(text)
    if len(ids) <= limit:
      return text, False
    return self.tokenizer.decode(ids[:limit]), True

  def _encode(self, segments: Sequence[str], **fields: str) -> tuple[int, ...]:
    ids: list[int] = []
    for seg in segments:
      ids.extend(self.tokenizer.encode(seg.format(**fields)))
    return tuple(ids)

  def query(self, query: str) -> tuple[tuple[int, ...], bool]:
    """(query-side token ids, whether the query was truncated)."""
    query, truncated = self._truncate(query, self.max_query_tokens)
    return self._encode(self.template.query_segments, query=query, instruction=self.instruction), truncated

  def _item(self, doc: str) -> tuple[tuple[int, ...], bool]:
    """(item-side token ids, whether the document was truncated)."""
    doc, truncated = self._truncate(doc, self.max_item_tokens)
    return self._encode(self.template.item_segments, doc=doc), truncated
