"""The HTTP front end (docs/ARCHITECTURE.md section 13): FastAPI routes over a ScoringService, served by uvicorn.

    POST /v1/score                 sglang's /v1/score (the numbers of Scorer.score)
    POST /v1/rerank, /rerank, /v2/rerank   Cohere/Jina rerank (the eval's ranking)
    GET  /health, /v1/models, /metrics

Every error is an OpenAI-style JSON body (schemas.ApiError) with a 4xx status for bad input, 503 with
Retry-After when the queue is full, 504 past request_timeout_s; the server keeps serving. SIGTERM (or
SIGINT) stops accepting connections, answers the requests in flight, drains the queue and returns.
"""

import asyncio
import contextlib
import errno
import signal
import socket
import threading
import time
from typing import Any, Awaitable, Callable, Optional

import fastapi
import uvicorn
from absl import logging
from starlette.exceptions import HTTPException as StarletteHTTPException

from maxscore import interrupt
from maxscore.serving import batching, schemas
from maxscore.serving.config import ServeError
from maxscore.serving.metrics import CONTENT_TYPE
from maxscore.serving.service import ScoringService

RERANK_PATHS = ("/v1/rerank", "/rerank", "/v2/rerank")
UNROUTED = "unrouted"  # the endpoint label of requests to a path the server does not have (a 404)


def _error_response(error: schemas.ApiError) -> fastapi.responses.JSONResponse:
  return fastapi.responses.JSONResponse(error.body(), status_code=error.status, headers=error.headers)


async def _answer(service: ScoringService, endpoint: str, handle: Callable[[], Awaitable[Any]]):
  """Runs a handler; maps every failure to its JSON error and records the request's metrics."""
  start = time.perf_counter()
  try:
    response = await handle()
  except schemas.ApiError as e:
    response = _error_response(e)
  except batching.QueueFull as e:
    response = _error_response(schemas.ApiError(503, str(e), headers={"Retry-After": "1"}))
  except batching.QueueClosed as e:
    response = _error_response(schemas.ApiError(503, str(e), headers={"Retry-After": "5"}))
  except asyncio.TimeoutError:
    response = _error_response(schemas.ApiError(
        504, f"the request was not scored within request_timeout_s={service.cfg.request_timeout_s}"))
  except Exception as e:  # pylint: disable=broad-except  (a bug: logged with its traceback, answered as 500)
    logging.exception("%s failed", endpoint)
    response = _error_response(schemas.ApiError(500, f"internal error: {type(e).__name__}: {e}"))
  if not isinstance(response, fastapi.Response):
    response = fastapi.responses.JSONResponse(response)
  service.metrics.observe(endpoint, response.status_code, time.perf_counter() - start)
  return response


def build_app(service: ScoringService) -> fastapi.FastAPI:
  """The FastAPI app; its lifespan starts the batch worker and, at shutdown, drains it."""

  @contextlib.asynccontextmanager
  async def lifespan(_app):
    service.queue.start()
    yield
    await asyncio.get_running_loop().run_in_executor(None, service.queue.close)

  app = fastapi.FastAPI(title="maxscore", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

  @app.exception_handler(StarletteHTTPException)
  async def http_error(request: fastapi.Request, exc: StarletteHTTPException):  # unknown path, wrong method
    path = request.url.path
    service.metrics.count(path if path in routes else UNROUTED, exc.status_code)  # bounded label values
    return _error_response(schemas.ApiError(exc.status_code, str(exc.detail)))

  async def score(request: fastapi.Request):
    async def handle():
      work = service.score_work(schemas.parse_json(await request.body()))
      result = await service.queue.submit(work, service.cfg.request_timeout_s)
      return result.to_response(service.model_name)
    return await _answer(service, "/v1/score", handle)

  async def rerank(request: fastapi.Request):
    async def handle():
      req, work = service.rerank_work(schemas.parse_json(await request.body()))
      result = await service.queue.submit(work, service.cfg.request_timeout_s)
      return schemas.rerank_response(req, service.ranking(result).tolist(), service.model_name,
                                     result.usage["prompt_tokens"])
    return await _answer(service, "/v1/rerank", handle)

  async def health():
    return await _answer(service, "/health", _constant(service.health))

  async def models():
    return await _answer(service, "/v1/models", _constant(service.models))

  async def metrics():
    body = service.metrics.render()  # rendered before this request is counted
    return await _answer(service, "/metrics", _constant(lambda: fastapi.Response(body, media_type=CONTENT_TYPE)))

  app.add_api_route("/v1/score", score, methods=["POST"])
  for path in RERANK_PATHS:
    app.add_api_route(path, rerank, methods=["POST"])
  app.add_api_route("/health", health, methods=["GET"])
  app.add_api_route("/v1/models", models, methods=["GET"])
  app.add_api_route("/metrics", metrics, methods=["GET"])
  routes = {r.path for r in app.routes}
  return app


def _constant(fn: Callable[[], Any]) -> Callable[[], Awaitable[Any]]:
  async def handle():
    return fn()
  return handle


def check_listen(host: str, port: int) -> None:
  """Binds every address `host` resolves to on `port`, as uvicorn's server does (asyncio's create_server), and
  closes the sockets at once: a busy port or an address this machine does not have is one ServeError before the
  model loads and warms up, not uvicorn's error after it. (Another process may still take the port in between.)"""
  where = f"--host={host} --port={port}"
  try:
    # "" is every interface, as asyncio reads it (getaddrinfo would refuse it)
    infos = socket.getaddrinfo(host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
  except socket.gaierror as e:
    raise ServeError(f"cannot listen on {where}: the host does not resolve ({e.strerror})") from None
  for family, kind, proto, _, address in infos:
    try:
      s = socket.socket(family, kind, proto)
    except OSError:
      continue  # a family this machine lacks (no IPv6, say): asyncio skips it too
    with s:
      s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio: a port in TIME_WAIT is free
      if family == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
      try:
        s.bind(address)
      except OSError as e:
        hint = ("; another process listens there: choose another --port (0: any free port)"
                if e.errno == errno.EADDRINUSE else "")
        raise ServeError(f"cannot listen on {where}: {e.strerror or e}{hint}") from None


def uvicorn_server(service: ScoringService) -> uvicorn.Server:
  config = uvicorn.Config(build_app(service), host=service.cfg.host, port=service.cfg.port,
                          log_level=service.cfg.log_level, access_log=False, lifespan="on",
                          timeout_graceful_shutdown=int(service.cfg.request_timeout_s) + 5)
  return uvicorn.Server(config)


def serve(service: ScoringService, on_ready: Optional[Callable[[str], None]] = None) -> None:
  """Serves until SIGTERM or SIGINT, then answers what is in flight and returns (exit code 0).

  uvicorn re-raises the signal it caught once it has shut down; a SIGTERM handler of our own takes it,
  so a drained server ends with status 0 rather than being killed by the default action."""
  server = uvicorn_server(service)
  previous = signal.signal(signal.SIGTERM, lambda *_: None)
  try:
    if on_ready is not None:
      _watch_started(server, lambda: on_ready(f"http://{service.cfg.host}:{_bound_port(server)}"))
    with interrupt.handled_elsewhere():  # Ctrl-C drains the server, rather than stopping the process at once
      server.run()
  finally:
    signal.signal(signal.SIGTERM, previous)


def _bound_port(server: uvicorn.Server) -> int:
  return server.servers[0].sockets[0].getsockname()[1]


def _watch_started(server: uvicorn.Server, callback: Callable[[], None]) -> None:
  def watch():
    while not server.started and not server.should_exit:
      time.sleep(0.02)
    if server.started:
      callback()
  threading.Thread(target=watch, daemon=True).start()


class ServerThread:
  """A server in a background thread of this process on a free loopback port (tests, the load benchmark)."""

  def __init__(self, service: ScoringService):
    self.service = service
    self.server = uvicorn_server(service)
    self.thread = threading.Thread(target=self.server.run, name="maxscore-server", daemon=True)

  def __enter__(self) -> "ServerThread":
    self.thread.start()
    while not self.server.started:
      if not self.thread.is_alive():
        raise RuntimeError("the server thread stopped before it started (see its log)")
      time.sleep(0.01)
    self.url = f"http://{self.service.cfg.host}:{_bound_port(self.server)}"
    return self

  def __exit__(self, *exc) -> None:
    self.server.should_exit = True
    self.thread.join()
