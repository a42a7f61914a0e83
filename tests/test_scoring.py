"""The scoring contract (docs/ARCHITECTURE.md section 1): every algorithm computes the same scores, equal to HF."""

import numpy as np
import pytest

from maxscore import ScoreInputError, Scorer, parse_multi_item_sequence
from maxscore.testing.hf_models import hf_logits
from maxscore.checkpoints.tokenizer import load_tokenizer

ALGORITHMS = ("serial", "packed", "prefill_extend")
VOCAB = 520
LABELS = [5, 17, 300]


@pytest.fixture(scope="module")
def qwen(hf_checkpoints):
  model, _, ckpt = hf_checkpoints("qwen3_kv2_tied")
  return model, Scorer.from_checkpoint(ckpt, attention="shared_prefix", separator_token_id=3)


@pytest.fixture(scope="module")
def llama(hf_checkpoints):
  model, _, ckpt = hf_checkpoints("llama_kv2_untied_scaled_bias")
  return model, Scorer.from_checkpoint(ckpt, attention="shared_prefix", separator_token_id=None)


def random_request(seed, query_len, item_lens):
  rng = np.random.default_rng(seed)
  return rng.integers(0, VOCAB, query_len).tolist(), [rng.integers(0, VOCAB, n).tolist() for n in item_lens]


def all_scores(scorer, query, items, **kw):
  return {a: scorer.score(query, items, LABELS, algorithm=a, **kw).scores for a in ALGORITHMS}


GEOMETRIES = [  # (seed, query_len, item lengths)
    (0, 1, [4]),
    (1, 37, [5, 0, 12, 3, 40, 1, 0]),
    (2, 600, [9, 2, 0, 17]),
    (3, 130, list(np.random.default_rng(3).integers(0, 12, 310))),
]


@pytest.mark.parametrize("seed,query_len,item_lens", GEOMETRIES, ids=lambda g: str(g)[:12])
@pytest.mark.parametrize("apply_softmax", [False, True])
def test_algorithms_agree(qwen, seed, query_len, item_lens, apply_softmax):
  _, scorer = qwen
  query, items = random_request(seed, query_len, item_lens)
  scores = all_scores(scorer, query, items, apply_softmax=apply_softmax)
  assert scores["serial"].shape == (len(items), len(LABELS))
  for a in ALGORITHMS[1:]:
    np.testing.assert_allclose(scores[a], scores["serial"], atol=1e-5, rtol=0, err_msg=a)
  if apply_softmax:
    np.testing.assert_allclose(scores["serial"].sum(-1), 1.0, atol=1e-5)
  else:
    assert np.all(scores["serial"].sum(-1) < 1.0)


def test_algorithms_agree_without_separator(llama):
  _, scorer = llama
  query, items = random_request(7, 45, [3, 0, 8, 20, 1])
  scores = all_scores(scorer, query, items)
  for a in ALGORITHMS[1:]:
    np.testing.assert_allclose(scores[a], scores["serial"], atol=1e-5, rtol=0)


@pytest.mark.parametrize("fixture,sep", [("qwen", 3), ("llama", None)])
@pytest.mark.parametrize("apply_softmax", [False, True])
def test_serial_equals_transformers(request, fixture, sep, apply_softmax):
  model, scorer = request.getfixturevalue(fixture)
  query, items = random_request(11, 23, [6, 0, 15, 2])
  got = scorer.score(query, items, LABELS, apply_softmax=apply_softmax, algorithm="serial").scores
  for i, item in enumerate(items):
    seq = query + ([sep] if sep is not None else []) + item
    logits = hf_logits(model, seq)[-1].astype(np.float64)
    lp = logits - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
    want = np.exp(lp[LABELS])
    if apply_softmax:
      want = want / want.sum()
    np.testing.assert_allclose(got[i], want, atol=1e-5, rtol=0)
  assert got.max() / got.min() > 10  # far from uniform, so a wrong score would show


def test_item_first_uses_serial_and_matches_transformers(qwen):
  model, scorer = qwen
  query, items = random_request(12, 9, [4, 7])
  result = scorer.score(query, items, LABELS, item_first=True, algorithm="packed")
  assert result.algorithm == "serial"
  for i, item in enumerate(items):
    logits = hf_logits(model, item + [3] + query)[-1].astype(np.float64)
    lp = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
    np.testing.assert_allclose(result.scores[i], np.exp(lp[LABELS]), atol=1e-5)


@pytest.mark.parametrize("algorithm", ["packed", "prefill_extend"])
def test_isolation(qwen, algorithm):
  _, scorer = qwen
  query, items = random_request(21, 50, [6, 9, 4, 0, 7])
  base = scorer.score(query, items, LABELS, algorithm=algorithm).scores
  changed = [list(x) for x in items]
  changed[1] = [(t + 1) % VOCAB for t in changed[1]]  # same length, other content
  got = scorer.score(query, changed, LABELS, algorithm=algorithm).scores
  keep = [0, 2, 3, 4]
  np.testing.assert_array_equal(got[keep], base[keep])
  assert not np.allclose(got[1], base[1])
  changed[1] = changed[1][:3]  # other length
  got = scorer.score(query, changed, LABELS, algorithm=algorithm).scores
  np.testing.assert_allclose(got[keep], base[keep], atol=1e-6, rtol=0)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_order_invariance_and_determinism(qwen, algorithm):
  _, scorer = qwen
  query, items = random_request(31, 20, [5, 1, 8, 0, 3, 11])
  base = scorer.score(query, items, LABELS, algorithm=algorithm).scores
  perm = np.random.default_rng(0).permutation(len(items))
  permuted = scorer.score(query, [items[i] for i in perm], LABELS, algorithm=algorithm).scores
  np.testing.assert_allclose(permuted, base[perm], atol=1e-6, rtol=0)
  again = scorer.score(query, items, LABELS, algorithm=algorithm).scores
  np.testing.assert_array_equal(again, base)


@pytest.mark.parametrize("tok_fixture", ["sp_tokenizer_path", "hf_tokenizer_path"])
def test_text_inputs_with_unicode_and_emoji(request, qwen, tok_fixture):
  model, scorer = qwen
  tok = load_tokenizer(request.getfixturevalue(tok_fixture))
  text_scorer = Scorer(scorer.config, scorer.runner.params, tok)
  query = "Which café serves naïve crêpes? 🚀"
  items = ["Zürich — ein Café 🍰", "", "东京的咖啡馆", "plain ascii document 🔥🔥"]
  labels = [tok.label_id("Yes"), tok.label_id("No")]
  got = text_scorer.score(query, items, labels).scores
  want = text_scorer.score(tok.encode(query), [tok.encode(x) for x in items], labels, algorithm="serial").scores
  np.testing.assert_allclose(got, want, atol=1e-5)
  assert got.shape == (4, 2) and np.all(np.isfinite(got))


def test_empty_items_and_no_items(qwen):
  _, scorer = qwen
  query, _ = random_request(41, 12, [])
  assert scorer.score(query, [], LABELS).scores.shape == (0, 3)
  result = scorer.score(query, [[], [], [7]], LABELS, algorithm="packed")
  np.testing.assert_array_equal(result.scores[0], result.scores[1])  # seq = Q + [s] for both
  serial = scorer.score(query, [[], [], [7]], LABELS, algorithm="serial").scores
  np.testing.assert_allclose(result.scores, serial, atol=1e-5)


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_extend_batch_size_does_not_change_scores(qwen, chunk):
  _, scorer = qwen
  query, items = random_request(51, 33, list(np.random.default_rng(5).integers(0, 10, 20)))
  base = scorer.score(query, items, LABELS, algorithm="serial").scores
  chunked = Scorer(scorer.config.replace(extend_batch_size=chunk), scorer.runner.params)
  np.testing.assert_allclose(chunked.score(query, items, LABELS, algorithm="prefill_extend").scores, base,
                             atol=1e-5, rtol=0)


def test_prefix_cache_hit_skips_prefill_and_evicts_under_budget(qwen):
  _, scorer = qwen
  fresh = Scorer(scorer.config, scorer.runner.params)
  calls = []
  original = fresh.runner.prefill
  fresh.runner.prefill = lambda *a, **k: calls.append(1) or original(*a, **k)
  query, items = random_request(61, 40, [3, 5, 2])
  first = fresh.score(query, items, LABELS, algorithm="prefill_extend").scores
  second = fresh.score(query, items[::-1], LABELS, algorithm="prefill_extend").scores
  assert len(calls) == 1 and fresh.prefix_cache.stats.hits == 1
  np.testing.assert_array_equal(second, first[::-1])
  one_state = fresh.prefix_cache.nbytes
  tight = Scorer(scorer.config.replace(prefix_cache_bytes=int(one_state * 1.5)), scorer.runner.params)
  for seed in range(3):
    q, its = random_request(70 + seed, 40, [2])
    tight.score(q, its, LABELS, algorithm="prefill_extend")
    assert tight.prefix_cache.nbytes <= int(one_state * 1.5)
  assert len(tight.prefix_cache) == 1 and tight.prefix_cache.stats.evictions == 2
  off = Scorer(scorer.config.replace(prefix_cache_bytes=0), scorer.runner.params)
  off.score(query, items, LABELS, algorithm="prefill_extend")
  assert len(off.prefix_cache) == 0


def test_score_batch_and_sglang_response(qwen):
  _, scorer = qwen
  reqs = [{"query": random_request(s, 10 + s, [])[0], "items": random_request(s, 1, [3, 4])[1],
           "label_token_ids": LABELS, "apply_softmax": bool(s % 2)} for s in range(4)]
  results = scorer.score_batch(reqs)
  for r, res in zip(reqs, results):
    single = scorer.score(r["query"], r["items"], LABELS, apply_softmax=r["apply_softmax"])
    np.testing.assert_allclose(res.scores, single.scores, atol=1e-5, rtol=0)
  body = results[0].to_response("m")
  assert body["object"] == "scoring" and body["model"] == "m" and len(body["scores"]) == 2
  assert body["usage"]["prompt_tokens"] == 10 + 1 + 3 + 4


def test_multi_item_sequence_parser(qwen):
  _, scorer = qwen
  d = 9
  assert parse_multi_item_sequence([1, 2, d, 3, 4, d, 5, d], d) == ([1, 2], [[3, 4], [5]])
  assert parse_multi_item_sequence([1, d, d, 5], d) == ([1], [[], [5]])
  assert parse_multi_item_sequence([1, 2, d], d) == ([1, 2], [])
  with pytest.raises(ScoreInputError, match="no delimiter"):
    parse_multi_item_sequence([1, 2, 3], d)
  with pytest.raises(ScoreInputError, match="empty query"):
    parse_multi_item_sequence([d, 1, d], d)
  query, items = parse_multi_item_sequence([4, 5, 6, d, 7, 8, d, 10, d], d)
  got = scorer.score(query, items, LABELS, separator_token_id=d).scores
  want = scorer.score([4, 5, 6], [[7, 8], [10]], LABELS, separator_token_id=d, algorithm="serial").scores
  np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("kwargs,field", [
    (dict(query=[1], items=[[1]], label_token_ids=5), "label_token_ids=5 must be a non-empty list"),
    (dict(query="", items=[[1]]), "text but this scorer has no tokenizer"),
    (dict(query=[1, 600], items=[[1]]), r"query\[1\]=600 is outside the vocabulary \[0, 520\)"),
    (dict(query=[1], items=[[1, -2]]), r"items\[0\]\[1\]=-2 is outside the vocabulary"),
    (dict(query=[1], items=[[1]], label_token_ids=[]), "label_token_ids is empty"),
    (dict(query=[1], items=[[1]], label_token_ids=[520]), r"label_token_ids\[0\]=520 is outside"),
    (dict(query=[1], items=[1, 2]), "flat list of ints"),
    (dict(query=[1], items=7), "items=7 must be a text"),
    (dict(query=[1], items=[[1.5]]), r"items\[0\]\[0\]=1.5 must be an integer"),
    (dict(query=[1], items=[[1], "a"]), "mixes text and token ids"),
    (dict(query=[1], items=[[1]], algorithm="fast"), "algorithm='fast' is not one of"),
])
def test_bad_inputs_name_the_field(qwen, kwargs, field):
  _, scorer = qwen
  kwargs = dict(dict(label_token_ids=LABELS), **kwargs)
  with pytest.raises(ScoreInputError, match=field):
    scorer.score(**kwargs)


def test_oversized_requests_are_refused(qwen):
  _, scorer = qwen
  small = Scorer(scorer.config.replace(max_request_tokens=50, prefix_buckets=[16, 32]), scorer.runner.params)
  with pytest.raises(ScoreInputError, match="max_request_tokens=50"):
    small.score([1] * 30, [[2] * 30], LABELS)
  with pytest.raises(ScoreInputError, match="query is 40 tokens with the separator, above the largest prefix bucket 32"):
    small.score([1] * 39, [[2]], LABELS)
  with pytest.raises(ScoreInputError, match=r"items\[0\] is 5000 tokens, above the largest item bucket 4096"):
    Scorer(scorer.config.replace(max_request_tokens=10**6), scorer.runner.params).score([1], [[2] * 5000], LABELS)


def test_hidden_states_feed_the_lm_head_exactly(qwen):
  """hidden_states + the lm_head reproduce score(): the features score heads train on are the right ones."""
  _, scorer = qwen
  query, items = random_request(81, 25, [4, 0, 9])
  import jax
  for algorithm in ALGORITHMS:
    h = scorer.hidden_states(query, items, algorithm=algorithm)
    assert h.shape == (3, scorer.config.model.hidden_size) and h.dtype == np.float32
    logits = np.asarray(scorer.runner.decoder("reference").apply({"params": scorer.runner.params}, h,
                                                                  method=type(scorer.runner.decoder("reference")).logits))
    lp = np.asarray(jax.nn.log_softmax(logits, axis=-1))[:, LABELS]
    np.testing.assert_allclose(np.exp(lp), scorer.score(query, items, LABELS, algorithm=algorithm).scores, atol=1e-6)


def test_packed_rows_joined_across_length_groups_score_as_serial(hf_checkpoints):
  """One item-count bucket (8) and items of 3 and 12 tokens: the packed layout joins the two length groups
  into one row of 12-token slots instead of two rows of 8 slots (maxscore/scoring/layout.py:
  join_padded_groups); every item still scores as the serial path does, in request order."""
  from maxscore.scoring import layout  # pylint: disable=import-outside-toplevel
  _, _, ckpt = hf_checkpoints("qwen3_kv2_tied")
  scorer = Scorer.from_checkpoint(ckpt, attention="shared_prefix", separator_token_id=3, item_count_buckets=[8])
  query, items = random_request(7, 9, [3, 12, 3, 12, 3])
  bk = scorer.config.buckets
  assert len(layout.plan_rows(0, query, items, bk.item_buckets, 8, bk.length_group_ratio)) == 2
  assert len(layout.plan_rows(0, query, items, bk.item_buckets, 8, bk.length_group_ratio, [8])) == 1
  packed = scorer.score(query, items, LABELS, algorithm="packed").scores
  serial = scorer.score(query, items, LABELS, algorithm="serial").scores
  np.testing.assert_allclose(packed, serial, atol=1e-5, rtol=0)
