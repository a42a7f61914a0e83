"""The serving request queue alone (maxscore/serving BatchQueue, no model and no server): requests gathered within
the wait, a failing one isolated, a cold payload compiled beside the warm ones, an unbuilt stack run one by one
and built for next time, and a large payload's parts taking turns with a small one. Through the server and a
model: tests/test_serving.py."""

import asyncio
import threading

import pytest

from maxscore import serving


def test_batch_queue_gathers_within_the_wait_and_isolates_a_failing_request():
  calls = []

  def run_batch(payloads):
    calls.append(list(payloads))
    if "bad" in payloads:
      raise ValueError("a bad payload")
    return [p * 2 for p in payloads]
  queue = serving.BatchQueue(run_batch, max_batch=4, max_wait_s=5.0, max_queue=8)
  queue.start()

  async def submit_all():
    return await asyncio.gather(*[queue.submit(p, 60) for p in (1, 2, "bad", 3)], return_exceptions=True)
  try:
    results = asyncio.run(submit_all())
  finally:
    queue.close(timeout_s=60)
  assert calls[0] == [1, 2, "bad", 3]  # one call: the batch filled before the wait ran out
  assert calls[1:] == [[1], [2], ["bad"], [3]]  # it failed, so each request ran alone
  assert results[:2] == [2, 4] and results[3] == 6 and isinstance(results[2], ValueError)


def test_batch_queue_compiles_a_cold_payload_beside_the_warm_ones():
  compiled, entered, release, order = {"warm"}, threading.Event(), threading.Event(), []

  def compile_(payloads):
    entered.set()
    assert release.wait(60)
    compiled.update(payloads)

  def run_batch(payloads):
    order.extend(payloads)
    return [p.upper() for p in payloads]
  queue = serving.BatchQueue(run_batch, max_batch=4, max_wait_s=0.5, max_queue=8,
                             is_warm=lambda ps: set(ps) <= compiled, compile=compile_)
  queue.start()

  async def submit_all():
    cold = asyncio.ensure_future(queue.submit("cold", 60))
    warm = asyncio.ensure_future(queue.submit("warm", 60))  # gathered into the same batch
    assert await warm == "WARM" and not cold.done()  # answered while the cold one compiles
    # the compile runs in its own thread, which a loaded machine may start after the warm answer
    assert await asyncio.to_thread(entered.wait, 30) and queue.depth == 1
    release.set()
    return await cold
  try:
    assert asyncio.run(submit_all()) == "COLD"
  finally:
    release.set()
    queue.close(timeout_s=60)
  assert order == ["warm", "cold"]


def test_batch_queue_runs_an_unbuilt_stack_one_by_one_and_builds_it_for_next_time():
  built, stack_built, calls = {("a",), ("b",)}, threading.Event(), []

  def compile_(payloads):
    built.add(tuple(sorted(payloads)))
    stack_built.set()

  def run_batch(payloads):
    calls.append(list(payloads))
    return list(payloads)
  queue = serving.BatchQueue(run_batch, max_batch=4, max_wait_s=0.5, max_queue=8,
                             is_warm=lambda ps: tuple(sorted(ps)) in built, compile=compile_)
  queue.start()

  async def both():
    return await asyncio.gather(queue.submit("a", 60), queue.submit("b", 60))
  try:
    assert asyncio.run(both()) == ["a", "b"] and calls == [["a"], ["b"]]  # each warm alone: no wait
    assert stack_built.wait(30) and ("a", "b") in built  # the stack compiled beside, for next time
    calls.clear()
    assert asyncio.run(both()) == ["a", "b"] and calls == [["a", "b"]]
  finally:
    queue.close(timeout_s=60)


def test_batch_queue_runs_a_large_payload_in_parts_that_take_turns():
  """A payload split into parts runs one part per turn; a payload that arrives while a part runs goes
  before the next part, and the large one's caller gets the merged result of every part, in order."""
  order, first_part = [], threading.Event()

  def run_batch(payloads):
    order.extend(payloads)
    if payloads == ["big:0"]:
      assert first_part.wait(60)
    return [p.upper() for p in payloads]
  queue = serving.BatchQueue(run_batch, max_batch=1, max_wait_s=0.0, max_queue=8,
                             split=lambda p: [f"{p}:{i}" for i in range(3)] if p == "big" else [p],
                             merge=lambda p, results: (p, results))
  queue.start()

  async def both():
    big = asyncio.ensure_future(queue.submit("big", 60))
    while order != ["big:0"]:
      await asyncio.sleep(0.01)
    small = asyncio.ensure_future(queue.submit("small", 60))
    while queue.depth < 1:
      await asyncio.sleep(0.01)
    first_part.set()
    return await big, await small
  try:
    assert asyncio.run(both()) == (("big", ["BIG:0", "BIG:1", "BIG:2"]), "SMALL")
  finally:
    first_part.set()
    queue.close(timeout_s=60)
  assert order == ["big:0", "small", "big:1", "big:2"]
  with pytest.raises(ValueError, match="together"):
    serving.BatchQueue(run_batch, 1, 0.0, 8, split=lambda p: [p])
