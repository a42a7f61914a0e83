"""Conversion from Hugging Face and logits parity with transformers (the external oracle)."""

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import HF_VARIANTS
from maxscore import Scorer
from maxscore.checkpoints.storage import read_metadata
from maxscore.checkpoints.convert import convert_hf_checkpoint
from maxscore.checkpoints.hf_config import ConversionError, model_config_from_hf
from maxscore.testing.hf_models import hf_logits, make_hf_model, save_hf_model

LENGTHS = (1, 7, 128, 512)


@pytest.mark.parametrize("variant", sorted(HF_VARIANTS))
def test_logits_match_transformers(hf_checkpoints, variant):
  model, _, ckpt = hf_checkpoints(variant)
  scorer = Scorer.from_checkpoint(ckpt)
  rng = np.random.default_rng(len(variant))
  for t in LENGTHS:
    tokens = rng.integers(0, 520, t)
    want, got = hf_logits(model, tokens), scorer.logits(tokens)
    assert got.shape == want.shape == (t, 520) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
  probs = np.exp(want - want.max(-1, keepdims=True))
  assert (probs / probs.sum(-1, keepdims=True)).max(-1).mean() > 5 / 520  # far from uniform: the test can fail


def test_sharded_safetensors_convert_identically(hf_checkpoints, tmp_path):
  model, hf_dir, ckpt = hf_checkpoints("qwen3_kv2_tied")
  sharded = save_hf_model(model, tmp_path / "sharded", max_shard_size="60KB")
  assert (sharded / "model.safetensors.index.json").is_file()
  out = convert_hf_checkpoint(sharded, tmp_path / "ckpt")
  tokens = np.arange(40) % 520
  np.testing.assert_array_equal(Scorer.from_checkpoint(out).logits(tokens), Scorer.from_checkpoint(ckpt).logits(tokens))


def test_old_and_new_rope_config_keys_agree(hf_checkpoints):
  _, hf_dir, _ = hf_checkpoints("llama_kv2_untied_scaled_bias")
  new = json.loads((hf_dir / "config.json").read_text())
  assert "rope_parameters" in new  # what this transformers version writes
  old = {k: v for k, v in new.items() if k != "rope_parameters"}
  old["rope_theta"] = new["rope_parameters"]["rope_theta"]
  old["rope_scaling"] = {k: v for k, v in new["rope_parameters"].items() if k != "rope_theta"}
  old["rope_scaling"]["type"] = old["rope_scaling"].pop("rope_type")
  assert model_config_from_hf(old) == model_config_from_hf(new)
  assert model_config_from_hf(new).rope_scaling_type == "llama3"


def test_tokenizer_and_chat_template_are_copied_into_checkpoint(tmp_path, hf_tokenizer_path):
  model = make_hf_model("qwen3", vocab_size=520)
  hf_dir = save_hf_model(model, tmp_path / "hf", tokenizer_file=hf_tokenizer_path)
  template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
  (hf_dir / "chat_template.jinja").write_text(template)  # where transformers now saves a tokenizer's chat template
  ckpt = convert_hf_checkpoint(hf_dir, tmp_path / "ckpt")
  _, tok = read_metadata(ckpt)
  assert tok is not None and tok.name == "tokenizer.json" and tok.is_file()
  assert (tok.parent / "chat_template.jinja").read_text() == template
  scorer = Scorer.from_checkpoint(ckpt)
  assert scorer.tokenizer is not None and scorer.tokenizer.kind == "hf"


def test_conversion_script_bf16_and_errors(hf_checkpoints, tmp_path):
  _, hf_dir, _ = hf_checkpoints("qwen3_kv2_tied")
  cmd = [sys.executable, "scripts/convert_hf_checkpoint.py", f"--hf_dir={hf_dir}", f"--output_dir={tmp_path / 'bf16'}",
         "--dtype=bfloat16"]
  done = subprocess.run(cmd, capture_output=True, text=True, cwd=pathlib_root())
  assert done.returncode == 0, done.stderr
  scorer = Scorer.from_checkpoint(tmp_path / "bf16", weight_dtype="bfloat16")
  assert str(scorer.runner.params["embed"]["embedding"].dtype) == "bfloat16"
  # A missing directory is one clear line and exit code 2.
  bad = subprocess.run(cmd[:2] + [f"--hf_dir={tmp_path / 'nope'}", f"--output_dir={tmp_path / 'x'}"],
                       capture_output=True, text=True, cwd=pathlib_root())
  assert bad.returncode == 2 and f"{tmp_path / 'nope'} does not exist" in bad.stderr


def test_unsupported_configs_are_named(tmp_path):
  with pytest.raises(ConversionError, match="model_type='gpt2'"):
    model_config_from_hf({"model_type": "gpt2"})
  base = dict(model_type="llama", vocab_size=8, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
              intermediate_size=8)
  with pytest.raises(ConversionError, match="rope_type='yarn'"):
    model_config_from_hf(dict(base, rope_scaling={"rope_type": "yarn", "factor": 2.0}))
  (tmp_path / "hf").mkdir()
  (tmp_path / "hf" / "config.json").write_text(json.dumps(base))
  with pytest.raises(ConversionError, match="model.safetensors"):
    convert_hf_checkpoint(tmp_path / "hf", tmp_path / "out")


def pathlib_root():
  import pathlib
  return pathlib.Path(__file__).resolve().parent.parent
