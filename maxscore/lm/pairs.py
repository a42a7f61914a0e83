"""Rerank training queries built from local text, for fine-tuning a reranker (JSONL form, split "train").

    records = build_pairs(layout_tok, sections, held_out, docstring_docs, seed=0, num_candidates=12)

Queries and their graded candidates (paragraphs cut to [min_tokens, max_tokens] tokens of
`layout_tok`, as the embedded rerank set cuts them):
  pydoc       a reference section's title against its own paragraphs (grade 2) and those of other
              sections of the same topic (grade 1); sections in `held_out` (the rerank set's dev and
              test queries) and titles that several sections share are never used, not even as
              negatives
  docstrings  a standard-library docstring's first paragraph (a summary of <= max_query_words words)
              against its later paragraphs (grade 2) and those of its siblings (grade 1: the other
              docstrings of the same class or module)
  keywords    (`keyword_queries` of them) one to `max_keywords` of a random paragraph's rarer
              words (none held by over 1% of paragraphs; idf-weighted, favouring words its
              group's other paragraphs share), in text order, like a section title ("Descriptor
              invocation"); relevance as its group's, the paragraph itself always a positive;
              reference paragraphs are used first. They teach what a title is: a few words of
              its text.
Paragraphs that repeat the opening of a held-out paragraph are dropped (the corpus's leak check).
Negatives (grade 0): the `hard_negatives` best BM25 paragraphs of other groups (maxscore.datasets.bm25
over every paragraph), then random paragraphs of other groups. Every pydoc query is kept; docstring
queries are sampled to fill `max_queries`. Deterministic in `seed`.
"""

import collections
from typing import Collection, Sequence

import numpy as np

from maxscore.datasets import bm25
from maxscore.datasets.bm25 import BM25Index
from maxscore.lm import corpus as corpus_lib

COMMON_WORD_FRACTION = 0.01  # a keyword query never uses a word held by more paragraphs than this


def clip(tok, text: str, max_tokens: int) -> str:
  """`text` with whitespace collapsed, cut at a word boundary to at most max_tokens tokens."""
  text = " ".join(text.split())
  while len(tok.encode(text)) > max_tokens:
    keep = tok.decode(tok.encode(text)[:max_tokens - 2]).rsplit(" ", 1)[0]
    text = keep.rstrip(" ,.;:") + " ..."
    max_tokens -= 2
  return text


def _paragraphs(tok, texts: Sequence[str], min_tokens: int, max_tokens: int) -> list[str]:
  kept = [clip(tok, p, max_tokens) for p in texts if p.strip()]
  return [p for p in kept if len(tok.encode(p)) >= min_tokens]


def query_groups(tok, sections: Sequence[dict], held_out: Collection[int], docstring_docs: Sequence[str],
                 min_tokens: int, max_tokens: int, max_query_words: int = 12) -> list[dict]:
  """{"query", "key" (near-relevance group), "source", "paragraphs"} per usable query, pydoc first."""
  titles = collections.Counter(s["title"] for s in sections)
  groups = []
  for i, s in enumerate(sections):
    if i in held_out or titles[s["title"]] > 1:
      continue
    paras = _paragraphs(tok, s["paragraphs"], min_tokens, max_tokens)
    if paras:
      groups.append({"query": s["title"].replace('"', ""), "key": "pydoc:" + s["topic"], "source": "pydoc",
                     "paragraphs": paras, "id": f"pydoc.{i}"})
  for j, text in enumerate(docstring_docs):
    name, _, doc = text.partition("\n\n")
    parts = [p.strip() for p in doc.split("\n\n") if p.strip()]
    if len(parts) < 2:
      continue
    summary = " ".join(parts[0].split()).rstrip(".")
    if not summary or len(summary.split()) > max_query_words:
      continue
    paras = _paragraphs(tok, parts[1:], min_tokens, max_tokens)
    if paras:
      groups.append({"query": summary, "key": "py:" + name.rpartition(".")[0], "source": "docstrings",
                     "paragraphs": paras, "id": f"doc.{j}"})
  return groups


def _without_leaks(groups: list[dict], sections: Sequence[dict], held_out: Collection[int]) -> list[dict]:
  """The groups without any paragraph that holds the opening of a held-out paragraph (the reference
  repeats a few paragraphs across sections); groups left without paragraphs are dropped."""
  probes = [" ".join(p.split())[:corpus_lib.LEAK_PREFIX_CHARS] for i in held_out for p in sections[i]["paragraphs"]]
  flat = [(g_i, p) for g_i, g in enumerate(groups) for p in g["paragraphs"]]
  leaking = corpus_lib.leaking_documents([p for _, p in flat], probes)
  kept: dict[int, list[str]] = collections.defaultdict(list)
  for k, (g_i, p) in enumerate(flat):
    if k not in leaking:
      kept[g_i].append(p)
  return [{**g, "paragraphs": kept[g_i]} for g_i, g in enumerate(groups) if kept[g_i]]


def keyword_query(text: str, sibling_words: Sequence[set[str]], index: BM25Index, rng: np.random.Generator,
                  max_keywords: int) -> str:
  """1..max_keywords distinct rarer words of `text`, in text order, first capitalized ("" when it has
  none). A word is drawn with weight idf * (1 + number of siblings holding it)^2 (`sibling_words`:
  the word sets of the other paragraphs of its group): words that recur across a section are what
  its title names."""
  common = COMMON_WORD_FRACTION * index.n
  vocab = list(dict.fromkeys(w for w in bm25.words(text) if len(w) >= 3 and index.doc_freq.get(w, 0) <= common))
  if not vocab:
    return ""
  weight = np.array([index.idf(w) * (1 + sum(w in h for h in sibling_words)) ** 2 for w in vocab])
  k = int(rng.integers(1, min(max_keywords, len(vocab)) + 1))
  pick = set(rng.choice(len(vocab), size=k, replace=False, p=weight / weight.sum()).tolist())
  query = " ".join(w for i, w in enumerate(vocab) if i in pick)
  return query[:1].upper() + query[1:]


def build_pairs(tok, sections: Sequence[dict], held_out: Collection[int], docstring_docs: Sequence[str], *,
                seed: int = 0, num_candidates: int = 12, max_positives: int = 3, max_near: int = 2,
                hard_negatives: int = 3, max_queries: int = 3000, keyword_queries: int = 0,
                max_keywords: int = 3, min_tokens: int = 36, max_tokens: int = 116) -> list[dict]:
  """Rerank training records (see the module docstring)."""
  if num_candidates < max_positives + max_near + hard_negatives + 1:
    raise ValueError(f"num_candidates={num_candidates} must exceed max_positives + max_near + hard_negatives")
  groups = _without_leaks(query_groups(tok, sections, held_out, docstring_docs, min_tokens, max_tokens),
                          sections, held_out)
  rng = np.random.default_rng(seed)
  pool = [(g_i, f"{g['id']}.{p_i}", p) for g_i, g in enumerate(groups) for p_i, p in enumerate(g["paragraphs"])]
  by_group: dict[int, list[int]] = collections.defaultdict(list)
  by_key: dict[str, list[int]] = collections.defaultdict(list)
  for j, (g_i, _, _) in enumerate(pool):
    by_group[g_i].append(j)
    by_key[groups[g_i]["key"]].append(j)
  index = BM25Index([p for _, _, p in pool])
  pydoc = [i for i, g in enumerate(groups) if g["source"] == "pydoc"]
  others = [i for i, g in enumerate(groups) if g["source"] != "pydoc"]
  room = max(max_queries - len(pydoc), 0)
  chosen = pydoc + sorted(rng.permutation(others)[:room].tolist())
  queries = [(g_i, groups[g_i]["query"], None, f"ft-{groups[g_i]['id']}") for g_i in rng.permutation(chosen).tolist()]
  anchors, word_sets = [], []
  if keyword_queries:  # anchors: reference paragraphs first (the rerank set's kind of text), then the rest
    is_pydoc = np.array([groups[g_i]["source"] == "pydoc" for g_i, _, _ in pool])
    anchors = [rng.permutation(np.nonzero(m)[0]).tolist() for m in (is_pydoc, ~is_pydoc)]
    anchors = (anchors[0] + anchors[1])[:keyword_queries]
    word_sets = [set(bm25.words(p)) for _, _, p in pool]  # each paragraph's words, once
  for j in anchors:
    siblings = [word_sets[i] for i in by_group[pool[j][0]] if i != j]
    query = keyword_query(pool[j][2], siblings, index, rng, max_keywords)
    if query:
      queries.append((pool[j][0], query, j, f"ft-kw-{pool[j][1]}"))
  records = []
  for g_i, query, anchor, qid in queries:
    g = groups[g_i]
    pos = [j for j in rng.permutation(by_group[g_i]).tolist() if j != anchor]
    pos = ([anchor] if anchor is not None else []) + pos
    pos = pos[:max_positives]
    near_ids = [j for j in by_key[g["key"]] if pool[j][0] != g_i]
    near = rng.permutation(near_ids)[:max_near].tolist() if near_ids else []
    related = set(by_key[g["key"]]) | set(by_group[g_i])
    hard = [j for j, _ in index.top_k(query, 4 * hard_negatives + len(related)) if j not in related]
    cands = pos + near + hard[:hard_negatives]
    left = np.setdiff1d(np.arange(len(pool)), np.fromiter(related | set(cands), np.int64))
    need = min(num_candidates - len(cands), len(left))
    cands += rng.choice(left, size=need, replace=False).tolist()
    cands = rng.permutation(cands).tolist()
    grades = {pool[j][1]: 2 for j in pos} | {pool[j][1]: 1 for j in near}
    records.append({"qid": qid, "query": query, "split": "train",
                    "candidates": [{"docid": pool[j][1], "text": pool[j][2]} for j in cands], "qrels": grades})
  return records
