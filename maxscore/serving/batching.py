"""Dynamic batching: an asyncio front end hands work to ONE worker thread that runs the model.

Requests that arrive within `max_wait_s` of the oldest waiting one (up to `max_batch`) are run by
one `run_batch` call, so concurrent requests share forwards and the devices run one model step at
a time. The event loop only enqueues and awaits a future: it never blocks on a forward. The queue
is bounded (QueueFull when full); a caller that stops waiting (timeout, disconnect) leaves its job
marked abandoned, so the worker skips it if it has not started and drops its result otherwise:
nothing else is cancelled. `close()` lets the worker finish every queued job, then stops it.

A new shape must not stall the requests of known shapes (docs/ARCHITECTURE.md section 13). With
`is_warm` and `compile` given, the worker runs a gathered batch at once only when `is_warm(payloads)`
says it needs no compilation. Otherwise each payload that is warm alone runs alone without waiting, and
each cold one goes to a second thread, the compiler, which calls `compile([payload])` and then puts the
job back at the head of the queue. So a request waits for its own compile, never for another's. A batch
whose payloads are each warm but whose stack is not is also handed to the compiler (`compile(payloads)`,
with no job waiting on it), so the next batch of that make-up runs stacked.

A large request must not stall the small ones behind it either. With `split` and `merge` given, a payload
is cut into parts (`split(payload) -> [part, ...]`) that run one at a time: after each part the job goes
back to the tail of the queue, so every job that arrived meanwhile runs before its next part. A request
behind a large one waits for one part, not for the whole; the large one's caller gets
`merge(payload, [result of each part])` once its last part has run, or the first part's error.
"""

import asyncio
import collections
import dataclasses
import threading
import time
from typing import Any, Callable, Optional, Sequence

from absl import logging


class QueueFull(RuntimeError):
  """The queue holds `max_queue` waiting jobs; the caller should retry later."""


class QueueClosed(RuntimeError):
  """The server is shutting down and takes no new work."""


@dataclasses.dataclass
class _Job:
  payload: Any
  future: asyncio.Future
  loop: asyncio.AbstractEventLoop
  enqueued: float
  abandoned: bool = False
  compiled: bool = False  # back from the compiler: run it even if a probe still calls it cold
  whole: Any = None  # the submitted payload when it runs in parts (payload is then the part that runs next)
  rest: list = dataclasses.field(default_factory=list)  # parts not yet run
  done: list = dataclasses.field(default_factory=list)  # results of the parts that ran


def _resolve(future: asyncio.Future, result: Any, error: Optional[BaseException]) -> None:
  if future.done():  # the caller gave up (timeout, disconnect): its result is dropped
    return
  if error is not None:
    future.set_exception(error)
  else:
    future.set_result(result)


class BatchQueue:
  """Gathers submitted payloads into `run_batch(payloads) -> results` calls on one worker thread.

  `on_batch(num_jobs)` is called before each run (metrics). `is_warm(payloads)` (whether running them
  together compiles nothing) and `compile(payloads)` (compile what running them together needs) move the
  compilation of new shapes to a compiler thread (see the module docstring); without them every batch runs
  as gathered. `split(payload)` and `merge(payload, part_results)` run a large payload in parts that take
  turns with the other jobs; without them each payload runs whole."""

  def __init__(self, run_batch: Callable[[Sequence[Any]], Sequence[Any]], max_batch: int, max_wait_s: float,
               max_queue: int, on_batch: Optional[Callable[[int], None]] = None,
               is_warm: Optional[Callable[[Sequence[Any]], bool]] = None,
               compile: Optional[Callable[[Sequence[Any]], None]] = None,  # pylint: disable=redefined-builtin
               split: Optional[Callable[[Any], Sequence[Any]]] = None,
               merge: Optional[Callable[[Any, list[Any]], Any]] = None):
    if (is_warm is None) != (compile is None):
      raise ValueError("is_warm and compile are given together or not at all")
    if (split is None) != (merge is None):
      raise ValueError("split and merge are given together or not at all")
    self._run_batch = run_batch
    self.max_batch, self.max_wait_s, self.max_queue = max_batch, max_wait_s, max_queue
    self._on_batch, self._is_warm, self._compile = on_batch, is_warm, compile
    self._split, self._merge = split, merge
    self._jobs: collections.deque[_Job] = collections.deque()
    # Waiting for the compiler: (payloads to compile together, the job waiting on it or None).
    self._cold: collections.deque[tuple[list[Any], Optional[_Job]]] = collections.deque()
    self._compiling = 0  # jobs the compiler holds (waiting in _cold or being compiled)
    self._cond = threading.Condition()
    self._closed = False
    self._thread: Optional[threading.Thread] = None
    self._compiler: Optional[threading.Thread] = None

  @property
  def depth(self) -> int:
    """Jobs waiting for the worker or for their compile (not counting the batch the worker is running)."""
    return len(self._jobs) + self._compiling

  def start(self) -> None:
    if self._thread is None:
      self._thread = threading.Thread(target=self._loop, name="maxscore-batcher", daemon=True)
      self._thread.start()
    if self._compile is not None and self._compiler is None:
      self._compiler = threading.Thread(target=self._compile_loop, name="maxscore-compiler", daemon=True)
      self._compiler.start()

  async def submit(self, payload: Any, timeout_s: float) -> Any:
    """The payload's result; QueueFull, QueueClosed, asyncio.TimeoutError or the worker's exception."""
    loop = asyncio.get_running_loop()
    job = _Job(payload, loop.create_future(), loop, time.monotonic())
    if self._split is not None:
      parts = list(self._split(payload))
      if len(parts) > 1:
        job.whole, job.payload, job.rest = payload, parts[0], parts[1:]
    with self._cond:
      if self._closed:
        raise QueueClosed("the server is shutting down")
      if self.depth >= self.max_queue:
        raise QueueFull(f"the request queue is full (max_queue={self.max_queue} waiting requests)")
      self._jobs.append(job)
      self._cond.notify_all()
    try:
      return await asyncio.wait_for(asyncio.shield(job.future), timeout_s)
    except BaseException:
      job.abandoned = True
      raise

  def close(self, timeout_s: Optional[float] = None) -> None:
    """Takes no new work, lets the worker run every queued job, and waits for it to stop."""
    with self._cond:
      self._closed = True
      self._cond.notify_all()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    for thread in (self._thread, self._compiler):
      if thread is not None:
        thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

  def _take(self) -> Optional[list[_Job]]:
    """The next batch: the oldest job and those arriving within max_wait_s of it; None once closed, empty and
    with nothing left at the compiler."""
    with self._cond:
      while not self._jobs and not (self._closed and not self._compiling):
        self._cond.wait()
      if not self._jobs:
        return None
      deadline = self._jobs[0].enqueued + self.max_wait_s
      while len(self._jobs) < self.max_batch and not self._closed:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
          break
        self._cond.wait(remaining)
      batch = [self._jobs.popleft() for _ in range(min(self.max_batch, len(self._jobs)))]
    return [j for j in batch if not j.abandoned]

  def _loop(self) -> None:
    while (batch := self._take()) is not None:
      if batch:
        self._dispatch(batch)

  def _dispatch(self, batch: list[_Job]) -> None:
    """Runs the batch as gathered when it is warm; else runs its warm jobs now and sends the cold ones
    to the compiler."""
    if self._is_warm is None or self._probe(batch):
      self._run(batch)
      return
    warm, cold = [], []
    for job in batch:
      (warm if job.compiled or self._probe([job]) else cold).append(job)
    stacked = len(warm) > 1 and len(warm) < len(batch) and self._probe(warm)  # == len(batch): known cold
    with self._cond:
      if self._closed:  # draining: the compiler may be gone; they compile as they run
        warm, cold = warm + cold, []
      for job in cold:
        self._cold.append(([job.payload], job))
      self._compiling += len(cold)
      if len(warm) > 1 and not stacked and not any(job is None for _, job in self._cold):
        self._cold.append(([j.payload for j in warm], None))  # the stack, for next time (one at a time)
      self._cond.notify_all()
    if stacked:
      self._run(warm)
    else:  # each warm alone: its shape is built for one request, not yet for this stack
      for job in warm:
        self._run([job])

  def _probe(self, jobs: list[_Job]) -> bool:
    try:
      return bool(self._is_warm([j.payload for j in jobs]))
    except Exception:  # pylint: disable=broad-except  (a bad payload: let the run report its error)
      return True

  def _compile_loop(self) -> None:
    """The compiler thread: compiles each cold job's shapes, then queues the job again at the head; and
    the stacks of warm jobs the worker ran one by one."""
    while True:
      with self._cond:
        while not self._cold and not self._closed:
          self._cond.wait()
        if not self._cold:
          return
        payloads, job = self._cold.popleft()
      skip = (job.abandoned if job is not None else self._closed) or self._probe_payloads(payloads)
      if not skip:
        start = time.monotonic()
        try:
          self._compile(payloads)
          logging.info("compiled a new shape (%d requests) in %.1f s", len(payloads), time.monotonic() - start)
        except Exception as e:  # pylint: disable=broad-except  (running it reports the error to its caller)
          logging.warning("compiling a request's shape failed (%s); it runs as it is", e)
      if job is None:
        continue
      job.compiled = True
      with self._cond:
        self._compiling -= 1
        if not job.abandoned:
          self._jobs.appendleft(job)
        self._cond.notify_all()

  def _probe_payloads(self, payloads: list[Any]) -> bool:
    try:
      return bool(self._is_warm(payloads))
    except Exception:  # pylint: disable=broad-except
      return False

  def _run(self, batch: list[_Job]) -> None:
    """Runs one batch; when it fails, each job runs alone, so one bad job cannot fail the others."""
    if self._on_batch is not None:
      self._on_batch(len(batch))
    try:
      outcomes = [(r, None) for r in self._run_batch([j.payload for j in batch])]
    except Exception as e:  # pylint: disable=broad-except
      if len(batch) == 1:
        outcomes = [(None, e)]
      else:
        logging.warning("a batch of %d requests failed (%s); running them one by one", len(batch), e)
        outcomes = [self._run_one(j) for j in batch]
    for job, (result, error) in zip(batch, outcomes):
      if error is None and job.rest:  # more parts: to the tail, behind every job that came meanwhile
        job.done.append(result)
        job.payload, job.rest, job.compiled = job.rest[0], job.rest[1:], False
        with self._cond:
          if not job.abandoned:
            self._jobs.append(job)
            self._cond.notify_all()
        continue
      if error is None and job.done:
        try:
          result = self._merge(job.whole, job.done + [result])
        except Exception as e:  # pylint: disable=broad-except
          result, error = None, e
      try:
        job.loop.call_soon_threadsafe(_resolve, job.future, result, error)
      except RuntimeError:  # the caller's event loop is closed: nobody waits for this result
        pass

  def _run_one(self, job: _Job) -> tuple[Any, Optional[BaseException]]:
    try:
      return self._run_batch([job.payload])[0], None
    except Exception as e:  # pylint: disable=broad-except
      return None, e
