"""Dynamic batching: an asyncio front end hands work to ONE worker thread that runs the model.

Requests that arrive within `max_wait_s` of the oldest waiting one (up to `max_batch`) are run by
one `run_batch` call, so concurrent requests share forwards and the devices run one model step at
a time. The event loop only enqueues and awaits a future: it never blocks on a forward. The queue
is bounded (QueueFull when full); a caller that stops waiting (timeout, disconnect) leaves its job
marked abandoned, so the worker skips it if it has not started and drops its result otherwise:
nothing else is cancelled. `close()` lets the worker finish every queued job, then stops it.
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


def _resolve(future: asyncio.Future, result: Any, error: Optional[BaseException]) -> None:
  if future.done():  # the caller gave up (timeout, disconnect): its result is dropped
    return
  if error is not None:
    future.set_exception(error)
  else:
    future.set_result(result)


class BatchQueue:
  """Gathers submitted payloads into `run_batch(payloads) -> results` calls on one worker thread.

  `on_batch(num_jobs)` is called before each run (metrics)."""

  def __init__(self, run_batch: Callable[[Sequence[Any]], Sequence[Any]], max_batch: int, max_wait_s: float,
               max_queue: int, on_batch: Optional[Callable[[int], None]] = None):
    self._run_batch = run_batch
    self.max_batch, self.max_wait_s, self.max_queue = max_batch, max_wait_s, max_queue
    self._on_batch = on_batch
    self._jobs: collections.deque[_Job] = collections.deque()
    self._cond = threading.Condition()
    self._closed = False
    self._thread: Optional[threading.Thread] = None

  @property
  def depth(self) -> int:
    """Jobs waiting for the worker (not counting the batch it is running)."""
    return len(self._jobs)

  def start(self) -> None:
    if self._thread is None:
      self._thread = threading.Thread(target=self._loop, name="maxscore-batcher", daemon=True)
      self._thread.start()

  async def submit(self, payload: Any, timeout_s: float) -> Any:
    """The payload's result; QueueFull, QueueClosed, asyncio.TimeoutError or the worker's exception."""
    loop = asyncio.get_running_loop()
    job = _Job(payload, loop.create_future(), loop, time.monotonic())
    with self._cond:
      if self._closed:
        raise QueueClosed("the server is shutting down")
      if len(self._jobs) >= self.max_queue:
        raise QueueFull(f"the request queue is full (max_queue={self.max_queue} waiting requests)")
      self._jobs.append(job)
      self._cond.notify()
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
    if self._thread is not None:
      self._thread.join(timeout_s)

  def _take(self) -> Optional[list[_Job]]:
    """The next batch: the oldest job and those arriving within max_wait_s of it; None once closed and empty."""
    with self._cond:
      while not self._jobs and not self._closed:
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
        self._run(batch)

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
      try:
        job.loop.call_soon_threadsafe(_resolve, job.future, result, error)
      except RuntimeError:  # the caller's event loop is closed: nobody waits for this result
        pass

  def _run_one(self, job: _Job) -> tuple[Any, Optional[BaseException]]:
    try:
      return self._run_batch([job.payload])[0], None
    except Exception as e:  # pylint: disable=broad-except
      return None, e
