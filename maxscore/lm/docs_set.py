"""A second embedded rerank set, large enough to show a difference: section titles of the Python
documentation (library reference, HOWTOs, tutorial, ...) against the paragraphs of the whole documentation.

    sections = read_sections("/usr/share/doc/python3.11/html")     # Debian's python3.11-doc, say
    files = build_files(sections, seed=0, test_queries=150, dev_queries=100, bm25_top_k=30)
    files["queries.jsonl"], files["qrels/test.tsv"], files["bm25.trec"], ...   # the BEIR layout

The source is the HTML that Sphinx writes for the Python documentation, read at build time only: the eval
reads the files written here. The `reference/` pages are left out: the first embedded set
(maxscore/lm/default_set.py) and the default's pretraining read the same text through pydoc_data.

- corpus.jsonl: every paragraph (`<p>`, at least `min_chars` characters, cut to `max_words` words) of every
  section below a page's title; docid `<dir>/<page>#<section>.<paragraph>`.
- queries.jsonl: one query per section whose title occurs once in the whole documentation (so "Examples" or
  "Module contents" are no query), that has at least two paragraphs and that BM25 finds something for; the
  text is the title without its section number.
- qrels/{train,dev,test}.tsv: grade 2 for every paragraph of the query's section, 1 for every other paragraph
  of its page. Splits are by page, so no page gives queries to two splits: pages in a seeded order go to
  test until it holds `test_queries` queries, then to dev until `dev_queries`, then the rest to train.
- bm25.trec: BM25's top `bm25_top_k` of the whole corpus per query (maxscore.datasets.bm25), every split.
Everything is deterministic in the HTML and the seed.
"""

import dataclasses
import html.parser
import json
import pathlib
import re
from typing import Iterable, Sequence

import numpy as np

from maxscore import errors
from maxscore.datasets import bm25, data

SUBDIRS = ("library", "howto", "tutorial", "using", "faq", "extending")  # reference/ is the first set's
RUN_TAG = "bm25"
SPLITS = ("train", "dev", "test")
_NUMBER = re.compile(r"^(\d+\.)+\d*\s*")  # "3.3.5. Emulating generic types" -> "Emulating generic types"


@dataclasses.dataclass(frozen=True)
class Section:
  page: str                  # "library/json"
  index: int                 # position among the page's sections
  title: str
  paragraphs: tuple[str, ...]


class _SectionParser(html.parser.HTMLParser):
  """Sphinx HTML -> (nesting depth, title, paragraph texts) per <section>, innermost text only."""

  def __init__(self):
    super().__init__(convert_charrefs=True)
    self.open: list[dict] = []
    self.done: list[tuple[int, int, str, list[str]]] = []  # (opening order, depth, title, paragraphs)
    self._opened = 0
    self._title: list[str] | None = None
    self._para: list[str] | None = None
    self._skip = 0  # inside a heading's permalink ("¶")

  def handle_starttag(self, tag, attrs):
    attrs = dict(attrs)
    if tag == "section":
      self.open.append({"order": self._opened, "title": None, "paragraphs": []})
      self._opened += 1
    elif self.open and tag in ("h1", "h2", "h3", "h4", "h5", "h6") and self.open[-1]["title"] is None:
      self._title = []
    elif self.open and tag == "p":
      self._para = []
    elif tag == "a" and "headerlink" in (attrs.get("class") or ""):
      self._skip += 1

  def handle_endtag(self, tag):
    if tag == "section" and self.open:
      s = self.open.pop()
      self.done.append((s["order"], len(self.open) + 1, s["title"] or "", s["paragraphs"]))
    elif tag.startswith("h") and self._title is not None:
      self.open[-1]["title"] = " ".join("".join(self._title).split())
      self._title = None
    elif tag == "p" and self._para is not None:
      self.open[-1]["paragraphs"].append(" ".join("".join(self._para).split()))
      self._para = None
    elif tag == "a" and self._skip:
      self._skip -= 1

  def handle_data(self, text):
    if self._skip:
      return
    if self._title is not None:
      self._title.append(text)
    elif self._para is not None:
      self._para.append(text)


def clip_words(text: str, max_words: int) -> str:
  words = text.split()
  return " ".join(words[:max_words])


def read_sections(html_dir, subdirs: Sequence[str] = SUBDIRS, min_chars: int = 150,
                  max_words: int = 64) -> list[Section]:
  """Every section below a page title of the pages under `html_dir`/<subdir>/*.html, with its own paragraphs
  (not its subsections'), each at least `min_chars` characters and cut to `max_words` words; sections with no
  such paragraph are dropped. Pages in sorted order, sections in document order."""
  root = pathlib.Path(html_dir)
  if not (root / "library" / "index.html").is_file():
    raise errors.ScoreInputError(
        f"{root} is not the Python documentation's HTML (no library/index.html); Debian's python3.11-doc "
        "package installs it as /usr/share/doc/python3.11/html (`make docs-source` unpacks it under out/)")
  sections = []
  for sub in subdirs:
    for path in sorted((root / sub).glob("*.html")):
      parser = _SectionParser()
      parser.feed(path.read_text(encoding="utf-8"))
      page = f"{sub}/{path.stem}"
      index = 0
      for _, depth, title, paras in sorted(parser.done):
        paras = [clip_words(p, max_words) for p in paras if len(p) >= min_chars]
        if depth >= 2 and paras:
          sections.append(Section(page, index, _NUMBER.sub("", title).strip(), tuple(paras)))
          index += 1
  return sections


def _queries(sections: Sequence[Section]) -> list[Section]:
  counts: dict[str, int] = {}
  for s in sections:
    counts[s.title.lower()] = counts.get(s.title.lower(), 0) + 1
  return [s for s in sections if counts[s.title.lower()] == 1 and len(s.paragraphs) >= 2 and s.title]


def qid(s: Section) -> str:
  return f"{s.page}#{s.index}"


def docid(s: Section, i: int) -> str:
  return f"{s.page}#{s.index}.{i}"


def assign_splits(queries: Sequence[Section], seed: int, test_queries: int, dev_queries: int) -> dict[str, str]:
  """{qid: split}, by page (module docstring)."""
  pages = sorted({s.page for s in queries})
  per_page: dict[str, int] = {}
  for s in queries:
    per_page[s.page] = per_page.get(s.page, 0) + 1
  split_of_page, counts = {}, {"test": 0, "dev": 0}
  for i in np.random.default_rng(seed).permutation(len(pages)):
    page = pages[int(i)]
    split = "test" if counts["test"] < test_queries else "dev" if counts["dev"] < dev_queries else "train"
    split_of_page[page] = split
    if split != "train":
      counts[split] += per_page[page]
  return {qid(s): split_of_page[s.page] for s in queries}


def build_files(sections: Sequence[Section], seed: int = 0, test_queries: int = 150, dev_queries: int = 100,
                bm25_top_k: int = 30) -> dict[str, str]:
  """{path under the set's directory: text} of the BEIR layout (module docstring)."""
  corpus = {docid(s, i): p for s in sections for i, p in enumerate(s.paragraphs)}
  queries = _queries(sections)
  run = bm25.first_stage_run(corpus, {qid(q): q.title for q in queries}, bm25_top_k)
  queries = [q for q in queries if run.get(qid(q))]  # a title none of whose words is in the corpus has nothing to rerank
  if len(queries) < test_queries + dev_queries:
    raise errors.ScoreInputError(f"{len(queries)} usable sections cannot give {test_queries} test and "
                            f"{dev_queries} dev queries")
  splits = assign_splits(queries, seed, test_queries, dev_queries)
  by_page: dict[str, list[Section]] = {}
  for s in sections:
    by_page.setdefault(s.page, []).append(s)
  qrels = {split: ["query-id\tcorpus-id\tscore"] for split in SPLITS}
  for q in queries:
    for s in by_page[q.page]:
      for i in range(len(s.paragraphs)):
        qrels[splits[qid(q)]].append(f"{qid(q)}\t{docid(s, i)}\t{2 if s.index == q.index else 1}")
  query_text = {qid(q): q.title for q in queries}
  run_lines = [line for q, scores in run.items() if q in query_text
               for line in data.trec_lines(q, list(scores), list(scores.values()), RUN_TAG)]
  files = {"corpus.jsonl": _jsonl({"_id": d, "text": t} for d, t in corpus.items()),
           "queries.jsonl": _jsonl({"_id": q, "text": t} for q, t in query_text.items()),
           "bm25.trec": "".join(line + "\n" for line in run_lines)}
  files |= {f"qrels/{split}.tsv": "".join(line + "\n" for line in lines) for split, lines in qrels.items()}
  return files


def _jsonl(records: Iterable[dict]) -> str:
  return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
