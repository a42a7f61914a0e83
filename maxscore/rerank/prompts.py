"""Prompt templates for reranking: a query side (the shared prefix) and an item side.

Everything that depends only on the query sits in the query side, so a query's candidates
share one prefix (docs/ARCHITECTURE.md section 1: seq_i = Q + I_i). Each side is a list of segments,
each tokenized on its own and concatenated: that reproduces how reference implementations
tokenize (Qwen3-Reranker encodes its system prefix, the `<Instruct>...<Document>: doc` pair
and its assistant suffix separately). The split between sides sits before the space that
precedes the document, so byte-level BPE tokenizers produce the same " word" token as they
would for the joined text.

Templates for the LLM rerankers people use: Qwen3-Reranker, bge-reranker-v2-gemma (FlagEmbedding:
`A: {query}` / `B: {passage}` / its instruction, ranked by the raw logit of "Yes"), mxbai-rerank-v2
(a Qwen2 chat prompt ranked by "1" against "0") and `chat`: the tokenizer's own chat template
(tokenizer_config.json `chat_template` or chat_template.jinja) around a yes/no question, the
document last in the user turn so everything before it is the shared prefix.

Truncation is token-level on the fields: a query or document longer than its limit is cut
to its first `max_*_tokens` tokens (decoded back to text) before it is put in the template.

`PromptConfig` names a template with its labels, score mode (`SCORE_MODES`: the ranking score read from
the label scores) and truncation: the settings the eval, head training and the server share.
"""

import dataclasses
import functools
import json
import pathlib
from typing import Literal, Optional, Sequence

import numpy as np

from maxscore import config as config_lib
from maxscore.checkpoints.tokenizer import Tokenizer
from maxscore.errors import DataError, ScoreInputError
from maxscore.rerank import metrics

DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
DEFAULT_METRICS = ("ndcg@10", "mrr@10", "map", "recall@10", "p@10")


@dataclasses.dataclass(frozen=True)
class Template:
  """Query-side segments (may use {query} and {instruction}) and item-side segments ({doc}).

  `bos`: the query side starts with the tokenizer's BOS token. `chat`: the segments come from the
  tokenizer's chat template (`chat_segments`) when a PromptBuilder is made.
  """
  query_segments: tuple[str, ...]
  item_segments: tuple[str, ...]
  default_labels: tuple[str, ...]
  bos: bool = False
  chat: bool = False


_QWEN3_SYSTEM = ('<|im_start|>system\nJudge whether the Document meets the requirements based on the Query '
                 'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
                 '<|im_start|>user\n')
_QWEN3_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"

BGE_GEMMA_PROMPT = ("Given a query A and a passage B, determine whether the passage contains an answer to the query "
                    "by providing a prediction of either 'Yes' or 'No'.")
_MXBAI_SYSTEM = ("<|endoftext|><|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
                 "assistant.\n<|im_end|>\n<|im_start|>user\n")
_MXBAI_TASK = ("You are a search relevance expert who evaluates how well documents match search queries. For each "
               "query-document pair, carefully analyze the semantic relationship between them, then provide your "
               "binary relevance judgment (0 for not relevant, 1 for relevant).\nRelevance:<|im_end|>\n"
               "<|im_start|>assistant\n")
CHAT_USER_MESSAGE = ('Judge whether the Document meets the requirements based on the Query and the Instruct provided. '
                     'Note that the answer can only be "yes" or "no".\n<Instruct>: {instruction}\n<Query>: {query}\n'
                     '<Document>: {doc}')

_PLAIN = Template(query_segments=("Query: {query}\nDocument:",), item_segments=(" {doc}\nRelevant:",),
                  default_labels=("Yes", "No"))

TEMPLATES: dict[str, Template] = {
    # Qwen3-Reranker's chat template; it reads p("yes") vs p("no") after the empty think block.
    "qwen3_reranker": Template(
        query_segments=(_QWEN3_SYSTEM, "<Instruct>: {instruction}\n<Query>: {query}\n<Document>:"),
        item_segments=(" {doc}", _QWEN3_SUFFIX),
        default_labels=("yes", "no")),
    # A plain prompt for base models and the embedded default model.
    "plain": _PLAIN,
    # The plain prompt after the tokenizer's BOS token, for base models that read text after it (Gemma).
    "plain_bos": dataclasses.replace(_PLAIN, bos=True),
    # bge-reranker-v2-gemma (FlagEmbedding LLM reranker): [bos] A: query, then per passage "\n", "B: passage",
    # "\n" and the fixed prompt, each tokenized on its own; it ranks by the raw logit of "Yes".
    "bge_gemma": Template(
        query_segments=("A: {query}",),
        item_segments=("\n", "B: {doc}", "\n", BGE_GEMMA_PROMPT),
        default_labels=("Yes", "No"), bos=True),
    # mxbai-rerank-v2 (Qwen2): a chat prompt, "query: ... \n" then "document: ... \n" and the task,
    # tokenized as one text (split before the newline, where byte-level BPE splits anyway); it ranks
    # by the logit of "1" minus that of "0" (log_odds with labels 1,0). No instruction line (its default).
    "mxbai_v2": Template(
        query_segments=(_MXBAI_SYSTEM + "query: {query} ",),
        item_segments=("\ndocument: {doc} \n" + _MXBAI_TASK,),
        default_labels=("1", "0")),
    # The tokenizer's own chat template around CHAT_USER_MESSAGE, with the generation prompt.
    "chat": Template(query_segments=(), item_segments=(), default_labels=("yes", "no"), chat=True),
}


def _chat_template_source(tokenizer: Tokenizer) -> str:
  """The Jinja chat template shipped beside the tokenizer file, or a ScoreInputError saying where it looked."""
  directory = pathlib.Path(tokenizer.path).parent
  jinja = directory / "chat_template.jinja"
  if jinja.is_file():
    return jinja.read_text(encoding="utf-8")
  config = directory / "tokenizer_config.json"
  source = json.loads(config.read_text(encoding="utf-8")).get("chat_template") if config.is_file() else None
  if isinstance(source, list):  # named templates: take "default"
    source = next((t.get("template") for t in source if t.get("name") == "default"), None)
  if not isinstance(source, str):
    raise ScoreInputError(f"template='chat' needs the tokenizer's chat template; {directory} has no "
                          "chat_template.jinja and no chat_template in tokenizer_config.json")
  return source


def has_chat_template(tokenizer: Tokenizer) -> bool:
  """Whether the tokenizer ships a chat template (chat_template.jinja, or chat_template in tokenizer_config.json)."""
  try:
    _chat_template_source(tokenizer)
  except ScoreInputError:
    return False
  return True


def render_user_turn(tokenizer: Tokenizer, content: str, system: str = "") -> str:
  """The tokenizer's chat template rendered for one user turn holding `content` (after a system turn when
  `system` is given), with the generation prompt (as transformers' apply_chat_template(...,
  add_generation_prompt=True, tokenize=False))."""
  import jinja2.ext  # pylint: disable=import-outside-toplevel
  import jinja2.sandbox  # pylint: disable=import-outside-toplevel
  env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                     extensions=[jinja2.ext.loopcontrols])

  def raise_exception(message):
    raise ScoreInputError(f"template='chat': the tokenizer's chat template refused the prompt: {message}")
  env.globals["raise_exception"] = raise_exception
  special = {name: tokenizer.decode([i]) if i is not None else "" for name, i in
             (("bos_token", tokenizer.bos_id), ("eos_token", tokenizer.eos_id))}
  return env.from_string(_chat_template_source(tokenizer)).render(
      messages=[{"role": "system", "content": system}] * bool(system) + [{"role": "user", "content": content}],
      add_generation_prompt=True, **special)


def chat_segments(tokenizer: Tokenizer, template: Template) -> Template:
  """`template` with segments rendered from the tokenizer's chat template (one user turn + generation prompt).

  Rendered once with markers for the query and the document, then split before the document: the
  query side ends with "<Document>:", the item side starts with " {doc}" (as the plain template).
  """
  q_mark, d_mark = "\x00QUERY\x00", "\x00DOC\x00"
  content = CHAT_USER_MESSAGE.replace("{query}", q_mark).replace(" {doc}", d_mark)
  text = render_user_turn(tokenizer, content)
  if text.count(d_mark) != 1 or text.count(q_mark) != 1:
    raise ScoreInputError("template='chat': the tokenizer's chat template does not render the user message once")
  escape = lambda x: x.replace("{", "{{").replace("}", "}}")
  head, tail = text.split(d_mark)
  head = escape(head).replace(escape(q_mark), "{query}").replace("{{instruction}}", "{instruction}")
  return dataclasses.replace(template, query_segments=(head,), item_segments=(" {doc}" + escape(tail),), chat=False)


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


def prompt_and_labels(tokenizer: Tokenizer, template_name: str, labels: Sequence[str | int], instruction,
                      max_query_tokens: int, max_item_tokens: int) -> tuple["PromptBuilder", tuple[int, ...]]:
  """(the PromptBuilder of a named template, the label ids: `labels`, else the template's defaults). The prompt is
  built first: a template the tokenizer cannot render (chat without a chat template) is the error named, not
  the labels it would have asked for."""
  template = get_template(template_name)
  builder = PromptBuilder(tokenizer, template, instruction, max_query_tokens, max_item_tokens)
  return builder, resolve_labels(tokenizer, labels or template.default_labels)


class PromptBuilder:
  """Token ids of a template's query side and item side, with counted truncation."""

  def __init__(self, tokenizer: Tokenizer, template: Template, instruction: str = DEFAULT_INSTRUCTION,
               max_query_tokens: int = 0, max_item_tokens: int = 0, cache_size: int = 1 << 16):
    if tokenizer is None:
      raise ScoreInputError("prompt templates need a tokenizer; the checkpoint has none and tokenizer_path is unset")
    if template.bos and tokenizer.bos_id is None:
      raise ScoreInputError(f"the template starts with a BOS token but the tokenizer {tokenizer.path} has none")
    self.tokenizer = tokenizer
    self.template = chat_segments(tokenizer, template) if template.chat else template
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
    bos = (self.tokenizer.bos_id,) if self.template.bos else ()
    return bos + self._encode(self.template.query_segments, query=query, instruction=self.instruction), truncated

  def passages(self, doc: str, tokens: int, stride: int = 0, first_only: bool = False) -> list[str]:
    """The document cut in token space into passages of `tokens` tokens starting every `stride` tokens (0 =
    `tokens`: no overlap), the last one running to the end; a document of at most `tokens` tokens is itself,
    unchanged. `first_only`: the first passage alone."""
    ids = self.tokenizer.encode(doc)
    if len(ids) <= tokens:
      return [doc]
    stride = stride or tokens
    starts = [0] if first_only else list(range(0, max(len(ids) - tokens, 0) + stride, stride))
    return [self.tokenizer.decode(ids[s:s + tokens]) for s in starts if s < len(ids)]

  def _item(self, doc: str) -> tuple[tuple[int, ...], bool]:
    """(item-side token ids, whether the document was truncated)."""
    doc, truncated = self._truncate(doc, self.max_item_tokens)
    return self._encode(self.template.item_segments, doc=doc), truncated


# --- ranking scores and the prompt settings ------------------------------------------------------
def _p_first(scores_NxK: np.ndarray) -> np.ndarray:
  return scores_NxK[:, 0]


def _log_odds(scores_NxK: np.ndarray) -> np.ndarray:
  with np.errstate(divide="ignore"):
    return np.log(scores_NxK[:, 0]) - np.log(scores_NxK[:, 1])


# name -> (apply_softmax, ranking score from the [N, K] scores). log_odds reads the label softmax:
# log p0 - log p1 is the same with or without it (the vocabulary log-sum-exp cancels), the softmax
# needs only the label rows of the lm_head (docs/ARCHITECTURE.md section 3), and its probabilities are at
# least the full-vocabulary ones, so they underflow no earlier. raw_logit (apply_softmax None)
# ranks by the first label's raw lm_head logit (Scorer.label_logits), as FlagEmbedding's LLM
# rerankers do; it can order items differently from p_first (the vocabulary log-sum-exp varies).
SCORE_MODES = {"p_first": (True, _p_first), "log_odds": (True, _log_odds), "raw_logit": (None, _p_first)}


def template_setting(default: str = "plain"):
  """The `template` field of a config section: a name in TEMPLATES, whose --help lists them all."""
  return dataclasses.field(default=default, metadata=config_lib.choices(TEMPLATES))


@dataclasses.dataclass(frozen=True)
class PromptConfig:
  """How prompts and ranking scores are built from a rerank set (the eval and head training share it)."""
  template: str = template_setting()
  instruction: str = DEFAULT_INSTRUCTION
  labels: tuple[str, ...] = ()             # label words or ids; () = the template's default labels
  score_mode: Literal["p_first", "log_odds", "raw_logit"] = "p_first"
  max_query_tokens: int = 512              # the query text is cut to this many tokens; 0 = no limit
  max_item_tokens: int = 512               # each document is cut to this many tokens; 0 = no limit
  metrics: tuple[str, ...] = DEFAULT_METRICS

  def validate(self):
    get_template(self.template)
    if self.score_mode not in SCORE_MODES:
      raise DataError(f"score_mode={self.score_mode!r} is not one of {sorted(SCORE_MODES)}")
    labels = self.labels or TEMPLATES[self.template].default_labels
    if len(labels) < 2:
      raise DataError(f"score_mode={self.score_mode} needs 2 labels (positive first), got {list(labels)}")
    for name in ("max_query_tokens", "max_item_tokens"):
      if getattr(self, name) < 0:
        raise DataError(f"{name}={getattr(self, name)} must be >= 0")
    for m in self.metrics:
      try:
        metrics.canonical_name(m)
      except ValueError as e:
        raise DataError(str(e)) from None
    return self
