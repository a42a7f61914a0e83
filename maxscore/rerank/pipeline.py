"""The eval loop's pipeline: the host prepares query i+1 and writes query i-1 while query i is scored.

    for prepared in prefetched(prepare, queries, depth=2):   # prepare() runs ahead in one thread
      writer.submit(score(prepared))                          # results written in order by another

Both run in one worker thread each, so order is the input order; XLA releases the GIL while it
computes, so tokenization and file writes overlap the model's work. An exception in a worker
reaches the caller at the next item (prefetched) or the next submit / close (OrderedWriter), and
nothing after it is written.
"""

import collections
import concurrent.futures
from typing import Any, Callable, Iterable, Iterator, Optional, TypeVar

T = TypeVar("T")
R = TypeVar("R")
_END = object()


def prefetched(fn: Callable[[T], R], items: Iterable[T], depth: int = 2) -> Iterator[R]:
  """fn(item) for each item, in order, with up to `depth` items computed ahead in a worker thread."""
  if depth < 1:
    raise ValueError(f"depth={depth} must be >= 1")
  it = iter(items)
  with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="eval-prepare") as pool:
    ahead: collections.deque = collections.deque()
    for item in it:
      ahead.append(pool.submit(fn, item))
      if len(ahead) >= depth:
        break
    while ahead:
      result = ahead.popleft().result()
      nxt = next(it, _END)
      if nxt is not _END:
        ahead.append(pool.submit(fn, nxt))
      yield result
    # closed early (the caller stopped or raised): the executor finishes the few calls already queued


class OrderedWriter:
  """Calls `write(x)` for each submitted x, in submission order, in one worker thread; at most `depth`
  writes wait. The first failed write is raised by the next submit() and by close(), and no later
  submission is written."""

  def __init__(self, write: Callable[[Any], None], depth: int = 2):
    self._write, self._depth = write, depth
    self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="eval-write")
    self._pending: collections.deque = collections.deque()
    self._error: Optional[BaseException] = None
    self._failed = False  # set by the worker at a failed write: the writes queued behind it do nothing

  def _guarded(self, x: Any) -> None:
    if self._failed:
      return
    try:
      self._write(x)
    except BaseException:
      self._failed = True
      raise

  def _settle(self, keep: int) -> None:
    if self._error is not None:
      raise self._error
    while len(self._pending) > keep:
      try:
        self._pending.popleft().result()
      except BaseException as e:
        self._error = e
        raise

  def submit(self, x: Any) -> None:
    self._settle(self._depth - 1)
    self._pending.append(self._pool.submit(self._guarded, x))

  def close(self) -> None:
    """Waits for every write; raises the first that failed."""
    try:
      self._settle(0)
    finally:
      self._pool.shutdown(wait=True, cancel_futures=True)

  def __enter__(self) -> "OrderedWriter":
    return self

  def __exit__(self, exc_type, *_) -> None:
    if exc_type is None:
      self.close()
    else:  # the loop failed: let queued writes finish (each is a whole record), raise the loop's error
      self._pool.shutdown(wait=True)
