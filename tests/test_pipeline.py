"""The eval loop's pipeline (maxscore/rerank/pipeline.py): order kept, work done ahead, errors not lost."""

import threading
import time

import pytest

from maxscore.rerank import pipeline


def test_prefetched_keeps_order_and_runs_ahead_in_another_thread():
  main, seen = threading.get_ident(), []

  def prepare(x):
    seen.append((x, threading.get_ident()))
    return x * 10

  out = []
  for i, y in enumerate(pipeline.prefetched(prepare, range(6), depth=2)):
    time.sleep(0.01)  # the "model work": the next item is prepared meanwhile
    assert len(seen) >= min(i + 2, 6)  # item i+1 was started before item i's result was used
    out.append(y)
  assert out == [0, 10, 20, 30, 40, 50]
  assert [x for x, _ in seen] == list(range(6)) and all(t != main for _, t in seen)


def test_prefetched_bounds_how_far_it_runs_ahead():
  started = []
  gen = pipeline.prefetched(lambda x: started.append(x) or x, range(100), depth=3)
  assert next(gen) == 0
  time.sleep(0.05)
  assert len(started) <= 4  # the item used, and at most depth more
  gen.close()


def test_prefetched_raises_the_workers_error_at_its_item():
  def prepare(x):
    if x == 2:
      raise ValueError("bad query 2")
    return x

  gen = pipeline.prefetched(prepare, range(5))
  assert [next(gen), next(gen)] == [0, 1]
  with pytest.raises(ValueError, match="bad query 2"):
    next(gen)


def test_prefetched_refuses_a_depth_below_one():
  with pytest.raises(ValueError, match="depth=0 must be >= 1"):
    list(pipeline.prefetched(lambda x: x, [1], depth=0))


def test_ordered_writer_writes_in_order_off_the_callers_thread():
  main, written = threading.get_ident(), []

  def write(x):
    time.sleep(0.005 * (5 - x))  # later records are quicker: order must still hold
    written.append((x, threading.get_ident()))

  with pipeline.OrderedWriter(write) as w:
    for x in range(5):
      w.submit(x)
  assert [x for x, _ in written] == list(range(5)) and all(t != main for _, t in written)


def test_ordered_writer_raises_the_first_failed_write_and_writes_nothing_after_it():
  written = []

  def write(x):
    if x == 1:
      raise OSError("disk full")
    written.append(x)

  w = pipeline.OrderedWriter(write, depth=1)
  w.submit(0)
  w.submit(1)
  with pytest.raises(OSError, match="disk full"):
    w.submit(2)  # waits for write 1, which failed
  with pytest.raises(OSError, match="disk full"):
    w.close()
  assert written == [0]


def test_ordered_writer_writes_nothing_queued_behind_a_failed_write():
  written, gate = [], threading.Event()

  def write(x):
    if x == 0:
      gate.wait(1)
      raise OSError("disk full")
    written.append(x)

  w = pipeline.OrderedWriter(write, depth=3)
  for x in range(3):
    w.submit(x)  # 1 and 2 queue behind 0
  gate.set()
  with pytest.raises(OSError, match="disk full"):
    w.close()
  assert written == []
