"""scripts/serve.py as a process: SIGTERM during load answers every request in flight and exits 0;
bad settings, a busy port, an address not here and several processes print one line and exit 2 before anything
is loaded."""

import asyncio
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from maxscore import serving
from maxscore.distributed import processes
from maxscore.testing import scripts

REPO = pathlib.Path(__file__).resolve().parent.parent
SERVE = [sys.executable, str(REPO / "scripts" / "serve.py")]


@pytest.mark.slow
def test_bad_setting_is_one_line_and_exit_2(tmp_path):
  r = subprocess.run(SERVE + ["--max_queue=0"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
  assert r.returncode == 2, r.stderr
  assert r.stderr.strip().splitlines()[-1] == "error: serve settings: max_queue=0 must be >= 1"
  assert list(tmp_path.iterdir()) == []


def _start(args) -> tuple[subprocess.Popen, str]:
  # SIGINT's default action in the child (a background job would inherit it ignored): Ctrl-C is tested too.
  proc = subprocess.Popen(processes.with_sigint(SERVE + args), stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
  deadline = time.monotonic() + 600
  for line in proc.stderr:  # "serving 'name' on http://127.0.0.1:PORT (...)"
    m = re.search(r"serving .* on (http://\S+)", line)
    if m:
      return proc, m.group(1)
    assert time.monotonic() < deadline, "the server did not start"
  raise AssertionError(f"the server exited with {proc.wait()} before serving")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl_c"])
def test_sigterm_during_load_answers_what_is_in_flight_and_exits_0(sig):
  """SIGTERM, or Ctrl-C (which every other script takes as a stop at once): the server drains."""
  proc, url = _start(["--port=0", "--warmup_items=0", "--max_batch_wait_ms=3000", "--max_batch_requests=16"])
  try:
    body = {"query": [11, 12, 13], "items": [[14, 15], [16]], "label_token_ids": [4, 5], "apply_softmax": True}
    first = httpx.post(url + "/v1/score", json=body, timeout=300)  # compiles the batch-1 shape
    assert first.status_code == 200

    async def load():
      async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        tasks = [asyncio.create_task(client.post("/v1/score", json=body)) for _ in range(12)]
        deadline = time.monotonic() + 60
        while (await client.get("/health")).json()["queue_depth"] < len(tasks):  # all 12 in flight
          assert time.monotonic() < deadline, "the requests did not reach the queue"
          await asyncio.sleep(0.02)
        proc.send_signal(sig)
        return await asyncio.gather(*tasks, return_exceptions=True)
    answers = asyncio.run(load())
    assert proc.wait(timeout=300) == 0
  finally:
    if proc.poll() is None:
      proc.kill()
  answered = [a for a in answers if isinstance(a, httpx.Response)]
  assert answered and all(a.status_code == 200 for a in answered), answers
  for a in answered:
    np.testing.assert_allclose(a.json()["scores"], first.json()["scores"], rtol=0, atol=1e-6)
  assert len(answered) == len(answers), [a for a in answers if not isinstance(a, httpx.Response)]


def test_several_processes_are_refused_in_one_line():
  with pytest.raises(serving.ServeError, match="runs in one process, but jax.distributed started 2"):
    serving.check_single_process(2)


def test_a_busy_port_or_an_address_not_here_is_one_line_before_the_model_loads(monkeypatch, capsys):
  """Found by binding before the load and warmup (tens of seconds), not by uvicorn after them (its Errno 98 and
  exit 3)."""
  with socket.socket() as held:
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    busy = (f"cannot listen on --host=127.0.0.1 --port={port}: Address already in use; another process listens "
            f"there: choose another --port (0: any free port)")
    with pytest.raises(serving.ServeError, match=re.escape(busy)):
      serving.check_listen("127.0.0.1", port)
    with pytest.raises(serving.ServeError, match=re.escape("cannot listen on --host=192.0.2.1 --port=8000: ")):
      serving.check_listen("192.0.2.1", 8000)  # TEST-NET-1: no interface of this machine has it
    serving.check_listen("127.0.0.1", 0)
    serving.check_listen("", 0)  # every interface, as uvicorn takes ""
    monkeypatch.setattr(serving, "build_service", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(SystemExit) as e:
      scripts.load_script("serve").run(["serve.py", f"--port={port}"])
  assert e.value.code == 2 and capsys.readouterr().err.strip().splitlines() == [f"error: {busy}"]
