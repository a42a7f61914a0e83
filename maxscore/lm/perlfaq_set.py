"""A natural-question test set on a corpus no maxscore model trains on: the Perl FAQ's questions against the
passages of every Perl pod (Debian's perl-doc).

    pods = read_pods("out/perl-doc/usr/share/perl/5.36.0/pod")      # {pod name: POD text}
    files, stats = build_files(pods)            # {path: text} of the BEIR layout, and the counts
    files["queries.jsonl"], files["qrels/test.tsv"], files["bm25.trec"], files["corpus.jsonl"]

- queries: every `=head2` of perlfaq1 to perlfaq9 (each is a question: "How do I get a random number
  between X and Y?"), the text as perldoc shows it; qid `<faq>#<n>`, n its position in that FAQ.
- corpus: every pod but those that list the questions (EXCLUDED: perlfaq.pod and perltoc.pod), cut into
  passages as maxscore/lm/faq_set.py cuts them (at most `max_words` words, never across a heading; docid
  `<pod>#<section>.<passage>`).
- qrels/test.tsv: grade 2 for every passage of a question's answer (its `=head2` section with the subsections
  below it). Test only: the set has no train or dev split.
- No passage repeats a question: a cross-reference to a FAQ question (L<perlfaq4/"How do I ...?">) is
  rendered as the page's name alone, and a passage that still holds a question's text is dropped (counted).
- bm25.trec: BM25's top `bm25_top_k` of the whole corpus per query (faq_set).
Everything is deterministic in the pods: pods in sorted order, no randomness.
"""

import pathlib
from typing import Mapping

from maxscore import errors
from maxscore.lm import faq_set, pod_text

FAQS = tuple(f"perlfaq{i}" for i in range(1, 10))
EXCLUDED = {"perlfaq": "the FAQ's index: it lists every question", "perltoc": "the table of contents: it lists "
            "every heading, the questions among them"}


def read_pods(pod_dir) -> dict[str, str]:
  """{name: text} of every `*.pod` under `pod_dir` (Debian's perl-doc installs them as
  /usr/share/perl/<version>/pod), sorted by name."""
  root = pathlib.Path(pod_dir)
  pods = {p.stem: p.read_text(encoding="utf-8", errors="replace") for p in sorted(root.glob("*.pod"))}
  missing = [f for f in FAQS if f not in pods]
  if missing:
    raise errors.ScoreInputError(
        f"{root} is not Perl's pod directory ({', '.join(missing)}.pod missing); Debian's perl-doc package "
        "installs it as /usr/share/perl/<version>/pod (`make question-sources` unpacks it under out/)")
  return pods


def questions(pods: Mapping[str, str]) -> dict[str, str]:
  """{qid: question} of the FAQ pods, in FAQ and document order."""
  out = {}
  for faq in FAQS:
    heads = [b.text for b in pod_text.read_pod(pods[faq]) if b.kind == "head2"]
    out |= {f"{faq}#{n}": q for n, q in enumerate(heads)}
  return out


def build_files(pods: Mapping[str, str], max_words: int = 64, min_words: int = 5,
                bm25_top_k: int = 30) -> tuple[dict[str, str], dict[str, int]]:
  """({path under the set's directory: text} of the BEIR layout, the construction's counts), module docstring."""
  asked = questions(pods)
  question_texts = {faq_set.normal(q) for q in asked.values()}
  drop_section = lambda section: faq_set.normal(section) in question_texts  # a link to a FAQ question: the page
  documents = {name: pod_text.read_pod(pod, drop_section) for name, pod in pods.items() if name not in EXCLUDED}
  return faq_set.set_files(documents, {qid: (qid.split("#")[0], q) for qid, q in asked.items()}, max_words,
                           min_words, bm25_top_k)
