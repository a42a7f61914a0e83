"""Load benchmark of the HTTP server (scripts/bench_serve.py): C concurrent clients x R /v1/rerank
requests each on loopback, against the same model served three ways in one run:

    batched     max_batch_wait_ms=W, up to max_batch_requests per score_batch call (the configured server)
    wait=0      no waiting, but whatever is queued when the worker is free still runs together
    unbatched   max_batch_requests=1: one request per score_batch call

Every answer is checked against the same request scored alone (the service's path with batch 1, which is
Scorer.score's): same ranking, scores within `tolerance`. The load is bounded in count (C x R) and in
time (time_limit_s per mode). Before timing, each mode runs a stack of each shape the pool's requests
take at every batch bucket on the worker's path (compiling those shapes) and an untimed pass over HTTP;
compilations during the timed pass are still counted and reported, and so is the model's share of the
timed pass ("model busy": the worker's time inside score_batch calls over the wall time: where stacking
requests does not make the model cheaper per row, batching can at most remove the rest of a request's
cost). Client and server share this process (and its cores): the figures are the server's with a local
client, a lower bound on what it serves to remote ones.
"""

import asyncio
import dataclasses
import os
import sys
import time
from typing import Any, Optional

import httpx
import numpy as np

from maxscore.datasets import data
from maxscore.scoring import layout
from maxscore.scoring import loading
from maxscore.serving import RerankPrompt, ScoringService, ServeConfig, ServerThread


@dataclasses.dataclass(frozen=True)
class LoadConfig:
  """What scripts/bench_serve.py runs (configs/bench_serve.yml documents each key)."""
  checkpoint_dir: Optional[str] = None
  clients: int = 32
  requests_per_client: int = 20
  items_per_request: int = 24
  max_item_tokens: int = 48
  max_batch_requests: int = 32
  max_batch_wait_ms: float = 10.0
  warm_requests_per_client: int = 2
  time_limit_s: float = 600.0
  tolerance: float = 1e-5

  def validate(self) -> "LoadConfig":
    for name in ("clients", "requests_per_client", "items_per_request", "max_batch_requests"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
    for name in ("max_item_tokens", "warm_requests_per_client", "max_batch_wait_ms"):
      if getattr(self, name) < 0:
        raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
    if self.time_limit_s <= 0 or self.tolerance <= 0:
      raise ValueError("time_limit_s and tolerance must be > 0")
    return self


def request_pool(cfg: LoadConfig) -> list[dict[str, Any]]:
  """/v1/rerank bodies from the embedded rerank set: queries with at least items_per_request candidates."""
  dataset = data.load_jsonl(data.DEFAULT_JSONL, split="all", top_k=cfg.items_per_request)
  pool = [{"query": q.query, "documents": [t for _, t in q.candidates], "return_documents": False}
          for q in dataset.queries if len(q.candidates) == cfg.items_per_request]
  if not pool:
    raise ValueError(f"items_per_request={cfg.items_per_request}: no query of the embedded set has that many "
                     f"candidates")
  return pool


def _expected(service: ScoringService, body: dict[str, Any]) -> np.ndarray:
  """The request's ranking scores, scored alone."""
  _, work = service.rerank_work(body)
  return service.ranking(service.run_batch([work])[0])


def _correct(answer: dict[str, Any], want: np.ndarray, tolerance: float) -> bool:
  results = answer.get("results", [])
  got = np.full(len(want), np.nan)
  for r in results:
    got[r["index"]] = r["relevance_score"]
  scores = [r["relevance_score"] for r in results]
  return (len(results) == len(want) and bool(np.all(np.abs(got - want) <= tolerance))
          and scores == sorted(scores, reverse=True))


async def _client(url: str, bodies, wants, tolerance: float, out: list) -> None:
  async with httpx.AsyncClient(base_url=url, timeout=300) as client:
    for body, want in zip(bodies, wants):
      start = time.perf_counter()
      r = await client.post("/v1/rerank", json=body)
      seconds = time.perf_counter() - start
      out.append((seconds, r.status_code == 200 and _correct(r.json(), want, tolerance)))


async def _load(url: str, pool, wants, clients: int, per_client: int, cfg: LoadConfig) -> tuple[list, float]:
  out: list = []
  start = time.perf_counter()
  tasks = [_client(url, [pool[(c * per_client + j) % len(pool)] for j in range(per_client)],
                   [wants[(c * per_client + j) % len(pool)] for j in range(per_client)], cfg.tolerance, out)
           for c in range(clients)]
  await asyncio.wait_for(asyncio.gather(*tasks), cfg.time_limit_s)
  return out, time.perf_counter() - start


def _run_mode(scorer, prompt: RerankPrompt, serve_cfg: ServeConfig, pool, wants, cfg: LoadConfig) -> dict[str, Any]:
  service = ScoringService(scorer, serve_cfg, prompt)
  _compile_batches(service, pool)
  with ServerThread(service) as server:
    if cfg.warm_requests_per_client:
      asyncio.run(_load(server.url, pool, wants, cfg.clients, cfg.warm_requests_per_client, cfg))
    compiled, metrics = scorer.runner.num_executables, service.metrics
    calls0, reqs0 = _hist(metrics.batch_requests)
    _, busy0 = _hist(metrics.batch_seconds)
    out, seconds = asyncio.run(_load(server.url, pool, wants, cfg.clients, cfg.requests_per_client, cfg))
    calls1, reqs1 = _hist(metrics.batch_requests)
    _, busy1 = _hist(metrics.batch_seconds)
  lat = np.asarray([s for s, _ in out]) * 1000
  n = len(out)
  return {"requests": n, "correct": sum(ok for _, ok in out), "seconds": seconds,
          "p50_ms": float(np.percentile(lat, 50)), "p95_ms": float(np.percentile(lat, 95)),
          "p99_ms": float(np.percentile(lat, 99)), "requests_per_s": n / seconds,
          "items_per_s": n * cfg.items_per_request / seconds,
          "mean_batch": (reqs1 - reqs0) / max(calls1 - calls0, 1), "model_busy": (busy1 - busy0) / seconds,
          "compiled_during_run": scorer.runner.num_executables - compiled}


def _compile_batches(service: ScoringService, pool) -> None:
  """Warms one request of every shape the pool's requests take (query, item length and item count
  buckets) at every batch size on the worker's path (no HTTP), so the timed pass meets compiled shapes."""
  buckets = service.scorer.config.buckets
  shapes = {}
  for body in pool:
    work = service.rerank_work(body)[1]
    req = work.request
    key = (layout.bucket(len(req.prefix), buckets.prefix_buckets, "query"),
           layout.bucket(max(len(x) for x in req.items), buckets.item_buckets, "item"), len(req.items))
    shapes.setdefault(key, work)
  service.warm(list(shapes.values()))


def _hist(histogram) -> tuple[float, float]:
  """(observations, their sum) of a prometheus Histogram without labels."""
  samples = {s.name: s.value for m in histogram.collect() for s in m.samples}
  count, total = (next(v for k, v in samples.items() if k.endswith(end)) for end in ("_count", "_sum"))
  return count, total


def run_load(cfg: LoadConfig, overrides=()) -> dict[str, Any]:
  """Runs the three modes on one model; returns the per-mode figures, the gains and the load average."""
  cfg.validate()
  load_before = os.getloadavg()
  scorer = loading.build_scorer(cfg.checkpoint_dir, overrides)
  prompt = RerankPrompt(max_item_tokens=cfg.max_item_tokens)
  base = ServeConfig(port=0, warmup_items=(0,), max_queue=max(256, cfg.clients * 2), request_timeout_s=300.0)
  pool = request_pool(cfg)
  reference = ScoringService(scorer, base, prompt)
  wants = [_expected(reference, body) for body in pool]
  modes = {
      "batched": dataclasses.replace(base, max_batch_requests=cfg.max_batch_requests,
                                     max_batch_wait_ms=cfg.max_batch_wait_ms),
      "wait=0": dataclasses.replace(base, max_batch_requests=cfg.max_batch_requests, max_batch_wait_ms=0.0),
      "unbatched": dataclasses.replace(base, max_batch_requests=1, max_batch_wait_ms=0.0),
  }
  results = {}
  for name, mode_cfg in modes.items():
    results[name] = _run_mode(scorer, prompt, mode_cfg, pool, wants, cfg)
    print(f"{name}: {results[name]['items_per_s']:.0f} items/s, {results[name]['correct']}/"
          f"{results[name]['requests']} correct", file=sys.stderr, flush=True)
  batched = results["batched"]["items_per_s"]
  return {"config": dataclasses.asdict(cfg), "model": scorer.model_name, "modes": results,
          "gain_vs_wait0": batched / results["wait=0"]["items_per_s"],
          "gain_vs_unbatched": batched / results["unbatched"]["items_per_s"],
          "load_before": load_before, "load_after": os.getloadavg()}


def format_report(report: dict[str, Any]) -> str:
  """A Markdown table of the modes, then the gains and the load average."""
  cfg = report["config"]
  lines = [f"{cfg['clients']} clients x {cfg['requests_per_client']} requests x {cfg['items_per_request']} items, "
           f"model {report['model']}",
           "| mode | answered correctly | p50 ms | p95 ms | p99 ms | requests/s | items/s | mean batch | model busy | "
           "compiled during run |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for name, r in report["modes"].items():
    lines.append(f"| {name} | {r['correct']}/{r['requests']} | {r['p50_ms']:.0f} | {r['p95_ms']:.0f} | "
                 f"{r['p99_ms']:.0f} | {r['requests_per_s']:.1f} | {r['items_per_s']:.0f} | {r['mean_batch']:.1f} | "
                 f"{100 * r['model_busy']:.0f}% | "
                 f"{r['compiled_during_run']} |")
  lines.append(f"batching gain (items/s): {report['gain_vs_wait0']:.2f}x vs wait=0, "
               f"{report['gain_vs_unbatched']:.2f}x vs unbatched")
  lines.append(f"load average before {report['load_before']}, after {report['load_after']}")
  return "\n".join(lines)
