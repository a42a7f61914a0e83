"""Listwise (FIRST) and setwise reranking: the scoring operation read once per window of candidates.

FIRST (Reddy et al. 2024) puts k numbered candidates in one prompt and ranks them by the logits of the k
identifier tokens at the first generated position; setwise (Zhuang et al. 2024) picks the best of a small
set from the same kind of read. Both are docs/ARCHITECTURE.md section 1's operation: one sequence per
window, the label log-probs of the identifier tokens at its last token. The query side of a window (the
instruction with the query) is the request's query and the numbered passages with the answer prefix its item,
so the windows of one query share their prefix (the prefix cache keeps it between steps) and the windows of
many queries go through one `Scorer.score_requests` call per step.

The window order is RankLLM's sliding window (castorini/rank_llm, ListwiseRankLLM's sliding windows): a
window of `window` positions starts at the bottom of the ranked list and moves up `stride` positions at a
time, the last window clipped at the top. Within a window the candidates are sorted by their identifier's
log-prob, highest first; equal log-probs keep the order the window was given (the earlier position wins).

Setwise runs a heap sort over sets of `set_size` candidates, a parent and its `set_size - 1` children
(ielab/llm-rankers' heapsort), to the top `top_k`; each comparison reads the set's identifier log-probs and
takes the highest, a tie going to the candidate with the better incoming rank (so the heap sorts by one total
order, and equal scores everywhere give the incoming order). Below the top k the incoming order is kept. The
heap is built a level at a time, a level's sets compared in one call.

Both passes are pure functions of the window scores (`sliding_window_rerank`, `setwise_rerank` take a score
callback), which the tests drive with scores written by hand; `listwise_rerank` runs them on a Scorer.
"""

import dataclasses
import functools
import re
from typing import Callable, Generator, Optional, Sequence

import numpy as np

from maxscore.checkpoints.tokenizer import Tokenizer
from maxscore.errors import ScoreInputError
from maxscore.rerank import prompts

LETTERS = tuple("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
IDENTIFIER_SETS = {"letters": LETTERS, "numbers": tuple(str(i) for i in range(1, 101))}


@dataclasses.dataclass(frozen=True)
class ListwiseTemplate:
  """A window prompt: `head` ({num}, {query}), one `passage` line per candidate ({id}, then its text), `tail`
  ({num}, {query}) and the `answer` prefix the identifier token follows. In a chat prompt head .. tail is the
  user turn of the tokenizer's chat template, after a `system` turn if there is one, and the answer prefix
  starts the assistant's reply."""
  head: str
  passage: str
  tail: str
  answer: str = "["
  system: str = ""


# After RankLLM's RankGPT-style prompt as FIRST uses it (castorini/rank_llm, rank_listwise_os_llm.py: a system
# message, the prefix and post prompts around "[id] passage" lines), reworded; the reply starts with "[" so that
# the next token is an identifier.
FIRST = ListwiseTemplate(
    system="You are RankLLM, an assistant that ranks passages by how relevant they are to a search query.",
    head=("You will get {num} passages, each marked by an identifier in brackets []. Order them by how relevant "
          "they are to the search query: {query}.\n\n"),
    passage="[{id}]",
    tail=("Search query: {query}.\nOrder the {num} passages above by relevance to the search query, most relevant "
          "first, listing every passage by its identifier in the form [] > [], e.g. [B] > [A]. Reply with the "
          "ranking alone, without explanation."))

# After Zhuang et al.'s setwise prompt (ielab/llm-rankers, setwise.py: which passage is the most relevant,
# answer with its label), reworded, with bracketed labels as FIRST's so the label read is a bare identifier.
SETWISE = ListwiseTemplate(
    head="For the query \"{query}\", which one of the {num} passages below is the most relevant?\n\n",
    passage="[{id}]",
    tail="Reply with the identifier of the most relevant passage only.")

LISTWISE_TEMPLATES = {"first": FIRST, "setwise": SETWISE}

# A passage's own "[3]" would read as an identifier: it becomes "(3)" (as RankLLM does).
_BRACKETED = re.compile(r"\[(\w{1,3})\]")


def identifier_ids(tokenizer: Tokenizer, identifiers: Sequence[str]) -> tuple[int, ...]:
  """The one token of each identifier, or a ScoreInputError naming the tokenizer and the identifier."""
  ids = []
  for ident in identifiers:
    try:
      ids.append(tokenizer.label_id(ident))
    except ScoreInputError as e:
      raise ScoreInputError(f"listwise identifier {ident!r} is not one token in the tokenizer {tokenizer.path} "
                            f"({e}); every identifier must be a single token (identifiers='letters' usually are)") \
          from None
  if len(set(ids)) != len(ids):
    raise ScoreInputError(f"listwise identifiers {list(identifiers)} map to repeated tokens {ids} in the tokenizer "
                          f"{tokenizer.path}")
  return tuple(ids)


@dataclasses.dataclass(frozen=True)
class Window:
  """One window prompt in token space: the shared query side, the item side and the identifiers read."""
  prefix: tuple[int, ...]
  body: tuple[int, ...]
  label_ids: tuple[int, ...]


class WindowPrompts:
  """Token ids of window prompts, each passage cut to a token budget so that a window fits `max_window_tokens`."""

  def __init__(self, tokenizer: Tokenizer, template: ListwiseTemplate, identifiers: str | Sequence[str] = "letters",
               max_passage_tokens: int = 128, max_window_tokens: int = 4096, max_query_tokens: int = 128,
               chat: Optional[bool] = None):
    if tokenizer is None:
      raise ScoreInputError("listwise prompts need a tokenizer; the checkpoint has none and tokenizer_path is unset")
    names = IDENTIFIER_SETS.get(identifiers) if isinstance(identifiers, str) else tuple(identifiers)
    if names is None:
      raise ScoreInputError(f"identifiers={identifiers!r} is not one of {sorted(IDENTIFIER_SETS)} or a list")
    self.tokenizer = tokenizer
    self.identifiers = names
    self.label_ids = identifier_ids(tokenizer, names)
    self.template = template
    self.max_passage_tokens = max_passage_tokens
    self.max_window_tokens = max_window_tokens
    self.max_query_tokens = max_query_tokens
    self._chat = ("", "")
    self.chat = resolve_chat(tokenizer, chat)
    if self.chat:
      mark = "\x00TURN\x00"
      try:
        text = prompts.render_user_turn(tokenizer, mark, template.system)
      except ScoreInputError as e:
        raise ScoreInputError(f"the listwise prompt is a chat turn (listwise_chat=true), but: {e}; "
                              "listwise_chat=false (or unset) gives a plain-text prompt") from None
      if text.count(mark) != 1:
        raise ScoreInputError("the tokenizer's chat template does not render the user message once")
      self._chat = tuple(text.split(mark))
    self._markers = {}
    # A query's text recurs in each of its windows and a document in several windows: each is encoded once.
    self._query_text = functools.lru_cache(maxsize=1 << 10)(self._cut_query)
    self._content = functools.lru_cache(maxsize=1 << 14)(self._encode_content)

  @property
  def max_window(self) -> int:
    return len(self.identifiers)

  def _cut_query(self, query: str) -> str:
    ids = self.tokenizer.encode(query)
    if 0 < self.max_query_tokens < len(ids):
      query = self.tokenizer.decode(ids[:self.max_query_tokens])
    return query

  def _encode_content(self, doc: str) -> tuple[int, ...]:
    """A passage's tokens (after a space, as it follows its identifier), its own "[x]" written "(x)"."""
    return tuple(self.tokenizer.encode(" " + _BRACKETED.sub(r"(\1)", doc.strip())))

  def _marker(self, i: int) -> tuple[int, ...]:
    if i not in self._markers:
      self._markers[i] = tuple(self.tokenizer.encode(self.template.passage.format(id=self.identifiers[i])))
    return self._markers[i]

  def window(self, query: str, docs: Sequence[str]) -> Window:
    """The prompt of one window over `docs` (in window order), each passage cut to the same token budget."""
    num = len(docs)
    if not 1 <= num <= self.max_window:
      raise ScoreInputError(f"a window holds 1 to {self.max_window} passages (one per identifier), got {num}")
    t, enc = self.template, self.tokenizer.encode
    query = self._query_text(query)
    prefix = tuple(enc(self._chat[0] + t.head.format(num=num, query=query)))
    tail = tuple(enc(t.tail.format(num=num, query=query) + self._chat[1])) + tuple(enc(t.answer))
    newline = tuple(enc("\n"))
    contents = [self._content(d) for d in docs]
    fixed = len(prefix) + len(tail) + sum(len(self._marker(i)) + len(newline) for i in range(num))
    budget = self.max_passage_tokens if self.max_passage_tokens > 0 else max(len(c) for c in contents)
    if self.max_window_tokens > 0:
      budget = min(budget, (self.max_window_tokens - fixed) // num)
      if budget < 1:
        raise ScoreInputError(f"max_window_tokens={self.max_window_tokens} leaves no room for {num} passages: the "
                              f"instruction, query and identifiers alone take {fixed} tokens")
    body: list[int] = []
    for i, content in enumerate(contents):
      body.extend(self._marker(i) + content[:budget] + newline)
    return Window(prefix, tuple(body) + tail, self.label_ids[:num])


@dataclasses.dataclass
class Usage:
  """What a rerank cost: forward sequences (one per window or set) and the tokens of their requests (a prefix
  shared by the windows of one request counted once)."""
  forwards: int = 0
  tokens: int = 0


def score_windows(scorer, windows: Sequence[Window], usage: Optional[Usage] = None) -> list[np.ndarray]:
  """Log-probs of each window's identifiers at its answer position (the log of the identifiers' softmax: one
  position per window, so the vocabulary log-sum-exp is common and the order is that of the full log-probs).
  All windows go through one `score_requests` call; windows with the same prefix and identifiers are the items
  of one request (they share the prefix, section 2)."""
  groups: dict[tuple, list[int]] = {}
  for i, w in enumerate(windows):
    groups.setdefault((w.prefix, w.label_ids), []).append(i)
  reqs = [scorer.make_request(list(prefix), [list(windows[i].body) for i in idx], list(labels), apply_softmax=True,
                              separator_token_id=None) for (prefix, labels), idx in groups.items()]
  results = scorer.score_requests(reqs)
  if usage is not None:
    usage.forwards += len(windows)
    usage.tokens += sum(r.usage["prompt_tokens"] for r in results)
  out: list = [None] * len(windows)
  for idx, result in zip(groups.values(), results):
    with np.errstate(divide="ignore"):
      for i, row in zip(idx, np.log(result.scores)):
        out[i] = row
  return out


# --- sliding windows -------------------------------------------------------------------------------------------
def window_spans(n: int, window: int = 20, stride: int = 10) -> list[tuple[int, int]]:
  """[start, end) of each window of the top-down pass over a list of n, in the order they run: the first ends
  at the bottom, each next one `stride` higher, the last clipped at the top (RankLLM's sliding windows)."""
  if window < 1 or not 0 < stride <= window:
    raise ScoreInputError(f"listwise window={window}, stride={stride}: need window >= 1 and 0 < stride <= window")
  spans = []
  end, start = n, max(n - window, 0)
  while end > start:
    spans.append((start, end))
    if start == 0:
      break
    end, start = end - stride, max(start - stride, 0)
  return spans


def order_window(items: Sequence, scores: np.ndarray) -> list:
  """`items` sorted by score, highest first; equal scores keep their order in the window."""
  scores = np.asarray(scores, np.float64)
  if len(scores) != len(items):
    raise ValueError(f"{len(items)} items, {len(scores)} scores")
  return [items[i] for i in np.argsort(-scores, kind="stable")]


ScoreFn = Callable[[list[tuple[int, list]]], list[np.ndarray]]


def sliding_window_rerank(orders: Sequence[Sequence], score: ScoreFn, window: int = 20, stride: int = 10,
                          top_k: int = 0) -> list[list]:
  """The top-down pass over each list (its first `top_k`, 0 = all; below them the order is kept).

  `score([(list index, window items), ...])` returns one score per item of each window; it is called once per
  step with the windows of every list that has one at that step (their positions do not depend on the scores).
  """
  orders = [list(o) for o in orders]
  spans = [window_spans(min(len(o), top_k) if top_k > 0 else len(o), window, stride) for o in orders]
  for step in range(max((len(s) for s in spans), default=0)):
    live = [(q, s[step]) for q, s in enumerate(spans) if step < len(s)]
    scores = score([(q, orders[q][a:b]) for q, (a, b) in live])
    for (q, (a, b)), sc in zip(live, scores):
      orders[q][a:b] = order_window(orders[q][a:b], sc)
  return orders


# --- setwise ---------------------------------------------------------------------------------------------------
def _sift_down(heap: list, size: int, i: int, children: int) -> Generator[list, int, None]:
  """Moves heap[i] down: each step asks for the best of a node and its children (yields the set, receives the
  index of its best)."""
  while children * i + 1 < size:
    kids = list(range(children * i + 1, min(children * i + children + 1, size)))
    best_in_set = yield [heap[j] for j in [i, *kids]]
    best = [i, *kids][best_in_set]
    if best == i:
      return
    heap[i], heap[best] = heap[best], heap[i]
    i = best


def _side_by_side(runs: Sequence[Generator]) -> Generator[list, list, None]:
  """Runs compare generators (as _sift_down) together: yields the list of their pending sets, is sent the list
  of those sets' bests."""
  pending = {}
  for j, run in enumerate(runs):
    try:
      pending[j] = next(run)
    except StopIteration:
      pass
  while pending:
    keys = sorted(pending)
    bests = yield [pending[j] for j in keys]
    for j, best in zip(keys, bests):
      try:
        pending[j] = runs[j].send(best)
      except StopIteration:
        del pending[j]


def setwise_top_k(items: Sequence, set_size: int = 4, top_k: int = 10) -> Generator[list, list, list]:
  """Heap sort with sets of `set_size` (a node and `set_size - 1` children) to the best `top_k` (0 = all), as a
  generator: it yields the list of sets it can compare now and is sent the index of each one's best. Returns the
  top k in order followed by the rest in their incoming order.

  The heap is built a level at a time, deepest first: the nodes of one level head disjoint subtrees, so their
  sift-downs run side by side (their sets are compared together) and leave the heap the one-at-a-time build
  leaves. Each extraction is one sift-down from the root, a set at a time."""
  if set_size < 2:
    raise ScoreInputError(f"setwise set_size={set_size}: a set compares at least 2 passages")
  heap, children, n = list(items), set_size - 1, len(items)
  k = min(top_k if top_k > 0 else n, n)
  levels, first = [], 0
  while first <= (n - 2) // children:  # the levels of internal nodes: [first, first + children ** depth)
    levels.append(range(first, min(first + children ** len(levels), (n - 2) // children + 1)))
    first = first * children + 1
  for level in reversed(levels):
    yield from _side_by_side([_sift_down(heap, n, i, children) for i in level])
  top = []
  for size in range(n, 0, -1):
    top.append(heap[0])
    if len(top) == k:
      break
    heap[0] = heap[size - 1]
    yield from _side_by_side([_sift_down(heap, size - 1, 0, children)])
  chosen = set(top)
  return top + [x for x in items if x not in chosen]


def setwise_rerank(orders: Sequence[Sequence], score: ScoreFn, set_size: int = 4, top_k: int = 10) -> list[list]:
  """setwise_top_k over each list (items must be hashable and distinct within a list): at each step every set
  that any list can compare goes into one `score` call (as sliding_window_rerank)."""
  runs = {q: setwise_top_k(o, set_size, top_k) for q, o in enumerate(orders)}
  ranks = [{x: i for i, x in enumerate(o)} for o in orders]
  out: list = [None] * len(orders)
  pending = {}
  for q, gen in runs.items():
    try:
      pending[q] = next(gen)
    except StopIteration as stop:
      out[q] = stop.value
  while pending:
    asked = [(q, items) for q in sorted(pending) for items in pending[q]]
    scores = iter(score(asked))
    for q in sorted(pending):
      bests = []
      for items in pending[q]:
        sc = np.asarray(next(scores), np.float64)
        bests.append(min(range(len(sc)), key=lambda j: (-sc[j], ranks[q][items[j]])))
      try:
        pending[q] = runs[q].send(bests)
      except StopIteration as stop:
        out[q] = stop.value
        del pending[q]
  return out


# --- the rerankers over a Scorer -------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ListwiseConfig:
  """How the listwise stage reranks: the method, its window or set and the prompt's token budgets."""
  reranker: str = "first"            # first (sliding windows) or setwise (heap sort)
  window: int = 20                   # passages per window (first) or per set (setwise)
  stride: int = 10                   # first: positions a window moves up
  top_k: int = 20                    # first: the head of the list reranked; setwise: the best k sorted (0 = all)
  identifiers: str = "letters"       # letters (A..Z) or numbers (1..100); each must be one token
  max_passage_tokens: int = 128      # each passage is cut to this many tokens (and less if the window needs)
  max_window_tokens: int = 4096      # a window's prompt holds at most this many tokens (0 = no limit)
  chat: Optional[bool] = None        # the prompt is a user turn of the tokenizer's chat template; None: when it has one
  max_query_tokens: int = 128        # the query is cut to this many tokens (0 = no limit)


def resolve_chat(tokenizer: Tokenizer, chat: Optional[bool]) -> bool:
  """Whether window prompts are a chat user turn: `chat` when set; unset, when the tokenizer has a chat template
  (a base model's tokenizer has none, and its prompts are plain text)."""
  return prompts.has_chat_template(tokenizer) if chat is None else chat


def prompt_form(chat: bool) -> str:
  """How the log names the form of the window prompts."""
  return "a user turn of the tokenizer's chat template" if chat else "plain text"


@functools.lru_cache(maxsize=8)
def window_prompts(tokenizer: Tokenizer, config: "ListwiseConfig") -> WindowPrompts:
  """One WindowPrompts per tokenizer and settings (the eval reranks a query at a time)."""
  return WindowPrompts(tokenizer, LISTWISE_TEMPLATES[config.reranker], config.identifiers, config.max_passage_tokens,
                       config.max_window_tokens, config.max_query_tokens, config.chat)


def listwise_rerank(scorer, queries: Sequence[str], candidates: Sequence[Sequence[str]], config: ListwiseConfig,
                    usage: Optional[Usage] = None) -> list[list[int]]:
  """Each query's candidate texts reranked (as indices into its list, best first) by `config.reranker`."""
  if config.reranker not in LISTWISE_TEMPLATES:
    raise ScoreInputError(f"reranker={config.reranker!r} is not one of {sorted(LISTWISE_TEMPLATES)}")
  builder = window_prompts(scorer.tokenizer, config)
  if config.window > builder.max_window:
    raise ScoreInputError(f"listwise window={config.window} exceeds the {builder.max_window} identifiers of "
                          f"identifiers={config.identifiers!r}")

  def score(windows):
    return score_windows(scorer, [builder.window(queries[q], [candidates[q][i] for i in idx]) for q, idx in windows],
                         usage)
  orders = [list(range(len(c))) for c in candidates]
  if config.reranker == "setwise":
    return setwise_rerank(orders, score, config.window, config.top_k)
  return sliding_window_rerank(orders, score, config.window, config.stride, config.top_k)
