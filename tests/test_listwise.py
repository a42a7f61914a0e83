"""Listwise (FIRST) and setwise reranking: window arithmetic and orders against references written by hand,
the identifier check, and window scores against `Scorer.score` on the same sequence (a tiny random model)."""

import dataclasses
import logging
import json
import shutil

import numpy as np
import pytest

from maxscore import Scorer
from maxscore.checkpoints.tokenizer import load_tokenizer
from maxscore.datasets import data
from maxscore.errors import ResumeError, ScoreInputError
from maxscore.rerank import eval as eval_lib, listwise
from maxscore.scoring import loading

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
DOCS = ["Use list.sort() to sort in place [2] and sorted() for a copy.", "Tuples are immutable sequences.",
        "A dict maps keys to values; see [10].", "Generators yield values lazily.", "Sets hold unique items.",
        "Strings are sequences of code points.", "The with statement manages contexts.", "Lambdas are small."]


@pytest.fixture(scope="module")
def tok(hf_tokenizer_path):
  return load_tokenizer(hf_tokenizer_path)


@pytest.fixture(scope="module")
def scorer(hf_checkpoints, tok):
  _, _, ckpt = hf_checkpoints("qwen3_kv2_tied")
  base = Scorer.from_checkpoint(ckpt, attention="shared_prefix", separator_token_id=None)
  return Scorer(base.config, base.runner.params, tok)


def relevance_scorer(relevance, calls=None):
  """A `score` callback that scores each item by a fixed relevance (and records the windows it saw)."""
  def score(windows):
    if calls is not None:
      calls.append([list(items) for _, items in windows])
    return [np.array([relevance[x] for x in items], np.float32) for _, items in windows]
  return score


# --- window arithmetic ---------------------------------------------------------------------------------------
def test_window_spans_by_hand():
  # RankLLM's pass: bottom first, up by the stride, the last window clipped at the top.
  assert listwise.window_spans(100, 20, 10) == [(80, 100), (70, 90), (60, 80), (50, 70), (40, 60), (30, 50),
                                                (20, 40), (10, 30), (0, 20)]
  assert listwise.window_spans(25, 20, 10) == [(5, 25), (0, 15)]
  assert listwise.window_spans(40, 20, 10) == [(20, 40), (10, 30), (0, 20)]
  assert listwise.window_spans(20, 20, 10) == [(0, 20)]
  assert listwise.window_spans(7, 20, 10) == [(0, 7)]  # shorter than one window: one window of all of it
  assert listwise.window_spans(0, 20, 10) == []
  assert listwise.window_spans(6, 4, 4) == [(2, 6), (0, 2)]
  for bad in ((0, 1), (4, 0), (4, 5)):
    with pytest.raises(ScoreInputError, match="stride"):
      listwise.window_spans(10, *bad)


def test_sliding_windows_see_what_the_reference_says_and_order_by_hand():
  # 8 candidates in first-stage order 0..7, window 4, stride 2: windows [4,8), [2,6), [0,4).
  relevance = {0: 0.1, 1: 0.5, 2: 0.2, 3: 0.0, 4: 0.3, 5: 0.9, 6: 0.4, 7: 0.8}
  calls = []
  order = listwise.sliding_window_rerank([list(range(8))], relevance_scorer(relevance, calls), window=4, stride=2)
  # [4,8) = 4 5 6 7 -> 5 7 6 4; the list is 0 1 2 3 5 7 6 4. [2,6) = 2 3 5 7 -> 5 7 2 3; 0 1 5 7 2 3 6 4.
  # [0,4) = 0 1 5 7 -> 5 7 1 0; 5 7 1 0 2 3 6 4.
  assert calls == [[[4, 5, 6, 7]], [[2, 3, 5, 7]], [[0, 1, 5, 7]]]
  assert order == [[5, 7, 1, 0, 2, 3, 6, 4]]


def test_top_k_reranks_the_head_only_and_lists_step_together():
  relevance = {i: float(i) for i in range(10)}
  calls = []
  orders = listwise.sliding_window_rerank([list(range(10)), [2, 1, 0]], relevance_scorer(relevance, calls),
                                          window=4, stride=2, top_k=6)
  # List 0: the head 0..5 in windows [2,6), [0,4); list 1 (shorter than a window) in one window at step 0.
  assert calls == [[[2, 3, 4, 5], [2, 1, 0]], [[0, 1, 5, 4]]]
  assert orders == [[5, 4, 1, 0, 3, 2, 6, 7, 8, 9], [2, 1, 0]]


def test_ties_keep_the_incoming_order():
  calls = []
  flat = {i: 0.0 for i in range(9)}
  assert listwise.sliding_window_rerank([list(range(9))], relevance_scorer(flat, calls), 4, 2) == [list(range(9))]
  assert listwise.order_window(["a", "b", "c", "d"], [1.0, 2.0, 1.0, 2.0]) == ["b", "d", "a", "c"]
  assert listwise.setwise_rerank([list(range(9))], relevance_scorer(flat), 3, 4) == [list(range(9))]


# --- setwise -----------------------------------------------------------------------------------------------------
def test_setwise_heap_by_hand():
  # 7 items, sets of 3 (a node and 2 children): build the heap from node 2 down to 0, then extract the top 3.
  relevance = {0: 0.1, 1: 0.5, 2: 0.2, 3: 0.0, 4: 0.3, 5: 0.9, 6: 0.4}
  calls = []
  order = listwise.setwise_rerank([list(range(7))], relevance_scorer(relevance, calls), set_size=3, top_k=3)
  # heap 0 1 2 3 4 5 6. Level 1 in one call: node 1 (1; 3 4): 1 stays; node 2 (2; 5 6) -> 5 up: 0 1 5 3 4 2 6.
  # Node 0 (0; 1 5) -> 5 up: 5 1 0 3 4 2 6, then node 2 (0; 2 6) -> 6 up: 5 1 6 3 4 2 0. Take 5; the last (0) to
  # the root: 0 1 6 3 4 2, (0; 1 6) -> 1: 1 0 6 3 4 2, node 1 (0; 3 4) -> 4: 1 4 6 3 0 2. Take 1; root 2:
  # 2 4 6 3 0, (2; 4 6) -> 6: 6 4 2 3 0, node 2 has no children. Take 6. The rest keep the incoming order.
  assert calls == [[[1, 3, 4], [2, 5, 6]], [[0, 1, 5]], [[0, 2, 6]], [[0, 1, 6]], [[0, 3, 4]], [[2, 4, 6]]]
  assert order == [[5, 1, 6, 0, 2, 3, 4]]


def test_setwise_full_sort_and_short_lists():
  rng = np.random.default_rng(0)
  relevance = dict(enumerate(rng.permutation(23).astype(float)))
  got = listwise.setwise_rerank([list(range(23)), [3], []], relevance_scorer(relevance), set_size=4, top_k=0)
  assert got == [sorted(range(23), key=lambda i: -relevance[i]), [3], []]
  # Any size, set size and k, with ties (few distinct scores): the top k by score then incoming rank, then the
  # rest in the incoming order. Lists of one call step together.
  for n, c, k in [(1, 2, 1), (2, 2, 5), (9, 2, 4), (10, 3, 3), (31, 4, 10), (40, 5, 0), (17, 8, 6)]:
    incoming = [int(x) for x in rng.permutation(n)]
    rel = {x: float(rng.integers(0, 4)) for x in incoming}
    top = sorted(incoming, key=lambda x: (-rel[x], incoming.index(x)))[:k or n]
    want = top + [x for x in incoming if x not in top]
    assert listwise.setwise_rerank([incoming, incoming[::-1]], relevance_scorer(rel), c, k)[0] == want
  with pytest.raises(ScoreInputError, match="set_size"):
    listwise.setwise_rerank([[0, 1]], relevance_scorer({0: 0, 1: 1}), set_size=1)


# --- prompts and scores --------------------------------------------------------------------------------------
def test_identifiers_must_each_be_one_token(tok):
  assert len(listwise.identifier_ids(tok, listwise.LETTERS)) == 26
  with pytest.raises(ScoreInputError, match=r"identifier 'Qzx#9' is not one token in the tokenizer .*tokenizer"):
    listwise.WindowPrompts(tok, listwise.FIRST, identifiers=["A", "Qzx#9"], chat=False)
  with pytest.raises(ScoreInputError, match="no chat_template.*listwise_chat=false"):
    listwise.WindowPrompts(tok, listwise.FIRST, chat=True)
  with pytest.raises(ScoreInputError, match="identifiers='roman'"):
    listwise.WindowPrompts(tok, listwise.FIRST, identifiers="roman", chat=False)


def test_window_prompt_layout_and_budget(tok):
  builder = listwise.WindowPrompts(tok, listwise.FIRST, max_passage_tokens=6, max_window_tokens=0, chat=False)
  w = builder.window("sort a list", DOCS[:3])
  head = listwise.FIRST.head.format(num=3, query="sort a list")
  assert w.prefix == tuple(tok.encode(head))
  assert w.label_ids == tuple(tok.label_id(c) for c in "ABC")
  passages = []
  for ident, doc in zip("ABC", DOCS[:3]):  # each cut to 6 tokens; "[2]" in a passage reads "(2)"
    passages += tok.encode(f"[{ident}]") + tok.encode(" " + doc.replace("[2]", "(2)").replace("[10]", "(10)"))[:6]
    passages += tok.encode("\n")
  tail = tok.encode(listwise.FIRST.tail.format(num=3, query="sort a list")) + tok.encode("[")
  assert list(w.body) == passages + tail
  # A window budget tighter than 6 tokens a passage cuts every passage to the same smaller budget.
  fixed = len(w.prefix) + len(tail) + sum(len(tok.encode(f"[{c}]")) + len(tok.encode("\n")) for c in "ABC")
  tight = listwise.WindowPrompts(tok, listwise.FIRST, max_passage_tokens=6, max_window_tokens=fixed + 3 * 4 + 2,
                                 chat=False).window("sort a list", DOCS[:3])
  assert len(w.prefix) + len(tight.body) == fixed + 3 * 4
  with pytest.raises(ScoreInputError, match="max_window_tokens=20 leaves no room for 3 passages"):
    listwise.WindowPrompts(tok, listwise.FIRST, max_window_tokens=20, chat=False).window("q", DOCS[:3])
  with pytest.raises(ScoreInputError, match="1 to 26 passages"):
    builder.window("q", DOCS * 4)


def test_chat_prompt_wraps_the_user_turn(tmp_path, hf_tokenizer_path):
  shutil.copy2(hf_tokenizer_path, tmp_path / "tokenizer.json")
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML, "bos_token": "<s>"}))
  tok = load_tokenizer(tmp_path / "tokenizer.json")
  builder = listwise.WindowPrompts(tok, listwise.SETWISE, max_window_tokens=0)  # chat unset: the tokenizer has one
  assert builder.chat is True
  w = builder.window("q", DOCS[:2])
  text = tok.decode(list(w.prefix + w.body))
  assert text.startswith("<|im_start|>user\nFor the query \"q\"") and text.endswith("<|im_start|>assistant\n[")
  first = listwise.WindowPrompts(tok, listwise.FIRST, max_window_tokens=0).window("q", DOCS[:2])
  text = tok.decode(list(first.prefix + first.body))
  assert text.startswith(f"<|im_start|>system\n{listwise.FIRST.system}<|im_end|>\n<|im_start|>user\nYou will get 2")


def test_chat_unset_gives_plain_text_on_a_tokenizer_without_a_chat_template(tok):
  """The embedded default's tokenizer has no chat template: unset, the prompt is the plain-text one."""
  auto = listwise.WindowPrompts(tok, listwise.FIRST, max_passage_tokens=6)
  plain = listwise.WindowPrompts(tok, listwise.FIRST, max_passage_tokens=6, chat=False)
  assert auto.chat is False and auto.window("q", DOCS[:3]) == plain.window("q", DOCS[:3])
  assert listwise.resolve_chat(tok, None) is False and listwise.resolve_chat(tok, True) is True


def test_window_scores_equal_scorer_score_on_the_same_sequence(scorer, tok):
  builder = listwise.WindowPrompts(tok, listwise.FIRST, max_passage_tokens=8, chat=False)
  # The first and the last share their prefix and identifiers: two items of one request.
  windows = [builder.window("sort a list", DOCS[:5]), builder.window("sort a list", DOCS[3:7]),
             builder.window("immutable tuple", DOCS[:5]), builder.window("sort a list", DOCS[2:7])]
  assert windows[0].prefix == windows[3].prefix and windows[0].body != windows[3].body
  usage = listwise.Usage()
  got = listwise.score_windows(scorer, windows, usage)
  assert usage.forwards == 4
  assert usage.tokens == sum(len(w.body) for w in windows) + sum(len(w.prefix) for w in windows[:3])
  for w, lp in zip(windows, got):
    want = scorer.score(list(w.prefix + w.body), [[]], list(w.label_ids), apply_softmax=False,
                        algorithm="serial", separator_token_id=None).scores[0]
    # the label softmax of the full-vocabulary probabilities, in log space
    np.testing.assert_allclose(lp, np.log(want / want.sum()), atol=1e-5)
    assert lp.shape == (len(w.label_ids),)


def test_listwise_rerank_end_to_end(scorer):
  queries, cands = ["sort a list", "immutable"], [DOCS, DOCS[:3]]
  cfg = listwise.ListwiseConfig(window=4, stride=2, top_k=0, max_passage_tokens=8, chat=False)
  usage = listwise.Usage()
  first = listwise.listwise_rerank(scorer, queries, cands, cfg, usage)
  assert [sorted(o) for o in first] == [list(range(8)), list(range(3))]
  assert usage.forwards == 3 + 1
  setwise = listwise.listwise_rerank(scorer, queries, cands, listwise.ListwiseConfig(
      reranker="setwise", window=3, top_k=2, max_passage_tokens=8, chat=False))
  assert [sorted(o) for o in setwise] == [list(range(8)), list(range(3))]
  with pytest.raises(ScoreInputError, match="exceeds the 26 identifiers"):
    listwise.listwise_rerank(scorer, queries, cands, listwise.ListwiseConfig(window=30, chat=False))


# --- the eval's listwise stage -------------------------------------------------------------------------------
def _rerank_set(path, num_queries=2, num_cands=7):
  lines = []
  for q in range(num_queries):
    cands = [{"docid": f"d{j}", "text": DOCS[(j + q) % len(DOCS)]} for j in range(num_cands)]
    lines.append(json.dumps({"qid": f"q{q}", "query": ["sort a list", "immutable"][q % 2], "candidates": cands,
                             "qrels": {"d1": 1, "d4": 2}}))
  path.write_text("\n".join(lines) + "\n")
  return data.load_jsonl(path, "all")


def _ranked(out):
  return {q: sorted(r, key=lambda d: -r[d]) for q, r in data.read_trec_run(out / "run.trec").items()}


def test_eval_listwise_stage_reorders_the_pointwise_head(tmp_path):
  scorer = loading.build_scorer()  # the embedded default model; the listwise stage reads its backbone
  dataset = _rerank_set(tmp_path / "set.jsonl")
  common = dict(max_query_tokens=8, max_item_tokens=24, fusion="none")
  pointwise = eval_lib.run_eval(scorer, dataset, eval_lib.EvalConfig(**common), tmp_path / "pw", progress=False)
  assert pointwise.summary["listwise"] is None
  cfg = eval_lib.EvalConfig(**common, reranker="first", listwise_window=4, listwise_stride=2, listwise_top_k=5,
                            listwise_passage_tokens=12, listwise_chat=False)
  report = eval_lib.run_eval(scorer, dataset, cfg, tmp_path / "lw", progress=False)
  before, after = _ranked(tmp_path / "pw"), _ranked(tmp_path / "lw")
  for q in dataset.queries:
    texts = dict(q.candidates)
    head = before[q.qid][:5]
    scorer.scorer.prefix_cache.clear()
    (order,) = listwise.listwise_rerank(scorer.scorer, [q.query], [[texts[d] for d in head]], cfg.listwise())
    assert after[q.qid] == [head[i] for i in order] + before[q.qid][5:]  # the tail keeps the pointwise order
    assert sorted(data.read_trec_run(tmp_path / "lw" / "run.trec")[q.qid].values()) == list(range(1, 8))
  lw = report.summary["listwise"]  # 5 candidates, window 4, stride 2: windows [1, 5) and [0, 3) per query
  assert (lw["forwards"], lw["forwards_per_query"]) == (4, 2.0) and lw["tokens_per_query"] > 0
  with pytest.raises(ResumeError):  # the listwise settings are part of the resume identity
    eval_lib.run_eval(scorer, dataset, dataclasses.replace(cfg, listwise_window=3), tmp_path / "lw", progress=False)
  part = tmp_path / "part"  # one query scored, the run killed, then resumed: the outputs of the whole run
  eval_lib.run_eval(scorer, dataset, dataclasses.replace(cfg, max_queries=1), part, progress=False)
  resumed = eval_lib.run_eval(scorer, dataset, cfg, part, progress=False)
  assert resumed.summary["queries_resumed"] == 1
  for f in ("run.trec", "metrics.json", "metrics_per_query.jsonl"):
    assert (part / f).read_bytes() == (tmp_path / "lw" / f).read_bytes(), f


def test_the_eval_decides_the_prompt_form_for_the_tokenizer_and_logs_it(scorer, caplog):
  cfg = eval_lib.EvalConfig(reranker="first")
  with caplog.at_level(logging.INFO):
    resolved = eval_lib.resolve_listwise(cfg, scorer)
  assert resolved.listwise_chat is False and resolved.listwise().chat is False
  assert "the first prompts are plain text (listwise_chat unset: the tokenizer has no chat template)" in caplog.text
  with pytest.raises(ScoreInputError, match="listwise_chat=true"):  # asked for, and impossible: before any output
    eval_lib.resolve_listwise(dataclasses.replace(cfg, listwise_chat=True), scorer)
  assert eval_lib.resolve_listwise(eval_lib.EvalConfig(), scorer).listwise_chat is None  # pointwise: no listwise


def test_eval_script_setwise_and_a_bad_listwise_flag(tmp_path, capsys, load_script):
  _rerank_set(tmp_path / "set.jsonl", num_queries=1, num_cands=5)
  eval_rerank = load_script("eval_rerank")
  flags = [f"--jsonl={tmp_path / 'set.jsonl'}", "--split=all", "--max_query_tokens=8", "--max_item_tokens=24",
           "--noprogress", "--noplot", "--fusion=none"]
  # The default model's tokenizer has no chat template: with listwise_chat unset the prompts are plain text.
  eval_rerank.run(["eval_rerank.py", *flags, f"--output_dir={tmp_path / 'o'}", "--reranker=setwise",
                   "--listwise_window=3", "--listwise_top_k=4", "--listwise_passage_tokens=12"])
  summary = json.loads((tmp_path / "o" / "summary.json").read_text())
  assert summary["listwise"]["reranker"] == "setwise" and summary["listwise"]["forwards"] >= 3
  assert summary["eval_config"]["listwise_chat"] is False
  assert "setwise over the pointwise top 4" in capsys.readouterr().out
  eval_rerank.run(["eval_rerank.py", *flags, f"--output_dir={tmp_path / 'f'}", "--reranker=first",
                   "--listwise_window=3", "--listwise_stride=2", "--listwise_passage_tokens=12"])
  assert json.loads((tmp_path / "f" / "summary.json").read_text())["listwise"]["reranker"] == "first"
  with pytest.raises(SystemExit) as e:
    eval_rerank.run(["eval_rerank.py", *flags, f"--output_dir={tmp_path / 'o2'}", "--reranker=first",
                     "--listwise_stride=30"])
  assert e.value.code == 2 and "listwise_stride=30 must be in [1, 20] (at most listwise_window=20" in (
      capsys.readouterr().err)
  assert not (tmp_path / "o2").exists()
  with pytest.raises(SystemExit) as e:  # the window is what is wrong, and what is named
    eval_rerank.run(["eval_rerank.py", *flags, f"--output_dir={tmp_path / 'o3'}", "--reranker=first",
                     "--listwise_window=1"])
  assert e.value.code == 2 and "listwise_window=1 must be in [2, 26]" in capsys.readouterr().err


def test_a_refused_listwise_eval_writes_nothing_and_a_stale_header_does_not_block_a_rerun(tmp_path, capsys,
                                                                                          load_script):
  """Chat prompts asked for on a tokenizer without a chat template: refused before anything is written. A
  results.jsonl that holds only the header of an eval with other settings (stopped before its first result)
  does not refuse the next run; one that holds results of other settings still does."""
  _rerank_set(tmp_path / "set.jsonl", num_queries=1, num_cands=5)
  eval_rerank = load_script("eval_rerank")
  out = tmp_path / "o"
  flags = [f"--jsonl={tmp_path / 'set.jsonl'}", "--split=all", "--max_query_tokens=8", "--max_item_tokens=24",
           "--noprogress", "--noplot", "--fusion=none", f"--output_dir={out}", "--listwise_window=3",
           "--listwise_top_k=4", "--listwise_passage_tokens=12"]
  with pytest.raises(SystemExit) as e:
    eval_rerank.run(["eval_rerank.py", *flags, "--reranker=setwise", "--listwise_chat"])
  assert e.value.code == 2 and "listwise_chat=true" in capsys.readouterr().err
  assert not out.exists()
  eval_rerank.run(["eval_rerank.py", *flags, "--reranker=first", "--listwise_stride=2"])
  with pytest.raises(SystemExit) as e:  # results of other settings: refused, as before
    eval_rerank.run(["eval_rerank.py", *flags, "--reranker=setwise"])
  assert e.value.code == 2 and "different run" in capsys.readouterr().err
  header = (out / "results.jsonl").read_text().splitlines()[0]
  (out / "results.jsonl").write_text(header + "\n")  # as if that eval had stopped before its first result
  eval_rerank.run(["eval_rerank.py", *flags, "--reranker=setwise"])
  summary = json.loads((out / "summary.json").read_text())
  assert summary["listwise"]["reranker"] == "setwise" and summary["queries_scored"] == 1
