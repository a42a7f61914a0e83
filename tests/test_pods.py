"""Pods on one machine (docs/ARCHITECTURE.md section 8): 4 jax.distributed processes of 2 CPU devices each against
one process of 8 devices with the same mesh shape, runs resumed on another number of processes, and a process
killed mid-run (a SIGKILL planted at a named point of the work, maxscore/interrupt.py) named by the survivors in one line: a
process of the eval, and process 0 (which holds JAX's coordination service) of the training."""

import json
import pathlib
import re
import shutil
import socket
import sys
import threading
import time

import numpy as np
import pytest

from maxscore import interrupt
from maxscore.distributed import mesh as mesh_lib
from maxscore.distributed import peers
from maxscore.distributed.peers import LOST_PEER_EXIT_CODE
from maxscore.distributed import processes

REPO = pathlib.Path(__file__).resolve().parent.parent
HEARTBEAT_S = 30  # the survivors stop within it (their watchdog decides at a third of it)
LOST_LINE = re.compile(r"error: process (\d+) of (\d+) stopped \((?:no heartbeat for [\d.]+ s|its coordination "
                       r"service closed)\): .*Run the same "
                       r"command on every host to resume; finished work is kept")
# Eval: the mesh (data 4, tensor 2) as one process of 8 devices, as 4 processes with data across them and tensor
# within, and as 2 processes (data 2 across them).
# One item-count bucket and no length groups: a row shape per query length, so each process compiles a few programs
# instead of one per (count, length) pair (22 s instead of 33 s for the one-process run).
EVAL = [sys.executable, str(REPO / "scripts" / "eval_rerank.py"), "--max_queries=8", "--noprogress",
        "item_count_buckets=[32]", "length_group_ratio=1000"]
REPLICATED_NOTE = "computed on each of those devices"  # eval's warning for a group whose data axis holds 2+ devices
EVAL_MESH = {1: ["ici_data_parallelism=4", "ici_tensor_parallelism=2"],
             4: ["dcn_data_parallelism=4", "ici_data_parallelism=1", "ici_tensor_parallelism=2"],
             2: ["dcn_data_parallelism=2", "ici_data_parallelism=1", "ici_tensor_parallelism=2"]}
# Training: the mesh (data 2, fsdp 4) as one process of 8 devices and as 4 processes with fsdp across them and
# data within; resumed as 2 processes (fsdp 2 across, data 2 within) and as one process of 2 devices (data 2).
TRAIN = [sys.executable, str(REPO / "scripts" / "train_reranker.py"), "--train_backbone", "--use_bias=false",
         "--max_train_queries=8", "--dev_split=", "--max_query_tokens=8", "--max_item_tokens=16", "--batch_size=8",
         "--num_steps=5", "--eval_every=0", "--save_every=2", "--keep_checkpoints=3", "--warmup_steps=0",
         "--learning_rate=1e-4", "--noprogress"]
LORA = ["--lora_rank=4", "--lora_alpha=8", "--lora_targets=q,v,up"]
# Runs that are never resumed save only their last step (a checkpoint save costs 1.5-3 s here).
NO_CHECKPOINTS = ["--save_every=0"]
TRAIN_MESH = {(1, 8): ["ici_data_parallelism=2", "ici_fsdp_parallelism=4"],
              (4, 2): ["dcn_fsdp_parallelism=4", "ici_data_parallelism=2", "ici_fsdp_parallelism=1"],
              (2, 2): ["dcn_fsdp_parallelism=2", "ici_data_parallelism=2", "ici_fsdp_parallelism=1"],
              (1, 2): ["ici_data_parallelism=2"]}


class _Runs:
  """`command + mesh flags` as `count` processes of `devices` devices, started now (process `killed` SIGKILLs
  itself at `kill_at`); `finish()` waits for them. A one-process oracle is started beside the run it checks: the
  4-process runs leave the cores idle while their processes wait for each other and for the watchdog's verdict."""
  started: list = []  # every run's processes, for _no_strays

  def __init__(self, command, count: int, devices: int, *, killed: int = -1, kill_at: str = ""):
    port = processes.free_port()

    def cmd(i):
      flags = processes.coordinator_flags(port, count, i, HEARTBEAT_S) if count > 1 else []
      if i == killed:  # its planted SIGKILL (maxscore/interrupt.py), in its environment alone
        return ["env", f"{interrupt.TEST_SIGNAL_AT_ENV}={kill_at}", f"{interrupt.TEST_SIGNAL_ENV}=SIGKILL", *command,
                *flags]
      return [*command, *flags]
    self.start = time.time()
    self.procs = processes.start_processes(cmd, count, devices)
    _Runs.started.append(self.procs)

  def finish(self):
    """(each process's Finished, wall seconds from the start to the last one's end)."""
    results = processes.collect(self.procs, timeout_s=900)
    return results, max(r.ended for r in results) - self.start


@pytest.fixture(autouse=True)
def _no_strays():
  """A test that fails while runs it started beside another are still going kills them."""
  yield
  for procs in _Runs.started:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  _Runs.started.clear()


def _run(command, count: int, devices: int, **kill):
  """_Runs(...).finish(): (results, wall seconds)."""
  return _Runs(command, count, devices, **kill).finish()


def _ok(results):
  assert [r.code for r in results] == [0] * len(results), [r.stderr[-3000:] for r in results]


def _assert_lost_named(results, killed: int):
  """The killed process died by SIGKILL; every other one exited LOST_PEER_EXIT_CODE within the heartbeat timeout,
  with the one line naming it as its last, and no crash dump or traceback. Returns the seconds the last one
  took after the kill."""
  assert results[killed].code == -9, results[killed].stderr[-2000:]
  killed_at = float(results[killed].stderr.split(interrupt.KILLED_AT)[-1].split()[0])
  for i, r in enumerate(results):
    if i == killed:
      continue
    last = r.stderr.strip().splitlines()[-1]
    runtime_lines = [l for l in r.stderr.splitlines() if re.match(r"[FE]\d{4} |Fatal|\*\*\*", l)]
    assert r.code == LOST_PEER_EXIT_CODE, (i, r.code, runtime_lines[:20], r.stderr[-1500:])
    m = LOST_LINE.fullmatch(last)
    assert m and int(m.group(1)) == killed and int(m.group(2)) == len(results), (i, last)
    assert sum(bool(LOST_LINE.fullmatch(l)) for l in r.stderr.splitlines()) == 1
    for dump in ("Fatal Python error", "Traceback", "Check failure stack trace", "Terminating process",
                 "terminate called"):
      assert dump not in r.stderr, (i, dump, r.stderr[-3000:])
  after = max(r.ended for r in results) - killed_at
  assert after < HEARTBEAT_S, after
  return after


# --- eval ------------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("killed", [2, 0], ids=["process_2", "coordinator"])
def test_eval_in_four_processes_equals_one_process_and_a_killed_process_is_named_and_resumed_in_two(tmp_path,
                                                                                                    killed):
  """Process 2, or process 0 (the coordinator, which writes the outputs), dies as it starts its second query; the
  others name it. Every query the four processes finished scored as in one process; 2 processes finish the eval,
  scoring only what is missing, and the outputs are the one-process run's."""
  eval_single, out = tmp_path / "single", tmp_path / "out"
  single = _Runs(EVAL + [f"--output_dir={eval_single}"] + EVAL_MESH[1], 1, 8)
  results, wall = _run(EVAL + [f"--output_dir={out}"] + EVAL_MESH[4], 4, 2, killed=killed, kill_at="query:2")
  print(f"eval, 4 processes, process {killed} killed: {wall:.1f}s wall")
  assert not any(REPLICATED_NOTE in r.stderr for r in results)  # a group per process, tensor 2 within
  after = _assert_lost_named(results, killed)
  print(f"the survivors named process {killed} and stopped {after:.1f}s after the kill")
  lines = (out / "results.jsonl").read_text().splitlines()
  records = [json.loads(l) for l in lines[1:]]  # every line whole (the first is the header)
  # Process 0 gathers and writes each round's records: losing another process leaves the first round written
  # (4 queries), losing process 0 what its writer had appended when it died (each line whole or absent).
  assert (4 if killed else 0) <= len(records) < 8 and not (out / "run.trec").exists()
  resumed = _Runs(EVAL + [f"--output_dir={out}"] + EVAL_MESH[2], 2, 2)
  single_results, single_wall = single.finish()
  _ok(single_results)
  print(f"eval, 1 process x 8 devices, beside them: {single_wall:.1f}s wall")
  # One data group of data 4 x tensor 2: each query's rows are computed on all 4 data rows, and the run says so.
  assert REPLICATED_NOTE in single_results[0].stderr, single_results[0].stderr[-2000:]
  oracle = {r["qid"]: r for r in map(json.loads, (eval_single / "results.jsonl").read_text().splitlines()[1:])}
  # A record's timing, and whether its process compiled, differ between runs; its scores and the rest do not.
  same = lambda r: {k: v for k, v in r.items() if k not in ("seconds", "compiled")}
  assert all(same(r) == same(oracle[r["qid"]]) for r in records)
  results, wall = resumed.finish()
  _ok(results)
  print(f"eval resumed by 2 processes: {wall:.1f}s wall")
  summary = json.loads((out / "summary.json").read_text())
  assert summary["queries_resumed"] == len(records) and summary["processes"] == 2
  for name in ("run.trec", "metrics.json", "metrics_per_query.jsonl"):
    assert (out / name).read_bytes() == (eval_single / name).read_bytes(), name
  # Every candidate of the 8 queries reranked: as many lines as the first stage (BM25's top 30, or fewer where
  # BM25 matched fewer paragraphs).
  lines = (out / "run.trec").read_text().count("\n")
  assert lines == (eval_single / "first_stage.trec").read_text().count("\n") and 8 * 20 < lines <= 8 * 30


# --- training --------------------------------------------------------------------------------------------------
def _losses(workdir: pathlib.Path) -> dict[int, float]:
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  return {r["step"]: r["loss"] for r in rows if r["kind"] == "train"}


def _train(root: pathlib.Path, extra, count: int, devices: int, **kill) -> _Runs:
  return _Runs(TRAIN + [f"--workdir={root / 'work'}", *extra, *TRAIN_MESH[(count, devices)]], count, devices, **kill)


@pytest.mark.slow
def test_lora_training_in_four_processes_equals_one_process(tmp_path):
  runs = {(count, devices): _train(tmp_path / str(count), LORA + NO_CHECKPOINTS, count, devices)
          for count, devices in ((1, 8), (4, 2))}
  losses = {}
  for (count, devices), run in runs.items():
    results, wall = run.finish()
    _ok(results)
    print(f"training (lora), {count} process(es) x {devices} devices, side by side: {wall:.1f}s wall")
    losses[count] = _losses(tmp_path / str(count) / "work")
  assert sorted(losses[1]) == sorted(losses[4]) == [1, 2, 3, 4, 5]
  np.testing.assert_allclose([losses[4][s] for s in losses[1]], list(losses[1].values()), rtol=0, atol=1e-6)


@pytest.mark.slow
def test_training_in_four_processes_equals_one_process_and_a_killed_process_is_named_and_resumed_in_two_and_one(
    tmp_path):
  """Process 0, the coordinator, dies as step 4 begins; the others name it. The steps the four processes took
  have the one-process run's losses; the last checkpoint resumes in 2 processes and in one, and the steps after
  it have them too."""
  one = _train(tmp_path / "one", NO_CHECKPOINTS, 1, 8)
  root = tmp_path / "killed"
  results, wall = _train(root, [], 4, 2, killed=0, kill_at="begin:4").finish()
  print(f"training, 4 processes, process 0 killed: {wall:.1f}s wall")
  after = _assert_lost_named(results, 0)
  print(f"the survivors named process 0 and stopped {after:.1f}s after the kill")
  work = root / "work"
  steps = sorted(int(p.name) for p in (work / "checkpoints").iterdir() if p.name.isdigit())
  assert steps == [2], steps  # the step-2 checkpoint, whole; nothing of a later one but Orbax's temporary names
  assert not (work / "summary.json").exists()
  resumes = {}
  for count, devices in ((1, 2), (2, 2)):
    resumed = tmp_path / f"resumed_{count}"
    shutil.copytree(root, resumed)
    resumes[count] = (resumed, _train(resumed, [], count, devices))
  results, wall = one.finish()
  _ok(results)
  print(f"training (full), 1 process x 8 devices, beside them: {wall:.1f}s wall")
  one_process = _losses(tmp_path / "one" / "work")
  four = _losses(work)
  assert sorted(four) == [1, 2, 3], four  # step 4 began and never ended
  np.testing.assert_allclose([four[s] for s in (1, 2, 3)], [one_process[s] for s in (1, 2, 3)], rtol=0, atol=1e-6)
  for count, (resumed, run) in resumes.items():
    results, wall = run.finish()
    _ok(results)
    print(f"training resumed by {count} process(es), side by side: {wall:.1f}s wall")
    summary = json.loads((resumed / "work" / "summary.json").read_text())
    assert summary["resumed_from_step"] == 2
    losses = _losses(resumed / "work")
    np.testing.assert_allclose([losses[s] for s in (3, 4, 5)], [one_process[s] for s in (3, 4, 5)],
                               rtol=0, atol=1e-6)


# --- the docs ---------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_multi_host_guide_names_flags_and_environment_variables_that_exist():
  """Every --flag and environment variable the multi-host guide (docs/pods-and-gpus.md) names is one a process
  reads: a flag of the distributed start-up or of the scripts, or a variable JAX or maxscore reads."""
  section = (REPO / "docs" / "pods-and-gpus.md").read_text()
  ours = [l for l in section.splitlines() if "gcloud" not in l and not l.strip().startswith("#SBATCH")]
  flags = {f for f in re.findall(r"--([a-z_]+)\b(?!-)", "\n".join(ours)) if not f.startswith("xla_")}
  from absl import flags as absl_flags  # pylint: disable=import-outside-toplevel
  fv = absl_flags.FlagValues()
  mesh_lib.define_flags(fv)
  script_flags = {name for s in ("eval_rerank", "train_reranker") for name in _script_flags(s)}
  assert flags and flags <= set(fv) | script_flags, flags - set(fv) - script_flags
  variables = set(re.findall(r"\b((?:JAX|SLURM|TPU|XLA|OMPI)_[A-Z_]+)", section))
  jax_src = pathlib.Path(mesh_lib.jax.__file__).parent / "_src"
  jax_source = "\n".join(p.read_text() for p in [*jax_src.glob("clusters/*.py"), jax_src / "distributed.py",
                                                  jax_src / "config.py", jax_src / "xla_bridge.py"])
  maxscore_source = (REPO / "maxscore" / "distributed" / "mesh.py").read_text()
  unknown = {v for v in variables if v not in jax_source and v not in maxscore_source and v != "XLA_FLAGS"}
  assert variables and not unknown, unknown


def _script_flags(name: str) -> set[str]:
  from maxscore.testing.scripts import load_script  # pylint: disable=import-outside-toplevel
  from absl import flags as absl_flags  # pylint: disable=import-outside-toplevel
  module = load_script(name)
  fv = absl_flags.FlagValues()
  module.define_flags(fv)
  return set(fv)


# --- the watchdog alone ------------------------------------------------------------------------------------------
class _KeyValues:
  """The coordination service's key-value store as the watchdog uses it."""

  def __init__(self):
    self.values, self.lock = {}, threading.Lock()

  def key_value_set(self, key, value, allow_overwrite=False):
    assert allow_overwrite
    with self.lock:
      self.values[key] = value

  def key_value_dir_get(self, prefix):
    with self.lock:
      return [(k, v) for k, v in self.values.items() if k.startswith(prefix)]


def _watch_until_verdict(monkeypatch, index: int, silent: dict[int, str], timeout_s: float = 2.0):
  """A watchdog of process `index` of 3 (heartbeat timeout 1.5 s) whose other peers beat, except those in `silent`
  (peer -> its last value); (exit code, stderr line) when it stops the process, or None."""
  store, ended = _KeyValues(), []
  stopped, released = threading.Event(), threading.Event()

  def fake_exit(code):  # the watchdog thread waits here instead of ending the test process
    ended.append(code)
    stopped.set()
    released.wait()
  monkeypatch.setattr(peers, "exit_now", fake_exit)
  said = []
  monkeypatch.setattr(peers, "_say", said.append)
  watchdog = peers.Watchdog(store, index, 3, heartbeat_timeout_s=1.5)
  for p, value in silent.items():
    store.key_value_set(f"{peers._PREFIX}{p}", value, allow_overwrite=True)  # pylint: disable=protected-access
  beating = [p for p in range(3) if p != index and p not in silent]
  done = threading.Event()

  def beat():
    n = 0
    while not done.wait(0.05):
      n += 1
      for p in beating:
        store.key_value_set(f"{peers._PREFIX}{p}", str(n), allow_overwrite=True)  # pylint: disable=protected-access
  threading.Thread(target=beat, daemon=True).start()
  watchdog.start()
  try:
    stopped.wait(timeout_s)
  finally:
    done.set()
    watchdog._stop.set()  # pylint: disable=protected-access
    released.set()
  return (ended[0], said[0]) if ended else None


@pytest.mark.slow
def test_watchdog_names_the_silent_peer_and_only_it(monkeypatch):
  code, line = _watch_until_verdict(monkeypatch, 1, {2: "7"})
  assert code == LOST_PEER_EXIT_CODE and LOST_LINE.fullmatch(line) and line.startswith("error: process 2 of 3 ")
  # A peer that ended normally, or is stopping itself, is not lost.
  assert _watch_until_verdict(monkeypatch, 1, {2: "done"}) is None
  assert _watch_until_verdict(monkeypatch, 0, {2: "stopping"}) is None


@pytest.mark.slow
def test_process_zero_speaks_last(monkeypatch):
  """Process 0 holds the coordination service: it waits (a few beats) for the other survivors to say they are
  stopping, so their runtime does not abort them first."""
  start = time.monotonic()
  code, line = _watch_until_verdict(monkeypatch, 0, {2: "7"}, timeout_s=5.0)
  waited = time.monotonic() - start
  assert code == LOST_PEER_EXIT_CODE and line.startswith("error: process 2 of 3 ")
  w = peers.Watchdog(None, 0, 3, 1.5)
  assert waited > w.stale_s + 3 * w.interval_s  # process 1 beats on and never says it is stopping


def test_coordinator_hook_gives_every_client_but_process_zeros_an_error_callback_and_then_steps_aside():
  """Process 0's client keeps the runtime's own handling (it holds the service); the others' get the callback
  that routes a lost coordinator to peers.name_lost_coordinator. The hook is gone once initialization is done."""
  made = []

  class FakeJaxLib:
    @staticmethod
    def get_distributed_runtime_client(address, node_id, **kwargs):
      made.append((address, node_id, sorted(kwargs)))
      return len(made)
  original = FakeJaxLib.get_distributed_runtime_client
  lib = FakeJaxLib()
  with peers.coordinator_hook(lib):
    lib.get_distributed_runtime_client("h:1", 0, init_timeout=5)
    assert lib.get_distributed_runtime_client("h:1", 3, init_timeout=5) == 2
    lib.get_distributed_runtime_client(address="h:1", node_id=2)
  assert made == [("h:1", 0, ["init_timeout"]), ("h:1", 3, ["init_timeout", "missed_heartbeat_callback"]),
                  ("h:1", 2, ["missed_heartbeat_callback"])]
  assert lib.get_distributed_runtime_client is original
  assert "its coordination service closed" in peers.lost_message([0], 4, None)
  assert not peers.name_lost_coordinator("h:1", 0, 4)  # process 0 installs nothing


def test_a_coordinator_whose_port_closes_a_moment_after_its_error_is_gone_and_one_that_stays_is_not():
  """The lost coordinator's error can reach a survivor while the dying process's listening socket still takes
  connections: the check waits for the port to close instead of taking the coordinator for alive."""
  listener = socket.create_server(("127.0.0.1", 0))
  address = f"127.0.0.1:{listener.getsockname()[1]}"
  threading.Timer(0.5, listener.close).start()
  start = time.monotonic()
  assert peers.coordinator_gone(address, within_s=5.0)
  assert 0.4 < time.monotonic() - start < 4.0
  with socket.create_server(("127.0.0.1", 0)) as alive:
    assert not peers.coordinator_gone(f"127.0.0.1:{alive.getsockname()[1]}", within_s=0.5)
