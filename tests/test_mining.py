"""Hard-negative mining (maxscore/groups/mining.py, scripts/mine_negatives.py) on hand-made data where the
right negatives are known: the rank range, the count, the false-negative filters, the seeded draw, the two
first stages, and the group JSONL form FlagEmbedding and sentence-transformers read."""

import json

import pytest

from maxscore.datasets import beir_files
from maxscore.datasets.bm25 import BM25Index
from maxscore.errors import DataError
from maxscore.datasets import groups as groups_lib
from maxscore.groups import mining

# q1's run ranks d0..d9 with scores 10..1; d3 is judged relevant, d1 the positive; q2 ranks d9..d0.
RUN = {"q1": [(f"d{i}", float(10 - i)) for i in range(10)], "q2": [(f"d{9 - i}", float(10 - i)) for i in range(10)]}
QRELS = {"q1": {"d1": 1, "d3": 2, "d5": 0}, "q2": {"d8": 1}, "q3": {"d0": 1}}


@pytest.fixture
def beir(tmp_path):
  """A BEIR directory whose corpus words make BM25's order plain, and a TREC run of RUN."""
  root = tmp_path / "beir"
  (root / "qrels").mkdir(parents=True)
  docs = {f"d{i}": " ".join(["alpha"] * (10 - i) + ["filler"] * i) for i in range(10)}
  docs["d_other"] = "nothing in common"
  (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": d, "title": "", "text": t}) + "\n"
                                             for d, t in docs.items()))
  queries = {"q1": "alpha", "q2": "filler", "q3": "zebra"}
  (root / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries.items()))
  (root / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
      f"{q}\t{d}\t{g}\n" for q, judged in QRELS.items() for d, g in judged.items()))
  run = root.parent / "run.trec"
  run.write_text("".join(f"{q} Q0 {d} {r + 1} {s} test\n" for q, rows in RUN.items() for r, (d, s) in enumerate(rows)))
  return root, run, docs


def _cfg(root, **kw):
  return mining.MiningConfig(data_dir=str(root), output="unused", **kw)


def _mine(cfg):
  records, counts = mining.mine(cfg)
  return {r["qid"]: r for r in records}, counts


def test_top_sampling_takes_the_range_without_judged_relevant_documents(beir):
  root, run, docs = beir
  got, counts = _mine(_cfg(root, run_file=str(run), range_min=1, range_max=6, num_negatives=3, sampling="top"))
  # q1's ranks 1..5 are d1..d5: d1 and d3 are judged relevant (never negatives), d5 judged 0 is a true negative
  assert got["q1"]["neg_ids"] == ["d2", "d4", "d5"] and got["q1"]["pos_ids"] == ["d1", "d3"]
  assert got["q1"]["neg"] == [docs[d] for d in ("d2", "d4", "d5")] and got["q1"]["query"] == "alpha"
  assert got["q2"]["neg_ids"] == ["d7", "d6", "d5"]  # ranks 1..5 of q2 hold d8, its positive
  assert "q3" not in got and counts.skipped_no_candidates == 1  # q3 is in no run line
  assert (counts.false_negatives_caught, counts.written, counts.negatives) == (3, 2, 6)


def test_every_judged_query_reports_done_once_skipped_ones_too(beir):
  root, run, _ = beir
  done = []
  records, counts = mining.mine(_cfg(root, run_file=str(run), range_max=6, num_negatives=3),
                                on_query=lambda: done.append(counts.written))
  assert len(list(records)) == 2 and counts.skipped_no_candidates == 1
  assert done == [1, 2, 2]  # q1 and q2 written, then q3 skipped: each reported once, after it is handled


def test_the_margin_drops_what_scores_near_the_lowest_positive(beir):
  root, run, _ = beir
  # q1's positives score 9 (d1) and 7 (d3): margin 1.5 drops every candidate scoring >= 5.5 (d2, d4)
  got, counts = _mine(_cfg(root, run_file=str(run), range_max=10, num_negatives=10, sampling="top", margin=1.5))
  assert got["q1"]["neg_ids"] == ["d5", "d6", "d7", "d8", "d9"]
  assert got["q1"]["neg_ids"] == [d for d in got["q1"]["neg_ids"] if RUN["q1"][int(d[1])][1] < 7 - 1.5]
  assert counts.margin_dropped == 3 + 2  # q1: d0, d2, d4; q2 (positive d8 at 9): d9 and d7 (8 >= 7.5)
  assert counts.short == 2


def test_a_random_draw_is_seeded_per_query_and_keeps_rank_order(beir):
  root, run, _ = beir
  cfg = _cfg(root, run_file=str(run), range_max=10, num_negatives=4, sampling="random", seed=3)
  first, _ = _mine(cfg)
  again, _ = _mine(cfg)
  assert first == again
  ranks = [int(d[1:]) for d in first["q1"]["neg_ids"]]
  assert len(ranks) == 4 and ranks == sorted(ranks) and not {1, 3} & set(ranks)
  others = {s: _mine(_cfg(root, run_file=str(run), range_max=10, num_negatives=4, seed=s))[0]["q1"]["neg_ids"]
            for s in range(6)}
  assert len({tuple(v) for v in others.values()}) > 1  # the seed matters
  # a query's draw does not depend on the other queries: q1 alone (q2 unjudged) draws the same
  (root / "qrels" / "train.tsv").write_text("q1\td1\t1\nq1\td3\t2\n")
  alone, _ = _mine(cfg)
  assert list(alone) == ["q1"] and alone["q1"]["neg_ids"] == first["q1"]["neg_ids"]


def test_bm25_first_stage_is_the_eval_bm25_over_the_whole_corpus(beir):
  root, _, docs = beir
  got, _ = _mine(_cfg(root, range_min=0, range_max=5, num_negatives=5, sampling="top"))
  docids = list(docs)
  ranked = [docids[i] for i, _ in BM25Index(list(docs.values())).top_k("alpha", 5)]
  assert got["q1"]["neg_ids"] == [d for d in ranked if d not in ("d1", "d3")]
  assert "q3" not in got  # BM25 finds nothing for "zebra"


def test_the_output_is_the_group_jsonl_that_trainers_read(beir, tmp_path, load_script, capsys):
  root, run, _ = beir
  out = tmp_path / "out" / "groups.jsonl"
  load_script("mine_negatives").run(["x", f"--data_dir={root}", f"--run_file={run}", f"--output={out}",
                                     "--range_max=8", "--num_negatives=2", "--prompt=Judge relevance"])
  printed = capsys.readouterr()
  summary = json.loads(printed.out)
  assert summary["written"] == 2 and summary["output"] == str(out)
  assert "3/3" in printed.err  # the bar counts judged queries, q3 (skipped: in no run line) too
  groups = groups_lib.read_groups(out)
  for g in groups:  # FlagEmbedding's keys and types (sentence-transformers' hard-negative form: query/pos/neg)
    assert isinstance(g["query"], str) and g["prompt"] == "Judge relevance"
    assert all(isinstance(t, str) for t in g["pos"] + g["neg"]) and len(g["neg"]) == 2
  with pytest.raises(SystemExit) as e:  # an existing output is not replaced without --overwrite
    load_script("mine_negatives").run(["x", f"--data_dir={root}", f"--output={out}"])
  assert e.value.code == 2 and "--overwrite" in capsys.readouterr().err
  with pytest.raises(SystemExit) as e:
    load_script("mine_negatives").run(["x", f"--data_dir={root}", f"--output={root / 'corpus.jsonl'}"])
  assert e.value.code == 2


def test_the_run_file_path_reads_only_the_documents_it_writes(beir):
  root, _, docs = beir
  assert beir_files.read_corpus(root / "corpus.jsonl", {"d2", "d_other", "missing"}) == {
      "d2": docs["d2"], "d_other": docs["d_other"]}
  (root / "corpus.jsonl").write_text('{"_id": "d1", "text": "a"}\n{"_id": "d1", "text": "b"}\n')
  with pytest.raises(DataError, match="appeared before with other text"):
    beir_files.read_corpus(root / "corpus.jsonl")


@pytest.mark.parametrize("line, message", [
    ('{"query": "q", "pos": [], "neg": ["n"]}', "'pos' is empty"),
    ('{"query": "q", "pos": ["p"], "neg": "n"}', "'neg' must be a list"),
    ('{"query": "", "pos": ["p"], "neg": []}', "non-empty 'query'"),
    ('{"query": "q", "pos": ["p"], "neg": ["n"], "neg_scores": [1, 2]}', "'neg_scores' must be a list of 1"),
    ('not json', "invalid JSON"),
])
def test_a_bad_group_line_is_one_error_naming_it(tmp_path, line, message):
  path = tmp_path / "g.jsonl"
  path.write_text('{"query": "q", "pos": ["p"], "neg": ["n"]}\n' + line + "\n")
  with pytest.raises(DataError, match=message) as e:
    groups_lib.read_groups(path)
  assert f"{path}:2" in str(e.value)


def test_bad_settings_are_refused(beir):
  root, _, _ = beir
  for kw, message in ((dict(range_min=5, range_max=5), "range_min"), (dict(num_negatives=0), "num_negatives"),
                      (dict(margin=float("nan")), "margin")):
    with pytest.raises(mining.MiningError, match=message):
      _cfg(root, **kw).validate()
  with pytest.raises(mining.MiningError, match="judges none"):
    (root / "qrels" / "train.tsv").write_text("qx\td1\t1\n")
    (root / "queries.jsonl").write_text('{"_id": "qx", "text": "a"}\n{"_id": "q9", "text": "b"}\n')
    (root / "qrels" / "train.tsv").write_text("")
    mining.mine(_cfg(root))
