"""Broken files are one line (docs/ARCHITECTURE.md section 9): every script turns a missing, unreadable, corrupt
or malformed input into one `error:` line naming the file (and line) and exit 2; a real bug keeps
its traceback. Data loaders fed random bytes raise only DataError."""

import json
import pathlib
import shutil

import hypothesis
import jax
import numpy as np
import pytest
from hypothesis import strategies as st

from maxscore.checkpoints import storage
from maxscore.datasets import data
from maxscore.errors import DataError
from maxscore.scoring import loading
from maxscore.testing import hf_models, scripts

REPO = pathlib.Path(__file__).resolve().parent.parent
GOOD_LINE = json.dumps({"qid": "q0", "query": "a query", "candidates": [{"docid": "d0", "text": "a doc"}],
                        "qrels": {"d0": 1}})
eval_rerank, score_script = scripts.load_script("eval_rerank"), scripts.load_script("score")
convert_script = scripts.load_script("convert_hf_checkpoint")


def _one_line_exit_2(capsys, script, argv, expected):
  with pytest.raises(SystemExit) as e:
    script.run(argv)
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2, err
  assert len(err) == 1 and err[0].startswith("error: ") and expected in err[0], err
  return err[0]


def _eval(capsys, tmp_path, expected, *args):
  return _one_line_exit_2(capsys, eval_rerank, ["eval_rerank.py", f"--output_dir={tmp_path / 'out'}", "--noprogress",
                                                *args], expected)


@pytest.fixture(scope="module")
def saved_checkpoint(tmp_path_factory):
  """The default model re-saved by save_checkpoint (so it carries a params digest and file manifest)."""
  ckpt = storage.restore_checkpoint(data.DEFAULT_CHECKPOINT)
  tok = data.DEFAULT_CHECKPOINT / "tokenizer" / "tokenizer.model"
  return storage.save_checkpoint(tmp_path_factory.mktemp("c") / "ckpt", ckpt.params, ckpt.model, tokenizer_files=(tok,))


@pytest.mark.parametrize("content,expected", [
    (GOOD_LINE.encode() + b"\n\xff\xfe{}\n", "bad.jsonl:2: not UTF-8 text"),
    (GOOD_LINE.encode() + b"\n" + b"[" * 100000 + b"\n", "bad.jsonl:2: JSON nested too deeply"),
    (GOOD_LINE.encode() + b'\n{"qid": "q1", "query": "\\ud800", "candidates": [], "qrels": {}}\n',
     "bad.jsonl:2: text holds a lone UTF-16 surrogate"),
])
def test_malformed_data_file_is_one_line_naming_file_and_line(tmp_path, capsys, content, expected):
  bad = tmp_path / "bad.jsonl"
  bad.write_bytes(content)
  _eval(capsys, tmp_path, expected, f"--jsonl={bad}")


def test_directory_where_a_file_is_expected_is_one_line(tmp_path, capsys):
  _eval(capsys, tmp_path, "is a directory, not a file", f"--jsonl={tmp_path}")
  (tmp_path / "dir").mkdir()
  _one_line_exit_2(capsys, score_script, ["score.py", f"--input={tmp_path / 'dir'}",
                                          f"--output={tmp_path / 'o.jsonl'}"], "Is a directory")


def test_checkpoint_dir_that_is_a_file_or_has_corrupt_metadata_is_one_line(tmp_path, capsys, saved_checkpoint):
  f = tmp_path / "file"
  f.write_text("x")
  _eval(capsys, tmp_path, "is not a directory", f"--checkpoint_dir={f}")
  ckpt = tmp_path / "ckpt"
  shutil.copytree(saved_checkpoint, ckpt)
  (ckpt / "maxscore.json").write_text("{broken")
  _eval(capsys, tmp_path, f"{ckpt / 'maxscore.json'} is corrupt", f"--checkpoint_dir={ckpt}")


def test_corrupt_tokenizer_file_is_one_line(tmp_path, capsys, saved_checkpoint):
  ckpt = tmp_path / "ckpt"
  shutil.copytree(saved_checkpoint, ckpt)
  (ckpt / "tokenizer" / "tokenizer.model").write_bytes(b"not a sentencepiece model")
  _eval(capsys, tmp_path, "tokenizer.model' is corrupt or unreadable", f"--checkpoint_dir={ckpt}")


def test_corrupt_hf_tokenizer_json_is_one_line(tmp_path, capsys, saved_checkpoint):
  ckpt = tmp_path / "ckpt"
  shutil.copytree(saved_checkpoint, ckpt)
  (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": [1, 2')
  _eval(capsys, tmp_path, "tokenizer.json' is corrupt or unreadable", f"--checkpoint_dir={ckpt}",
        f"tokenizer_path={tmp_path / 'tokenizer.json'}")


def test_truncated_orbax_checkpoint_is_one_line(tmp_path, capsys, saved_checkpoint):
  ckpt = tmp_path / "ckpt"
  shutil.copytree(saved_checkpoint, ckpt)
  biggest = max((p for p in (ckpt / "params").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
  biggest.write_bytes(biggest.read_bytes()[:100])
  _eval(capsys, tmp_path, "is not what was written with", f"--checkpoint_dir={ckpt}")


def test_corrupt_config_json_and_truncated_safetensors_are_one_line(tmp_path, capsys):
  model = hf_models.make_hf_model("qwen3", vocab_size=64, num_hidden_layers=1)
  hf_dir = hf_models.save_hf_model(model, tmp_path / "hf")
  capsys.readouterr()  # the save progress bar
  args = ["convert_hf_checkpoint.py", f"--hf_dir={hf_dir}", f"--output_dir={tmp_path / 'ckpt'}"]
  config = (hf_dir / "config.json").read_text()
  for broken, expected in (("{", "config.json is not valid JSON"), ("[1]", "must hold a JSON object"),
                           (json.dumps({k: v for k, v in json.loads(config).items() if k != "hidden_size"}),
                            "lacks the key 'hidden_size'")):
    (hf_dir / "config.json").write_text(broken)
    _one_line_exit_2(capsys, convert_script, args, expected)
  (hf_dir / "config.json").write_text(config)
  weights = hf_dir / "model.safetensors"
  weights.write_bytes(weights.read_bytes()[:1000])
  _one_line_exit_2(capsys, convert_script, args, "cannot read the safetensors weights")
  assert not (tmp_path / "ckpt").exists()


def test_a_real_bug_still_shows_its_traceback(tmp_path, monkeypatch):
  def bug(*args, **kwargs):
    raise KeyError("a bug, not bad input")
  monkeypatch.setattr(loading, "build_scorer", bug)
  with pytest.raises(KeyError, match="a bug"):
    eval_rerank.run(["eval_rerank.py", f"--output_dir={tmp_path / 'out'}", "--noprogress"])


# --- loaders fed random bytes ------------------------------------------------------------------------
@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode), st.integers(0, 400))
def test_data_loaders_on_random_bytes_and_truncated_files_raise_only_data_errors(tmp_path_factory, blob, cut):
  d = tmp_path_factory.mktemp("fuzz")
  good = (GOOD_LINE + "\n" + GOOD_LINE.replace("q0", "q1") + "\n").encode()
  (d / "qrels").mkdir()
  cases = {"random.jsonl": blob, "cut.jsonl": good[:cut], "run.trec": blob, "corpus.jsonl": blob,
           "queries.jsonl": b'{"_id": "q0", "text": "a query"}\n', "qrels/test.tsv": blob}
  for name, content in cases.items():
    (d / name).write_bytes(content)
  for load in (lambda: data.load_jsonl(d / "random.jsonl", "all"), lambda: data.load_jsonl(d / "cut.jsonl", "all"),
               lambda: data.read_trec_run(d / "run.trec"), lambda: data.load_beir(d, d / "run.trec"),
               lambda: data.load_jsonl(d / "random.jsonl", "all", skip_bad=True)):
    try:
      load()
    except DataError:
      pass


# --- plot_runs: nothing to plot, or a plot that would mislead --------------------------------------------
plot_runs = scripts.load_script("plot_runs")


def _eval_dir(d, k, data_source, model="m"):
  d.mkdir(parents=True)
  (d / "run.trec").write_text("".join(f"q0 Q0 d{i} {i + 1} {1.0 / (i + 1)} r\n" for i in range(k)))
  (d / "metrics.json").write_text(json.dumps({"metrics": {"ndcg_cut_10": k / 10}, "first_stage": {}}))
  (d / "summary.json").write_text(json.dumps({"model": model, "checkpoint_dir": model, "head": None,
                                              "label_ids": [1, 2], "data": dict(data_source, top_k=k)}))
  return d


@pytest.mark.parametrize("case", ["other_data", "other_model", "empty_group"])
def test_plot_depth_refuses_mixed_evals_in_one_line(tmp_path, capsys, case):
  a = _eval_dir(tmp_path / "a", 3, {"format": "jsonl", "path": "x.jsonl"})
  b = _eval_dir(tmp_path / "b", 6, {"format": "jsonl", "path": "y.jsonl" if case == "other_data" else "x.jsonl"},
                model="other" if case == "other_model" else "m")
  group = "l=," if case == "empty_group" else f"l={a},{b}"
  _one_line_exit_2(capsys, plot_runs, ["plot_runs.py", "depth", group, f"--output={tmp_path / 'p.png'}"], "")
  assert not (tmp_path / "p.png").exists()


@pytest.mark.parametrize("content", [b"", b"\xff\xfe\x00", b"[1, 2]\n", b'{"kind": "train", "step": 1, "loss": 1}\n'])
def test_plot_training_files_with_nothing_to_plot_are_one_line(tmp_path, capsys, content):
  """Empty, non-UTF-8, a JSON array, or a metric never logged (the last: only train loss, no dev ndcg)."""
  f = tmp_path / "metrics.jsonl"
  f.write_bytes(content)
  _one_line_exit_2(capsys, plot_runs, ["plot_runs.py", "training", str(f), f"--output={tmp_path / 'p.png'}"],
                   str(f) if content == b"\xff\xfe\x00" else "")
  assert not (tmp_path / "p.png").exists()


def test_plot_output_is_written_in_the_format_its_suffix_names(tmp_path, capsys):
  f = tmp_path / "metrics.jsonl"
  f.write_text("".join(json.dumps(r) + "\n" for r in [{"kind": "train", "step": 1, "loss": 1.0},
                                                     {"kind": "eval", "step": 1, "split": "dev", "ndcg_cut_10": 0.3}]))
  for suffix, magic in ((".pdf", b"%PDF"), (".png", b"\x89PNG"), (".svg", b"<?xml")):
    plot_runs.run(["plot_runs.py", "training", str(f), f"--output={tmp_path / ('p' + suffix)}"])
    assert (tmp_path / f"p{suffix}").read_bytes().startswith(magic)
  _one_line_exit_2(capsys, plot_runs, ["plot_runs.py", "training", str(f), f"--output={tmp_path / 'p.jpeg'}"],
                   "p.jpeg")
  assert not (tmp_path / "p.jpeg").exists()


# --- compile_check: every flag checked before any compile --------------------------------------------------
@pytest.mark.parametrize("flag,key", [("--geometries=", "geometries"), ("--search=foo", "search"),
                                      ("--algorithms=bogus", "algorithms")])
def test_compile_check_bad_flags_are_one_line_before_any_compile(load_script, capsys, monkeypatch, flag, key):
  from maxscore.bench import compile_report
  compile_check = load_script("compile_check")
  monkeypatch.setattr(compile_report, "run", lambda *a: pytest.fail("compiled before checking the flags"))
  _one_line_exit_2(capsys, compile_check, ["compile_check.py", flag], key)


def test_several_bad_values_are_each_named(load_script, capsys):
  compile_check = load_script("compile_check")
  err = _one_line_exit_2(capsys, compile_check, ["compile_check.py", "--geometries=1x2", "--algorithms=bogus",
                                                 "--num_labels=0"], "")
  assert all(k in err for k in ("geometries", "algorithms", "num_labels"))


def test_a_topology_libtpu_does_not_know_blames_the_shape_not_libtpu():
  import importlib.util as util
  from maxscore.bench import chips, compile_report
  if util.find_spec("libtpu") is None:
    pytest.skip("needs libtpu")
  with pytest.raises(chips.TopologyError) as e:
    compile_report.describe_topology("v6e:3x3")
  assert "v6e:3x3" in str(e.value) and "pip install" not in str(e.value)


# --- non-finite scores -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def nan_checkpoint(tmp_path_factory):
  """The default model with one NaN in the final norm: every score is NaN."""
  ckpt = storage.restore_checkpoint(data.DEFAULT_CHECKPOINT)
  params = jax.tree_util.tree_map(np.asarray, ckpt.params)
  params["final_norm"]["scale"] = params["final_norm"]["scale"].copy()
  params["final_norm"]["scale"][0] = np.nan
  tok = data.DEFAULT_CHECKPOINT / "tokenizer" / "tokenizer.model"
  return storage.save_checkpoint(tmp_path_factory.mktemp("nan") / "ckpt", params, ckpt.model, tokenizer_files=(tok,))


@pytest.mark.slow
def test_non_finite_scores_are_an_error_line_in_score_and_one_line_in_eval(tmp_path, capsys, nan_checkpoint):
  src, dst = tmp_path / "req.jsonl", tmp_path / "resp.jsonl"
  src.write_text(json.dumps({"query": [10, 11], "items": [[12], [13]], "label_token_ids": [4, 5]}) + "\n")
  with pytest.raises(SystemExit) as e:
    score_script.run(["score.py", f"--input={src}", f"--output={dst}", f"--checkpoint_dir={nan_checkpoint}"])
  assert e.value.code == score_script.SOME_FAILED
  out = json.loads(dst.read_text())  # strict JSON: no NaN
  assert set(out) == {"error"} and out["error"].startswith("line 1:")
  assert len(capsys.readouterr().err.strip().splitlines()) == 1
  jsonl = tmp_path / "d.jsonl"
  jsonl.write_text(GOOD_LINE + "\n")
  _eval(capsys, tmp_path, "'q0'", f"--jsonl={jsonl}", "--split=all", f"--checkpoint_dir={nan_checkpoint}")


def test_a_query_over_the_largest_prefix_bucket_names_the_query_and_the_flag(tmp_path, capsys):
  jsonl = tmp_path / "d.jsonl"
  jsonl.write_text(GOOD_LINE.replace("a query", "word " * 300) + "\n")
  err = _eval(capsys, tmp_path, "'q0'", f"--jsonl={jsonl}", "--split=all", "--max_query_tokens=0",
              "prefix_buckets=[16]")
  assert "--max_query_tokens" in err


def test_compare_runs_qrels_error_offers_no_flag_it_lacks(load_script, tmp_path, capsys):
  compare_runs = load_script("compare_runs")
  (tmp_path / "qrels.txt").write_text("q0 0 a 1\nbroken\n")
  (tmp_path / "r.trec").write_text("q0 Q0 a 1 1.0 r\n")
  err = _one_line_exit_2(capsys, compare_runs, ["compare_runs.py", str(tmp_path / "r.trec"),
                                                f"--qrels={tmp_path / 'qrels.txt'}"], "qrels.txt:2")
  assert "--skip_bad" not in err


# --- every script's --help, and a clean console without a TPU -----------------------------------------------
# Runs each script as __main__ with --help in one interpreter (one import of jax and the rest, instead of one per
# script); the flags a script defined are dropped before the next defines its own.
_HELP_ALL = """
import contextlib, io, json, runpy, sys
from absl import flags
results = {}
for path in sys.argv[1:]:
  out, code = io.StringIO(), "returned without exiting"
  sys.argv = [path, "--help"]
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
    try:
      runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
      code = e.code
  for name in list(flags.FLAGS):
    if not (flags.FLAGS.find_module_defining_flag(name) or "").startswith("absl"):
      delattr(flags.FLAGS, name)
  results[path] = [code, out.getvalue()]
print(json.dumps(results))
"""


@pytest.mark.slow
def test_every_script_help_exits_0():
  import subprocess
  import sys
  from maxscore.distributed import processes
  scripts = sorted(str(p) for p in (REPO / "scripts").glob("*.py"))
  done = subprocess.run([sys.executable, "-c", _HELP_ALL, *scripts], capture_output=True, text=True, timeout=600,
                        env=processes.subprocess_env(1))
  assert done.returncode == 0, done.stderr[-3000:]
  results = json.loads(done.stdout)
  assert sorted(results) == scripts
  for path, (code, printed) in results.items():
    name = pathlib.Path(path).name
    assert code == 0, (name, code, printed[-500:])
    assert f"{name}:" in printed and "\n  --" in printed, (name, printed[-500:])  # its own flags' section


def test_jax_platform_default_only_where_libtpu_has_no_tpu():
  from maxscore import jax_platform
  choose = lambda env, libtpu, tpu, gpu=(): jax_platform.choose_platforms(env, libtpu, tpu, lambda: list(gpu))
  assert choose({}, libtpu=True, tpu=False) == "cpu"
  assert choose({}, libtpu=True, tpu=False, gpu=["cuda"]) == "cuda,cpu"
  assert choose({}, libtpu=True, tpu=True) is None          # a TPU VM keeps its TPU
  assert choose({}, libtpu=False, tpu=False) is None        # nothing to quiet
  assert choose({"JAX_PLATFORMS": "tpu"}, libtpu=True, tpu=False) is None  # the user's choice stands


def test_importing_maxscore_without_a_tpu_prints_nothing():
  import importlib.util as util
  import os
  import subprocess
  import sys
  from maxscore import jax_platform
  if util.find_spec("libtpu") is None or jax_platform.tpu_device_present():
    pytest.skip("needs libtpu installed on a machine without a TPU")
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  done = subprocess.run([sys.executable, "-c", "import maxscore, jax; jax.devices()"], cwd=REPO, text=True,
                        env=dict(env, PYTHONPATH=str(REPO)), capture_output=True, timeout=300)
  assert done.returncode == 0 and done.stderr == "", done.stderr
