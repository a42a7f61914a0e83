"""Prometheus metrics of one server (its own registry, so several servers can live in one process)."""

from typing import Callable

import prometheus_client as prom

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class ServerMetrics:
  """Requests by endpoint and status, latency, items and tokens scored, batch sizes and model time per
  batch, queue depth and the number of compiled executables (it stays flat after warmup when requests
  fit the warmed shapes)."""

  def __init__(self, queue_depth: Callable[[], int], compilations: Callable[[], int]):
    self.registry = prom.CollectorRegistry()
    r = self.registry
    self.requests = prom.Counter("maxscore_requests", "HTTP requests by endpoint and status code",
                                 ["endpoint", "status"], registry=r)
    self.latency = prom.Histogram("maxscore_request_latency_seconds", "Time from request to response",
                                  ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
    self.items = prom.Counter("maxscore_items_scored", "Items (documents) scored", registry=r)
    self.tokens = prom.Counter("maxscore_tokens_scored", "Prompt tokens of the scored requests", registry=r)
    self.batch_requests = prom.Histogram("maxscore_batch_requests", "Requests per score_batch call",
                                         buckets=BATCH_BUCKETS, registry=r)
    self.batch_seconds = prom.Histogram("maxscore_batch_seconds", "Model time per score_batch call",
                                        buckets=LATENCY_BUCKETS, registry=r)
    self.queue_depth = prom.Gauge("maxscore_queue_depth", "Requests waiting for the model", registry=r)
    self.queue_depth.set_function(queue_depth)
    self.compilations = prom.Gauge("maxscore_compiled_executables", "Executables the scorer has compiled",
                                   registry=r)
    self.compilations.set_function(compilations)

  def observe(self, endpoint: str, status: int, seconds: float) -> None:
    self.count(endpoint, status)
    self.latency.labels(endpoint=endpoint).observe(seconds)

  def count(self, endpoint: str, status: int) -> None:
    """Counts a request the routes never saw (a 404 for an unknown path, a 405 for a wrong method): in
    maxscore_requests_total, not in the latency histogram."""
    self.requests.labels(endpoint=endpoint, status=str(status)).inc()

  def render(self) -> bytes:
    """The Prometheus text exposition format."""
    return prom.generate_latest(self.registry)


CONTENT_TYPE = prom.CONTENT_TYPE_LATEST
