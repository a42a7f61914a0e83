"""The python-docs rerank set: Sphinx HTML -> sections -> the BEIR layout with splits by page and a BM25 run,
on a hand-made documentation tree, and the shipped set's invariants."""

import collections
import json
import pathlib

import pytest

from maxscore import errors
from maxscore.datasets import data
from maxscore.lm import docs_set

LONG = "word " * 40  # a paragraph long enough to keep (>= 150 characters)


def _page(title: str, sections: list[tuple[str, list[str], list[tuple[str, list[str]]]]]) -> str:
  """Sphinx-like HTML: a page section with its h1, then sections (title, paragraphs, subsections)."""
  def section(tag, t, paras, subs=()):
    inner = "".join(f"<p>{p}</p>" for p in paras) + "".join(section("h3", st, sp) for st, sp in subs)
    return (f'<section id="x"><{tag}>{t}<a class="headerlink" href="#x">¶</a></{tag}>{inner}</section>')
  body = "".join(section("h2", t, p, subs) for t, p, subs in sections)
  return f"<html><body><section id='top'><h1>{title}</h1><p>{LONG} intro</p>{body}</section></body></html>"


def _tree(tmp_path: pathlib.Path, pages: dict[str, str]) -> pathlib.Path:
  root = tmp_path / "html"
  for rel, text in {"library/index.html": "<html></html>", **pages}.items():
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text(text, encoding="utf-8")
  return root


def test_sections_titles_and_paragraphs_of_sphinx_html(tmp_path):
  root = _tree(tmp_path, {"library/json.html": _page("json", [
      ("1.2. Basic Usage", [f"{LONG} dumps <code>obj</code> &amp; more", "too short", f"{LONG} loads"],
       [("Character Encodings", [f"{LONG} utf-8"])]),
      ("Empty", ["short"], []),
  ])})
  sections = docs_set.read_sections(root, subdirs=("library",), max_words=10)
  assert [(s.page, s.index, s.title) for s in sections] == [
      ("library/json", 0, "Basic Usage"), ("library/json", 1, "Character Encodings")]
  basic = sections[0]
  # Own paragraphs only (not the subsection's), short ones dropped, entities decoded, cut to 10 words,
  # and the heading's permalink sign left out of the title.
  assert len(basic.paragraphs) == 2 and all(len(p.split()) == 10 for p in basic.paragraphs)
  assert sections[1].paragraphs == (" ".join(["word"] * 10),)
  full = docs_set.read_sections(root, subdirs=("library",), max_words=100)
  assert full[0].paragraphs[0].endswith("dumps obj & more") and "¶" not in full[0].title


def test_not_the_documentation_is_one_clear_error(tmp_path):
  with pytest.raises(errors.ScoreInputError, match="python3.11-doc"):
    docs_set.read_sections(tmp_path)


def _pages(n: int) -> dict[str, str]:
  """n pages, each with two query sections (unique titles) and one 'Examples' section (a repeated title);
  page i's words end in letters of i (BM25 reads only letters)."""
  def tag(i):
    return "".join(chr(ord("a") + int(c)) for c in str(i))
  return {f"library/mod{i}.html": _page(f"mod{i}", [
      (f"Topic alpha{tag(i)}", [f"{LONG} alpha{tag(i)} one", f"{LONG} alpha{tag(i)} two"], []),
      (f"Topic beta{tag(i)}", [f"{LONG} beta{tag(i)} one", f"{LONG} beta{tag(i)} two", f"{LONG} beta{tag(i)} three"],
       []),
      ("Examples", [f"{LONG} example{tag(i)} one", f"{LONG} example{tag(i)} two"], []),
  ]) for i in range(n)}


def test_beir_layout_splits_by_page_with_graded_qrels_and_bm25(tmp_path):
  sections = docs_set.read_sections(_tree(tmp_path, _pages(10)), subdirs=("library",))
  files = docs_set.build_files(sections, seed=0, test_queries=4, dev_queries=2, bm25_top_k=5)
  assert files == docs_set.build_files(sections, seed=0, test_queries=4, dev_queries=2, bm25_top_k=5)
  corpus = [json.loads(l) for l in files["corpus.jsonl"].splitlines()]
  queries = {q["_id"]: q["text"] for q in map(json.loads, files["queries.jsonl"].splitlines())}
  assert len(corpus) == 10 * 7 and "Examples" not in queries.values() and len(queries) == 20
  qrels = {s: [l.split("\t") for l in files[f"qrels/{s}.tsv"].splitlines()[1:]] for s in docs_set.SPLITS}
  split_of = {q: s for s, lines in qrels.items() for q, _, _ in lines}
  assert set(split_of) == set(queries)
  per_split = collections.Counter(split_of.values())
  assert per_split == {"test": 4, "dev": 2, "train": 14}  # whole pages of 2 queries each
  pages = collections.defaultdict(set)
  for q, s in split_of.items():
    pages[q.split("#")[0]].add(s)
  assert all(len(s) == 1 for s in pages.values())  # no page gives queries to two splits
  for lines in qrels.values():
    for q, d, grade in lines:
      same_section = d.rsplit(".", 1)[0] == q
      assert d.split("#")[0] == q.split("#")[0] and grade == ("2" if same_section else "1")
  # Every paragraph of the query's page is judged: 2 (own section, its 2 or 3) or 1 (the page's others).
  judged = collections.Counter((q, g) for lines in qrels.values() for q, _, g in lines)
  assert all(judged[q, "2"] + judged[q, "1"] == 7 for q in queries)
  (tmp_path / "bm25.trec").write_text(files["bm25.trec"])
  run = data.read_trec_run(tmp_path / "bm25.trec")
  assert set(run) == set(queries) and all(0 < len(v) <= 5 for v in run.values())
  # A query's own words find its section first: "Topic betad" -> page 3's beta paragraphs.
  q = next(q for q, t in queries.items() if t == "Topic betad")
  assert all(d.startswith(q + ".") for d in list(run[q])[:3])


def test_too_few_sections_for_the_splits_is_one_clear_error(tmp_path):
  sections = docs_set.read_sections(_tree(tmp_path, _pages(2)), subdirs=("library",))
  with pytest.raises(errors.ScoreInputError, match="cannot give 4 test and 2 dev"):
    docs_set.build_files(sections, test_queries=4, dev_queries=2)


def test_the_shipped_set_holds_enough_held_out_queries():
  d = data.DEFAULT_DOCS_DIR
  qrels = {s: [l.split("\t") for l in (d / "qrels" / f"{s}.tsv").read_text().splitlines()[1:]]
           for s in docs_set.SPLITS}
  split_of = {q: s for s, lines in qrels.items() for q, _, _ in lines}
  counts = collections.Counter(split_of.values())
  assert counts["test"] >= 100 and counts["dev"] >= 100 and counts["train"] >= 500
  pages = collections.defaultdict(set)
  for q, s in split_of.items():
    pages[q.split("#")[0]].add(s)
  assert all(len(s) == 1 for s in pages.values())
  corpus = {json.loads(l)["_id"] for l in (d / "corpus.jsonl").read_text().splitlines()}
  assert all(doc in corpus for lines in qrels.values() for _, doc, _ in lines)
  run = data.read_trec_run(d / "bm25.trec")
  assert set(run) == set(split_of) and all(doc in corpus for v in run.values() for doc in v)
  assert not any(q.startswith("reference/") for q in split_of)  # the first set's source, left out
