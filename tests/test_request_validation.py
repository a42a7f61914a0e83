"""Strict request types (docs/ARCHITECTURE.md sections 1 and 9): every bad value is a ScoreInputError naming the
field; every good request is scored; one bad line of a request file never costs the other lines."""

import json

import hypothesis
import numpy as np
import pytest
from hypothesis import strategies as st

from maxscore import ScoreInputError
from maxscore.scoring import jsonl as score_file
from maxscore.scoring import loading

ALGORITHMS = ("serial", "packed", "prefill_extend")
GOOD = {"query": [1, 2], "items": [[3], [4, 5]], "label_token_ids": [6, 7]}


@pytest.fixture(scope="module")
def scorer():
  """The embedded default model (it has a tokenizer, vocabulary 3072), without its head."""
  return loading.build_scorer(use_head=False)


@pytest.mark.parametrize("field,value,message", [
    ("label_token_ids", 5, "label_token_ids=5 must be a non-empty list"),
    ("label_token_ids", "5", 'label_token_ids="5" must be a non-empty list'),
    ("label_token_ids", [True, 1], r"label_token_ids\[0\]=true must be an integer token id, not boolean"),
    ("label_token_ids", [1.0], r"label_token_ids\[0\]=1.0 must be an integer token id, not non-integer number"),
    ("label_token_ids", [2 ** 70], r"label_token_ids\[0\]=\d+ is outside the vocabulary"),
    ("apply_softmax", "false", r'apply_softmax="false" must be a boolean \(JSON true or false\), not string'),
    ("apply_softmax", 0, r"apply_softmax=0 must be a boolean \(JSON true or false\), not integer"),
    ("apply_softmax", None, r"apply_softmax=null must be a boolean \(JSON true or false\), not null"),
    ("item_first", "true", 'item_first="true" must be a boolean'),
    ("query", None, "query=null must be text or a list of token ids"),
    ("query", {"a": 1}, 'query={"a": 1} must be text or a list of token ids, not object'),
    ("query", [[1]], r"query\[0\]=\[1\] must be an integer"),
    ("query", [1, False], r"query\[1\]=false must be an integer token id, not boolean"),
    ("items", None, "items=null must be a text, a list of texts"),
    ("items", [["a"]], r'items\[0\]\[0\]="a" must be an integer token id, not string'),
    ("items", [[1], "a"], "mixes text and token ids"),
    ("items", [[-1]], r"items\[0\]\[0\]=-1 is outside the vocabulary \[0, 3072\)"),
    ("model", 3, "model=3 must be a string"),
])
def test_v1_score_bad_field_types_are_score_input_errors(scorer, field, value, message):
  with pytest.raises(ScoreInputError, match=message):
    scorer.validate({**GOOD, field: value})


def test_bare_int_label_token_ids_is_one_error_line_not_a_lost_batch(scorer, tmp_path):
  src = tmp_path / "req.jsonl"
  src.write_text(json.dumps(GOOD) + "\n" + json.dumps({**GOOD, "label_token_ids": 5}) + "\n" + json.dumps(GOOD) + "\n")
  counts = score_file.score_jsonl(scorer, str(src), str(tmp_path / "out.jsonl"), batch_size=16)
  out = [json.loads(l) for l in (tmp_path / "out.jsonl").read_text().splitlines()]
  assert counts == {"ok": 2, "errors": 1} and out[0] == out[2] and "scores" in out[0]
  assert out[1] == {"error": "line 2: label_token_ids=5 must be a non-empty list of integer token ids, not integer"}


def test_apply_softmax_string_false_is_refused_not_taken_as_true(scorer):
  with pytest.raises(ScoreInputError, match=r'apply_softmax="false" must be a boolean \(JSON true or false\), not string'):
    scorer.score_batch([{**GOOD, "apply_softmax": "false"}])
  with pytest.raises(ScoreInputError, match=r'apply_softmax="false" must be a boolean \(JSON true or false\), not string'):
    scorer.score(**GOOD, apply_softmax="false")


def test_v1_score_missing_and_unknown_fields(scorer):
  with pytest.raises(ScoreInputError, match="items is missing"):
    scorer.validate({"query": [1]})
  with pytest.raises(ScoreInputError, match=r'unknown fields \["x"\]'):
    scorer.validate({**GOOD, "x": 1})
  with pytest.raises(ScoreInputError, match="must be a JSON object, got array"):
    scorer.validate([1, 2])


def test_python_api_refuses_bools_as_token_ids(scorer):
  for kwargs in (dict(query=[True]), dict(items=[[1, np.bool_(True)]]), dict(label_token_ids=[np.bool_(False)]),
                 dict(items=np.array([[True]])), dict(query=np.array([1.5]))):
    with pytest.raises(ScoreInputError):
      scorer.score(**{**GOOD, **kwargs})


def test_python_api_bad_types_are_score_input_errors_not_type_errors(scorer):
  for kwargs in (dict(items=7), dict(items={"a": 1}), dict(query=3.5), dict(label_token_ids=7),
                 dict(apply_softmax="no"), dict(item_first=1), dict(query=[object()])):
    with pytest.raises(ScoreInputError):
      scorer.score(**{**GOOD, **kwargs})
  with pytest.raises(ScoreInputError, match=r"requests\[1\]: label_token_ids=5"):
    scorer.score_batch([GOOD, {**GOOD, "label_token_ids": 5}])
  for batch in (None, GOOD, "x"):
    with pytest.raises(ScoreInputError, match="requests must be a list"):
      scorer.score_batch(batch)
  # numpy integers and arrays are token ids
  got = scorer.score(np.array([1, 2]), [np.array([3], np.int32), [np.int64(4), 5]], np.array([6, 7])).scores
  np.testing.assert_array_equal(got, scorer.score(**GOOD).scores)


def test_lone_surrogate_in_query_text_is_a_score_input_error(scorer):
  with pytest.raises(ScoreInputError, match="query holds a lone surrogate"):
    scorer.score("bad \ud800 text", ["doc"], [6, 7])


@pytest.mark.parametrize("separator", [3, None])
def test_empty_query_is_valid_and_every_algorithm_agrees(scorer, separator):
  items = [[5, 6, 7], [8], [9, 10, 11, 12, 13]]
  scores = {a: scorer.score([], items, [5, 17], algorithm=a, separator_token_id=separator).scores
            for a in ALGORITHMS}
  for a in ALGORITHMS[1:]:
    np.testing.assert_allclose(scores[a], scores["serial"], atol=1e-5, rtol=0, err_msg=a)
  # seq_i = [s] + I_i (or I_i): the same sequence split elsewhere scores the same
  sep = [] if separator is None else [separator]
  for i, item in enumerate(items):
    whole = sep + item
    alone = scorer.score(whole[:1], [whole[1:]], [5, 17], algorithm="serial", separator_token_id=None).scores[0]
    np.testing.assert_allclose(scores["serial"][i], alone, atol=1e-6)
  if separator is None:
    with pytest.raises(ScoreInputError, match=r"items\[1\] is empty and so is the query"):
      scorer.score([], [[1], []], [5], separator_token_id=None)
  else:
    assert scorer.score([], [[]], [5], separator_token_id=separator).scores.shape == (1, 1)
  assert scorer.score([], [], [5], separator_token_id=separator).scores.shape == (0, 1)


def test_score_jsonl_bad_lines_get_their_own_error_and_good_lines_are_answered_as_if_alone(scorer, tmp_path):
  good = [json.dumps(GOOD), json.dumps({"query": "text", "items": ["a", "bb"], "label_token_ids": [6],
                                        "apply_softmax": True})]
  bad = [b'{"query": [1], "items": [[1]], "label_token_ids": 5}', b'{"query": [1], "items": [[1]], '
         b'"label_token_ids": [1], "apply_softmax": "false"}', b"\xff\xfe not utf-8", b"[" * 100000,
         b'{"query": "\\ud800", "items": ["x"], "label_token_ids": [1]}']
  lines = [bad[0], good[0].encode(), bad[1], bad[2], good[1].encode(), bad[3], bad[4]]
  src = tmp_path / "mixed.jsonl"
  src.write_bytes(b"\n".join(lines) + b"\n")
  counts = score_file.score_jsonl(scorer, str(src), str(tmp_path / "out.jsonl"), batch_size=8)
  out = (tmp_path / "out.jsonl").read_text().splitlines()
  assert counts == {"ok": 2, "errors": 5} and len(out) == len(lines)
  errors = {i: json.loads(out[i])["error"] for i in (0, 2, 3, 5, 6)}
  assert errors[0].startswith("line 1: label_token_ids=5 must be a non-empty list")
  assert errors[2].startswith('line 3: apply_softmax="false" must be a boolean')
  assert errors[3].startswith("line 4: not UTF-8 text")
  assert errors[5].startswith("line 6: ")
  assert errors[6].startswith("line 7: query holds a lone surrogate")
  for line, i in ((good[0], 1), (good[1], 4)):
    (tmp_path / "one.jsonl").write_text(line + "\n")
    score_file.score_jsonl(scorer, str(tmp_path / "one.jsonl"), str(tmp_path / "one_out.jsonl"))
    assert out[i] == (tmp_path / "one_out.jsonl").read_text().strip()


def test_a_line_cut_short_names_its_own_last_column(scorer, tmp_path):
  """A truncated line's JSON error points past its last character on that line, not at column 1 of the next."""
  cut = '{"query": "a", "items": ['
  src = tmp_path / "cut.jsonl"
  src.write_text(json.dumps(GOOD) + "\n" + cut + "\n")
  counts = score_file.score_jsonl(scorer, str(src), str(tmp_path / "out.jsonl"))
  error = json.loads((tmp_path / "out.jsonl").read_text().splitlines()[1])["error"]
  assert counts == {"ok": 1, "errors": 1}
  assert error == f"line 2: invalid JSON (Expecting value at column {len(cut) + 1}; the line ends there, cut short)"


def test_score_jsonl_skips_blank_lines(scorer, tmp_path):
  src = tmp_path / "blank.jsonl"
  src.write_text("\n" + json.dumps(GOOD) + "\n  \n\r\n" + json.dumps(GOOD) + "\n\n")
  counts = score_file.score_jsonl(scorer, str(src), str(tmp_path / "out.jsonl"))
  out = [json.loads(l) for l in (tmp_path / "out.jsonl").read_text().splitlines()]
  assert counts == {"ok": 2, "errors": 0} and len(out) == 2 and out[0] == out[1] and "scores" in out[0]


def test_score_jsonl_refuses_a_model_it_does_not_serve_as_the_server_does(scorer, tmp_path):
  src = tmp_path / "models.jsonl"
  lines = [{**GOOD, "model": "whatever"}, GOOD, {**GOOD, "model": "pydoc-tiny-qwen3"}, {**GOOD, "model": "rerank-v1"}]
  src.write_text("".join(json.dumps(r) + "\n" for r in lines))
  counts = score_file.score_jsonl(scorer, str(src), str(tmp_path / "out.jsonl"))
  out = [json.loads(l) for l in (tmp_path / "out.jsonl").read_text().splitlines()]
  assert counts == {"ok": 2, "errors": 2}
  assert out[0]["error"].startswith('line 1: model "whatever" is not served here; the served names are '
                                    '"pydoc-tiny-qwen3"')
  assert out[1]["model"] == out[2]["model"] == "pydoc-tiny-qwen3" and "not served" in out[3]["error"]
  counts = score_file.score_jsonl(scorer, str(src), str(tmp_path / "alias.jsonl"),
                                  served_names=("rerank-v1", "pydoc-tiny-qwen3"))
  out = [json.loads(l) for l in (tmp_path / "alias.jsonl").read_text().splitlines()]
  assert counts == {"ok": 3, "errors": 1} and '"rerank-v1", "pydoc-tiny-qwen3"' in out[0]["error"]
  assert [r["model"] for r in out[1:]] == ["rerank-v1"] * 3  # responses report the first served name


def test_score_jsonl_a_request_stacked_with_others_scores_within_1e_5_of_it_alone(scorer, tmp_path):
  """The README's guarantee: batch-mates of one shape share a forward (another batch size, other rounding),
  so a request's scores are within 1e-5 of the request alone, not bit for bit."""
  rng = np.random.default_rng(4)
  reqs = [{"query": rng.integers(10, 3000, 9).tolist(), "items": rng.integers(10, 3000, (5, 12)).tolist(),
           "label_token_ids": [6, 7], "apply_softmax": False} for _ in range(8)]
  src = tmp_path / "same_shape.jsonl"
  src.write_text("".join(json.dumps(r) + "\n" for r in reqs))
  score_file.score_jsonl(scorer, str(src), str(tmp_path / "out.jsonl"), batch_size=8)
  together = [json.loads(l)["scores"] for l in (tmp_path / "out.jsonl").read_text().splitlines()]
  for r, got in zip(reqs, together):
    scorer.prefix_cache.clear()
    alone = scorer.score_requests([scorer.validate(r)])[0].scores
    np.testing.assert_allclose(got, alone, rtol=0, atol=1e-5)


# --- properties --------------------------------------------------------------------------------------
def _containers(children):
  return st.one_of(st.lists(children, max_size=3), st.dictionaries(st.text(max_size=3), children, max_size=2))


JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 3000) | st.floats(allow_nan=False, width=32)
                    | st.text(max_size=6), _containers, max_leaves=8)
IDS = st.lists(st.integers(0, 40), max_size=5)
LABELS = st.lists(st.integers(0, 40), min_size=1, max_size=3)
REQUIRED = {  # mostly plausible values, so that many requests are valid and get scored
    "query": st.one_of(IDS, st.text(max_size=8), JSON),
    "items": st.one_of(st.lists(IDS, max_size=3), st.lists(st.text(max_size=8), max_size=3), JSON),
    "label_token_ids": st.one_of(LABELS, LABELS, JSON),
}
OPTIONAL = {"apply_softmax": st.one_of(st.booleans(), JSON), "item_first": st.one_of(st.booleans(), JSON)}


@hypothesis.settings(max_examples=30, deadline=None, suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(st.fixed_dictionaries(REQUIRED, optional=OPTIONAL),
                  st.one_of(st.just({}), st.dictionaries(st.text(max_size=4), JSON, max_size=1)))
def test_any_json_in_any_field_gives_a_response_or_a_score_input_error(scorer, request_fields, extra):
  request = {**request_fields, **extra}
  try:
    req = scorer.validate(json.loads(json.dumps(request)))
  except ScoreInputError:
    return
  response = scorer.score_requests([req], algorithm="serial")[0].to_response("m")
  scores = np.asarray(response["scores"], np.float32).reshape(len(req.items), len(req.label_ids))
  assert np.all(np.isfinite(scores)) and np.all((scores >= 0) & (scores <= 1))
