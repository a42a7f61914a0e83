"""A FAQ's questions against the passages of a manual they were never trained on, in the BEIR layout: what the Perl
FAQ set (maxscore/lm/perlfaq_set.py, from POD) and the R FAQ set (maxscore/lm/rfaq_set.py, from Texinfo HTML)
share once their documents are read into blocks (maxscore/lm/pod_text.Block).

    files, stats = set_files({doc: blocks}, {qid: (doc, question)})

- corpus: every document's passages: a section's paragraphs (text, code, list items) in order, packed into
  passages of at most `max_words` words (a longer paragraph is cut), never across a heading; headings are no
  passage's text, so a question is never its own answer's text. Passages of fewer than `min_words` words are
  dropped, and so is a passage that still holds a question's text (counted). docid `<doc>#<section>.<passage>`.
- qrels/test.tsv: grade 2 for every passage of a question's answer (the passages under its heading, subsections
  included). Test only: the set has no train or dev split.
- A question whose answer has no passage left, or none of whose words BM25 knows, is no query (counted).
- bm25.trec: BM25's top `bm25_top_k` of the whole corpus per query, English stopwords left out (the questions
  are sentences; maxscore.datasets.bm25).
Deterministic in the blocks: documents in the order given, no randomness.
"""

import dataclasses
import json
from typing import Iterable, Mapping, Sequence

from maxscore.datasets import bm25, data
from maxscore.lm import pod_text

RUN_TAG = "bm25"


@dataclasses.dataclass(frozen=True)
class Passage:
  docid: str
  text: str
  heads: tuple[str, ...]  # the headings above it, outermost first (its section's path)


def normal(text: str) -> str:
  return " ".join(text.lower().split())


def _cut(text: str, max_words: int) -> list[str]:
  words = text.split(" ")
  return [" ".join(words[i:i + max_words]) for i in range(0, len(words), max_words)]


def passages(name: str, blocks: Iterable[pod_text.Block], max_words: int, min_words: int) -> list[Passage]:
  """A document's passages (module docstring), in document order."""
  out: list[Passage] = []
  heads: list[tuple[int, str]] = []
  section, in_section, current, count = 0, 0, [], 0  # the text before a document's first heading is section 0

  def flush():
    nonlocal current, count, in_section
    text = " ".join(current)
    if current and len(text.split()) >= min_words:
      out.append(Passage(f"{name}#{section}.{in_section}", text, tuple(h for _, h in heads)))
      in_section += 1
    current, count = [], 0

  for block in blocks:
    if block.kind in pod_text.HEADINGS:
      flush()
      level = int(block.kind[-1])
      heads = [h for h in heads if h[0] < level] + [(level, block.text)]
      section, in_section = section + 1, 0
      continue
    text = " ".join(block.text.split())  # code too: one line, its tokens kept
    for piece in _cut(text, max_words):
      n = len(piece.split())
      if count and count + n > max_words:
        flush()
      current.append(piece)
      count += n
  flush()
  return out


def set_files(documents: Mapping[str, Sequence[pod_text.Block]], asked: Mapping[str, tuple[str, str]],
              max_words: int = 64, min_words: int = 5, bm25_top_k: int = 30) -> tuple[dict[str, str], dict[str, int]]:
  """({path under the set's directory: text} of the BEIR layout, the construction's counts) for the questions
  `asked` ({qid: (the document holding it as a heading, its text)}) against every passage of `documents`."""
  question_texts = {normal(q) for _, q in asked.values()}
  qids_by_heading = {(doc, q): qid for qid, (doc, q) in asked.items()}
  corpus: dict[str, Passage] = {}
  answers: dict[str, list[str]] = {}
  stats = {"documents_read": 0, "passages_with_a_question_dropped": 0}
  for name, blocks in documents.items():
    stats["documents_read"] += 1
    for p in passages(name, blocks, max_words, min_words):
      text = normal(p.text)
      if any(q in text for q in question_texts):
        stats["passages_with_a_question_dropped"] += 1
        continue
      corpus[p.docid] = p
      qid = next((qids_by_heading[(name, h)] for h in p.heads if (name, h) in qids_by_heading), None)
      if qid is not None:
        answers.setdefault(qid, []).append(p.docid)
  texts = {d: p.text for d, p in corpus.items()}
  answered = {qid: q for qid, (_, q) in asked.items() if answers.get(qid)}
  run = bm25.first_stage_run(texts, answered, bm25_top_k, stopwords=bm25.ENGLISH_STOPWORDS)
  queries = {qid: q for qid, q in answered.items() if run.get(qid)}
  stats |= {"passages": len(corpus), "questions": len(asked), "questions_without_an_answer": len(asked) - len(answered),
            "questions_bm25_finds_nothing_for": len(answered) - len(queries), "queries": len(queries),
            "judgments": sum(len(answers[q]) for q in queries)}
  qrels = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t2" for q in queries for d in answers[q]]
  run_lines = [line for q in queries
               for line in data.trec_lines(q, list(run[q]), list(run[q].values()), RUN_TAG)]
  files = {"corpus.jsonl": jsonl({"_id": d, "text": t} for d, t in texts.items()),
           "queries.jsonl": jsonl({"_id": q, "text": t} for q, t in queries.items()),
           "bm25.trec": "".join(line + "\n" for line in run_lines),
           "qrels/test.tsv": "".join(line + "\n" for line in qrels)}
  return files, stats


def jsonl(records: Iterable[dict]) -> str:
  return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
