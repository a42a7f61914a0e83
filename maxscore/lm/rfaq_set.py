"""A second natural-question test set on a corpus no maxscore model trains on or is selected on: the R FAQ's
questions against the passages of the R manuals (Debian's r-doc-html), built as the Perl FAQ set is
(maxscore/lm/faq_set.py).

    manuals = read_manuals("out/r-doc/usr/share/R/doc/manual")   # {manual name: HTML}
    files, stats = build_files(manuals)          # {path: text} of the BEIR layout, and the counts

- queries: every heading of R-FAQ.html (section, subsection) that asks a question: its text ends with "?"
  ("How can I set components of a list to NULL?"); headings that state a topic ("Citing R") are no query.
  qid `R-FAQ#<n>`, n its position among the FAQ's questions.
- corpus: the passages of all seven manuals (R-FAQ, R-intro, R-lang, R-admin, R-exts, R-data, R-ints), read by
  maxscore/lm/texinfo_html.py, which drops what repeats headings (the navigation line of every node, the
  tables of contents, the lists of child nodes, the indices). A cross-reference to a question ("see What is
  CRAN?") is rendered as the FAQ's name alone ("see R-FAQ"), and a passage that still holds a question's text
  is dropped.
- qrels/test.tsv: grade 2 for the passages under the question's heading. Test only.
Deterministic in the HTML: manuals in sorted order, no randomness.
"""

import pathlib
from typing import Mapping

from maxscore import errors
from maxscore.lm import faq_set, texinfo_html

FAQ = "R-FAQ"
MANUALS = ("R-FAQ", "R-admin", "R-data", "R-exts", "R-intro", "R-ints", "R-lang")
_QUESTION_HEADINGS = ("head2", "head3", "head4")


def read_manuals(manual_dir) -> dict[str, str]:
  """{name: HTML} of the R manuals under `manual_dir` (Debian's r-doc-html installs them as
  /usr/share/R/doc/manual), sorted by name."""
  root = pathlib.Path(manual_dir)
  missing = [m for m in MANUALS if not (root / f"{m}.html").is_file()]
  if missing:
    raise errors.ScoreInputError(
        f"{root} is not R's manual directory ({', '.join(m + '.html' for m in missing)} missing); Debian's "
        "r-doc-html package installs it as /usr/share/R/doc/manual (`make question-sources` unpacks it under out/)")
  return {m: (root / f"{m}.html").read_text(encoding="utf-8", errors="replace") for m in sorted(MANUALS)}


def questions(faq_html: str) -> dict[str, str]:
  """{qid: question} of the FAQ, in document order."""
  heads = [b.text for b in texinfo_html.read_blocks(faq_html) if b.kind in _QUESTION_HEADINGS]
  return {f"{FAQ}#{n}": q for n, q in enumerate(h for h in heads if h.endswith("?"))}


def build_files(manuals: Mapping[str, str], max_words: int = 64, min_words: int = 5,
                bm25_top_k: int = 30) -> tuple[dict[str, str], dict[str, int]]:
  """({path under the set's directory: text} of the BEIR layout, the construction's counts), module docstring."""
  if FAQ not in manuals:
    raise errors.ScoreInputError(f"the manuals hold no {FAQ}: its questions are the queries")
  asked = questions(manuals[FAQ])
  question_texts = {faq_set.normal(q) for q in asked.values()}
  stand_in = lambda link: FAQ if faq_set.normal(link) in question_texts else None  # a link to a question: the FAQ
  documents = {name: texinfo_html.read_blocks(text, replace_link=stand_in) for name, text in manuals.items()}
  return faq_set.set_files(documents, {qid: (FAQ, q) for qid, q in asked.items()}, max_words, min_words,
                           bm25_top_k)
