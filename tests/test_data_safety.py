"""Nothing lost, nothing mixed (docs/ARCHITECTURE.md section 9): outputs never replace inputs or foreign files,
--overwrite removes only what maxscore wrote, and a resumed run refuses changed content."""

import dataclasses
import importlib.util
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import hypothesis
import jax
import numpy as np
import pytest
from hypothesis import strategies as st

from maxscore import cli
from maxscore.checkpoints import storage
from maxscore.checkpoints.convert import convert_hf_checkpoint
from maxscore.errors import ResumeError, UnsafeOutputError
from maxscore.files import identity, safety
from maxscore.heads import score_heads as heads, train as train_lib
from maxscore.rerank import data, eval as eval_lib
from maxscore.scoring import jsonl as score_file

REPO = pathlib.Path(__file__).resolve().parent.parent
CFG = eval_lib.EvalConfig(max_query_tokens=4, max_item_tokens=8)


def _script(name):
  spec = importlib.util.spec_from_file_location(f"_safety_{name}", REPO / "scripts" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _tree(directory):
  """{relative path: bytes} of every file under `directory`."""
  return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _tiny_set(path, n=2):
  lines = [json.dumps({"qid": f"q{i}", "query": f"query {i}", "candidates": [
      {"docid": "a", "text": "some text"}, {"docid": "b", "text": f"other text {i}"}], "qrels": {"a": 1}})
           for i in range(n)]
  path.write_text("\n".join(lines) + "\n")
  return data.load_jsonl(path, "all")


def _foreign_dir(path):
  path.mkdir(parents=True)
  (path / "notes.txt").write_text("mine")
  return _tree(path)


@pytest.fixture(scope="module")
def scorer():
  return eval_lib.build_scorer(use_head=False)


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory):
  """Two maxscore checkpoints of the default architecture and tokenizer with different weights."""
  root = tmp_path_factory.mktemp("ckpts")
  base = storage.restore_checkpoint(data.DEFAULT_CHECKPOINT)
  tok = data.DEFAULT_CHECKPOINT / "tokenizer" / "tokenizer.model"
  out = []
  for name, scale in (("a", 1.0), ("b", 1.01)):
    params = jax.tree_util.tree_map(lambda x: np.asarray(x) * scale, base.params)
    out.append(storage.save_checkpoint(root / name, params, base.model, tokenizer_files=(tok,)))
  return out


# --- score.py ------------------------------------------------------------------------------------------
def test_score_output_equal_to_input_is_refused_and_input_kept(tmp_path, capsys):
  src = tmp_path / "req.jsonl"
  src.write_text('{"query": [1], "items": [[2]], "label_token_ids": [3]}\n')
  before = src.read_bytes()
  with pytest.raises(SystemExit) as e:
    _script("score").run(["score.py", f"--input={src}", f"--output={src}"])
  assert e.value.code == 2 and src.read_bytes() == before
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "--output" in err[0] and "is the input" in err[0]


def test_score_output_symlinked_to_the_input_is_refused(tmp_path, scorer):
  src = tmp_path / "req.jsonl"
  src.write_text('{"query": [1], "items": [[2]], "label_token_ids": [3]}\n')
  link = tmp_path / "out.jsonl"
  link.symlink_to(src)
  with pytest.raises(UnsafeOutputError, match="is the input"):
    score_file.score_jsonl(scorer, str(src), str(link))
  assert src.read_text().startswith('{"query"')


def test_score_killed_mid_run_leaves_the_previous_output_intact(tmp_path, scorer, monkeypatch):
  src, dst = tmp_path / "req.jsonl", tmp_path / "resp.jsonl"
  src.write_text('{"query": [1], "items": [[2]], "label_token_ids": [3]}\n' * 3)
  dst.write_text("previous responses\n")
  calls = []

  def dies(reqs, algorithm=None):
    calls.append(1)
    raise KeyboardInterrupt  # stands in for kill -9: nothing after this line of the run happens
  monkeypatch.setattr(scorer, "score_requests", dies)
  with pytest.raises(KeyboardInterrupt):
    score_file.score_jsonl(scorer, str(src), str(dst), batch_size=1)
  assert calls and dst.read_text() == "previous responses\n"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["req.jsonl", "resp.jsonl"]  # no temporary left


def test_score_kill_9_leaves_the_previous_output_intact(tmp_path):
  src, dst = tmp_path / "req.jsonl", tmp_path / "resp.jsonl"
  src.write_text('{"query": [1], "items": [[2]], "label_token_ids": [3]}\n' * 2000)
  dst.write_text("previous responses\n")
  proc = subprocess.Popen([sys.executable, str(REPO / "scripts" / "score.py"), f"--input={src}", f"--output={dst}",
                           "--batch_size=1"], env=dict(os.environ, PYTHONPATH=str(REPO)),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 120
  while not list(tmp_path.glob(".resp.jsonl.*.tmp")) and time.time() < deadline and proc.poll() is None:
    time.sleep(0.05)
  time.sleep(0.5)  # some responses written to the temporary file
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert proc.returncode == -signal.SIGKILL  # killed while scoring, not finished
  assert dst.read_text() == "previous responses\n"


# --- conversion and export ---------------------------------------------------------------------------
def test_convert_overwrite_refuses_the_hugging_face_source_directory(hf_checkpoints):
  _, hf_dir, _ = hf_checkpoints("qwen3_kv2_tied")
  before = _tree(hf_dir)
  for out in (hf_dir, hf_dir / "sub"):
    with pytest.raises(UnsafeOutputError, match="the input"):
      convert_hf_checkpoint(hf_dir, out, overwrite=True)
  assert _tree(hf_dir) == before


def test_convert_overwrite_refuses_an_unrelated_directory_and_replaces_its_own(hf_checkpoints, tmp_path):
  _, hf_dir, _ = hf_checkpoints("qwen3_kv2_tied")
  other = tmp_path / "home"
  before = _foreign_dir(other)
  with pytest.raises(UnsafeOutputError, match="not written by maxscore"):
    convert_hf_checkpoint(hf_dir, other, overwrite=True)
  assert _tree(other) == before
  ckpt = convert_hf_checkpoint(hf_dir, tmp_path / "ckpt")
  with pytest.raises(UnsafeOutputError, match="already exists"):
    convert_hf_checkpoint(hf_dir, ckpt)
  assert convert_hf_checkpoint(hf_dir, ckpt, overwrite=True) == ckpt
  assert safety.is_owned(ckpt, "checkpoint") and storage.restore_checkpoint(ckpt).digest


def test_export_refuses_an_existing_foreign_directory_even_with_overwrite(tmp_path):
  cfg = heads.HeadConfig(kind="lm_labels", label_token_ids=(4, 5), hidden_size=128, delta="none")
  params = heads.init_head(cfg, jax.random.PRNGKey(0))
  target = tmp_path / "existing"
  before = _foreign_dir(target)
  for overwrite in (False, True):
    with pytest.raises(UnsafeOutputError, match="not written by maxscore"):
      heads.export_checkpoint(data.DEFAULT_CHECKPOINT, target, cfg, params, overwrite=overwrite)
  assert _tree(target) == before


def test_train_export_dir_existing_directory_is_kept_without_overwrite(tmp_path):
  target = tmp_path / "export"
  before = _foreign_dir(target)
  dataset = _tiny_set(tmp_path / "d.jsonl")
  with pytest.raises(UnsafeOutputError, match="not written by maxscore"):
    train_lib.train(train_lib.TrainConfig(num_steps=1), CFG, None, dataset, None, tmp_path / "work",
                    export_dir=target, progress=False)
  assert _tree(target) == before


def test_train_export_of_a_random_init_model_is_refused_before_any_work(tmp_path):
  """A random-init model (--checkpoint_dir=none) has no base checkpoint to export beside the weights."""
  dataset = _tiny_set(tmp_path / "d.jsonl")
  with pytest.raises(train_lib.TrainError, match="--checkpoint_dir=none.*leave out --export_dir"):
    train_lib.train(train_lib.TrainConfig(num_steps=1), CFG, "none", dataset, None, tmp_path / "work",
                    export_dir=tmp_path / "export", progress=False)
  assert not (tmp_path / "work").exists() and not (tmp_path / "export").exists()


def test_train_export_inside_the_workdir_is_refused_with_where_to_put_it(tmp_path):
  dataset = _tiny_set(tmp_path / "d.jsonl")
  with pytest.raises(UnsafeOutputError, match="choose an export path outside it"):
    train_lib.train(train_lib.TrainConfig(num_steps=1), CFG, None, dataset, None, tmp_path / "work",
                    export_dir=tmp_path / "work" / "export", progress=False)


def test_build_output_inside_its_workdir_is_refused_before_anything_is_written(tmp_path, capsys):
  """The build's output under its workdir (which --overwrite removes) is refused before either exists."""
  build = _script("build_default_assets")
  with pytest.raises(SystemExit) as e:
    cli.run_with_fresh_flags(build.define_flags, build.main,
                             ["prog", f"--workdir={tmp_path / 'w'}", f"--output_dir={tmp_path / 'w' / 'assets'}"])
  assert e.value.code == 2 and "lies inside --workdir" in capsys.readouterr().err
  assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("where", ["inside", "foreign"])
def test_pretrain_export_refused_before_any_work(tmp_path, where):
  """Pretraining checks its export as the score-head trainer does: never inside the workdir (which
  --overwrite removes), and an existing directory maxscore did not write is left alone."""
  from maxscore.lm import pretrain as pretrain_lib  # pylint: disable=import-outside-toplevel
  export = tmp_path / "work" / "model" if where == "inside" else tmp_path / "model"
  if where == "foreign":
    _foreign_dir(export)
  before = _tree(tmp_path)
  with pytest.raises(UnsafeOutputError, match="outside it" if where == "inside" else "not written by maxscore"):
    pretrain_lib.pretrain(pretrain_lib.PretrainConfig(num_steps=1), data.DEFAULT_CHECKPOINT / "tokenizer" /
                          "tokenizer.model", ["text"] * 4, [], tmp_path / "work", export_dir=export, progress=False)
  assert not (tmp_path / "work").exists() and _tree(tmp_path) == before


def test_train_workdir_overwrite_refuses_a_directory_maxscore_did_not_write(tmp_path):
  workdir = tmp_path / "home"
  before = _foreign_dir(workdir)
  dataset = _tiny_set(tmp_path / "d.jsonl")
  for overwrite in (True, False):
    with pytest.raises(UnsafeOutputError, match="not written by maxscore"):
      train_lib.train(train_lib.TrainConfig(num_steps=1), CFG, None, dataset, None, workdir,
                      overwrite=overwrite, progress=False)
  assert _tree(workdir) == before


# --- eval outputs and resume identity ----------------------------------------------------------------
def test_eval_output_dir_equal_to_the_beir_data_directory_keeps_run_trec(tmp_path, scorer):
  d = tmp_path / "beir"
  (d / "qrels").mkdir(parents=True)
  (d / "corpus.jsonl").write_text('{"_id": "d0", "text": "a doc"}\n')
  (d / "queries.jsonl").write_text('{"_id": "q0", "text": "a query"}\n')
  (d / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td0\t1\n")
  (d / "run.trec").write_text("q0 Q0 d0 1 2.0 bm25\n")
  dataset = data.load_beir(d, d / "run.trec")
  before = _tree(d)
  for out in (d, d / "eval"):
    with pytest.raises(UnsafeOutputError, match="the input"):
      eval_lib.run_eval(scorer, dataset, CFG, out, progress=False)
  assert _tree(d) == before


def test_eval_output_dir_holding_foreign_files_is_refused(tmp_path, scorer):
  out = tmp_path / "results"
  before = _foreign_dir(out)
  with pytest.raises(UnsafeOutputError, match="not written by maxscore"):
    eval_lib.run_eval(scorer, _tiny_set(tmp_path / "d.jsonl"), CFG, out, progress=False, overwrite=True)
  assert _tree(out) == before


def test_eval_resume_refused_after_weights_replaced_in_place(tmp_path, two_checkpoints):
  a, b = two_checkpoints
  ckpt, out = tmp_path / "model", tmp_path / "out"
  dataset = _tiny_set(tmp_path / "d.jsonl")
  shutil.copytree(a, ckpt)
  eval_lib.run_eval(eval_lib.build_scorer(str(ckpt)), dataset, dataclasses.replace(CFG, max_queries=1), out,
                    progress=False)
  shutil.rmtree(ckpt)
  shutil.copytree(b, ckpt)  # same path, other weights
  with pytest.raises(ResumeError, match=r"changed: scorer.params_sha256.*--overwrite"):
    eval_lib.run_eval(eval_lib.build_scorer(str(ckpt)), dataset, CFG, out, progress=False)
  shutil.rmtree(ckpt / "params")
  shutil.copytree(b / "params", ckpt / "params")  # only params/ replaced: its files no longer match
  shutil.copy2(a / "maxscore.json", ckpt / "maxscore.json")
  with pytest.raises(storage.CheckpointError, match="is not what was written"):
    eval_lib.build_scorer(str(ckpt))


def test_eval_resume_refused_after_reconverting_with_other_weights(tmp_path, hf_checkpoints, sp_tokenizer_path):
  _, hf_dir, _ = hf_checkpoints("qwen3_kv2_tied")
  ckpt, out = tmp_path / "ckpt", tmp_path / "out"
  cfg = dataclasses.replace(CFG, labels=("5", "17"))
  over = [f"tokenizer_path={sp_tokenizer_path}"]
  dataset = _tiny_set(tmp_path / "d.jsonl")
  convert_hf_checkpoint(hf_dir, ckpt)
  eval_lib.run_eval(eval_lib.build_scorer(str(ckpt), over), dataset, dataclasses.replace(cfg, max_queries=1), out,
                    progress=False)
  convert_hf_checkpoint(hf_dir, ckpt, overwrite=True)  # the same weights again: resumes
  report = eval_lib.run_eval(eval_lib.build_scorer(str(ckpt), over), dataset, cfg, out, progress=False)
  assert report.summary["queries_resumed"] == 1
  convert_hf_checkpoint(hf_dir, ckpt, dtype="bfloat16", overwrite=True)
  with pytest.raises(ResumeError, match=r"changed: scorer.params_sha256"):
    eval_lib.run_eval(eval_lib.build_scorer(str(ckpt), over), dataset, cfg, out, progress=False)


def test_eval_resume_refused_after_tokenizer_changed(tmp_path, two_checkpoints, sp_tokenizer_path, scorer):
  a, _ = two_checkpoints
  out = tmp_path / "out"
  dataset = _tiny_set(tmp_path / "d.jsonl")
  eval_lib.run_eval(eval_lib.build_scorer(str(a)), dataset, dataclasses.replace(CFG, max_queries=1), out,
                    progress=False)
  same = tmp_path / "copy.model"  # the same tokenizer at another path resumes: identity is content
  shutil.copy2(a / "tokenizer" / "tokenizer.model", same)
  report = eval_lib.run_eval(eval_lib.build_scorer(str(a), [f"tokenizer_path={same}"]), dataset, CFG, out,
                             progress=False)
  assert report.summary["queries_resumed"] == 1
  with pytest.raises(ResumeError, match=r"changed: scorer.tokenizer_sha256"):
    eval_lib.run_eval(eval_lib.build_scorer(str(a), [f"tokenizer_path={sp_tokenizer_path}"]), dataset, CFG,
                      out, progress=False)
  ckpt = tmp_path / "model"  # the tokenizer file replaced in place, at the same path
  shutil.copytree(a, ckpt)
  eval_lib.run_eval(eval_lib.build_scorer(str(ckpt)), dataset, CFG, tmp_path / "out2", progress=False)
  shutil.copy2(sp_tokenizer_path, ckpt / "tokenizer" / "tokenizer.model")
  with pytest.raises(ResumeError, match=r"changed: scorer.tokenizer_sha256"):
    eval_lib.run_eval(eval_lib.build_scorer(str(ckpt)), dataset, CFG, tmp_path / "out2", progress=False)


# --- the machinery itself ----------------------------------------------------------------------------
def test_atomic_output_keeps_the_old_file_on_error(tmp_path):
  path = tmp_path / "f.txt"
  path.write_text("old")
  with pytest.raises(RuntimeError):
    with safety.atomic_output(path) as f:
      f.write("new, half written")
      raise RuntimeError("killed")
  assert path.read_text() == "old" and os.listdir(tmp_path) == ["f.txt"]
  safety.atomic_write_text(path, "new")
  assert path.read_text() == "new"


def test_resume_identity_names_what_changed():
  with pytest.raises(ResumeError, match=r"changed: a.b, c\); refusing to mix them: start over"):
    identity.check_same({"a": {"b": 1}, "c": 2}, {"a": {"b": 2}, "c": 3}, "out", "start over")
  identity.check_same({"a": (1, 2)}, {"a": [1, 2]}, "out", "-")  # JSON-equal is equal


# --- a refused run writes nothing: not a log file, not a directory ------------------------------------
def _paths(directory):
  """{relative path: bytes or None for a directory} of everything under `directory`."""
  return {p.relative_to(directory).as_posix(): (p.read_bytes() if p.is_file() else None)
          for p in sorted(directory.rglob("*"))}


def _refused(script, argv):
  with pytest.raises(SystemExit) as e:
    script.run(argv)
  assert e.value.code == 2


EVAL = _script("eval_rerank")


@pytest.mark.slow
def test_refused_evals_write_no_log_and_create_nothing(tmp_path, script_log, two_checkpoints, capsys):
  """Pointed at its data directory, at a foreign directory holding only a file named like its log, or at an
  earlier run's directory with another checkpoint: refused, and the disk is as it was."""
  d = tmp_path / "data"
  d.mkdir()
  _tiny_set(d / "d.jsonl")
  foreign = tmp_path / "foreign"
  foreign.mkdir()
  (foreign / "eval_rerank.log").write_text("someone's log\n")
  for out in (d, foreign):
    before = _paths(tmp_path)
    script_log(out / "eval_rerank.log")
    _refused(EVAL, ["eval_rerank.py", f"--jsonl={d / 'd.jsonl'}", "--split=all", f"--output_dir={out}",
                    "--noprogress", "--max_queries=1"])
    assert _paths(tmp_path) == before
  a, b = two_checkpoints
  out = tmp_path / "out"
  argv = ["eval_rerank.py", f"--jsonl={d / 'd.jsonl'}", "--split=all", f"--output_dir={out}", "--noprogress",
          "--max_queries=1", "--max_query_tokens=4"]
  script_log(out / "eval_rerank.log")
  EVAL.run(argv + [f"--checkpoint_dir={a}"])
  assert (out / "eval_rerank.log").stat().st_size > 0  # written once the run passed its checks
  before = _paths(out)
  script_log(out / "eval_rerank.log")  # a new run (a new process)
  _refused(EVAL, argv + [f"--checkpoint_dir={b}"])  # other weights: the earlier run's log is untouched
  assert _paths(out) == before
  capsys.readouterr()


def test_refused_pretraining_leaves_no_directory(tmp_path, script_log):
  pretrain = _script("pretrain_lm")
  export = tmp_path / "model"
  _foreign_dir(export)
  before = _paths(tmp_path)
  script_log(tmp_path / "work" / "pretrain_lm.log")
  _refused(pretrain, ["pretrain_lm.py", f"--workdir={tmp_path / 'work'}", f"--export_dir={export}",
                      "--num_steps=1", "--noprogress"])
  assert _paths(tmp_path) == before


def test_build_output_dir_of_someone_else_is_refused(tmp_path, capsys):
  build = _script("build_default_assets")
  out = tmp_path / "mine"
  _foreign_dir(out)
  (out / "pydoc_rerank.jsonl").write_text("my own data\n")
  before = _paths(tmp_path)
  with pytest.raises(SystemExit) as e:
    cli.run_with_fresh_flags(build.define_flags, build.main,
                             ["prog", f"--workdir={tmp_path / 'w'}", f"--output_dir={out}"])
  assert e.value.code == 2 and _paths(tmp_path) == before
  assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_head_study_never_writes_over_its_input_nor_into_a_foreign_workdir(tmp_path, capsys):
  study = _script("head_study")
  jsonl = tmp_path / "d.jsonl"
  _tiny_set(jsonl)
  foreign = tmp_path / "foreign"
  _foreign_dir(foreign)
  before = _paths(tmp_path)
  _refused(study, ["head_study.py", f"--jsonl={jsonl}", f"--output_json={jsonl}", f"--workdir={tmp_path / 'w'}"])
  _refused(study, ["head_study.py", f"--jsonl={jsonl}", f"--workdir={foreign}"])
  assert _paths(tmp_path) == before
  capsys.readouterr()


def _runs_and_qrels(d):
  d.mkdir()
  (d / "qrels.txt").write_text("q0 0 a 1\nq1 0 b 1\n")
  for name in ("x y", "x_y", "base"):
    (d / f"{name}.trec").write_text("q0 Q0 a 1 2.0 r\nq0 Q0 b 2 1.0 r\nq1 Q0 a 1 2.0 r\nq1 Q0 b 2 1.0 r\n")
  return d


@pytest.mark.parametrize("case", ["foreign_plot_dir", "json_is_latex", "plot_names_collide"])
def test_compare_runs_outputs_never_replace_each_other_or_foreign_files(tmp_path, case, capsys):
  compare_runs = _script("compare_runs")
  d = _runs_and_qrels(tmp_path / "runs")
  runs = [f"base={d / 'base.trec'}", f"a={d / 'x y.trec'}"]
  if case == "foreign_plot_dir":
    _foreign_dir(tmp_path / "plots")
    (tmp_path / "plots" / "delta_a.png").write_text("my picture")
    extra = [f"--plot_dir={tmp_path / 'plots'}"]
  elif case == "json_is_latex":
    extra = [f"--output_json={tmp_path / 'r'}", f"--output_latex={tmp_path / 'r'}"]
  else:
    runs = [f"base={d / 'base.trec'}", f"x y={d / 'x y.trec'}", f"x_y={d / 'x_y.trec'}"]
    extra = [f"--plot_dir={tmp_path / 'plots'}"]
  before = _paths(tmp_path)
  _refused(compare_runs, ["compare_runs.py", *runs, f"--qrels={d / 'qrels.txt'}", "--baseline=base", *extra])
  assert _paths(tmp_path) == before
  assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.parametrize("what", ["eval", "train", "build"])
def test_output_dir_that_is_a_file_is_one_line_and_nothing_is_written(tmp_path, what, capsys):
  f = tmp_path / "file"
  f.write_text("mine")
  jsonl = tmp_path / "d.jsonl"
  _tiny_set(jsonl)
  argv = {"eval": (EVAL, ["eval_rerank.py", f"--jsonl={jsonl}", "--split=all", f"--output_dir={f}"]),
          "train": (_script("train_score_head"), ["train_score_head.py", f"--jsonl={jsonl}", "--train_split=all",
                                                  "--dev_split=", f"--workdir={f}"]),
          "build": (_script("build_default_assets"), ["prog", f"--workdir={f}", f"--output_dir={tmp_path / 'o'}"])}
  script, args = argv[what]
  for target in (f, f / "under"):
    before = _paths(tmp_path)
    flag = "--workdir" if what != "eval" else "--output_dir"
    with pytest.raises(SystemExit) as e:
      cli.run_with_fresh_flags(script.define_flags, script.main,
                               [a if not a.startswith(flag + "=") else f"{flag}={target}" for a in args])
    assert e.value.code == 2 and _paths(tmp_path) == before
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(target) in err[0]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_output_dir_under_a_read_only_directory_is_one_line(tmp_path, capsys):
  jsonl = tmp_path / "d.jsonl"
  _tiny_set(jsonl)
  ro = tmp_path / "ro"
  ro.mkdir()
  ro.chmod(0o555)
  try:
    with pytest.raises(SystemExit) as e:
      EVAL.run(["eval_rerank.py", f"--jsonl={jsonl}", "--split=all", f"--output_dir={ro / 'out'}"])
  finally:
    ro.chmod(0o755)
  assert e.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1


def test_a_log_file_that_cannot_be_written_is_one_line_naming_it(capfd, tmp_path):
  """A full disk (/dev/full answers every write with ENOSPC): one line naming the file, not one per record."""
  import logging
  handler = cli._LogFile("/dev/full", encoding="utf-8")
  logger = logging.getLogger("maxscore.test_full_disk")
  logger.propagate, logger.level = False, logging.INFO
  logger.addHandler(handler)
  try:
    for i in range(50):
      logger.info("record %d", i)
  finally:
    logger.removeHandler(handler)
  err = capfd.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "/dev/full" in err[0]


  class FullDisk:
    def write(self, text):
      raise OSError(28, "No space left on device")
  with pytest.raises(OSError) as e:
    eval_lib._append(FullDisk(), {"qid": "q"}, False, tmp_path / "results.jsonl")
  assert e.value.filename == str(tmp_path / "results.jsonl")


# --- property: no output may be, hold, or lie inside an input -------------------------------------------
def _inputs(root):
  """Every script's inputs under `root`: script -> (its input paths, argv given the output path)."""
  lines = [json.dumps({"qid": f"q{i}", "query": "a query", "split": s, "candidates": [
      {"docid": "a", "text": "some text"}, {"docid": "b", "text": "other"}], "qrels": {"a": 1}})
           for i, s in enumerate(("train", "dev", "test"))]
  jsonl = root / "data" / "set.jsonl"
  jsonl.parent.mkdir(parents=True)
  jsonl.write_text("\n".join(lines) + "\n")
  runs = _runs_and_qrels(root / "runs")
  req = root / "req.jsonl"
  req.write_text(json.dumps({"query": "q", "items": ["a"], "label_token_ids": [4]}) + "\n")
  metrics_file = root / "train" / "metrics.jsonl"
  metrics_file.parent.mkdir()
  metrics_file.write_text(json.dumps({"kind": "train", "step": 1, "loss": 1.0}) + "\n")
  hf = root / "hf"
  hf.mkdir()
  (hf / "config.json").write_text("{}")
  return {
      "score": ([req], lambda o: ["score.py", f"--input={req}", f"--output={o}"]),
      "compare_runs": ([runs / "base.trec", runs / "x_y.trec", runs / "qrels.txt"],
                       lambda o: ["compare_runs.py", str(runs / "base.trec"), str(runs / "x_y.trec"),
                                  f"--qrels={runs / 'qrels.txt'}", f"--output_json={o}"]),
      "plot_runs": ([metrics_file], lambda o: ["plot_runs.py", "training", str(metrics_file), f"--output={o}"]),
      "head_study": ([jsonl], lambda o: ["head_study.py", f"--jsonl={jsonl}", f"--output_json={o}",
                                         f"--workdir={root / 'new_study'}"]),
      "convert_hf_checkpoint": ([hf], lambda o: ["convert.py", f"--hf_dir={hf}", f"--output_dir={o}"]),
      "train_score_head": ([jsonl], lambda o: ["train.py", f"--jsonl={jsonl}", f"--workdir={o}", "--num_steps=1"]),
      "eval_rerank": ([jsonl], lambda o: ["eval_rerank.py", f"--jsonl={jsonl}", "--split=all", f"--output_dir={o}",
                                          "--noprogress"]),
  }


_PROPERTY_SCRIPTS = {}


@hypothesis.settings(max_examples=30, deadline=None,
                     suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture])
@hypothesis.given(st.sampled_from(["score", "compare_runs", "plot_runs", "head_study", "convert_hf_checkpoint",
                                   "train_score_head", "eval_rerank"]),
                  st.integers(0, 2), st.sampled_from(["equal", "inside", "contains"]), st.sampled_from(["", ".png"]))
def test_no_script_writes_an_output_that_is_holds_or_lies_inside_an_input(tmp_path_factory, capsys, name, which,
                                                                          relation, suffix):
  root = tmp_path_factory.mktemp("prop")
  inputs, argv = _inputs(root)[name]
  i = inputs[which % len(inputs)]
  out = {"equal": i, "inside": i / f"sub{suffix}", "contains": i.parent}[relation]
  script = _PROPERTY_SCRIPTS.setdefault(name, _PROPERTY_SCRIPTS.get(name) or _script(name))
  before = _paths(root)
  with pytest.raises(SystemExit) as e:
    script.run(argv(out))
  assert e.value.code == 2 and _paths(root) == before
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: "), err
