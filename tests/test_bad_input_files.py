"""Broken files are one line (DESIGN.md section 9): every script turns a missing, unreadable, corrupt
or malformed input into one `error:` line naming the file (and line) and exit 2; a real bug keeps
its traceback. Data loaders fed random bytes raise only DataError."""

import importlib.util
import json
import pathlib
import shutil

import hypothesis
import pytest
from hypothesis import strategies as st

from maxscore.checkpoints import storage
from maxscore.rerank import data, eval as eval_lib
from maxscore.testing import hf_models

REPO = pathlib.Path(__file__).resolve().parent.parent
GOOD_LINE = json.dumps({"qid": "q0", "query": "a query", "candidates": [{"docid": "d0", "text": "a doc"}],
                        "qrels": {"d0": 1}})


def _script(name):
  spec = importlib.util.spec_from_file_location(f"_badfiles_{name}", REPO / "scripts" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


eval_rerank, score_script, convert_script = _script("eval_rerank"), _script("score"), _script("convert_hf_checkpoint")


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
  monkeypatch.setattr(eval_lib, "build_scorer", bug)
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
    except data.DataError:
      pass
