"""GGUF -> maxscore on small GGUF files written (as llama.cpp writes them) from the tiny random HF models:
names, metadata, the llama q/k permutation and Gemma's norm offset undone, checked against the HF model the
file came from and against transformers loading the same file; and the errors, with nothing written."""

import dataclasses
import json

import numpy as np
import pytest

from maxscore import Scorer
from maxscore.checkpoints import convert, gguf_reader, hf_config
from maxscore.checkpoints.convert import convert_gguf_checkpoint, convert_hf_checkpoint
from maxscore.checkpoints.hf_config import ConversionError
from maxscore.testing.gguf_files import bpe_tokenizer_metadata, sentencepiece_metadata, write_gguf
from maxscore.testing.hf_models import hf_logits, make_hf_model, save_hf_model

# name -> (family, overrides, 2-D tensor type). The overrides keep to what both a GGUF file and transformers' GGUF
# loader express: no Llama-3 RoPE scaling (llama.cpp stores it as a rope_freqs tensor), head_dim 128 for Qwen3 and
# 256 (= query_pre_attn_scalar) for Gemma 2/3, Gemma 2's default soft-caps, Gemma 3's default 5:1 layer pattern.
VARIANTS = {
    "llama_bias": ("llama", dict(rope_scaling=None, attention_bias=True, tie_word_embeddings=False), "F32"),
    "llama_kv1_tied_q8_0": ("llama", dict(rope_scaling=None, num_key_value_heads=1, tie_word_embeddings=True), "Q8_0"),
    "llama_linear_rope": ("llama", dict(rope_scaling={"rope_type": "linear", "factor": 2.0}), "F32"),
    "qwen2": ("qwen2", {}, "F32"),
    "qwen3_f16": ("qwen3", dict(head_dim=128), "F16"),
    "gemma": ("gemma", {}, "F32"),
    "gemma2_bf16": ("gemma2", dict(head_dim=256, query_pre_attn_scalar=256, attn_logit_softcapping=50.0,
                                   final_logit_softcapping=30.0), "BF16"),
    "gemma3": ("gemma3", dict(num_hidden_layers=6, head_dim=256, query_pre_attn_scalar=256, layer_types=None,
                              rope_parameters=None), "F32"),
}
# Files transformers' GGUF loader does not read as llama.cpp does (these are checked against the HF model only):
NOT_IN_TRANSFORMERS = {"gemma": "it has no gemma (v1) architecture",
                       "llama_bias": "its config never sets attention_bias, so it drops the biases llama.cpp applies",
                       "llama_linear_rope": "it ignores {arch}.rope.scaling.*"}
VOCAB = 96


@pytest.fixture(scope="module")
def gguf_variants(tmp_path_factory):
  """name -> (hf model, hf dir, gguf path, converted checkpoint), built on first use."""
  root = tmp_path_factory.mktemp("gguf")
  cache = {}

  def get(name):
    if name not in cache:
      family, overrides, tensor_type = VARIANTS[name]
      model = make_hf_model(family, vocab_size=VOCAB, **overrides)
      hf_dir = save_hf_model(model, root / f"{name}_hf")
      path = write_gguf(model, root / f"{name}.gguf", tensor_type=tensor_type)
      cache[name] = (model, hf_dir, path, convert_gguf_checkpoint(path, root / f"{name}_ckpt"))
    return cache[name]
  return get


def _transformers_from_gguf(path):
  import torch
  import transformers
  return transformers.AutoModelForCausalLM.from_pretrained(
      str(path.parent), gguf_file=path.name, dtype=torch.float32, attn_implementation="eager").eval()


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_logits_match_transformers_on_the_same_gguf(gguf_variants, name):
  model, _, path, ckpt = gguf_variants(name)
  scorer = Scorer.from_checkpoint(ckpt)
  oracles = [] if name in NOT_IN_TRANSFORMERS else [("transformers on the GGUF", _transformers_from_gguf(path))]
  if VARIANTS[name][2] == "F32":  # unquantized: the file holds the HF model's own weights
    oracles.append(("the HF model the GGUF was written from", model))
  assert oracles
  rng = np.random.default_rng(3)
  for t in (1, 40):  # 40: past every sliding window
    tokens = rng.integers(0, VOCAB, t)
    got = scorer.logits(tokens)
    for what, oracle in oracles:
      np.testing.assert_allclose(got, hf_logits(oracle, tokens), atol=1e-4, rtol=0, err_msg=what)


@pytest.mark.parametrize("name", ["llama_bias", "qwen2", "gemma", "gemma3"])
def test_metadata_and_tensors_map_as_the_hf_directory_does(gguf_variants, name):
  """The F32 GGUF's config and params equal the HF directory's: bit for bit, except Gemma's norms, which llama.cpp
  stores as 1 + w (w comes back within float32 rounding of 1)."""
  _, hf_dir, path, _ = gguf_variants(name)
  f = gguf_reader.GGUFFile(path)
  hf_json = json.loads((hf_dir / "config.json").read_text())
  from_gguf, from_hf = hf_config.model_config_from_hf(gguf_reader.hf_config(f)), hf_config.model_config_from_hf(hf_json)
  assert from_gguf.rms_norm_eps == pytest.approx(from_hf.rms_norm_eps, rel=1e-6)  # stored as float32
  assert dataclasses.replace(from_gguf, rms_norm_eps=from_hf.rms_norm_eps) == from_hf
  got = convert.convert_params(gguf_reader.GGUFTensorReader(f, gguf_reader.hf_config(f)), from_gguf, np.float32)
  want = convert.convert_params(convert._TensorReader(hf_dir), from_hf, np.float32)  # pylint: disable=protected-access
  flat_got, flat_want = _flat(got), _flat(want)
  assert flat_got.keys() == flat_want.keys()
  for key, w in flat_want.items():
    if name.startswith("gemma") and "norm" in key:
      np.testing.assert_allclose(flat_got[key], w, atol=2e-7, rtol=0, err_msg=key)
    else:
      np.testing.assert_array_equal(flat_got[key], w, err_msg=key)


def _flat(tree, prefix=""):
  out = {}
  for k, v in tree.items():
    out.update(_flat(v, f"{prefix}{k}/") if isinstance(v, dict) else {prefix + k: v})
  return out


def test_llama_q_and_k_rows_are_unpermuted(gguf_variants):
  """llama.cpp stores llama q/k rows permuted per head; the reader gives back the HF rows (biases too)."""
  model, _, path, _ = gguf_variants("llama_bias")
  f = gguf_reader.GGUFFile(path)
  reader = gguf_reader.GGUFTensorReader(f, gguf_reader.hf_config(f))
  for name in ("model.layers.1.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.bias"):
    want = model.state_dict()[name].numpy()
    stored = f.read(reader._names[name])  # pylint: disable=protected-access
    assert not np.array_equal(stored, want)  # the file's layout differs: the test can fail
    np.testing.assert_array_equal(reader.get(name, np.float32), want)


# --- the tokenizer ---------------------------------------------------------------------------------
CHAT = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def test_tokenizer_and_chat_template_come_from_the_gguf_metadata(tmp_path, hf_tokenizer_path):
  import transformers
  from maxscore.lm.tokenizer_training import sample_texts
  from maxscore.rerank import prompts
  model = make_hf_model("qwen2", vocab_size=520)
  path = write_gguf(model, tmp_path / "m.gguf", tokenizer=bpe_tokenizer_metadata(hf_tokenizer_path, CHAT))
  scorer = Scorer.from_checkpoint(convert_gguf_checkpoint(path, tmp_path / "ckpt"))
  original = transformers.PreTrainedTokenizerFast(tokenizer_file=str(hf_tokenizer_path))
  from_gguf = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="m.gguf")
  texts = sample_texts()[:50] + ["Yes No <sep> <s>x</s> 2024-11-26 ünïcödé 🙂"]
  for text in texts:
    want = original.encode(text, add_special_tokens=False)
    assert scorer.tokenizer.encode(text) == want == from_gguf.encode(text, add_special_tokens=False), text
  assert (scorer.tokenizer.bos_id, scorer.tokenizer.eos_id) == (original.convert_tokens_to_ids("<s>"),
                                                                original.convert_tokens_to_ids("</s>"))
  assert (scorer.tokenizer.path.parent / "chat_template.jinja").read_text() == CHAT
  chat = prompts.chat_segments(scorer.tokenizer, prompts.TEMPLATES["chat"])
  assert chat.query_segments[0].startswith("<|user|>Judge whether") and chat.item_segments[0].endswith(
      "</s>\n<|assistant|>")


def _train_sentencepiece_bpe(directory):
  """A 600-piece sentencepiece BPE model made as Gemma's is: byte fallback, no dummy prefix, no normalization,
  user-defined newlines, tabs and runs of 2 to 31 spaces, Gemma's special-token ids."""
  import sentencepiece as spm
  from maxscore.lm.tokenizer_training import sample_texts
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(sample_texts()), model_prefix=str(directory / "sp"), vocab_size=600, model_type="bpe",
      byte_fallback=True, add_dummy_prefix=False, remove_extra_whitespaces=False, normalization_rule_name="identity",
      split_digits=True, split_by_whitespace=False, allow_whitespace_only_pieces=True, pad_id=0, eos_id=1, bos_id=2,
      unk_id=3, control_symbols=["<start_of_turn>", "<end_of_turn>"],
      user_defined_symbols=["\n", "\n\n", "\t"] + ["\u2581" * n for n in range(2, 32)], minloglevel=2)
  return directory / "sp.model"


def test_sentencepiece_tokenizer_gives_the_ids_of_transformers_and_of_sentencepiece(tmp_path):
  """A sentencepiece vocabulary (tokenizer.ggml.model=llama) written as llama.cpp writes Gemma's: our tokenizer.json
  gives transformers' ids on every text, and the original sentencepiece model's ids except on runs of more than 31
  spaces, the longest whitespace piece (sentencepiece takes the longest piece first, BPE merges pairs)."""
  import re
  import sentencepiece as spm
  import transformers
  from maxscore.lm.tokenizer_training import sample_texts
  sp_model = _train_sentencepiece_bpe(tmp_path)
  sp = spm.SentencePieceProcessor(model_file=str(sp_model))
  model = make_hf_model("gemma3", vocab_size=sp.get_piece_size())
  path = write_gguf(model, tmp_path / "m.gguf", tokenizer=sentencepiece_metadata(sp_model))
  ours = Scorer.from_checkpoint(convert_gguf_checkpoint(path, tmp_path / "ckpt")).tokenizer
  hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="m.gguf")
  corners = ["  two   spaces    and\n\nlines\t\ttabs  ", " leading", "ünïcödé 🙂 \x00", "x" * 300, "a\u2581b",
             "<0x41>", "\n\n\n\n", "12345 6.78", " " * 40 + "z"]
  long_runs = []
  for text in sample_texts() + corners:
    ids = ours.encode(text)
    assert ids == hf.encode(text, add_special_tokens=False), text
    if ids != sp.encode(text):
      long_runs.append(text)
  assert long_runs and all(re.search(" {32}", text) for text in long_runs)
  # Control pieces and <unk> in the text are matched whole (as llama.cpp parses special tokens); sentencepiece
  # reads them as text.
  text = "<start_of_turn>user\nhi<end_of_turn><unk>"
  assert ours.encode(text) == hf.encode(text, add_special_tokens=False) == [
      sp.piece_to_id("<start_of_turn>"), *sp.encode("user\nhi"), sp.piece_to_id("<end_of_turn>"), sp.unk_id()]
  assert (ours.bos_id, ours.eos_id, ours.pad_id) == (2, 1, 0) and ours.decode(ours.encode("a  b\tü")) == "a  b\tü"


# --- errors: one clear line, nothing written --------------------------------------------------------
@pytest.fixture(scope="module")
def small_llama():
  return make_hf_model("llama", vocab_size=64, hidden_size=32, intermediate_size=64, head_dim=8, rope_scaling=None)


def _small_sentencepiece(case):
  """tokenizer.* keys of a minimal sentencepiece vocabulary (<unk>, the 256 byte pieces, a, b, ab), broken as
  `case` says."""
  tokens = ["<unk>"] + [f"<0x{b:02X}>" for b in range(256)] + ["a", "b", "ab"]
  types = [2] + [6] * 256 + [1, 1, 1]
  scores = [0.0] * 257 + [0.0, -1.0, -2.0]
  meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
          "tokenizer.ggml.token_type": types, "tokenizer.ggml.add_space_prefix": case == "sp_space_prefix"}
  if case == "sp_scores":
    meta["tokenizer.ggml.scores"] = scores[:-1] + [5.0]
  elif case == "sp_no_bytes":
    meta.update({key: value[:1] + value[257:] for key, value in meta.items() if isinstance(value, list)})
  elif case == "sp_merges":
    meta["tokenizer.ggml.merges"] = ["a b"]
  elif case == "sp_twice":
    meta["tokenizer.ggml.tokens"] = tokens[:-1] + ["a"]
  elif case == "sp_unk":
    meta["tokenizer.ggml.unknown_token_id"] = len(tokens)
  elif case == "sep_token":
    meta["tokenizer.ggml.add_sep_token"] = True
  return meta


@pytest.mark.parametrize("case,match", [
    ("truncated", r"truncated"),
    ("unknown_arch", r"general\.architecture='phi3' is not supported; supported: \['gemma', .*'qwen3'\]"),
    ("unknown_key", r"metadata keys this converter does not know .*llama\.expert_count"),
    ("missing_key", r"lacks llama\.embedding_length \(config\.json's hidden_size\)"),
    ("unsupported_type", r"tensor types not supported: blk\.0\.ffn_down\.weight \(F64\).*supported: F32, F16"),
    ("unknown_tokenizer", r"tokenizer\.ggml\.model='t5' is not supported; supported: gpt2 .*, llama"),
    ("sp_space_prefix", r"tokenizer\.ggml\.add_space_prefix=True \(sentencepiece's dummy prefix\) is not supported"),
    ("sp_scores", r"tokenizer\.ggml\.scores of the normal pieces do not fall with the token id"),
    ("sp_no_bytes", r"without the byte pieces <0x00>"),
    ("sp_merges", r"tokenizer\.ggml\.merges with tokenizer\.ggml\.model=llama is not supported"),
    ("sep_token", r"tokenizer\.ggml\.add_sep_token=True is not supported"),
    ("sp_twice", r"tokenizer\.ggml\.tokens spells 1 token\(s\) twice \(\['a'\]\)"),
    ("sp_unk", r"tokenizer\.ggml\.unknown_token_id=260 is not a token id \(0 to 259\)"),
    ("rope_freqs", r"rope_freqs\.weight"),
    ("not_gguf", r"not a readable GGUF file"),
])
def test_bad_gguf_files_are_one_clear_error_and_nothing_is_written(small_llama, tmp_path, case, match):
  path = tmp_path / "m.gguf"
  if case == "unknown_arch":
    write_gguf(small_llama, path, architecture="phi3")
  elif case == "unknown_key":
    write_gguf(small_llama, path, metadata={"expert_count": 4})
  elif case == "missing_key":
    write_gguf(small_llama, path, metadata={"embedding_length": None})
  elif case == "unknown_tokenizer":
    write_gguf(small_llama, path, tokenizer={"tokenizer.ggml.model": "t5", "tokenizer.ggml.tokens": ["a"]})
  elif case.startswith("sp_") or case == "sep_token":
    write_gguf(small_llama, path, tokenizer=_small_sentencepiece(case))
  elif case == "not_gguf":
    path.write_bytes(b"PK\x03\x04 not a gguf file at all")
  elif case == "unsupported_type":
    write_gguf(small_llama, path, edit=lambda t: dict(t, **{"blk.0.ffn_down.weight":
                                                             t["blk.0.ffn_down.weight"].astype(np.float64)}))
  elif case == "rope_freqs":
    write_gguf(small_llama, path, edit=lambda t: dict(t, **{"rope_freqs.weight": np.ones(4, np.float32)}))
  else:
    write_gguf(small_llama, path)
  if case == "truncated":
    data = path.read_bytes()
    path.write_bytes(data[:len(data) - 100])
    for cut in (24, 200, len(data) // 2):  # inside the header, the metadata and the tensor data
      (tmp_path / "cut.gguf").write_bytes(data[:cut])
      with pytest.raises(ConversionError, match=rf"cut\.gguf is truncated: .*the file has {cut}\b"):
        convert_gguf_checkpoint(tmp_path / "cut.gguf", tmp_path / "out")
  with pytest.raises(ConversionError, match=match) as e:
    convert_gguf_checkpoint(path, tmp_path / "out")
  assert "\n" not in str(e.value)
  assert not (tmp_path / "out").exists()


def test_script_converts_and_refuses_a_missing_file_in_one_line(gguf_variants, tmp_path, load_script, capsys):
  _, _, path, ckpt = gguf_variants("qwen2")
  script = load_script("convert_gguf_checkpoint")
  script.run(["convert_gguf_checkpoint.py", f"--gguf={path}", f"--output_dir={tmp_path / 'bf16'}", "--dtype=bfloat16"])
  scorer = Scorer.from_checkpoint(tmp_path / "bf16", weight_dtype="bfloat16")
  assert str(scorer.runner.params["embed"]["embedding"].dtype) == "bfloat16"
  with pytest.raises(SystemExit) as e:
    script.run(["convert_gguf_checkpoint.py", f"--gguf={tmp_path / 'nope.gguf'}", f"--output_dir={tmp_path / 'x'}"])
  assert e.value.code == 2 and f"{tmp_path / 'nope.gguf'} does not exist" in capsys.readouterr().err
  assert not (tmp_path / "x").exists()


def test_q8_0_loads_as_per_channel_int8_exactly_where_a_channel_shares_one_block_scale(small_llama, tmp_path):
  """--quantize=int8 on a Q8_0 file: a channel whose blocks share one scale keeps its stored codes and scale (no
  rounding); any other channel is requantized per channel from the exact dequantized values, within s / 2 of
  them and equal to what a scorer quantizing the float conversion at load computes."""
  from layers import quantization as quant
  from maxscore.checkpoints import gguf_quants, storage

  def shared_up(tensors):  # every 32-block of each ffn_up row holds the row's largest |w|: one Q8_0 scale per row
    w = tensors["blk.0.ffn_up.weight"].copy()
    w[:, ::32] = np.abs(w).max(axis=1, keepdims=True) * 1.5
    return dict(tensors, **{"blk.0.ffn_up.weight": w})
  path = write_gguf(small_llama, tmp_path / "m.gguf", tensor_type="Q8_0", edit=shared_up)
  f = gguf_reader.GGUFFile(path)
  codes, scale, exact = gguf_quants.q8_0_per_channel(f.tensors["blk.0.ffn_up.weight"].data,
                                                     f.shape("blk.0.ffn_up.weight"))
  stored = gguf_quants.unpack(f.tensors["blk.0.ffn_up.weight"].data, "Q8_0")
  assert exact.all() and np.array_equal(codes.reshape(-1), stored.codes_NxGxE.reshape(-1))
  assert np.array_equal(scale, stored.scale_NxGx1.reshape(len(scale), -1)[:, 0])
  assert not gguf_quants.q8_0_per_channel(f.tensors["blk.0.ffn_down.weight"].data,
                                          f.shape("blk.0.ffn_down.weight"))[2].any()  # per-block scales differ

  ckpt = convert_gguf_checkpoint(path, tmp_path / "int8", quantize="int8")
  float_ckpt = convert_gguf_checkpoint(path, tmp_path / "float")
  assert storage.stored_quantization(ckpt) == "int8"
  got = storage.restore_checkpoint(ckpt).params
  flt = storage.restore_checkpoint(float_ckpt).params
  up, up_scale = np.asarray(got["layers"]["mlp"]["up"][0]), np.asarray(got["layers"]["mlp"]["up_scale"][0])
  assert up.dtype == np.int8 and np.array_equal(up, codes.T) and np.array_equal(up_scale, scale)
  np.testing.assert_array_equal(up * up_scale, flt["layers"]["mlp"]["up"][0])  # no rounding at all
  # Requantized channels (every other projection, llama's permuted q/k among them): as quantized at load.
  at_load = quant.quantize_params(flt, "int8_weights")
  for name in ("q", "k", "o"):
    np.testing.assert_array_equal(got["layers"]["attn"][name], at_load["layers"]["attn"][name])
    w = quant.dequantize(got["layers"]["attn"][name], got["layers"]["attn"][f"{name}_scale"],
                         (1, 2) if name == "o" else (1,))
    bound = np.expand_dims(np.asarray(got["layers"]["attn"][f"{name}_scale"]), (1, 2) if name == "o" else (1,))
    assert np.all(np.abs(np.asarray(w) - flt["layers"]["attn"][name]) <= bound / 2 + 1e-9)
  np.testing.assert_array_equal(got["layers"]["mlp"]["down"], at_load["layers"]["mlp"]["down"])
  np.testing.assert_array_equal(got["lm_head"], at_load["lm_head"])  # the separate lm_head is Q8_0 too
  assert got["lm_head"].dtype == np.int8
  # It scores as the float conversion quantized at load, up to the exact channels (which are closer).
  kw = dict(mesh=None, separator_token_id=3)
  a = Scorer.from_checkpoint(ckpt, **kw).score([4, 9, 12], [[5, 6], [7, 8, 9]], [5, 17]).scores
  b = Scorer.from_checkpoint(float_ckpt, quantization="int8_weights", **kw).score(
      [4, 9, 12], [[5, 6], [7, 8, 9]], [5, 17]).scores
  np.testing.assert_allclose(a, b, atol=1e-3)


def test_q8_0_channels_sharing_a_scale_keep_codes_that_requantizing_would_round():
  """Block bytes written by hand: row 0's two blocks share d and no code reaches 127 (gguf's quantizer always
  reaches it, a file need not), so requantizing its float values (s = max|w| / 127) would round the codes
  again; the exact load keeps them. Row 1's blocks differ in d: requantized, within s / 2."""
  from layers import quantization as quant
  from maxscore.checkpoints import gguf_quants
  rng = np.random.default_rng(0)
  q = rng.integers(-100, 101, size=(2, 2, 32)).astype(np.int8)
  d = np.asarray([[0.01, 0.01], [0.01, 0.02]], np.float16)
  blocks = np.concatenate([d.reshape(4, 1).view(np.uint8), q.reshape(4, 32).view(np.uint8)], axis=1)
  codes, scale, exact = gguf_quants.q8_0_per_channel(blocks.reshape(-1), (2, 64))
  assert exact.tolist() == [True, False]
  assert np.array_equal(codes[0], q[0].reshape(-1)) and scale[0] == np.float32(d[0, 0])
  w = gguf_quants.dequantize(blocks.reshape(-1), "Q8_0", (2, 64))
  requantized, requantized_scale = (np.asarray(x) for x in quant.quantize(w, (1,)))
  assert not np.array_equal(requantized[0], codes[0])  # what the float round trip would have stored
  assert np.array_equal(codes[1], requantized[1]) and scale[1] == requantized_scale[1]
  assert np.abs(codes[1] * scale[1] - w[1]).max() <= scale[1] / 2
  assert np.array_equal(codes[0] * scale[0], w[0])


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_q8_0_loads_as_stored_with_group_size_32_and_scores_as_the_float_conversion(tmp_path, family):
  """--quantize=int8 --quantize_group_size=32 on a Q8_0 file keeps every projection's codes and f16 block scales
  as stored (Q8_0's own layout: no float round trip, no rounding), llama's permuted q/k rows included: each
  dequantized weight equals the float conversion's, and the checkpoint scores exactly as the float one does."""
  from layers import quantization as quant
  from maxscore.checkpoints import gguf_quants, storage
  model = make_hf_model(family, vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=2,
                        num_key_value_heads=1, head_dim=32, tie_word_embeddings=False,
                        **(dict(rope_scaling=None) if family == "llama" else {}))
  path = write_gguf(model, tmp_path / "m.gguf", tensor_type="Q8_0")
  ckpt = convert_gguf_checkpoint(path, tmp_path / "g32", quantize="int8", quantize_group_size=32)
  float_ckpt = convert_gguf_checkpoint(path, tmp_path / "float")
  assert storage.stored_group_size(ckpt) == 32
  got, flt = (storage.restore_checkpoint(c).params for c in (ckpt, float_ckpt))
  f = gguf_reader.GGUFFile(path)
  codes, _ = gguf_quants.q8_0_blocks(f.tensors["blk.1.ffn_down.weight"].data, f.shape("blk.1.ffn_down.weight"))
  assert np.array_equal(got["layers"]["mlp"]["down"][1], codes.T)
  for module, names in (("attn", ("q", "k", "v", "o")), ("mlp", ("gate", "up", "down"))):
    for name in names:
      axes = (1, 2) if name == "o" else (1,)
      w = quant.dequantize(got["layers"][module][name], got["layers"][module][f"{name}_scale"], axes)
      np.testing.assert_array_equal(w, flt["layers"][module][name], err_msg=name)
  np.testing.assert_array_equal(quant.dequantize(got["lm_head"], got["lm_head_scale"], (0,)), flt["lm_head"])
  kw = dict(mesh=None, separator_token_id=3)
  a = Scorer.from_checkpoint(ckpt, **kw)
  b = Scorer.from_checkpoint(float_ckpt, **kw)
  assert (a.runner.quantization, a.runner.quantization_group) == ("int8_weights", 32)
  request = ([4, 9, 12, 40], [[5, 6], [7, 8, 9], []], [5, 17])
  np.testing.assert_array_equal(a.score(*request).scores, b.score(*request).scores)
  np.testing.assert_array_equal(a.logits([4, 9, 12, 40, 3, 5]), b.logits([4, 9, 12, 40, 3, 5]))


def test_a_group_size_the_model_cannot_hold_is_refused_and_nothing_is_written(small_llama, tmp_path):
  """head_dim 8: Q8_0's 32-weight blocks of o_proj run across heads, which per-head groups cannot hold."""
  path = write_gguf(small_llama, tmp_path / "m.gguf", tensor_type="Q8_0")
  with pytest.raises(ConversionError, match=r"quantize_group_size=32 must divide each contracting dim .*head_dim 8\)"):
    convert_gguf_checkpoint(path, tmp_path / "g32", quantize="int8", quantize_group_size=32)
  assert not (tmp_path / "g32").exists()
