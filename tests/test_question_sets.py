"""The natural-question sets: POD and Texinfo HTML as text, the Perl FAQ and R FAQ test sets (hand-made sources,
then the shipped sets and rebuilds from Debian's perl-doc and r-doc-html), and the Python FAQ's question splits of
python_docs_beir."""

import collections
import json
import pathlib
import shutil
import subprocess

import pytest

from maxscore import errors
from maxscore.datasets import beir_files, data
from maxscore.lm import docs_questions, docs_set, perlfaq_set, pod_text, question_sets, rfaq_set, texinfo_html

PERLFAQ = question_sets.PERLFAQ_DIR
RFAQ = question_sets.RFAQ_DIR
DOCS = data.DEFAULT_DOCS_DIR


def test_pod_formatting_codes_become_their_text():
  assert pod_text.render("Use C<rand()> and B<I<bold>> F<a.txt>") == "Use rand() and bold a.txt"
  assert pod_text.render("C<< 0 <= rand($x) < $x >> and C<<< $a >> $b >>>") == "0 <= rand($x) < $x and $a >> $b"
  assert pod_text.render("a X<index entry>b Z<>c E<lt>E<gt>E<eacute>E<0x41>") == "a b c <>éA"
  assert pod_text.render('L<perlfunc/"rand">, L<the docs|perlop>, L<perlre>, L<https://perl.org>') == \
      '"rand" in perlfunc, the docs, perlre, https://perl.org'
  assert pod_text.render('see L<perlfaq4/"Why?">', drop_section=lambda s: s == "Why?") == "see perlfaq4"


def test_pod_blocks_headings_paragraphs_code_and_what_is_dropped():
  pod = ("=head1 NAME\n\nx - y\n\n=over 4\n\n=item * first item\n\nIts text\non two lines.\n\n=back\n\n"
         "    my $x = 1;\n      $x++;\n\n=for html <b>dropped</b>\n\n=begin text\n\nalso dropped\n\n=end text\n\n"
         "=cut\n\nnot pod at all\n\n=head2 Next\n\nkept\n")
  blocks = pod_text.read_pod(pod)
  assert [(b.kind, b.text) for b in blocks] == [
      ("head1", "NAME"), ("para", "x - y"), ("para", "first item"), ("para", "Its text on two lines."),
      ("verbatim", "my $x = 1;\n  $x++;"), ("head2", "Next"), ("para", "kept")]


def _faq(questions: dict[str, list[str]]) -> str:
  body = "".join(f"=head2 {q}\n\n" + "".join(p + "\n\n" for p in paras) for q, paras in questions.items())
  return f"=head1 NAME\n\nperlfaqN - questions\n\n=head1 DESCRIPTION\n\n{body}"


def _pods(tmp_path: pathlib.Path) -> pathlib.Path:
  words = " ".join(f"w{i}" for i in range(30))
  pods = {f"perlfaq{i}": _faq({f"How do I do thing {i}?": [f"Use the thing{i} function {words}."]})
          for i in range(1, 10)}
  pods["perlfaq4"] = _faq({
      "How do I get a random number between X and Y?": [
          f"Call C<rand()> and shift it, {words}.", "    my $n = 10 + int rand(6);",
          'See also L<perlfaq1/"How do I do thing 1?"> for more about the first thing.'],
      "Why is int() broken?": [f"It is not; C<int> truncates toward zero, {words}."],
      "Who answers this one?": []})
  pods["perlfunc"] = ("=head1 rand\n\nReturns a random fractional number between 0 and the value given, "
                      "the random generator seeded once.\n\n=head2 srand\n\nSets the random number seed for rand, "
                      "How do I do thing 2? is a question repeated here.\n")
  pods["perlfaq"] = _faq({"How do I do thing 1?": ["the index repeats every question"]})
  pods["perltoc"] = "=head1 perlfaq4\n\nHow do I get a random number between X and Y?\n"
  root = tmp_path / "pod"
  root.mkdir()
  for name, text in pods.items():
    (root / f"{name}.pod").write_text(text)
  return root


def _read(files: dict[str, str], name: str) -> list[dict]:
  return [json.loads(line) for line in files[name].splitlines()]


def test_perlfaq_set_from_hand_made_pods(tmp_path):
  pods = perlfaq_set.read_pods(_pods(tmp_path))
  files, stats = perlfaq_set.build_files(pods, max_words=20, min_words=3, bm25_top_k=5)
  assert files == perlfaq_set.build_files(pods, max_words=20, min_words=3, bm25_top_k=5)[0]  # deterministic
  corpus = {r["_id"]: r["text"] for r in _read(files, "corpus.jsonl")}
  queries = {r["_id"]: r["text"] for r in _read(files, "queries.jsonl")}
  assert queries["perlfaq4#0"] == "How do I get a random number between X and Y?"
  assert "perlfaq4#2" not in queries and stats["questions_without_an_answer"] == 1  # no text under it
  assert not any(d.startswith(("perlfaq#", "perltoc#")) for d in corpus)  # the pods that list the questions
  assert stats["passages_with_a_question_dropped"] == 1  # perlfunc's srand passage repeats a question
  assert not any(q.lower() in t.lower() for q in queries.values() for t in corpus.values())
  assert any("See also perlfaq1 for more" in t for t in corpus.values())  # the link: the page alone
  assert all(len(t.split()) <= 20 for t in corpus.values())  # passages of at most max_words words
  qrels = [line.split("\t") for line in files["qrels/test.tsv"].splitlines()[1:]]
  answer = sorted(d for q, d, g in qrels if q == "perlfaq4#0")
  assert answer and all(d.startswith("perlfaq4#") for d in answer) and {g for *_, g in qrels} == {"2"}
  assert "my $n = 10 + int rand(6);" in " ".join(corpus[d] for d in answer)  # code is passage text too
  assert set(files) == {"corpus.jsonl", "queries.jsonl", "qrels/test.tsv", "bm25.trec"}  # test only


def test_perlfaq_refuses_a_directory_that_is_not_perls_pods(tmp_path):
  with pytest.raises(errors.ScoreInputError, match="not Perl's pod directory"):
    perlfaq_set.read_pods(tmp_path)


def test_a_build_that_names_no_source_is_refused_and_writes_nothing(tmp_path):
  options = question_sets.QuestionSetOptions(perlfaq_dir=str(tmp_path / "perl"), docs_dir=str(tmp_path / "docs"))
  with pytest.raises(errors.ScoreInputError, match="nothing to build"):
    question_sets.build(options.validate())
  assert not list(tmp_path.iterdir())


def test_shipped_perlfaq_set_invariants():
  corpus = beir_files.read_corpus(PERLFAQ / "corpus.jsonl")
  queries = beir_files.read_queries(PERLFAQ / "queries.jsonl")
  assert len(queries) >= 300 and len(corpus) > 20_000
  assert sorted(p.name for p in (PERLFAQ / "qrels").iterdir()) == ["test.tsv"]
  texts = [t.lower() for t in corpus.values()]
  assert not [q for q in queries.values() if any(q.lower() in t for t in texts)]
  rs = data.load_beir(PERLFAQ, PERLFAQ / "bm25.trec", split="test", top_k=30)
  assert len(rs.queries) == len(queries)


def _unpacked_package(tmp_path: pathlib.Path, package: str, version: str) -> tuple[pathlib.Path, bool]:
  """apt-get download `package` at `version` (else its current version) and dpkg-deb -x it: (the unpacked root,
  whether `version` itself was downloaded)."""
  if not shutil.which("apt-get") or not shutil.which("dpkg-deb"):
    pytest.skip("needs Debian's apt-get and dpkg-deb")
  got = subprocess.run(["apt-get", "download", f"{package}={version}"], cwd=tmp_path, capture_output=True)
  if got.returncode:
    subprocess.run(["apt-get", "download", package], cwd=tmp_path, check=True, capture_output=True)
  deb = next(tmp_path.glob(f"{package}_*.deb"))
  subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path / "x")], check=True)
  return tmp_path / "x", got.returncode == 0


def _assert_rebuilt(shipped: pathlib.Path, build, exact: bool) -> None:
  """`build()` gives the same files twice and, from the version the set names, the shipped files byte for byte."""
  files, _ = build()
  if exact:
    for name, text in files.items():
      assert (shipped / name).read_text(encoding="utf-8") == text, name
  assert files == build()[0]


@pytest.mark.slow
def test_perlfaq_rebuilt_from_debians_perl_doc_is_byte_identical(tmp_path):
  """apt-get download perl-doc (Debian's registry); the version the shipped set names is rebuilt byte for byte,
  and any version builds the same files twice."""
  root, exact = _unpacked_package(tmp_path, "perl-doc", json.loads((PERLFAQ / "source.json").read_text())["version"])
  pod_dir = next((root / "usr" / "share" / "perl").glob("*/pod"))
  _assert_rebuilt(PERLFAQ, lambda: perlfaq_set.build_files(perlfaq_set.read_pods(pod_dir)), exact)


def _qrels(split: str) -> dict[str, set[str]]:
  out = collections.defaultdict(set)
  for line in (DOCS / "qrels" / f"{split}.tsv").read_text().splitlines()[1:]:
    q, d, _ = line.split("\t")
    out[q].add(d)
  return out


def test_shipped_python_faq_questions_share_nothing_across_splits():
  queries = beir_files.read_queries(DOCS / "queries.jsonl")
  splits = {s: _qrels(s) for s in ("train", "dev", "test", *docs_questions.SPLITS)}
  assert len(splits["questions_dev"]) == 70 and len(splits["questions_train"]) >= 70
  for a in splits:
    for b in splits:
      if a < b:
        assert not set(splits[a]) & set(splits[b]), (a, b)  # no query in two splits
        passages = lambda s: {d for ds in splits[s].values() for d in ds}
        assert not (passages(a) & passages(b)) or {a, b} <= {"train", "dev", "test"}, (a, b)
  texts = lambda s: {queries[q].lower() for q in splits[s]}
  for keyword in ("train", "dev", "test"):  # no question is also a keyword query (the FAQ's titles left)
    assert not texts(keyword) & (texts("questions_dev") | texts("questions_train"))
  assert all(queries[q].endswith("?") for q in splits["questions_dev"])
  rs = data.load_beir(DOCS, DOCS / docs_questions.RUN_FILE, split="questions_dev", top_k=30)
  assert len(rs.queries) == 70


def test_python_faq_questions_rebuilt_from_their_own_output_are_the_same(tmp_path):
  names = ("corpus.jsonl", "queries.jsonl", "qrels/train.tsv", "bm25.trec")
  shipped = {n: (DOCS / n).read_text(encoding="utf-8") for n in names}
  sections = [docs_set.Section("faq/general", 0, "Why is Python?", ("A paragraph that answers it.",)),
              docs_set.Section("faq/general", 1, "What is Python?", ("Another paragraph, a second answer.",))]
  corpus = "".join(json.dumps({"_id": docs_set.docid(s, 0), "text": s.paragraphs[0]}) + "\n" for s in sections)
  files = dict(shipped, **{"corpus.jsonl": shipped["corpus.jsonl"] + corpus})
  first = docs_questions.question_files(sections, files, dev_questions=1)
  again = docs_questions.question_files(sections, dict(files, **first), dev_questions=1)
  assert first == again
  assert sum(line.startswith("query-id") is False for line in first["qrels/questions_dev.tsv"].splitlines()) == 1
  with pytest.raises(errors.ScoreInputError, match="differ"):
    docs_questions.question_files(sections, shipped, dev_questions=1)  # their paragraphs are not in the corpus


# --- the R FAQ set ----------------------------------------------------------------------------------------------
def _node(level: str, cls: str, title: str, body: str, nav: str = "") -> str:
  return (f'<div class="{cls}"><div class="header"><p>Next: <a href="#x">{nav}</a></p></div>'
          f'<h{level} class="{cls}">{title}</h{level}>{body}</div>')


def test_texinfo_html_blocks_headings_text_code_and_what_is_dropped():
  page = ('<h1 class="settitle">A Manual</h1><p>the title page</p>'
          '<div class="contents"><ul><li><a href="#a">1 Basics</a></li></ul></div>'
          + _node(2, "chapter", "1 Basics", '<ul class="section-toc"><li><a href="#q">What is it?</a></li></ul>'
                  '<p>Intro text<br>on two lines.</p>', nav="What is it?")
          + _node(3, "section", "1.1 What is it?", '<p>It is a thing (see <a href="#o">Other question?</a>).</p>'
                  '<div class="example"><pre class="example">x &lt;- 1\n  y\n</pre></div>'
                  '<ul><li>an item</li></ul><dl><dt>term</dt><dd>its meaning</dd></dl>'
                  '<table class="index-cp"><tr><td>index entry</td></tr></table>'
                  '<table class="menu"><tr><td>menu entry</td></tr></table>')
          + _node(4, "subsection", "A.1.2 Deeper", "<p>deep")  # an unclosed <p> at the end
          + '<div class="footnote"><p>a footnote</p></div>')
  blocks = texinfo_html.read_blocks(page, replace_link=lambda t: "MANUAL" if t == "Other question?" else None)
  assert [(b.kind, b.text) for b in blocks] == [
      ("head1", "Basics"), ("para", "Intro text on two lines."), ("head2", "What is it?"),
      ("para", "It is a thing (see MANUAL)."), ("verbatim", "x <- 1\n  y"), ("para", "an item"), ("para", "term"),
      ("para", "its meaning"), ("head3", "Deeper"), ("para", "deep")]


def _manuals(tmp_path: pathlib.Path) -> pathlib.Path:
  words = " ".join(f"w{i}" for i in range(30))
  faq = (_node(2, "chapter", "1 Basics", "")
         + _node(3, "section", "1.1 How can I read a table?", f"<p>Use read.table() on the file, {words}.</p>"
                 '<pre class="example">df &lt;- read.table("a.txt")</pre>')
         + _node(3, "section", "1.2 Citing R", f"<p>A topic, not a question, {words}.</p>")
         + _node(3, "section", "1.3 Why is R named R?", f'<p>After its authors; see <a href="#t">How can I read a '
                 f'table?</a> for more, {words}.</p>')
         + _node(4, "subsection", "1.3.1 Who answers this one?", ""))
  root = tmp_path / "manual"
  root.mkdir()
  for name in rfaq_set.MANUALS:
    (root / f"{name}.html").write_text(f'<h2 class="chapter">1 {name}</h2><p>The {name} manual, {words}.</p>')
  (root / "R-FAQ.html").write_text(faq)
  (root / "R-data.html").write_text(_node(2, "chapter", "1 Import", f"<p>read.table reads a table from a file "
                                                                    f"into a data frame, {words}.</p>"))
  return root


def test_rfaq_set_from_hand_made_manuals(tmp_path):
  manuals = rfaq_set.read_manuals(_manuals(tmp_path))
  files, stats = rfaq_set.build_files(manuals, max_words=20, min_words=3, bm25_top_k=5)
  assert files == rfaq_set.build_files(manuals, max_words=20, min_words=3, bm25_top_k=5)[0]  # deterministic
  corpus = {r["_id"]: r["text"] for r in _read(files, "corpus.jsonl")}
  queries = {r["_id"]: r["text"] for r in _read(files, "queries.jsonl")}
  # questions only ("Citing R" is a topic), numbers stripped; one with no text under it is no query
  assert list(queries.values()) == ["How can I read a table?", "Why is R named R?"]
  assert stats["questions"] == 3 and stats["questions_without_an_answer"] == 1
  assert not any(q.lower() in t.lower() for q in queries.values() for t in corpus.values())
  assert any("see R-FAQ for more" in t for t in corpus.values())  # the cross-reference: the FAQ's name alone
  assert not any("Next:" in t for t in corpus.values())  # the navigation lines are no text
  qrels = [line.split("\t") for line in files["qrels/test.tsv"].splitlines()[1:]]
  answer = [d for q, d, _ in qrels if q == "R-FAQ#0"]
  assert answer and all(d.startswith("R-FAQ#") for d in answer)
  assert 'df <- read.table("a.txt")' in " ".join(corpus[d] for d in answer)
  assert any(d.startswith("R-data#") for d in corpus) and set(files) == {"corpus.jsonl", "queries.jsonl",
                                                                         "qrels/test.tsv", "bm25.trec"}


def test_rfaq_refuses_a_directory_that_is_not_rs_manuals(tmp_path):
  with pytest.raises(errors.ScoreInputError, match="not R's manual directory"):
    rfaq_set.read_manuals(tmp_path)


def test_shipped_rfaq_set_invariants():
  corpus = beir_files.read_corpus(RFAQ / "corpus.jsonl")
  queries = beir_files.read_queries(RFAQ / "queries.jsonl")
  assert len(queries) >= 70 and len(corpus) > 4_000 and all(q.endswith("?") for q in queries.values())
  assert sorted(p.name for p in (RFAQ / "qrels").iterdir()) == ["test.tsv"]
  texts = [t.lower() for t in corpus.values()]
  assert not [q for q in queries.values() if any(q.lower() in t for t in texts)]
  perl = beir_files.read_queries(PERLFAQ / "queries.jsonl")
  assert not set(queries) & set(perl) and not set(corpus) & set(beir_files.read_corpus(PERLFAQ / "corpus.jsonl"))
  rs = data.load_beir(RFAQ, RFAQ / "bm25.trec", split="test", top_k=30)
  assert len(rs.queries) == len(queries)


@pytest.mark.slow
def test_rfaq_rebuilt_from_debians_r_doc_html_is_byte_identical(tmp_path):
  """apt-get download r-doc-html (Debian's registry): the version the shipped set names is rebuilt byte for byte,
  and any version builds the same files twice."""
  source = json.loads((RFAQ / "source.json").read_text())
  root, exact = _unpacked_package(tmp_path, "r-doc-html", source["version"])
  _assert_rebuilt(RFAQ, lambda: rfaq_set.build_files(rfaq_set.read_manuals(root / source["manual_dir"])), exact)
