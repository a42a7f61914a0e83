"""A natural-question test set on a corpus no maxscore model trains on: the Perl FAQ's questions against the
passages of every Perl pod (Debian's perl-doc).

    pods = read_pods("out/perl-doc/usr/share/perl/5.36.0/pod")      # {pod name: POD text}
    files, stats = build_files(pods)            # {path: text} of the BEIR layout, and the counts
    files["queries.jsonl"], files["qrels/test.tsv"], files["bm25.trec"], files["corpus.jsonl"]

- queries: every `=head2` of perlfaq1 to perlfaq9 (each is a question: "How do I get a random number
  between X and Y?"), the text as perldoc shows it; qid `<faq>#<n>`, n its position in that FAQ.
- corpus: every pod but those that list the questions (EXCLUDED: perlfaq.pod and perltoc.pod), cut into
  passages: a section's paragraphs (text, code, list items) in order, packed into passages of at most
  `max_words` words (a longer paragraph is cut), never across a heading; headings are no passage's text, so a
  question is never its own answer's text. Passages of fewer than `min_words` words are dropped. docid
  `<pod>#<section>.<passage>`.
- qrels/test.tsv: grade 2 for every passage of a question's answer (its `=head2` section with the subsections
  below it). Test only: the set has no train or dev split.
- No passage repeats a question: a cross-reference to a FAQ question (L<perlfaq4/"How do I ...?">) is
  rendered as the page's name alone, and a passage that still holds a question's text is dropped (counted).
  A question whose answer has no passage left, or none of whose words BM25 knows, is no query (counted).
- bm25.trec: BM25's top `bm25_top_k` of the whole corpus per query, English stopwords left out (the questions
  are sentences; maxscore.datasets.bm25).
Everything is deterministic in the pods: pods in sorted order, no randomness.
"""

import dataclasses
import json
import pathlib
import re
from typing import Iterable, Mapping

from maxscore import errors
from maxscore.datasets import bm25, data
from maxscore.lm import pod_text

FAQS = tuple(f"perlfaq{i}" for i in range(1, 10))
EXCLUDED = {"perlfaq": "the FAQ's index: it lists every question", "perltoc": "the table of contents: it lists "
            "every heading, the questions among them"}
RUN_TAG = "bm25"


@dataclasses.dataclass(frozen=True)
class Passage:
  docid: str
  text: str
  heads: tuple[str, ...]  # the headings above it, outermost first (its section's path)


def read_pods(pod_dir) -> dict[str, str]:
  """{name: text} of every `*.pod` under `pod_dir` (Debian's perl-doc installs them as
  /usr/share/perl/<version>/pod), sorted by name."""
  root = pathlib.Path(pod_dir)
  pods = {p.stem: p.read_text(encoding="utf-8", errors="replace") for p in sorted(root.glob("*.pod"))}
  missing = [f for f in FAQS if f not in pods]
  if missing:
    raise errors.ScoreInputError(
        f"{root} is not Perl's pod directory ({', '.join(missing)}.pod missing); Debian's perl-doc package "
        "installs it as /usr/share/perl/<version>/pod (`make perlfaq-source` unpacks it under out/)")
  return pods


def _normal(text: str) -> str:
  return " ".join(text.lower().split())


def questions(pods: Mapping[str, str]) -> dict[str, str]:
  """{qid: question} of the FAQ pods, in FAQ and document order."""
  out = {}
  for faq in FAQS:
    heads = [b.text for b in pod_text.read_pod(pods[faq]) if b.kind == "head2"]
    out |= {f"{faq}#{n}": q for n, q in enumerate(heads)}
  return out


def _cut(text: str, max_words: int) -> list[str]:
  words = text.split(" ")
  return [" ".join(words[i:i + max_words]) for i in range(0, len(words), max_words)]


def passages(name: str, pod: str, max_words: int, min_words: int, drop_section=None) -> list[Passage]:
  """`pod`'s passages (module docstring), in document order."""
  out: list[Passage] = []
  heads: list[tuple[int, str]] = []
  section, in_section, current, count = 0, 0, [], 0  # the text before a pod's first heading is section 0

  def flush():
    nonlocal current, count, in_section
    text = " ".join(current)
    if current and len(text.split()) >= min_words:
      out.append(Passage(f"{name}#{section}.{in_section}", text, tuple(h for _, h in heads)))
      in_section += 1
    current, count = [], 0

  for block in pod_text.read_pod(pod, drop_section):
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


def _answers(faq_passages: list[Passage], faq: str, qids_by_text: Mapping[str, str]) -> dict[str, list[str]]:
  """{qid: docids of its answer}: the passages whose section path runs through the question's =head2."""
  out: dict[str, list[str]] = {}
  for p in faq_passages:
    for head in p.heads:
      qid = qids_by_text.get((faq, head))
      if qid is not None:
        out.setdefault(qid, []).append(p.docid)
        break
  return out


def build_files(pods: Mapping[str, str], max_words: int = 64, min_words: int = 5,
                bm25_top_k: int = 30) -> tuple[dict[str, str], dict[str, int]]:
  """({path under the set's directory: text} of the BEIR layout, the construction's counts), module docstring."""
  asked = questions(pods)
  question_texts = {_normal(q) for q in asked.values()}
  drop_section = lambda section: _normal(section) in question_texts  # a link to a FAQ question: the page alone
  corpus: dict[str, Passage] = {}
  answers: dict[str, list[str]] = {}
  qids_by_text = {(qid.split("#")[0], q): qid for qid, q in asked.items()}
  stats = {"pods_read": 0, "passages_with_a_question_dropped": 0}
  for name, pod in pods.items():
    if name in EXCLUDED:
      continue
    stats["pods_read"] += 1
    kept = []
    for p in passages(name, pod, max_words, min_words, drop_section):
      text = _normal(p.text)
      if any(q in text for q in question_texts):
        stats["passages_with_a_question_dropped"] += 1
        continue
      kept.append(p)
    corpus |= {p.docid: p for p in kept}
    if name in FAQS:
      answers |= _answers(kept, name, qids_by_text)
  texts = {d: p.text for d, p in corpus.items()}
  answered = {qid: q for qid, q in asked.items() if answers.get(qid)}
  run = bm25.first_stage_run(texts, answered, bm25_top_k, stopwords=bm25.ENGLISH_STOPWORDS)
  queries = {qid: q for qid, q in answered.items() if run.get(qid)}
  stats |= {"passages": len(corpus), "questions": len(asked), "questions_without_an_answer": len(asked) - len(answered),
            "questions_bm25_finds_nothing_for": len(answered) - len(queries), "queries": len(queries),
            "judgments": sum(len(answers[q]) for q in queries)}
  qrels = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t2" for q in queries for d in answers[q]]
  run_lines = [line for q in queries
               for line in data.trec_lines(q, list(run[q]), list(run[q].values()), RUN_TAG)]
  files = {"corpus.jsonl": _jsonl({"_id": d, "text": t} for d, t in texts.items()),
           "queries.jsonl": _jsonl({"_id": q, "text": t} for q, t in queries.items()),
           "bm25.trec": "".join(line + "\n" for line in run_lines),
           "qrels/test.tsv": "".join(line + "\n" for line in qrels)}
  return files, stats


def _jsonl(records: Iterable[dict]) -> str:
  return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
