"""Nothing lost, nothing mixed (docs/ARCHITECTURE.md section 9), as the library sees it: an output never replaces
its input or a foreign file, --overwrite removes only what maxscore wrote, an interrupted write keeps the old file,
a resumed eval refuses changed weights or tokenizer, and a cache entry moves in whole, its key last (the scripts'
refusals: tests/test_data_safety.py)."""

import dataclasses
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import jax
import pytest

from maxscore.checkpoints import head_storage
from maxscore.checkpoints import storage
from maxscore.checkpoints.convert import convert_hf_checkpoint
from maxscore.datasets import data
from maxscore.errors import ResumeError, TrainError, UnsafeOutputError
from maxscore.files import cache, identity, safety
from maxscore.heads import head
from maxscore.rerank import eval as eval_lib
from maxscore.scoring import jsonl as score_file
from maxscore.scoring import loading
from maxscore.testing.disk import foreign_dir, tiny_set, tree
from maxscore.training.reranker import train as train_lib
from maxscore.training.reranker.config import TrainConfig

REPO = pathlib.Path(__file__).resolve().parent.parent
CFG = eval_lib.EvalConfig(max_query_tokens=4, max_item_tokens=8)


@pytest.fixture(scope="module")
def scorer():
  return loading.build_scorer(use_head=False)


# --- score.py ------------------------------------------------------------------------------------------
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
  dst.write_text("previous responses\n")  # replaced on success (--overwrite), intact if the run is killed
  proc = subprocess.Popen([sys.executable, str(REPO / "scripts" / "score.py"), f"--input={src}", f"--output={dst}",
                           "--batch_size=1", "--overwrite"], env=dict(os.environ, PYTHONPATH=str(REPO)),
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
  before = tree(hf_dir)
  for out in (hf_dir, hf_dir / "sub"):
    with pytest.raises(UnsafeOutputError, match="the input"):
      convert_hf_checkpoint(hf_dir, out, overwrite=True)
  assert tree(hf_dir) == before


def test_convert_overwrite_refuses_an_unrelated_directory_and_replaces_its_own(hf_checkpoints, tmp_path):
  _, hf_dir, _ = hf_checkpoints("qwen3_kv2_tied")
  other = tmp_path / "home"
  before = foreign_dir(other)
  with pytest.raises(UnsafeOutputError, match="not written by maxscore"):
    convert_hf_checkpoint(hf_dir, other, overwrite=True)
  assert tree(other) == before
  ckpt = convert_hf_checkpoint(hf_dir, tmp_path / "ckpt")
  with pytest.raises(UnsafeOutputError, match="already exists"):
    convert_hf_checkpoint(hf_dir, ckpt)
  assert convert_hf_checkpoint(hf_dir, ckpt, overwrite=True) == ckpt
  assert safety.is_owned(ckpt, "checkpoint") and storage.restore_checkpoint(ckpt).digest


def test_export_refuses_an_existing_foreign_directory_even_with_overwrite(tmp_path):
  cfg = head.HeadConfig(kind="lm_labels", label_token_ids=(4, 5), hidden_size=128, delta="none")
  params = head.init_head(cfg, jax.random.PRNGKey(0))
  target = tmp_path / "existing"
  before = foreign_dir(target)
  for overwrite in (False, True):
    with pytest.raises(UnsafeOutputError, match="not written by maxscore"):
      head_storage.export_checkpoint(data.DEFAULT_CHECKPOINT, target, cfg, params, overwrite=overwrite)
  assert tree(target) == before


def test_train_export_dir_existing_directory_is_kept_without_overwrite(tmp_path):
  target = tmp_path / "export"
  before = foreign_dir(target)
  dataset = tiny_set(tmp_path / "d.jsonl")
  with pytest.raises(UnsafeOutputError, match="not written by maxscore"):
    train_lib.train(TrainConfig.of(num_steps=1), CFG, None, dataset, None, tmp_path / "work",
                    export_dir=target, progress=False)
  assert tree(target) == before


def test_train_export_of_a_random_init_model_is_refused_before_any_work(tmp_path):
  """A random-init model (--checkpoint_dir=none) has no base checkpoint to export beside the weights."""
  dataset = tiny_set(tmp_path / "d.jsonl")
  with pytest.raises(TrainError, match="--checkpoint_dir=none.*leave out --export_dir"):
    train_lib.train(TrainConfig.of(num_steps=1), CFG, "none", dataset, None, tmp_path / "work",
                    export_dir=tmp_path / "export", progress=False)
  assert not (tmp_path / "work").exists() and not (tmp_path / "export").exists()


def test_train_export_inside_the_workdir_is_refused_with_where_to_put_it(tmp_path):
  dataset = tiny_set(tmp_path / "d.jsonl")
  with pytest.raises(UnsafeOutputError, match="choose an export path outside it"):
    train_lib.train(TrainConfig.of(num_steps=1), CFG, None, dataset, None, tmp_path / "work",
                    export_dir=tmp_path / "work" / "export", progress=False)


@pytest.mark.parametrize("where", ["inside", "foreign"])
def test_pretrain_export_refused_before_any_work(tmp_path, where):
  """Pretraining checks its export as the score-head trainer does: never inside the workdir (which
  --overwrite removes), and an existing directory maxscore did not write is left alone."""
  from maxscore.lm import pretrain as pretrain_lib  # pylint: disable=import-outside-toplevel
  export = tmp_path / "work" / "model" if where == "inside" else tmp_path / "model"
  if where == "foreign":
    foreign_dir(export)
  before = tree(tmp_path)
  with pytest.raises(UnsafeOutputError, match="outside it" if where == "inside" else "not written by maxscore"):
    pretrain_lib.pretrain(pretrain_lib.PretrainConfig(num_steps=1), data.DEFAULT_CHECKPOINT / "tokenizer" /
                          "tokenizer.model", ["text"] * 4, [], tmp_path / "work", export_dir=export, progress=False)
  assert not (tmp_path / "work").exists() and tree(tmp_path) == before


def test_train_workdir_overwrite_refuses_a_directory_maxscore_did_not_write(tmp_path):
  workdir = tmp_path / "home"
  before = foreign_dir(workdir)
  dataset = tiny_set(tmp_path / "d.jsonl")
  for overwrite in (True, False):
    with pytest.raises(UnsafeOutputError, match="not written by maxscore"):
      train_lib.train(TrainConfig.of(num_steps=1), CFG, None, dataset, None, workdir,
                      overwrite=overwrite, progress=False)
  assert tree(workdir) == before


# --- eval outputs and resume identity ----------------------------------------------------------------
def test_eval_output_dir_equal_to_the_beir_data_directory_keeps_run_trec(tmp_path, scorer):
  d = tmp_path / "beir"
  (d / "qrels").mkdir(parents=True)
  (d / "corpus.jsonl").write_text('{"_id": "d0", "text": "a doc"}\n')
  (d / "queries.jsonl").write_text('{"_id": "q0", "text": "a query"}\n')
  (d / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td0\t1\n")
  (d / "run.trec").write_text("q0 Q0 d0 1 2.0 bm25\n")
  dataset = data.load_beir(d, d / "run.trec")
  before = tree(d)
  for out in (d, d / "eval"):
    with pytest.raises(UnsafeOutputError, match="the input"):
      eval_lib.run_eval(scorer, dataset, CFG, out, progress=False)
  assert tree(d) == before


def test_eval_output_dir_holding_foreign_files_is_refused(tmp_path, scorer):
  out = tmp_path / "results"
  before = foreign_dir(out)
  with pytest.raises(UnsafeOutputError, match="not written by maxscore"):
    eval_lib.run_eval(scorer, tiny_set(tmp_path / "d.jsonl"), CFG, out, progress=False, overwrite=True)
  assert tree(out) == before


def test_eval_resume_refused_after_weights_replaced_in_place(tmp_path, two_checkpoints):
  a, b = two_checkpoints
  ckpt, out = tmp_path / "model", tmp_path / "out"
  dataset = tiny_set(tmp_path / "d.jsonl")
  shutil.copytree(a, ckpt)
  eval_lib.run_eval(loading.build_scorer(str(ckpt)), dataset, dataclasses.replace(CFG, max_queries=1), out,
                    progress=False)
  shutil.rmtree(ckpt)
  shutil.copytree(b, ckpt)  # same path, other weights
  with pytest.raises(ResumeError, match=r"changed: scorer.params_sha256.*--overwrite"):
    eval_lib.run_eval(loading.build_scorer(str(ckpt)), dataset, CFG, out, progress=False)
  shutil.rmtree(ckpt / "params")
  shutil.copytree(b / "params", ckpt / "params")  # only params/ replaced: its files no longer match
  shutil.copy2(a / "maxscore.json", ckpt / "maxscore.json")
  with pytest.raises(storage.CheckpointError, match="is not what was written"):
    loading.build_scorer(str(ckpt))


def test_eval_resume_refused_after_reconverting_with_other_weights(tmp_path, hf_checkpoints, sp_tokenizer_path):
  _, hf_dir, _ = hf_checkpoints("qwen3_kv2_tied")
  ckpt, out = tmp_path / "ckpt", tmp_path / "out"
  cfg = dataclasses.replace(CFG, labels=("5", "17"))
  over = [f"tokenizer_path={sp_tokenizer_path}"]
  dataset = tiny_set(tmp_path / "d.jsonl")
  convert_hf_checkpoint(hf_dir, ckpt)
  eval_lib.run_eval(loading.build_scorer(str(ckpt), over), dataset, dataclasses.replace(cfg, max_queries=1), out,
                    progress=False)
  convert_hf_checkpoint(hf_dir, ckpt, overwrite=True)  # the same weights again: resumes
  report = eval_lib.run_eval(loading.build_scorer(str(ckpt), over), dataset, cfg, out, progress=False)
  assert report.summary["queries_resumed"] == 1
  convert_hf_checkpoint(hf_dir, ckpt, dtype="bfloat16", overwrite=True)
  with pytest.raises(ResumeError, match=r"changed: scorer.params_sha256"):
    eval_lib.run_eval(loading.build_scorer(str(ckpt), over), dataset, cfg, out, progress=False)


def test_eval_resume_refused_after_tokenizer_changed(tmp_path, two_checkpoints, sp_tokenizer_path, scorer):
  a, _ = two_checkpoints
  out = tmp_path / "out"
  dataset = tiny_set(tmp_path / "d.jsonl")
  eval_lib.run_eval(loading.build_scorer(str(a)), dataset, dataclasses.replace(CFG, max_queries=1), out,
                    progress=False)
  same = tmp_path / "copy.model"  # the same tokenizer at another path resumes: identity is content
  shutil.copy2(a / "tokenizer" / "tokenizer.model", same)
  report = eval_lib.run_eval(loading.build_scorer(str(a), [f"tokenizer_path={same}"]), dataset, CFG, out,
                             progress=False)
  assert report.summary["queries_resumed"] == 1
  with pytest.raises(ResumeError, match=r"changed: scorer.tokenizer_sha256"):
    eval_lib.run_eval(loading.build_scorer(str(a), [f"tokenizer_path={sp_tokenizer_path}"]), dataset, CFG,
                      out, progress=False)
  ckpt = tmp_path / "model"  # the tokenizer file replaced in place, at the same path
  shutil.copytree(a, ckpt)
  eval_lib.run_eval(loading.build_scorer(str(ckpt)), dataset, CFG, tmp_path / "out2", progress=False)
  shutil.copy2(sp_tokenizer_path, ckpt / "tokenizer" / "tokenizer.model")
  with pytest.raises(ResumeError, match=r"changed: scorer.tokenizer_sha256"):
    eval_lib.run_eval(loading.build_scorer(str(ckpt)), dataset, CFG, tmp_path / "out2", progress=False)


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


def test_a_cache_entry_moves_in_file_by_file_its_key_last_and_a_failed_build_moves_nothing(tmp_path, monkeypatch):
  entry = tmp_path / "cache" / "entry"
  entry.mkdir(parents=True)
  (entry / "key.json").write_text("old")
  with pytest.raises(RuntimeError):
    with cache.building(entry, "key.json") as built:
      (built / "key.json").write_text("new")
      raise RuntimeError("the build failed")
  assert (entry / "key.json").read_text() == "old" and sorted(p.name for p in entry.parent.iterdir()) == ["entry"]
  moved = []
  real_replace = os.replace
  monkeypatch.setattr(os, "replace", lambda a, b: (moved.append(pathlib.Path(b).relative_to(entry)),
                                                   real_replace(a, b)))
  with cache.building(entry, "key.json") as built:
    (built / "key.json").write_text("new")
    (built / "sub").mkdir()
    for name in ("a.npy", "sub/b.npy", "z.json"):
      (built / name).write_text(name)
  assert moved[-1] == pathlib.Path("key.json") and sorted(map(str, moved)) == ["a.npy", "key.json", "sub/b.npy",
                                                                              "z.json"]
  assert (entry / "key.json").read_text() == "new" and (entry / "sub" / "b.npy").read_text() == "sub/b.npy"
  assert sorted(p.name for p in entry.parent.iterdir()) == ["entry"]  # the builder's directory is gone
  with pytest.raises(FileNotFoundError, match="has no key.json"):
    with cache.building(entry, "key.json") as built:
      (built / "a.npy").write_text("without its key")
  assert (entry / "a.npy").read_text() == "a.npy"


def test_a_published_cache_directory_is_the_first_build_and_a_failed_build_publishes_nothing(tmp_path):
  entry = tmp_path / "cache" / "base"
  with pytest.raises(RuntimeError):
    with cache.publishing(entry) as private:
      private.mkdir()
      (private / "params").write_text("half")
      raise RuntimeError("the conversion failed")
  assert not entry.parent.exists() or list(entry.parent.iterdir()) == []
  for build in ("first", "second"):  # the second finds the first in place: it stays, and the second is dropped
    with cache.publishing(entry) as private:
      private.mkdir()
      (private / "params").write_text(build)
  assert (entry / "params").read_text() == "first" and [p.name for p in entry.parent.iterdir()] == ["base"]
  cache.set_aside(entry)
  cache.set_aside(entry)  # already gone: nothing to do
  assert list(entry.parent.iterdir()) == []
