"""Config: every YAML parses, overrides apply, bad keys and values are named with suggestions."""

import pathlib

import pytest
import yaml

from maxscore.config import CONFIG_DIR, ConfigError, load_config, to_flat_dict

MODEL_FILES = sorted((CONFIG_DIR / "models").glob("*.yml"))


def test_every_yaml_in_repo_parses():
  ymls = sorted(pathlib.Path(CONFIG_DIR).rglob("*.yml"))
  assert len(ymls) >= 5
  for path in ymls:
    assert isinstance(yaml.safe_load(path.read_text()), dict), path


@pytest.mark.parametrize("path", MODEL_FILES, ids=lambda p: p.stem)
def test_every_model_config_loads(path):
  cfg = load_config([f"model_name={path.stem}"])
  assert cfg.runtime.model_name == path.stem
  assert cfg.model.num_heads % cfg.model.num_kv_heads == 0


def test_base_yml_documents_every_key():
  for line in (CONFIG_DIR / "base.yml").read_text().splitlines():
    if line and not line.startswith((" ", "#")) and ":" in line:
      assert "#" in line, f"base.yml key without a one-line comment: {line}"
  base_keys = set(yaml.safe_load((CONFIG_DIR / "base.yml").read_text()))
  model_keys = set(yaml.safe_load((CONFIG_DIR / "models" / "qwen3-0.6b.yml").read_text()))
  assert base_keys | model_keys <= set(to_flat_dict(load_config()))


def test_overrides_apply_and_are_typed():
  cfg = load_config(["model_name=tiny-llama", "attention=reference", "label_token_ids=[3, 4]", "dtype=bfloat16",
                     "extend_batch_size=7"])
  assert cfg.model.family == "llama" and cfg.kernel.attention == "reference"
  assert cfg.scoring.label_token_ids == (3, 4) and cfg.runtime.dtype == "bfloat16"
  assert cfg.scoring.extend_batch_size == 7
  assert cfg.replace(separator_token_id=5).scoring.separator_token_id == 5
  assert load_config({"hidden_size": 32}).model.hidden_size == 32


@pytest.mark.parametrize("override,message", [
    ("atention=reference", "did you mean attention"),
    ("extend_batchsize=3", "extend_batch_size"),
    ("attention=splsh", "did you mean 'splash'"),
    ("dtype=float16", "not one of"),
    ("extend_batch_size=many", "must be an integer"),
    ("extend_batch_size=0", "must be positive"),
    ("prefix_buckets=[64, 32]", "strictly increasing"),
    ("apply_softmax=3", "true or false"),
    ("num_kv_heads=3", "multiple of num_kv_heads"),
    ("model_name=qwen3-06b", "did you mean qwen3-0.6b"),
    ("noequals", "key=value"),
])
def test_bad_config_is_a_clear_error(override, message):
  with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
    load_config([override])


def test_base_yml_and_dataclass_defaults_agree():
  """configs/base.yml is the documented source of every default; the dataclasses must not drift from it."""
  from maxscore.config import BucketConfig, KernelConfig, MeshConfig, ScoringConfig
  cfg = load_config()
  assert cfg.scoring == ScoringConfig() and cfg.kernel == KernelConfig()
  assert cfg.buckets == BucketConfig() and cfg.mesh == MeshConfig()
