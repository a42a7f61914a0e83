"""Tests for maxscore.checkpoints.tokenizer on tiny sentencepiece and byte-level BPE models trained here."""

import json

import pytest
import sentencepiece as spm
import tokenizers

from maxscore.errors import ScoreInputError
from maxscore.lm import tokenizer_training
from maxscore.testing import tokenizers as testing_tokenizers
from maxscore.checkpoints.tokenizer import find_tokenizer_file, load_tokenizer

KINDS = ("sentencepiece", "hf")
TEXTS = (
  "Is this passage relevant to the query?",
  "naïve café — Zürich",
  "排序模型为候选文档打分",
  "نموذج الترتيب يقيّم المستندات",
  "ranking 🚀🔥 results",
  "unseen emoji fall back to bytes: 🦩🪿",
  "  leading, double  spaces and\nnewlines\t",
)


@pytest.fixture(scope="module")
def tokenizer_files(tmp_path_factory):
  """Trains each kind once; maps kind -> (directory, tokenizer file)."""
  texts = tokenizer_training.sample_texts()
  sp_dir = tmp_path_factory.mktemp("sp")
  hf_dir = tmp_path_factory.mktemp("hf")
  return {
    "sentencepiece": (sp_dir, tokenizer_training.train_sentencepiece(sp_dir / "tokenizer", texts)),
    "hf": (hf_dir, testing_tokenizers.train_hf_bpe(hf_dir, texts)),
  }


@pytest.fixture(params=KINDS)
def tok(request, tokenizer_files):
  return load_tokenizer(tokenizer_files[request.param][1])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("from_dir", [False, True], ids=["file", "dir"])
def test_load(tokenizer_files, kind, from_dir):
  directory, file = tokenizer_files[kind]
  tok = load_tokenizer(directory if from_dir else str(file))
  assert tok.kind == kind
  assert tok.path == file
  assert find_tokenizer_file(directory) == file


def test_directory_prefers_tokenizer_json(tokenizer_files, tmp_path):
  (tmp_path / "tokenizer.json").write_bytes(tokenizer_files["hf"][1].read_bytes())
  (tmp_path / "tokenizer.model").write_bytes(tokenizer_files["sentencepiece"][1].read_bytes())
  assert find_tokenizer_file(tmp_path) == tmp_path / "tokenizer.json"
  assert load_tokenizer(tmp_path).kind == "hf"


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok, text):
  ids = tok.encode(text)
  assert ids and all(0 <= i < tok.vocab_size for i in ids)
  assert tok.decode(ids) == text


def test_encode_adds_no_bos_or_eos(tok):
  ids = tok.encode("query")
  assert tok.bos_id not in ids and tok.eos_id not in ids
  assert tok.encode("") == []


def test_unseen_emoji_uses_byte_fallback(tokenizer_files):
  sp = spm.SentencePieceProcessor(model_file=str(tokenizer_files["sentencepiece"][1]))
  pieces = sp.encode("🦩", out_type=str)
  assert "<0xF0>" in pieces  # 🦩 is F0 9F A6 A9 in UTF-8


@pytest.mark.parametrize("token", ["Yes", "No", "<sep>"])
def test_single_token_labels(tok, token):
  token_id = tok.token_to_id(token)
  assert tok.label_id(token) == token_id
  assert tok.decode([token_id]) == token
  assert tok.special_tokens()["<sep>"] == tok.token_to_id("<sep>")


def _is_piece(tok, text):
  try:
    tok.token_to_id(text)
    return True
  except ScoreInputError:
    return False


def test_label_id_falls_back_to_single_token_encoding(tok):
  # Common words that are no piece themselves but encode to one ("▁the" / "Ġthe").
  words = [w for w in ("the", " the", "is", " is", "of", " of") if not _is_piece(tok, w)]
  single = [(w, tok.encode(w)) for w in words if len(tok.encode(w)) == 1]
  assert single, f"no single-token word among {words}"
  for word, ids in single:
    assert tok.label_id(word) == ids[0]
  with pytest.raises(ScoreInputError, match=r"encodes to \d+ tokens"):
    tok.label_id(" Yes maybe")


def test_unknown_token_names_it_and_suggests(tok):
  with pytest.raises(ScoreInputError, match="Yess") as err:
    tok.token_to_id("Yess")
  assert "'Yes'" in str(err.value)  # the close match is suggested


def test_vocab_and_special_ids(tok, tokenizer_files):
  file = tokenizer_files[tok.kind][1]
  if tok.kind == "sentencepiece":
    sp = spm.SentencePieceProcessor(model_file=str(file))
    assert tok.vocab_size == sp.get_piece_size()
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (sp.bos_id(), sp.eos_id(), sp.pad_id())
    assert {"<unk>", "<s>", "</s>", "<pad>", "Yes", "No", "<sep>"} <= set(tok.special_tokens())
    assert not any(p.startswith("<0x") for p in tok.special_tokens())  # byte pieces are not
  else:
    hf = tokenizers.Tokenizer.from_file(str(file))
    assert tok.vocab_size == hf.get_vocab_size(with_added_tokens=True)
    assert max(hf.get_vocab(with_added_tokens=True).values()) == tok.vocab_size - 1
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (1, 2, 0)
    assert {"<pad>", "<s>", "</s>", "<sep>", "Yes", "No"} <= set(tok.special_tokens())
  assert all(0 <= i < tok.vocab_size for i in tok.special_tokens().values())


def test_hf_special_ids_follow_tokenizer_config(tokenizer_files, tmp_path):
  (tmp_path / "tokenizer.json").write_bytes(tokenizer_files["hf"][1].read_bytes())
  config = {"bos_token": None, "eos_token": {"content": "<sep>"}, "pad_token": "</s>"}
  (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
  tok = load_tokenizer(tmp_path)
  assert (tok.bos_id, tok.eos_id, tok.pad_id) == (None, 3, 2)


def test_missing_path_is_named(tmp_path):
  missing = tmp_path / "nope" / "tokenizer.model"
  with pytest.raises(FileNotFoundError, match="nope"):
    load_tokenizer(missing)
  with pytest.raises(FileNotFoundError, match=r"tokenizer\.json"):
    load_tokenizer(tmp_path)  # a directory with no tokenizer in it
  assert find_tokenizer_file(tmp_path) is None


def test_unsupported_suffix(tmp_path):
  bad = tmp_path / "vocab.txt"
  bad.write_text("a\n")
  with pytest.raises(ValueError, match=r"vocab\.txt"):
    load_tokenizer(bad)
