"""The natural-question sets: POD as text, the Perl FAQ test set (hand-made pods, then the shipped set and a
rebuild from Debian's perl-doc), and the Python FAQ's question splits of python_docs_beir."""

import collections
import json
import pathlib
import shutil
import subprocess

import pytest

from maxscore import errors
from maxscore.datasets import beir_files, data
from maxscore.lm import docs_questions, docs_set, perlfaq_set, pod_text, question_sets

PERLFAQ = question_sets.PERLFAQ_DIR
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


@pytest.mark.slow
def test_perlfaq_rebuilt_from_debians_perl_doc_is_byte_identical(tmp_path):
  """apt-get download perl-doc (Debian's registry); the version the shipped set names is rebuilt byte for byte,
  and any version builds the same files twice."""
  if not shutil.which("apt-get") or not shutil.which("dpkg-deb"):
    pytest.skip("needs Debian's apt-get and dpkg-deb")
  source = json.loads((PERLFAQ / "source.json").read_text())
  got = subprocess.run(["apt-get", "download", f"perl-doc={source['version']}"], cwd=tmp_path, capture_output=True)
  if got.returncode:
    subprocess.run(["apt-get", "download", "perl-doc"], cwd=tmp_path, check=True, capture_output=True)
  deb = next(tmp_path.glob("perl-doc_*.deb"))
  subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path / "x")], check=True)
  pod_dir = next((tmp_path / "x" / "usr" / "share" / "perl").glob("*/pod"))
  files, _ = perlfaq_set.build_files(perlfaq_set.read_pods(pod_dir))
  if got.returncode == 0:
    for name, text in files.items():
      assert (PERLFAQ / name).read_text(encoding="utf-8") == text, name
  assert files == perlfaq_set.build_files(perlfaq_set.read_pods(pod_dir))[0]


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
