"""Exact conversion: every source tensor is used or allow-listed, shapes and dtypes are checked first."""

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from maxscore.checkpoints.convert import convert_hf_checkpoint
from maxscore.checkpoints.hf_config import ConversionError
from maxscore.errors import UnsafeOutputError
from maxscore.testing.hf_models import make_hf_model, save_hf_model


@pytest.fixture(scope="module")
def three_layer_dir(tmp_path_factory):
  model = make_hf_model("llama", vocab_size=64, num_hidden_layers=3, hidden_size=32, intermediate_size=48,
                        head_dim=8)
  return save_hf_model(model, tmp_path_factory.mktemp("hf3") / "hf")


def _copy(src, dst, config_edit=None, tensors_edit=None):
  dst.mkdir()
  config = json.loads((src / "config.json").read_text())
  (dst / "config.json").write_text(json.dumps(dict(config, **(config_edit or {}))))
  tensors = load_file(src / "model.safetensors")
  save_file(dict(tensors, **(tensors_edit or {})), dst / "model.safetensors")
  return dst


def test_extra_layer_weights_fail_naming_them(three_layer_dir, tmp_path):
  hf = _copy(three_layer_dir, tmp_path / "hf", {"num_hidden_layers": 2})
  with pytest.raises(ConversionError, match=r"does not use.*model\.layers\.2\.") as e:
    convert_hf_checkpoint(hf, tmp_path / "out")
  assert "model.layers.2.mlp.down_proj.weight" in str(e.value)
  assert not (tmp_path / "out").exists()  # nothing written


def test_unknown_tensor_fails_and_rotary_inv_freq_is_allowed(three_layer_dir, tmp_path):
  extra = {"model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(4, np.float32)}
  ok = _copy(three_layer_dir, tmp_path / "ok", tensors_edit=extra)
  convert_hf_checkpoint(ok, tmp_path / "out")
  bad = _copy(three_layer_dir, tmp_path / "bad", tensors_edit={"model.vision_tower.weight": np.ones(2, np.float32)})
  with pytest.raises(ConversionError, match="model.vision_tower.weight"):
    convert_hf_checkpoint(bad, tmp_path / "out2")


def test_shapes_and_dtypes_are_checked_before_writing(three_layer_dir, tmp_path):
  hf = _copy(three_layer_dir, tmp_path / "shape", {"intermediate_size": 40})
  with pytest.raises(ConversionError, match=r"model\.layers\.0\.mlp\.gate_proj\.weight is F32\[48, 32\], "
                                            r"config\.json implies \[40, 32\]"):
    convert_hf_checkpoint(hf, tmp_path / "out")
  ints = {"model.norm.weight": np.ones(32, np.int32)}
  hf = _copy(three_layer_dir, tmp_path / "dtype", tensors_edit=ints)
  with pytest.raises(ConversionError, match=r"model\.norm\.weight is I32"):
    convert_hf_checkpoint(hf, tmp_path / "out")
  hf = _copy(three_layer_dir, tmp_path / "missing", {"num_hidden_layers": 4})
  with pytest.raises(ConversionError, match=r"missing.*model\.layers\.3\."):
    convert_hf_checkpoint(hf, tmp_path / "out")
  assert not (tmp_path / "out").exists()


# --- conversion never guesses ----------------------------------------------------------------------
def test_defaults_for_absent_keys_are_transformers_defaults():
  """HF_DEFAULTS holds, per family, exactly what transformers' config class takes for an absent key."""
  from maxscore.checkpoints.hf_config import HF_DEFAULTS
  from maxscore.testing.hf_models import _classes
  for model_type, defaults in HF_DEFAULTS.items():
    hf = _classes(model_type)[0]()
    rope = hf.rope_parameters
    for key, value in defaults.items():
      if key == "rope_theta":
        got = (rope.get("full_attention") or rope)["rope_theta"]
      elif key == "rope_local_base_freq":
        got = rope["sliding_attention"]["rope_theta"]
      elif key == "sliding_window_pattern":
        got = hf._sliding_window_pattern
      else:
        got = getattr(hf, key)
      assert got == value, (model_type, key, got, value)


@pytest.mark.slow
@pytest.mark.parametrize("family,drop", [
    ("gemma2", ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping")),
    ("gemma3", ("rope_parameters", "query_pre_attn_scalar")),
])
def test_absent_keys_convert_as_transformers_loads_them(tmp_path, family, drop):
  """config.json without these keys: the converted model's logits are transformers' on the same directory."""
  import transformers
  from maxscore import Scorer
  from maxscore.testing.hf_models import hf_logits
  hf_dir = save_hf_model(make_hf_model(family, vocab_size=96), tmp_path / "hf")
  config = json.loads((hf_dir / "config.json").read_text())
  assert all(k in config for k in drop)
  (hf_dir / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k not in drop}))
  model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, attn_implementation="eager").eval()
  tokens = np.arange(40) * 7 % 96
  want = hf_logits(model, tokens)
  got = Scorer.from_checkpoint(convert_hf_checkpoint(hf_dir, tmp_path / "ckpt")).logits(tokens)
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_tied_embeddings_with_a_different_saved_lm_head_are_refused(three_layer_dir, tmp_path):
  hf = _copy(three_layer_dir, tmp_path / "hf", {"tie_word_embeddings": True})
  with pytest.raises(ConversionError, match="lm_head.weight"):
    convert_hf_checkpoint(hf, tmp_path / "out")
  assert not (tmp_path / "out").exists()


def test_non_finite_tensors_are_refused_naming_them(three_layer_dir, tmp_path):
  bad = load_file(three_layer_dir / "model.safetensors")["model.layers.1.mlp.up_proj.weight"].copy()
  bad[0, 0] = np.nan
  inf = np.full(32, np.inf, np.float32)
  hf = _copy(three_layer_dir, tmp_path / "hf", tensors_edit={"model.layers.1.mlp.up_proj.weight": bad,
                                                             "model.norm.weight": inf})
  with pytest.raises(ConversionError) as e:
    convert_hf_checkpoint(hf, tmp_path / "out")
  assert "model.layers.1.mlp.up_proj.weight" in str(e.value) and "model.norm.weight" in str(e.value)
  assert not (tmp_path / "out").exists()


def test_wrongly_typed_config_values_name_each_key(three_layer_dir, tmp_path):
  hf = _copy(three_layer_dir, tmp_path / "hf", {"num_attention_heads": "four", "rms_norm_eps": None})
  with pytest.raises(ConversionError) as e:
    convert_hf_checkpoint(hf, tmp_path / "out")
  assert "num_attention_heads" in str(e.value) and "rms_norm_eps" in str(e.value)


def test_an_unrelated_output_dir_is_refused_with_or_without_overwrite(three_layer_dir, tmp_path):
  out = tmp_path / "mine"
  out.mkdir()
  (out / "notes.txt").write_text("keep")
  for overwrite in (False, True):
    with pytest.raises(UnsafeOutputError):
      convert_hf_checkpoint(three_layer_dir, out, overwrite=overwrite)
  assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "keep"


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
def test_keep_layers_is_the_model_of_its_first_layers(tmp_path, family):
  """keep_layers=2 of a 3-layer model: logits equal transformers' model loaded with num_hidden_layers=2 from the
  same directory (the first two layers, the final norm and the head); out of range is one clear error."""
  import transformers
  from maxscore import Scorer
  from maxscore.checkpoints.convert import convert_gguf_checkpoint
  from maxscore.testing.hf_models import hf_logits
  from maxscore.testing.gguf_files import write_gguf
  extra = {"rope_scaling": None} if family == "llama" else {}  # the GGUF writer of the tests keeps default RoPE only
  whole = make_hf_model(family, vocab_size=96, num_hidden_layers=3, **extra)
  hf_dir = save_hf_model(whole, tmp_path / "hf")
  model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, num_hidden_layers=2,
                                                            attn_implementation="eager").eval()
  assert model.config.num_hidden_layers == 2
  tokens = np.arange(40) * 7 % 96
  scorer = Scorer.from_checkpoint(convert_hf_checkpoint(hf_dir, tmp_path / "ckpt", keep_layers=2))
  assert scorer.config.model.num_layers == 2
  np.testing.assert_allclose(scorer.logits(tokens), hf_logits(model, tokens), atol=1e-4, rtol=0)
  for bad in (4, -1):
    with pytest.raises(ConversionError, match=f"keep_layers={bad} must be between 1 and the model's 3 layers"):
      convert_hf_checkpoint(hf_dir, tmp_path / f"bad{bad}", keep_layers=bad)
  gguf = write_gguf(whole, tmp_path / "m.gguf") or tmp_path / "m.gguf"
  from_gguf = Scorer.from_checkpoint(convert_gguf_checkpoint(gguf, tmp_path / "g", keep_layers=2))
  np.testing.assert_allclose(from_gguf.logits(tokens), hf_logits(model, tokens), atol=1e-4, rtol=0)
  with pytest.raises(ConversionError, match="keep_layers=9"):
    convert_gguf_checkpoint(gguf, tmp_path / "g9", keep_layers=9)
