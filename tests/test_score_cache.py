"""The persistent score cache (maxscore/rerank/score_cache.py): a second eval over the same pairs does no model work
and writes the same numbers, a changed model or prompt misses, processes writing at once lose nothing, and a
corrupt entry is skipped and scored again."""

import dataclasses
import json
import multiprocessing

import numpy as np
import pytest

from maxscore.datasets import data
from maxscore.rerank import eval as eval_lib
from maxscore.rerank.score_cache import ScoreCache, pair_key
from maxscore.rerank.score_cache import scorer_key as _key_of
from maxscore.scoring import loading


def scorer_key(scorer, cfg, label_ids):
  return _key_of(eval_lib.score_fingerprint(scorer, cfg, label_ids))

CFG = eval_lib.EvalConfig(max_queries=3, fusion="none", max_query_tokens=8, max_item_tokens=24)


@pytest.fixture(scope="module")
def scorer():
  return loading.build_scorer()


@pytest.fixture(scope="module")
def dataset():
  return data.load_jsonl(data.DEFAULT_JSONL, split="test")


def _eval(scorer, dataset, out, cache, cfg=CFG):
  return eval_lib.run_eval(scorer, dataset, cfg, out, progress=False, score_cache=cache)


def test_a_second_eval_reads_every_pair_and_writes_the_same_numbers(scorer, dataset, tmp_path, monkeypatch):
  plain = _eval(scorer, dataset, tmp_path / "plain", None)
  first = _eval(scorer, dataset, tmp_path / "first", tmp_path / "cache")
  pairs = sum(len(q.candidates) for q in dataset.queries[:3])
  assert first.summary["score_cache"]["misses"] == first.summary["score_cache"]["written"] == pairs
  for name in ("run.trec", "metrics.json", "metrics_per_query.jsonl"):  # a cache being filled changes nothing
    assert (tmp_path / "first" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes(), name

  def no_model(*args, **kwargs):
    raise AssertionError("the model ran for a cached pair")
  monkeypatch.setattr(scorer, "score", no_model)
  second = _eval(scorer, dataset, tmp_path / "second", tmp_path / "cache")
  assert second.summary["score_cache"] | {"dir": None} == {"dir": None, "hits": pairs, "misses": 0, "written": 0,
                                                              "corrupt_lines": 0}
  assert second.summary["algorithms"] == {"cache": 3}
  for name in ("run.trec", "metrics.json", "metrics_per_query.jsonl"):
    assert (tmp_path / "second" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes(), name
  assert plain.metrics == second.metrics
  assert "score cache: " in eval_lib.format_report(second)


def test_a_changed_model_or_prompt_misses(scorer, two_checkpoints, tmp_path):
  key = scorer_key(scorer, CFG, [1, 2])
  assert key == scorer_key(scorer, dataclasses.replace(CFG, max_queries=9), [1, 2])  # not a scoring setting
  for other in (dataclasses.replace(CFG, template="qwen3_reranker"), dataclasses.replace(CFG, max_item_tokens=9),
                dataclasses.replace(CFG, score_mode="log_odds")):
    assert scorer_key(scorer, other, [1, 2]) != key
  assert scorer_key(scorer, CFG, [2, 1]) != key
  a, b = (loading.build_scorer(str(c)) for c in two_checkpoints)
  assert scorer_key(a, CFG, [1, 2]) != scorer_key(b, CFG, [1, 2])  # weights differ by 1%


def _writer(directory, worker, n):
  cache = ScoreCache(directory)
  for i in range(n):  # one pair per append: the two writers' lines interleave in time
    cache.put(f"query {worker}", [f"doc {i}"], [worker + i / 1000])
  cache.close()


def test_processes_writing_at_once_lose_nothing_and_a_corrupt_line_is_skipped(tmp_path):
  directory = tmp_path / "c"
  directory.mkdir()
  ctx = multiprocessing.get_context("spawn")
  procs = [ctx.Process(target=_writer, args=(directory, w, 400)) for w in (1, 2)]
  for p in procs:
    p.start()
  for p in procs:
    p.join(120)
    assert p.exitcode == 0
  with open(next(directory.glob("*.jsonl")), "a", encoding="utf-8") as f:
    f.write('{"k": "torn", "s": 0.1\n{"k": 5, "s": 1}\nnot json\n{"k": "x", "s": true}\n')
  entries = ScoreCache.load(directory)
  assert entries.corrupt == 4 and len(entries.entries) == 800
  for w in (1, 2):
    got = entries.get(f"query {w}", [f"doc {i}" for i in range(400)])
    assert got == [w + i / 1000 for i in range(400)]
  assert entries.get("query 1", ["doc 400"]) == [None] and (entries.hits, entries.misses) == (800, 1)


def test_a_corrupt_entry_is_scored_again(scorer, dataset, tmp_path):
  _eval(scorer, dataset, tmp_path / "first", tmp_path / "cache")
  directory = next((tmp_path / "cache").iterdir())
  path = next(directory.glob("*.jsonl"))
  lines = path.read_text().splitlines()
  path.write_text("\n".join(["garbage"] + lines[1:]) + "\n")  # the first pair's entry is lost
  second = _eval(scorer, dataset, tmp_path / "second", tmp_path / "cache")
  c = second.summary["score_cache"]
  assert (c["corrupt_lines"], c["misses"], c["written"]) == (1, 1, 1)
  first_q = json.loads((tmp_path / "first" / "results.jsonl").read_text().splitlines()[1])
  again_q = json.loads((tmp_path / "second" / "results.jsonl").read_text().splitlines()[1])
  assert again_q["docids"] == first_q["docids"] and again_q["algorithm"] != "cache"
  q0 = dataset.queries[0]
  lost = next(i for i, (_, text) in enumerate(q0.candidates) if pair_key(q0.query, text) == json.loads(lines[0])["k"])
  # the lost pair alone was scored again (a one-item call: within 1e-5 of its score beside the others)
  np.testing.assert_allclose(again_q["scores"][lost], first_q["scores"][lost], rtol=0, atol=1e-5)
  assert [s for i, s in enumerate(again_q["scores"]) if i != lost] == [
      s for i, s in enumerate(first_q["scores"]) if i != lost]
  assert pair_key("a", "b") != pair_key("b", "a")
