"""Exact conversion: every source tensor is used or allow-listed, shapes and dtypes are checked first."""

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from maxscore.checkpoints.convert import ConversionError, convert_hf_checkpoint
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
