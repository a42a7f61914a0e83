"""Ctrl-C (maxscore/interrupt.py): a flag checked at safe points, one line and exit 130 from every script, a
second Ctrl-C at once, and a run that resumes bit for bit from where it stopped.

Children start with SIGINT's default action: a shell starts background jobs with SIGINT ignored, and a suite
run in the background would otherwise not test Ctrl-C at all.
"""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from maxscore import interrupt
from maxscore.distributed import processes
from maxscore.testing.gguf_files import write_gguf
from maxscore.testing.hf_models import make_hf_model

REPO = pathlib.Path(__file__).resolve().parent.parent
TRAIN_FLAGS = ["--max_train_queries=6", "--max_dev_queries=3", "--max_query_tokens=8", "--max_item_tokens=24",
               "--batch_size=2", "--num_epochs=3", "--eval_every=2", "--save_every=2", "--keep_checkpoints=2",
               "--warmup_steps=2", "--learning_rate=1e-2"]
STOP_LINE = (r"stopped at step (\d+) \(Ctrl-C\); (the last checkpoint is step (\d+)|no checkpoint was written yet) "
             r"in .*: (run the same command to resume from it|a rerun starts over)")


def _run(cmd, env_extra=None, timeout=300, **kw):
  env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu", **(env_extra or {})}
  return subprocess.run(processes.with_sigint(cmd), env=env, capture_output=True, text=True, timeout=timeout, **kw)


# --- the handler alone (the module loaded by path: no JAX in these children) ---------------------------------
_CHILD = """
import importlib.util, os, signal, sys, time
spec = importlib.util.spec_from_file_location("interrupt", {path!r})
interrupt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(interrupt)
print(interrupt.install(), flush=True)
"""


def _child(body, tmp_path, sigint="SIG_DFL"):
  script = tmp_path / "child.py"
  script.write_text(_CHILD.format(path=str(REPO / "maxscore" / "interrupt.py")) + textwrap.dedent(body))
  return subprocess.run(processes.with_sigint([sys.executable, str(script)], sigint), capture_output=True,
                        text=True, timeout=60)


def test_with_sigint_gives_the_child_the_action_asked_for_whatever_ours_and_keeps_its_process_id():
  """processes.with_sigint: from a parent with SIGINT ignored (a shell's background job) the child gets the
  default action, or keeps it ignored when asked; the command is exec'd, so the process id Popen reports is its."""
  report = "import os, signal; print(os.getpid(), signal.getsignal(signal.SIGINT) is signal.SIG_IGN)"
  before = signal.signal(signal.SIGINT, signal.SIG_IGN)
  try:
    for action, ignored in (("SIG_DFL", "False"), ("SIG_IGN", "True")):
      proc = subprocess.Popen(processes.with_sigint([sys.executable, "-c", report], action), stdout=subprocess.PIPE,
                              text=True)
      out, _ = proc.communicate(timeout=60)
      assert proc.returncode == 0 and out.split() == [str(proc.pid), ignored], (action, out)
  finally:
    signal.signal(signal.SIGINT, before)
  with pytest.raises(ValueError, match="SIG_DFL or SIG_IGN"):
    processes.with_sigint(["true"], "SIG_HOLD")


def test_inside_stop_points_the_first_ctrl_c_is_a_flag_and_the_second_stops_at_once(tmp_path):
  done = _child("""
      with interrupt.stop_points():
        os.kill(os.getpid(), signal.SIGINT)
        while not interrupt.requested():
          time.sleep(0.01)
        print("still running", flush=True)
        with interrupt.note(lambda: "the last checkpoint is step 4"):
          os.kill(os.getpid(), signal.SIGINT)
          time.sleep(30)
      print("not reached", flush=True)
      """, tmp_path)
  assert done.returncode == 130
  assert done.stdout.split() == ["True", "still", "running"]
  assert done.stderr == "stopped (Ctrl-C); the last checkpoint is step 4\n"


def test_outside_stop_points_ctrl_c_stops_at_once_and_removes_the_output_being_written(tmp_path):
  done = _child(f"""
      tmp = {str(tmp_path / "out.tmp")!r}
      os.mkdir(tmp)
      open(os.path.join(tmp, "half"), "w").write("x")
      with interrupt.removed_on_stop(tmp):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)  # a wait in C: the handler of Python would not run before it ends
      print("not reached", flush=True)
      """, tmp_path)
  assert (done.returncode, done.stderr) == (130, "stopped (Ctrl-C)\n")
  assert not (tmp_path / "out.tmp").exists()


def test_an_ignored_sigint_stays_ignored(tmp_path):
  """A background job of a non-interactive shell inherits SIGINT ignored: Ctrl-C is not meant for it."""
  done = _child("""
      os.kill(os.getpid(), signal.SIGINT)
      time.sleep(0.2)
      print("finished", flush=True)
      """, tmp_path, sigint="SIG_IGN")
  assert (done.returncode, done.stdout.split()) == (0, ["False", "finished"])


# --- training: planted Ctrl-C, then the same command resumes bit for bit ------------------------------------
def _train(workdir, cache, *extra, point=None):
  cmd = [sys.executable, str(REPO / "scripts" / "train_reranker.py"), f"--workdir={workdir}",
         f"--feature_cache={cache}", *TRAIN_FLAGS, *extra]
  return _run(cmd, {interrupt.TEST_SIGNAL_AT_ENV: point} if point else None)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  root = tmp_path_factory.mktemp("train")
  done = _train(root / "work", root / "features.npz")
  assert done.returncode == 0, done.stderr[-3000:]
  return root, done


def test_training_shows_its_progress_on_the_console(uninterrupted):
  """Features and steps on stderr (progress defaults to true); INFO lines stay in the log file."""
  root, done = uninterrupted
  lines = done.stderr.splitlines()
  assert "features: 6/6 queries" in lines and "features: 3/3 queries" in lines
  assert [line for line in lines if line.startswith("train: step")][-1].startswith("train: step 9/9 loss ")
  assert "train: step 1/9 loss" in (root / "work" / "train_reranker.log").read_text()
  # never silent for long: the first step's compile is announced and its loss shown, and each dev evaluation
  steps = [line for line in lines if line.startswith("train: step")]
  assert steps[:3] == [steps[0], "train: step 1/9: compiling the training step", steps[2]], steps
  assert re.fullmatch(r"train: step 0/9 dev .*ndcg_cut_10 [\d.]+ \([\d.]+ s\)", steps[0]), steps
  assert re.fullmatch(r"train: step 1/9 loss [\d.]+ \(compiled and run in [\d.]+ s\)", steps[2]), steps
  assert sum(" dev " in line for line in steps) == 6  # steps 0, 2, 4, 6, 8 and 9
  quiet = _train(root / "quiet", root / "features.npz", "--noprogress")
  assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr[-2000:]


@pytest.mark.parametrize("point,stops_at,saved", [("compile", 1, 1), ("step:3", 3, 3), ("save:4", 4, 4)])
def test_ctrl_c_at_a_planted_point_stops_with_one_line_and_resumes_bit_for_bit(uninterrupted, tmp_path, point,
                                                                                 stops_at, saved):
  """Ctrl-C during the first compile, between steps, or with a checkpoint save in flight: the run stops at the
  next safe point (after that step), saves it first (save_every=2 would have lost step 3; step 4 was being saved
  already), says where it stands, and the same command ends as the uninterrupted run: metrics.jsonl (every loss
  and dev metric) byte for byte, the same final params."""
  root, _ = uninterrupted
  stopped = _train(tmp_path / "work", root / "features.npz", "--noprogress", point=point)
  assert stopped.returncode == 130, stopped.stderr[-3000:]
  want = (f"stopped at step {stops_at} (Ctrl-C); " + (
      f"no checkpoint was written yet in {tmp_path / 'work'}: a rerun starts over" if saved is None else
      f"the last checkpoint is step {saved} in {tmp_path / 'work'}: run the same command to resume from it"))
  assert stopped.stderr == want + "\n"
  resumed = _train(tmp_path / "work", root / "features.npz", "--noprogress")
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  a, b = (json.loads((d / "summary.json").read_text()) for d in (root / "work", tmp_path / "work"))
  assert b["resumed_from_step"] == saved and a["params_sha256"] == b["params_sha256"]
  assert (root / "work" / "metrics.jsonl").read_text() == (tmp_path / "work" / "metrics.jsonl").read_text()


def test_ctrl_c_while_features_are_computed_keeps_the_log_and_says_a_rerun_starts_over(tmp_path):
  stopped = _train(tmp_path / "work", tmp_path / "features.npz", point="features:3")
  assert stopped.returncode == 130, stopped.stderr[-3000:]
  assert stopped.stderr.splitlines()[-1] == (f"stopped (Ctrl-C); no checkpoint was written yet in "
                                             f"{tmp_path / 'work'}: a rerun starts over")
  assert "Traceback" not in stopped.stderr
  assert (tmp_path / "work" / "train_reranker.log").read_text().count("\n") > 3  # the run's log is kept
  assert not (tmp_path / "features.npz").exists()


# --- conversion ----------------------------------------------------------------------------------------------
def test_ctrl_c_in_a_conversion_leaves_no_output_and_no_temporary_directory(tmp_path):
  write_gguf(make_hf_model("llama", vocab_size=64, hidden_size=32, intermediate_size=64, head_dim=8,
                           rope_scaling=None), tmp_path / "m.gguf")
  out = tmp_path / "converted" / "model"
  cmd = [sys.executable, str(REPO / "scripts" / "convert_gguf_checkpoint.py"), f"--gguf={tmp_path / 'm.gguf'}",
         f"--output_dir={out}"]
  stopped = _run(cmd, {interrupt.TEST_SIGNAL_AT_ENV: "replace_dir"})
  assert (stopped.returncode, stopped.stderr) == (130, f"stopped (Ctrl-C); {out} is as it was\n")
  assert list(out.parent.iterdir()) == []  # neither the output nor its temporary directory
  done = _run(cmd)
  assert done.returncode == 0 and out.is_dir(), done.stderr[-2000:]


def test_the_first_ctrl_c_is_taken_while_the_main_thread_waits(tmp_path):
  """The watcher acts at once, also while the main thread sits in a long C call (time.sleep stands for a
  compile): nothing waits for the next Python bytecode."""
  t0 = time.monotonic()
  done = _child("""
      os.kill(os.getpid(), signal.SIGINT)
      time.sleep(30)
      """, tmp_path)
  assert done.returncode == 130 and time.monotonic() - t0 < 20


def test_every_entry_script_imports_maxscore_first():
  """The package's import installs the handler, so each script imports it before anything slower (absl's flags
  alone take a quarter of a second on a busy machine): a Ctrl-C from then on is one line, not a traceback."""
  import ast
  import pathlib
  scripts = sorted((pathlib.Path(__file__).resolve().parent.parent / "scripts").glob("*.py"))
  assert scripts
  for path in scripts:
    imports = [node for node in ast.parse(path.read_text()).body if isinstance(node, (ast.Import, ast.ImportFrom))]
    first = imports[0]
    assert isinstance(first, ast.Import) and [a.name for a in first.names] == ["maxscore"], path.name


def test_a_finished_run_ignores_ctrl_c_while_the_process_exits(tmp_path):
  """After main returns, cli.run_script ignores SIGINT: a Ctrl-C during the interpreter's teardown (XLA's threads
  take seconds) neither kills the finished process by the signal nor goes half-handled. The child sends itself
  SIGINT after its work and still exits with the run's own status (without the change: 130, "stopped")."""
  script = tmp_path / "finished.py"
  script.write_text(textwrap.dedent("""
      import maxscore
      import os, signal, time
      from maxscore import cli

      def main(argv):
        print("work done", flush=True)
        return 0

      try:
        cli.run_script(main)
      finally:  # as if Ctrl-C came while the interpreter winds down
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)
      """))
  done = _run([sys.executable, str(script)])
  assert (done.returncode, done.stdout, done.stderr) == (0, "work done\n", ""), done.stderr[-2000:]
