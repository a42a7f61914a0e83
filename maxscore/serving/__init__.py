"""The HTTP server (docs/ARCHITECTURE.md section 13): sglang's /v1/score and Cohere/Jina /v1/rerank over the Scorer,
with dynamic batching on one worker thread, Prometheus /metrics and a drained shutdown.

    service = ScoringService(scorer, ServeConfig(), RerankPrompt())
    service.warmup()
    serve(service)                                 # or: with ServerThread(service) as s: s.url
"""

from typing import Callable, Sequence

from maxscore.serving.app import RERANK_PATHS, UNROUTED, ServerThread, build_app, check_listen, serve
from maxscore.serving.batching import BatchQueue, QueueClosed, QueueFull
from maxscore.serving.config import RerankPrompt, ServeConfig, ServeError
from maxscore.serving.service import ScoringService, Work, check_single_process


def build_service(cfg: ServeConfig, prompt: RerankPrompt, overrides: Sequence[str] = ()) -> ScoringService:
  """The checkpoint's scorer (the embedded default when cfg.checkpoint_dir is None) as a ScoringService."""
  from maxscore.scoring import loading  # pylint: disable=import-outside-toplevel
  check_single_process()
  cfg.validate()
  prompt.validate()
  return ScoringService(loading.build_scorer(cfg.checkpoint_dir, overrides, use_head=cfg.use_head), cfg, prompt)


def run_server(cfg: ServeConfig, prompt: RerankPrompt, overrides: Sequence[str] = (),
               log: Callable[[str], None] = print) -> None:
  """Checks that host and port can be listened on, loads the model, warms up the configured shapes, serves until
  SIGTERM, drains and returns."""
  check_listen(cfg.host, cfg.port)  # before the load and warmup (tens of seconds), which a busy port would waste
  service = build_service(cfg, prompt, overrides)
  stats = service.warmup(log)
  log(f"warmup: {stats['executables']} executables in {stats['seconds']:.1f} s; a request of another shape "
      f"compiles on its own, beside the batches that run")
  serve(service, on_ready=lambda url: log(f"serving {service.model_name!r} on {url} "
                                          f"(/v1/score, /v1/rerank, /health, /v1/models, /metrics)"))


__all__ = ["BatchQueue", "QueueClosed", "QueueFull", "RERANK_PATHS", "RerankPrompt", "ScoringService", "ServeConfig",
           "ServeError", "ServerThread", "UNROUTED", "Work", "build_app", "build_service", "check_listen",
           "check_single_process",
           "run_server", "serve"]
