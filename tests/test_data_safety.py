"""Nothing lost, nothing mixed (docs/ARCHITECTURE.md section 9), as the scripts see it: a run refused for its
outputs (an input itself, inside or around one, a foreign, read-only or unwritable place) exits 2 with one line and
leaves the disk as it was, not even a log file or a directory (the library's checks:
tests/test_data_safety_library.py)."""

import json
import os

import hypothesis
import pytest
from hypothesis import strategies as st

from maxscore import cli
from maxscore.rerank import results_file
from maxscore.testing import scripts
from maxscore.testing.disk import foreign_dir, tiny_set


def _paths(directory):
  """{relative path: bytes or None for a directory} of everything under `directory`."""
  return {p.relative_to(directory).as_posix(): (p.read_bytes() if p.is_file() else None)
          for p in sorted(directory.rglob("*"))}


def _refused(script, argv):
  with pytest.raises(SystemExit) as e:
    script.run(argv)
  assert e.value.code == 2


EVAL = scripts.load_script("eval_rerank")


# --- a refused run writes nothing: not a log file, not a directory ------------------------------------
def test_score_output_equal_to_input_is_refused_and_input_kept(load_script, tmp_path, capsys):
  src = tmp_path / "req.jsonl"
  src.write_text('{"query": [1], "items": [[2]], "label_token_ids": [3]}\n')
  before = src.read_bytes()
  with pytest.raises(SystemExit) as e:
    load_script("score").run(["score.py", f"--input={src}", f"--output={src}"])
  assert e.value.code == 2 and src.read_bytes() == before
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "--output" in err[0] and "is the input" in err[0]


def test_score_refuses_an_existing_output_without_overwrite(load_script, tmp_path, capsys, monkeypatch):
  """An existing --output is a user's file: refused (exit 2, one line, the file kept) before a model loads;
  --overwrite replaces it."""
  src, dst = tmp_path / "req.jsonl", tmp_path / "resp.jsonl"
  src.write_text('{"query": [1], "items": [[2]], "label_token_ids": [3]}\n')
  dst.write_text("the user's file\n")
  score = load_script("score")
  loaded = []
  monkeypatch.setattr(score.loading, "build_scorer", lambda *a: loaded.append(a) or pytest.fail("loaded a model"))
  with pytest.raises(SystemExit) as e:
    score.run(["score.py", f"--input={src}", f"--output={dst}"])
  assert e.value.code == 2 and dst.read_text() == "the user's file\n" and not loaded
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [f"error: --output {dst} exists; pass --overwrite to replace it"]
  written = []
  monkeypatch.setattr(score.loading, "build_scorer", lambda *a: "scorer")
  monkeypatch.setattr(score.score_file, "score_jsonl", lambda *a: written.append(a[2]) or {"ok": 1, "errors": 0})
  score.run(["score.py", f"--input={src}", f"--output={dst}", "--overwrite"])
  assert written == [str(dst)]


def test_build_output_inside_its_workdir_is_refused_before_anything_is_written(load_script, tmp_path, capsys):
  """The build's output under its workdir (which --overwrite removes) is refused before either exists."""
  build = load_script("build_default_assets")
  with pytest.raises(SystemExit) as e:
    cli.run_with_fresh_flags(build.define_flags, build.main,
                             ["prog", f"--workdir={tmp_path / 'w'}", f"--output_dir={tmp_path / 'w' / 'assets'}"])
  assert e.value.code == 2 and "lies inside --workdir" in capsys.readouterr().err
  assert not (tmp_path / "w").exists()


@pytest.mark.slow
def test_refused_evals_write_no_log_and_create_nothing(tmp_path, script_log, two_checkpoints, capsys):
  """Pointed at its data directory, at a foreign directory holding only a file named like its log, or at an
  earlier run's directory with another checkpoint: refused, and the disk is as it was."""
  d = tmp_path / "data"
  d.mkdir()
  tiny_set(d / "d.jsonl")
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


def test_refused_pretraining_leaves_no_directory(load_script, tmp_path, script_log):
  pretrain = load_script("pretrain_lm")
  export = tmp_path / "model"
  foreign_dir(export)
  before = _paths(tmp_path)
  script_log(tmp_path / "work" / "pretrain_lm.log")
  _refused(pretrain, ["pretrain_lm.py", f"--workdir={tmp_path / 'work'}", f"--export_dir={export}",
                      "--num_steps=1", "--noprogress"])
  assert _paths(tmp_path) == before


def test_build_output_dir_of_someone_else_is_refused(load_script, tmp_path, capsys):
  build = load_script("build_default_assets")
  out = tmp_path / "mine"
  foreign_dir(out)
  (out / "pydoc_rerank.jsonl").write_text("my own data\n")
  before = _paths(tmp_path)
  with pytest.raises(SystemExit) as e:
    cli.run_with_fresh_flags(build.define_flags, build.main,
                             ["prog", f"--workdir={tmp_path / 'w'}", f"--output_dir={out}"])
  assert e.value.code == 2 and _paths(tmp_path) == before
  assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_head_study_never_writes_over_its_input_nor_into_a_foreign_workdir(load_script, tmp_path, capsys):
  study = load_script("head_study")
  jsonl = tmp_path / "d.jsonl"
  tiny_set(jsonl)
  foreign = tmp_path / "foreign"
  foreign_dir(foreign)
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
def test_compare_runs_outputs_never_replace_each_other_or_foreign_files(load_script, tmp_path, case, capsys):
  compare_runs = load_script("compare_runs")
  d = _runs_and_qrels(tmp_path / "runs")
  runs = [f"base={d / 'base.trec'}", f"a={d / 'x y.trec'}"]
  if case == "foreign_plot_dir":
    foreign_dir(tmp_path / "plots")
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
def test_output_dir_that_is_a_file_is_one_line_and_nothing_is_written(load_script, tmp_path, what, capsys):
  f = tmp_path / "file"
  f.write_text("mine")
  jsonl = tmp_path / "d.jsonl"
  tiny_set(jsonl)
  argv = {"eval": (EVAL, ["eval_rerank.py", f"--jsonl={jsonl}", "--split=all", f"--output_dir={f}"]),
          "train": (load_script("train_score_head"), ["train_score_head.py", f"--jsonl={jsonl}", "--train_split=all",
                                                  "--dev_split=", f"--workdir={f}"]),
          "build": (load_script("build_default_assets"), ["prog", f"--workdir={f}", f"--output_dir={tmp_path / 'o'}"])}
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
  tiny_set(jsonl)
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
    results_file.append_record(FullDisk(), {"qid": "q"}, False, tmp_path / "results.jsonl")
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
def test_no_script_writes_an_output_that_is_holds_or_lies_inside_an_input(load_script, tmp_path_factory, capsys, name,
                                                                          which, relation, suffix):
  root = tmp_path_factory.mktemp("prop")
  inputs, argv = _inputs(root)[name]
  i = inputs[which % len(inputs)]
  out = {"equal": i, "inside": i / f"sub{suffix}", "contains": i.parent}[relation]
  script = _PROPERTY_SCRIPTS.setdefault(name, _PROPERTY_SCRIPTS.get(name) or load_script(name))
  before = _paths(root)
  with pytest.raises(SystemExit) as e:
    script.run(argv(out))
  assert e.value.code == 2 and _paths(root) == before
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: "), err
