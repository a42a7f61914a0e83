"""Long documents as passages (eval's passage_tokens, passage_stride, aggregate): the split in token space, each
aggregation against a by-hand split-and-aggregate, and a document shorter than one passage scoring as today."""

import dataclasses

import numpy as np
import pytest

from maxscore.datasets import data
from maxscore.errors import DataError
from maxscore.rerank import eval as eval_lib, prompts
from maxscore.rerank import query_scoring
from maxscore.scoring import loading

CFG = eval_lib.EvalConfig(max_query_tokens=8, max_item_tokens=64, fusion="none")


@pytest.fixture(scope="module")
def scorer():
  return loading.build_scorer()


@pytest.fixture(scope="module")
def builder(scorer):
  return prompts.PromptBuilder(scorer.tokenizer, prompts.get_template(CFG.template), CFG.instruction, 8, 64)


@pytest.fixture(scope="module")
def labels(scorer):
  return prompts.resolve_labels(scorer.tokenizer, prompts.get_template(CFG.template).default_labels)


def test_passages_cut_the_document_in_token_space(builder):
  tok = builder.tokenizer
  doc = " ".join(f"word{i}" for i in range(60))
  ids = tok.encode(doc)
  parts = builder.passages(doc, 20, 10)
  want_starts = list(range(0, len(ids) - 20 + 10, 10))
  assert parts == [tok.decode(ids[s:s + 20]) for s in want_starts]
  assert parts[-1] == tok.decode(ids[want_starts[-1]:])  # the last runs to the end
  assert builder.passages(doc, 20) == [tok.decode(ids[s:s + 20]) for s in range(0, len(ids), 20)]
  assert builder.passages(doc, 20, first_only=True) == [tok.decode(ids[:20])]
  assert builder.passages("short text", 20) == ["short text"]  # unchanged, not decoded


def _record(scorer, builder, labels, q, cfg):
  return query_scoring.score_query(scorer, builder, q, labels, cfg)


@pytest.mark.parametrize("aggregate", ["maxp", "firstp", "sump"])
def test_each_aggregation_equals_a_by_hand_split_and_aggregate(scorer, builder, labels, aggregate):
  test = data.load_jsonl(data.DEFAULT_JSONL, split="test")
  q = test.queries[0]
  long_text = " ".join(t for _, t in q.candidates[:3])
  query = data.RerankQuery("q", q.query, (("long", long_text), ("short", q.candidates[3][1][:40])))
  cfg = dataclasses.replace(CFG, passage_tokens=24, passage_stride=16, aggregate=aggregate)
  rec = _record(scorer, builder, labels, query, cfg)
  parts = [builder.passages(t, 24, 16, first_only=aggregate == "firstp") for _, t in query.candidates]
  assert (len(parts[0]) == 1 if aggregate == "firstp" else len(parts[0]) > 2) and len(parts[1]) == 1
  assert rec["passages"] == len(parts[0]) + 1 and len(builder.passages(long_text, 24, 16)) > 2
  # by hand: every passage an item of the query in one score call, then each document's passages aggregated
  scorer.prefix_cache.clear()
  got = scorer.score(builder.query(query.query)[0], [builder.item(p)[0] for doc in parts for p in doc],
                     label_token_ids=labels, apply_softmax=True).scores[:, 0]
  long_scores, short_score = got[:len(parts[0])], got[len(parts[0])]
  want = {"maxp": max(long_scores), "firstp": long_scores[0], "sump": np.float32(sum(map(float, long_scores)))}
  assert rec["docids"] == ["long", "short"]
  assert rec["scores"] == [float(np.float32(want[aggregate])), float(short_score)]


def test_documents_shorter_than_a_passage_score_as_today(scorer, builder, labels):
  test = data.load_jsonl(data.DEFAULT_JSONL, split="test")
  q = test.queries[1]
  today = _record(scorer, builder, labels, q, CFG)
  longest = max(len(builder.tokenizer.encode(t)) for _, t in q.candidates)
  split = _record(scorer, builder, labels, q, dataclasses.replace(CFG, passage_tokens=longest, aggregate="sump"))
  assert split["scores"] == today["scores"] and split["passages"] == len(q.candidates)
  # a resumed eval (and the score cache) tells passage settings apart; a run without them keeps its fingerprint
  settings = ({}, dict(passage_tokens=24), dict(passage_tokens=24, passage_stride=16),
              dict(passage_tokens=24, aggregate="sump"))
  prints = [eval_lib.score_fingerprint(scorer, dataclasses.replace(CFG, **kw), labels) for kw in settings]
  assert "passages" not in prints[0] and len({repr(p) for p in prints}) == 4


@pytest.mark.parametrize("kw, message", [(dict(passage_tokens=-1), "passage_tokens"),
                                         (dict(passage_stride=4), "needs passage_tokens"),
                                         (dict(passage_tokens=4, passage_stride=8), "skip text"),
                                         (dict(aggregate="avgp"), "aggregate")])
def test_bad_passage_settings_are_refused(kw, message):
  with pytest.raises(DataError, match=message):
    dataclasses.replace(CFG, **kw).validate()
