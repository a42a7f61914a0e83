"""The HTTP server: every endpoint gives the numbers of Scorer.score / the eval's ranking, concurrent
requests get their own answers, bad input is a 4xx JSON error that leaves the server serving, a full
queue is a 503, a slow request a 504, and /metrics counts what was sent.

One server per model per module (uvicorn in a thread on a free loopback port); the buckets are cut
to few sizes so the whole module compiles a handful of executables. The request queue alone:
tests/test_serving_queue.py."""

import asyncio
import dataclasses
import json
import threading
import time

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from maxscore import serving
from maxscore.checkpoints.convert import convert_hf_checkpoint
from maxscore.config import load_config, parse_override
from maxscore.datasets import data
from maxscore.rerank import eval as eval_lib
from maxscore.scoring import Scorer
from maxscore.scoring import loading
from maxscore.testing import hf_models

FEW_BUCKETS = ["batch_buckets=[1,8]", "item_count_buckets=[4,8,32]", "item_buckets=[16,64,4096]",
               "prefix_buckets=[32,64,256]"]
PROMPT = serving.RerankPrompt(max_item_tokens=40)  # rerank items fit the 64-token bucket
CFG = serving.ServeConfig(max_batch_requests=8, max_batch_wait_ms=20.0, max_items=48, warmup_items=(0,),
                          port=0, request_timeout_s=120.0)
LABELS = [4, 5]


@pytest.fixture(scope="module")
def default_server():
  """The embedded default model (with its score head), served."""
  service = serving.ScoringService(loading.build_scorer(None, FEW_BUCKETS), CFG, PROMPT)
  with serving.ServerThread(service) as server:
    yield server


def _reference(scorer, query, items, labels, apply_softmax):
  scorer.prefix_cache.clear()
  return scorer.score(query, items, label_token_ids=labels, apply_softmax=apply_softmax).scores


def _post(url, path, body):
  return httpx.post(url + path, content=body if isinstance(body, bytes) else json.dumps(body), timeout=120)


@pytest.mark.parametrize("apply_softmax", [True, False])
def test_score_equals_scorer_score(default_server, apply_softmax):
  scorer = default_server.service.scorer
  body = {"query": "assignment statements", "items": ["x = 1 binds x", "for loops", ""],
          "label_token_ids": LABELS, "apply_softmax": apply_softmax, "model": "pydoc-tiny-qwen3"}
  r = _post(default_server.url, "/v1/score", body)
  assert r.status_code == 200, r.text
  out = r.json()
  assert out["object"] == "scoring" and out["model"] == "pydoc-tiny-qwen3" and out["usage"]["prompt_tokens"] > 0
  want = _reference(scorer, body["query"], body["items"], LABELS, apply_softmax)
  np.testing.assert_allclose(np.asarray(out["scores"]), want, rtol=0, atol=1e-6)
  assert _post(default_server.url, "/v1/score", dict(body, items=[])).json()["scores"] == []


def test_rerank_ranks_as_the_eval(default_server, tmp_path):
  scorer = default_server.service.scorer
  dataset = data.load_jsonl(data.DEFAULT_JSONL, top_k=6, split="all")
  cfg = eval_lib.EvalConfig(max_queries=2, max_item_tokens=PROMPT.max_item_tokens)
  eval_lib.run_eval(scorer, dataset, cfg, tmp_path / "eval", progress=False)
  lines = (tmp_path / "eval" / "results.jsonl").read_text().splitlines()[1:]
  records = {r["qid"]: r for r in map(json.loads, lines)}
  for q in dataset.queries[:2]:
    docs = [text for _, text in q.candidates]
    want = np.asarray(records[q.qid]["scores"])
    bodies = [_post(default_server.url, path, {"query": q.query, "documents": docs}).json()
              for path in serving.RERANK_PATHS]
    assert bodies[0] == bodies[1] == bodies[2]
    results = bodies[0]["results"]
    assert [r["index"] for r in results] == sorted(range(len(docs)), key=lambda i: (-want[i], i))
    got = np.asarray([r["relevance_score"] for r in sorted(results, key=lambda r: r["index"])])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert [r["document"]["text"] for r in results] == [docs[r["index"]] for r in results]
  top = _post(default_server.url, "/v1/rerank", {"query": "q", "documents": [{"text": "a b"}, "c"], "top_n": 1,
                                                  "return_documents": False}).json()
  assert len(top["results"]) == 1 and "document" not in top["results"][0]


def test_a_request_stacked_with_others_scores_within_1e_5_of_it_alone(default_server):
  """The README's batch-invariance guarantee for the server's batches (row stacking rounds differently)."""
  service, rng = default_server.service, np.random.default_rng(5)
  works = [service.score_work({"query": rng.integers(10, 3000, 9).tolist(), "items": rng.integers(10, 3000, (4, 10))
                               .tolist(), "label_token_ids": LABELS}) for _ in range(3)]
  together = service.run_batch(works)
  for work, got in zip(works, together):
    np.testing.assert_allclose(got.scores, service.run_batch([work])[0].scores, rtol=0, atol=1e-5)


async def _client(url, jobs, answers, give_up):
  async with httpx.AsyncClient(base_url=url, timeout=0.001 if give_up else 120) as client:
    for key, body in jobs:
      try:
        r = await client.post("/v1/score", json=body)
        answers[key] = (r.status_code, r.json())
      except httpx.TimeoutException:  # the client hangs up; nothing else may notice
        answers[key] = None


@pytest.mark.slow
def test_concurrent_clients_get_their_own_answers(default_server):
  """32 clients x 2 requests of different content (same shape), 4 of the clients hanging up early."""
  rng = np.random.default_rng(0)
  scorer = default_server.service.scorer
  jobs = {(c, j): {"query": rng.integers(10, 3000, 12).tolist(),
                   "items": rng.integers(10, 3000, (4, 10)).tolist(), "label_token_ids": LABELS,
                   "apply_softmax": True} for c in range(32) for j in range(2)}
  want = {k: _reference(scorer, b["query"], b["items"], LABELS, True) for k, b in jobs.items()}
  answers = {}

  async def run_all():
    await asyncio.wait_for(asyncio.gather(*[
        _client(default_server.url, [((c, j), jobs[(c, j)]) for j in range(2)], answers, give_up=c < 4)
        for c in range(32)]), timeout=300)
  asyncio.run(run_all())
  for key, answer in answers.items():
    if key[0] < 4 and answer is None:
      continue
    status, body = answer
    assert status == 200, body
    np.testing.assert_allclose(np.asarray(body["scores"]), want[key], rtol=0, atol=1e-6)
  assert sum(a is not None for a in answers.values()) >= 56
  assert _post(default_server.url, "/v1/score", jobs[(0, 0)]).status_code == 200


GOOD = {"query": [11, 12, 13], "items": [[14, 15], [16]], "label_token_ids": LABELS}
BAD_REQUESTS = [
    ("/v1/score", b'{"query": [1, 2', 400, None, "not valid JSON"),
    ("/v1/score", b"[1, 2]", 400, None, "must be a JSON object"),
    ("/v1/score", {"query": 5, "items": ["a"], "label_token_ids": LABELS}, 400, "query", "must be text"),
    ("/v1/score", {"query": "a", "items": 7, "label_token_ids": LABELS}, 400, "items", "must be a text"),
    ("/v1/score", {"query": "a", "items": ["b"], "label_token_ids": "yes"}, 400, "label_token_ids", "list"),
    ("/v1/score", {"query": "a", "items": ["b"], "label_token_ids": LABELS, "apply_softmax": "yes"}, 400,
     "apply_softmax", "boolean"),
    ("/v1/score", {"query": "a", "label_token_ids": LABELS}, 400, "items", "missing"),
    ("/v1/score", {"query": "a", "items": ["b"], "label_token_ids": LABELS, "colour": 1}, 400, None, "unknown fields"),
    ("/v1/score", {"query": "a", "items": ["b"] * 49, "label_token_ids": LABELS}, 413, "items", "max_items=48"),
    ("/v1/score", {"query": [1], "items": [[7] * 5000], "label_token_ids": LABELS}, 413, "items[0]",
     "largest item bucket 4096"),
    ("/v1/score", {"query": [1] * 300, "items": [[7]], "label_token_ids": LABELS}, 413, "query",
     "largest prefix bucket 256"),
    ("/v1/score", dict(GOOD, model="gpt-4"), 404, "model", "not served here"),
    ("/v1/rerank", {"query": "a", "documents": []}, 400, "documents", "non-empty list"),
    ("/v1/rerank", {"query": "a", "documents": ["ok", 3]}, 400, "documents[1]", "must be a string"),
    ("/v1/rerank", {"query": ["a"], "documents": ["b"]}, 400, "query", "must be a string"),
    ("/v1/rerank", {"query": "a", "documents": ["b"], "top_n": 0}, 400, "top_n", "positive integer"),
    ("/v1/rerank", {"query": "a", "documents": ["b"] * 49}, 413, "documents", "max_items=48"),
    ("/rerank", {"query": "a", "documents": ["b"], "model": "other"}, 404, "model", "not served here"),
    ("/v1/nothing", {}, 404, None, "Not Found"),
]


@pytest.mark.parametrize("path, body, status, param, message", BAD_REQUESTS,
                         ids=[f"{p}-{m}-{s}" for p, _, s, _, m in BAD_REQUESTS])
def test_bad_input_is_a_json_error_and_the_server_keeps_serving(default_server, path, body, status, param, message):
  r = _post(default_server.url, path, body)
  assert r.status_code == status, r.text
  error = r.json()["error"]
  assert message in error["message"] and error["param"] == param and error["type"] and "\n" not in error["message"]
  assert _post(default_server.url, "/v1/score", GOOD).status_code == 200


def test_metrics_count_the_requests_sent(default_server):
  def scrape():
    text = httpx.get(default_server.url + "/metrics").text
    out = {}
    for family in text_string_to_metric_families(text):
      for s in family.samples:
        out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out
  before = scrape()
  tokens = 0
  for _ in range(3):
    r = _post(default_server.url, "/v1/score", GOOD)
    assert r.status_code == 200
    tokens += r.json()["usage"]["prompt_tokens"]
  assert _post(default_server.url, "/v1/score", b"{").status_code == 400
  assert _post(default_server.url, "/v1/score", dict(GOOD, model="gpt-4")).status_code == 404
  assert httpx.get(default_server.url + "/v1/score").status_code == 405
  assert _post(default_server.url, "/v1/nothing", GOOD).status_code == 404
  assert httpx.get(default_server.url + "/health").json()["status"] == "ok"
  models = httpx.get(default_server.url + "/v1/models").json()
  assert models["data"][0]["id"] == "pydoc-tiny-qwen3"
  after = scrape()

  def delta(name, **labels):
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0) - before.get(key, 0)
  assert delta("maxscore_requests_total", endpoint="/v1/score", status="200") == 3
  assert delta("maxscore_requests_total", endpoint="/v1/score", status="400") == 1
  assert delta("maxscore_requests_total", endpoint="/v1/score", status="404") == 1  # an unknown model
  assert delta("maxscore_requests_total", endpoint="/v1/score", status="405") == 1  # a wrong method
  assert delta("maxscore_requests_total", endpoint=serving.UNROUTED, status="404") == 1  # an unknown path
  assert delta("maxscore_requests_total", endpoint="/health", status="200") == 1
  assert delta("maxscore_requests_total", endpoint="/v1/models", status="200") == 1
  assert delta("maxscore_requests_total", endpoint="/metrics", status="200") == 1
  assert delta("maxscore_items_scored_total") == 3 * len(GOOD["items"])
  assert delta("maxscore_tokens_scored_total") == tokens > 0
  assert delta("maxscore_request_latency_seconds_count", endpoint="/v1/score") == 5
  assert delta("maxscore_batch_requests_count") == delta("maxscore_batch_seconds_count") == 3
  assert delta("maxscore_batch_seconds_sum") > 0
  assert after[("maxscore_queue_depth", ())] == 0
  assert after[("maxscore_compiled_executables", ())] > 0


# --- a random-init tiny model without a tokenizer: no compile needed for these ---------------------
@pytest.fixture(scope="module")
def tiny_scorer():
  return Scorer.from_config(load_config(["model_name=tiny-qwen3"] + FEW_BUCKETS))


def test_text_without_a_tokenizer_is_a_400(tiny_scorer):
  service = serving.ScoringService(tiny_scorer, CFG)
  with TestClient(serving.build_app(service)) as client:
    r = client.post("/v1/score", json={"query": "text", "items": ["more"], "label_token_ids": LABELS})
    assert r.status_code == 400 and "no tokenizer" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "query"
    r = client.post("/v1/rerank", json={"query": "text", "documents": ["more"]})
    assert r.status_code == 400 and "no tokenizer" in r.json()["error"]["message"]
    assert client.get("/v1/score").status_code == 405
    assert client.get("/health").status_code == 200


def test_served_model_aliases_are_answered_and_the_first_is_reported(tiny_scorer):
  service = serving.ScoringService(tiny_scorer, dataclasses.replace(CFG, served_model_name=("rerank-v1", "tiny")))
  with TestClient(serving.build_app(service)) as client:
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["rerank-v1", "tiny"]
    for name in ("tiny", "rerank-v1", None):
      r = client.post("/v1/score", json=GOOD if name is None else dict(GOOD, model=name))
      assert r.status_code == 200 and r.json()["model"] == "rerank-v1", r.text
    r = client.post("/v1/score", json=dict(GOOD, model="tiny-qwen3"))  # the checkpoint's own name is no alias
    assert r.status_code == 404 and '"rerank-v1", "tiny"' in r.json()["error"]["message"]
  with pytest.raises(serving.ServeError, match="empty name"):
    serving.ScoringService(tiny_scorer, dataclasses.replace(CFG, served_model_name=("",)))


def test_full_queue_is_a_503_with_retry_after_and_slow_requests_a_504(tiny_scorer):
  entered, release = threading.Event(), threading.Event()
  service = serving.ScoringService(tiny_scorer, dataclasses.replace(
      CFG, max_batch_requests=1, max_batch_wait_ms=0.0, max_queue=1, request_timeout_s=3.0))

  def run_batch(works):  # a model call that does not return while the test looks
    entered.set()
    release.wait(60)
    return [None] * len(works)  # never read: the requests have timed out by then
  service.queue._run_batch = run_batch
  service.queue._is_warm = lambda works: True  # the stand-in model has nothing to compile

  async def run(url):
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
      first = asyncio.create_task(client.post("/v1/score", json=GOOD))  # taken by the (blocked) worker
      while not entered.is_set():
        await asyncio.sleep(0.01)
      second = asyncio.create_task(client.post("/v1/score", json=GOOD))  # waits in the queue
      while service.queue.depth < 1:
        await asyncio.sleep(0.01)
      third = await client.post("/v1/score", json=GOOD)
      return third, await first, await second
  try:
    with serving.ServerThread(service) as server:
      third, first, second = asyncio.run(run(server.url))
      assert third.status_code == 503 and third.headers["retry-after"] == "1"
      assert "max_queue=1" in third.json()["error"]["message"]
      assert first.status_code == second.status_code == 504
      assert "request_timeout_s=3.0" in first.json()["error"]["message"]
      release.set()
  finally:
    release.set()


def test_a_warm_request_behind_a_cold_one_answers_within_its_own_budget(tiny_scorer, monkeypatch):
  """A request of a new shape compiles on the compiler thread: a request of a warmed shape sent while
  that compile runs (made 4 s slower here, as a large model's is) answers at once, within its own 3 s."""
  cfg = serving.ServeConfig(max_batch_requests=2, max_batch_wait_ms=0.0, warmup_query_tokens=(5,),
                            warmup_items=(6,), warmup_item_tokens=(7,), port=0, request_timeout_s=3.0)
  service = serving.ScoringService(tiny_scorer, cfg)
  service.warmup()
  runner, call_placed = tiny_scorer.runner, tiny_scorer.runner._call_placed

  def slow_compile(*args):
    before = runner.num_executables
    out = call_placed(*args)
    if runner.num_executables > before:
      time.sleep(4.0)
    return out
  monkeypatch.setattr(runner, "_call_placed", slow_compile)
  warm = {"query": [3] * 5, "items": [[9] * 7] * 6, "label_token_ids": [0, 1], "apply_softmax": True}
  cold = {"query": [3] * 40, "items": [[9] * 30] * 5, "label_token_ids": [0, 1], "apply_softmax": True}

  async def run(url):
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
      first = asyncio.create_task(client.post("/v1/score", json=cold))
      while service.queue.depth < 1 and not first.done():  # the cold request is in (compiling)
        await asyncio.sleep(0.01)
      start = time.monotonic()
      second = await client.post("/v1/score", json=warm)
      return second, time.monotonic() - start, await first
  with serving.ServerThread(service) as server:
    second, seconds, first = asyncio.run(run(server.url))
    assert second.status_code == 200 and seconds < 2.0, (second.text, seconds)
    assert first.status_code == 504  # its own compile took longer than its own budget
    while service.queue.depth:  # the compile finishes; then the new shape is warm
      time.sleep(0.05)
    again = httpx.post(server.url + "/v1/score", json=cold, timeout=60)
    assert again.status_code == 200, again.text
  tiny_scorer.prefix_cache.clear()
  np.testing.assert_allclose(again.json()["scores"], tiny_scorer.score(**cold).scores, rtol=0, atol=1e-6)
  np.testing.assert_allclose(second.json()["scores"], tiny_scorer.score(**warm).scores, rtol=0, atol=1e-6)


def test_a_small_request_behind_a_large_one_answers_within_its_own_budget():
  """A 24-item request runs in parts of 4 (each made 0.6 s slow here, as a large model's are): a small
  request sent while it runs answers within its own 3 s, long before the large one, which still gets
  every score, in order, within 1e-5 of scoring it whole, and the usage of one request. (Its own scorer:
  the warmup tests count what the module's scorer compiles.)"""
  tiny_scorer = Scorer.from_config(load_config(["model_name=tiny-qwen3"] + FEW_BUCKETS))
  cfg = serving.ServeConfig(max_batch_requests=1, max_batch_wait_ms=0.0, max_items=64, max_items_per_run=4,
                            warmup_query_tokens=(5,), warmup_items=(4,), warmup_item_tokens=(7,), port=0,
                            request_timeout_s=3.0)
  service = serving.ScoringService(tiny_scorer, cfg)
  service.warmup()
  large = {"query": [3] * 5, "items": [[9 + i % 7] * 7 for i in range(24)], "label_token_ids": [0, 1],
           "apply_softmax": True}
  small = {"query": [3] * 5, "items": [[9] * 7] * 3, "label_token_ids": [0, 1], "apply_softmax": True}
  parts, run_batch = [], service.queue._run_batch

  def slow_run_batch(works):
    parts.append(len(works[0].request.items))
    time.sleep(0.6)
    return run_batch(works)
  service.queue._run_batch = slow_run_batch

  async def run(url):
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
      first = asyncio.create_task(client.post("/v1/score", json=dict(large, items=large["items"][:8])))
      while len(parts) < 1:
        await asyncio.sleep(0.01)
      await first  # 2 parts of 4: within its own budget
      first = asyncio.create_task(client.post("/v1/score", json=large))
      while len(parts) < 3:  # the large one's first part is running
        await asyncio.sleep(0.01)
      start = time.monotonic()
      second = await client.post("/v1/score", json=small)
      return second, time.monotonic() - start, await first
  with serving.ServerThread(service) as server:
    second, seconds, first = asyncio.run(run(server.url))
  assert second.status_code == 200 and seconds < 2.0, (second.text, seconds)
  assert first.status_code == 504  # six parts of 0.6 s each: more than its own 3 s
  assert parts[:4] == [4, 4, 4, 3] and sum(parts) >= 16  # the small one ran right after the part it found running
  cfg = dataclasses.replace(cfg, request_timeout_s=60.0)
  service = serving.ScoringService(tiny_scorer, cfg)
  with serving.ServerThread(service) as server:
    whole = httpx.post(server.url + "/v1/score", json=large, timeout=60).json()
  tiny_scorer.prefix_cache.clear()
  want = tiny_scorer.score(**large)
  np.testing.assert_allclose(whole["scores"], want.scores, rtol=0, atol=1e-5)
  assert whole["usage"]["prompt_tokens"] == want.usage["prompt_tokens"] == 5 + 24 * 7
  assert whole["usage"]["processed_tokens"] == 6 * 5 + 24 * 7  # the query once per part
  with pytest.raises(serving.ServeError, match="max_items_per_run"):
    serving.ScoringService(tiny_scorer, dataclasses.replace(cfg, max_items_per_run=-1))


def test_warmup_compiles_what_a_request_of_that_shape_runs(tiny_scorer):
  cfg = serving.ServeConfig(max_batch_requests=1, warmup_query_tokens=(5,), warmup_items=(3,),
                            warmup_item_tokens=(7,), port=0)
  service = serving.ScoringService(tiny_scorer, cfg)
  stats = service.warmup()
  assert stats["executables"] >= 1
  before = tiny_scorer.runner.num_executables
  with TestClient(serving.build_app(service)) as client:
    for softmax in (True, False):
      body = {"query": [3] * 5, "items": [[9] * 7] * 3, "label_token_ids": [0, 1], "apply_softmax": softmax}
      assert client.post("/v1/score", json=body).status_code == 200
  assert tiny_scorer.runner.num_executables == before


# --- a converted tiny Hugging Face model with a tokenizer -----------------------------------------
@pytest.mark.slow
def test_converted_hf_model_scores_and_ranks_as_scorer_and_eval(tmp_path, hf_tokenizer_path):
  model = hf_models.make_hf_model("qwen3", vocab_size=520, num_key_value_heads=2)
  hf_dir = hf_models.save_hf_model(model, tmp_path / "hf", tokenizer_file=hf_tokenizer_path)
  scorer = Scorer.from_checkpoint(convert_hf_checkpoint(hf_dir, tmp_path / "ckpt"),
                                  **dict(parse_override(a) for a in FEW_BUCKETS))
  labels = ("7", "9")
  service = serving.ScoringService(scorer, CFG, dataclasses.replace(PROMPT, labels=labels))
  jsonl = tmp_path / "set.jsonl"
  records = [{"qid": f"q{i}", "query": f"how to sort a list {i}",
              "candidates": [{"docid": f"d{j}", "text": t} for j, t in enumerate(
                  ["sorted returns a new list", "the for statement", "list.sort sorts in place", "x"][i:])],
              "qrels": {"d0": 1}}
             for i in range(2)]
  jsonl.write_text("".join(json.dumps(r) + "\n" for r in records))
  dataset = data.load_jsonl(jsonl, split="all")
  eval_cfg = eval_lib.EvalConfig(labels=labels, max_item_tokens=PROMPT.max_item_tokens)
  eval_lib.run_eval(scorer, dataset, eval_cfg, tmp_path / "eval", progress=False)
  lines = (tmp_path / "eval" / "results.jsonl").read_text().splitlines()[1:]
  want = {r["qid"]: r["scores"] for r in map(json.loads, lines)}
  with TestClient(serving.build_app(service)) as client:
    for q in dataset.queries:
      docs = [t for _, t in q.candidates]
      results = client.post("/v1/rerank", json={"query": q.query, "documents": docs}).json()["results"]
      got = [r["relevance_score"] for r in sorted(results, key=lambda r: r["index"])]
      np.testing.assert_allclose(got, want[q.qid], rtol=0, atol=1e-6)
      assert [r["index"] for r in results] == sorted(range(len(docs)), key=lambda i: (-want[q.qid][i], i))
    body = {"query": "sort a list", "items": ["sorted", "for loops"], "label_token_ids": [7, 9, 11]}
    out = client.post("/v1/score", json=body).json()
    np.testing.assert_allclose(out["scores"], _reference(scorer, body["query"], body["items"], [7, 9, 11], False),
                               rtol=0, atol=1e-6)


def test_raw_logit_with_a_score_head_is_refused_at_start(default_server):
  with pytest.raises(serving.ServeError, match="score_mode=raw_logit .* score head"):
    serving.ScoringService(default_server.service.scorer, CFG, serving.RerankPrompt(score_mode="raw_logit"))


@pytest.mark.slow
def test_load_benchmark_answers_every_request_correctly():
  from maxscore.bench import serve_load  # pylint: disable=import-outside-toplevel
  cfg = serve_load.LoadConfig(clients=4, requests_per_client=2, items_per_request=6, max_batch_requests=4,
                              warm_requests_per_client=1, time_limit_s=300)
  report = serve_load.run_load(cfg, FEW_BUCKETS)
  for mode in ("batched", "wait=0", "unbatched"):
    assert report["modes"][mode]["correct"] == report["modes"][mode]["requests"] == 8
  assert "| batched | 8/8 |" in serve_load.format_report(report)
  assert report["modes"]["unbatched"]["mean_batch"] == 1
  for mode in report["modes"].values():  # the model's share of the timed pass: a fraction of its wall time
    assert 0 < mode["model_busy"] <= 1
