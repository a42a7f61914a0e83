"""LM pretraining on local text: the held-out sections stay out of every training text, the loss falls,
a resumed run ends bit for bit where an uninterrupted one does, and the fine-tuning pairs and BM25
negatives are what they claim."""

import json
import shutil

import numpy as np
import pytest

from maxscore.checkpoints import storage
from maxscore.checkpoints.tokenizer import load_tokenizer
from maxscore.datasets import bm25
from maxscore.datasets import data
from maxscore.errors import ResumeError
from maxscore.lm import corpus as corpus_lib
from maxscore.lm import pairs as pairs_lib
from maxscore.lm import pretrain as pretrain_lib
from maxscore.lm import tokenizer_training

TOKENIZER = data.DEFAULT_CHECKPOINT / "tokenizer" / "tokenizer.model"
TINY = dict(model_name="tiny-qwen3", sources=("pydoc",), pydoc_repeats=1, seq_len=32, batch_size=4, num_steps=6,
            learning_rate=1e-2, warmup_steps=0, log_every=1, eval_every=3, save_every=3, keep_checkpoints=3)


@pytest.fixture(scope="module")
def held():
  return corpus_lib.held_out_sections(data.DEFAULT_JSONL, ("dev", "test"))


@pytest.fixture(scope="module")
def texts(held):
  sections = corpus_lib.pydoc_sections()
  c = corpus_lib.collect(held, ("pydoc",))
  return corpus_lib.training_texts(c, 1)[:40], corpus_lib.held_out_text(sections, held)[:6]


def test_held_out_sections_are_the_dev_and_test_queries_and_stay_out(held):
  sections = corpus_lib.pydoc_sections()
  for split in ("dev", "test"):
    for q in data.load_jsonl(data.DEFAULT_JSONL, split).queries:
      assert sections[corpus_lib.section_index(q.qid)]["title"].replace('"', "") == q.query
  assert len(held) == 39
  c = corpus_lib.collect(held, ("pydoc",))
  joined = "\n".join(c.texts)
  for i in held:
    for p in sections[i]["paragraphs"]:
      assert p not in joined
  # A section that repeats a held-out paragraph's opening is dropped too (the reference has one).
  assert len(c.texts) + sum(c.dropped.values()) == sum(1 for i, s in enumerate(sections)
                                                       if i not in held and s["paragraphs"])


def test_leak_check_finds_a_paragraph_whatever_its_whitespace():
  texts = ["alpha beta", "x  the   quick\nbrown fox y", "nothing"]
  assert corpus_lib.leaking_documents(texts, ["the quick brown fox"]) == {1}


@pytest.fixture(scope="module")
def uninterrupted(texts, tmp_path_factory):
  root = tmp_path_factory.mktemp("pretrain")
  summary = pretrain_lib.pretrain(pretrain_lib.PretrainConfig(**TINY), TOKENIZER, *texts, root / "a",
                                  export_dir=root / "a_model", progress=False)
  return root, summary


@pytest.mark.slow  # three tiny runs: about 30 s on one core
def test_pretraining_loss_falls_and_resume_is_bit_exact(texts, uninterrupted, tmp_path):
  train_texts, held_texts = texts
  cfg = pretrain_lib.PretrainConfig(**TINY)
  root, a = uninterrupted
  assert a["steps"] == 6 and a["final_train_loss"] < a["first_train_loss"] - 0.5
  assert a["held_out_final"]["perplexity"] < a["held_out_initial"]["perplexity"]
  assert a["unigram_held_out"]["perplexity"] > 1 and a["tokens_per_s"] > 0
  assert a["held_out_copy_probe"]["span"] == 16 and np.isfinite(a["held_out_copy_probe"]["repeat"])
  # An interrupted run: its last checkpoint (step 6) is lost, so a restart resumes from step 3.
  b = pretrain_lib.pretrain(cfg, TOKENIZER, train_texts, held_texts, tmp_path / "b", progress=False)
  shutil.rmtree(tmp_path / "b" / "checkpoints" / "6")
  lines = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
  (tmp_path / "b" / "metrics.jsonl").write_text("\n".join(lines[:5]) + "\n{\"torn")
  resumed = pretrain_lib.pretrain(cfg, TOKENIZER, train_texts, held_texts, tmp_path / "b", progress=False)
  assert resumed["resumed_from_step"] == 3
  assert resumed["params_sha256"] == b["params_sha256"] == a["params_sha256"]
  # Run again over the finished run: nothing trains, and the timing of the process that did is kept.
  again = pretrain_lib.pretrain(cfg, TOKENIZER, train_texts, held_texts, tmp_path / "b", progress=False)
  assert again["resumed_from_step"] == 6 and again["params_sha256"] == a["params_sha256"]
  assert again["tokens_per_s"] == resumed["tokens_per_s"] and again["wall_seconds"] > resumed["wall_seconds"]
  records = [json.loads(l) for l in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
  assert records == [json.loads(l) for l in (root / "a" / "metrics.jsonl").read_text().splitlines()]
  ckpt = storage.restore_checkpoint(root / "a_model")
  assert ckpt.model.vocab_size == load_tokenizer(TOKENIZER).vocab_size and ckpt.digest == a["params_sha256"]


@pytest.mark.slow
def test_resume_with_other_settings_is_refused(texts, uninterrupted):
  root, _ = uninterrupted
  with pytest.raises(ResumeError, match="learning_rate"):
    pretrain_lib.pretrain(pretrain_lib.PretrainConfig(**{**TINY, "learning_rate": 1e-3}), TOKENIZER, *texts,
                          root / "a", progress=False)


def test_copy_probe_reads_a_repeated_span_against_its_first_reading():
  ckpt = storage.restore_checkpoint(data.DEFAULT_CHECKPOINT)
  decoder = pretrain_lib.make_decoder(ckpt.model)
  rows = np.random.default_rng(0).integers(3, ckpt.model.vocab_size, size=(5, 24)).astype(np.int32)
  probe = pretrain_lib.copy_probe(decoder, ckpt.params, rows, span=10)
  first = pretrain_lib.make_held_out_nll(decoder, rows[:, :10], 2)(ckpt.params)  # the evaluator's oracle
  assert probe["span"] == 10 and probe["first_read"] == pytest.approx(first, rel=1e-5)
  nll = np.asarray(pretrain_lib.token_nll(decoder, ckpt.params, np.tile(rows[:, :10], 2)))  # [5, 19]
  assert probe["repeat"] == pytest.approx(nll[:, 10:].mean(), rel=1e-5)


def test_unigram_baseline_is_add_one_counts():
  train = np.asarray([[0, 1, 1, 2]])
  held = np.asarray([[0, 1, 3]])
  p = np.asarray([1, 3, 2, 1]) / 7  # targets 1, 1, 2 counted, +1 each over a vocabulary of 4
  assert pretrain_lib.unigram_nll(train, held, 4) == pytest.approx(-(np.log(p[1]) + np.log(p[3])) / 2)


def test_tokenizer_files_are_the_same_in_any_directory(tmp_path):
  """The model names its prefix without the directory, so the same texts give the same bytes anywhere."""
  texts = tokenizer_training.sample_texts()
  a = tokenizer_training.train_sentencepiece(tmp_path / "a" / "tokenizer", texts, 512)
  b = tokenizer_training.train_sentencepiece(tmp_path / "elsewhere" / "b" / "tokenizer", texts, 512)
  assert a.name == b.name == "tokenizer.model"
  for suffix in (".model", ".vocab"):
    assert a.with_suffix(suffix).read_bytes() == b.with_suffix(suffix).read_bytes(), suffix
  assert [load_tokenizer(a).label_id(label) for label in tokenizer_training.LABELS] == [4, 5]


def test_finetuning_pairs_hold_no_held_out_text_and_grade_their_own_paragraphs(held):
  sections = corpus_lib.pydoc_sections()
  tok = load_tokenizer(TOKENIZER)
  docs = ["mod.f\n\nReturn the sum of two numbers\n\n" + " ".join(["The sum adds both numbers together."] * 6),
          "mod.g\n\nOpen a file for reading\n\n" + " ".join(["The file is opened in text mode for reading."] * 5)]
  records = pairs_lib.build_pairs(tok, sections, held, docs, seed=1, num_candidates=12, max_queries=500)
  queries = {r["query"] for r in records}
  assert "Return the sum of two numbers" in queries and len(records) > 90
  probes = [" ".join(p.split())[:corpus_lib.LEAK_PREFIX_CHARS] for i in held for p in sections[i]["paragraphs"]]
  held_titles = {sections[i]["title"].replace('"', "") for i in held}
  for r in records:
    assert r["split"] == "train" and len(r["candidates"]) == 12 and r["query"] not in held_titles
    assert any(g == 2 for g in r["qrels"].values())
    texts = [c["text"] for c in r["candidates"]]
    assert not corpus_lib.leaking_documents(texts, probes)
    for c in r["candidates"]:
      if c["docid"].startswith("pydoc."):
        assert int(c["docid"].split(".")[1]) not in held
    for docid, grade in r["qrels"].items():  # grade 2: a paragraph of the query's own section / docstring
      assert (docid.rsplit(".", 1)[0] == r["qid"][len("ft-"):]) == (grade == 2)


def test_keyword_queries_are_rarer_words_of_a_paragraph_that_ranks_among_the_relevant(held):
  sections = corpus_lib.pydoc_sections()
  tok = load_tokenizer(TOKENIZER)
  records = pairs_lib.build_pairs(tok, sections, held, [], seed=2, num_candidates=12, max_queries=10,
                                  keyword_queries=150, max_keywords=3)
  kw = [r for r in records if r["qid"].startswith("ft-kw-")]
  assert 140 <= len(kw) <= 150 < len(records)
  probes = [" ".join(p.split())[:corpus_lib.LEAK_PREFIX_CHARS] for i in held for p in sections[i]["paragraphs"]]
  sizes = set()
  for r in kw:
    anchor = r["qid"][len("ft-kw-"):]
    assert r["qrels"][anchor] == 2 and anchor.startswith("pydoc.") and int(anchor.split(".")[1]) not in held
    text_words = list(dict.fromkeys(bm25.words({c["docid"]: c["text"] for c in r["candidates"]}[anchor])))
    query_words = bm25.words(r["query"])
    positions = [text_words.index(w) for w in query_words]  # raises unless every word is the paragraph's
    assert positions == sorted(positions) and r["query"][0].isupper() and min(map(len, query_words)) >= 3
    sizes.add(len(query_words))
    group = anchor.rsplit(".", 1)[0]
    assert all(d.rsplit(".", 1)[0] == group for d, g in r["qrels"].items() if g == 2)
    assert not corpus_lib.leaking_documents([c["text"] for c in r["candidates"]], probes)
  assert sizes == {1, 2, 3}
