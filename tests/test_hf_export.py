"""Export to transformers (maxscore/checkpoints/export.py): the exported directory loads with
AutoModelForCausalLM and computes maxscore's logits; HF -> maxscore -> HF gives back the very tensors; LoRA
adapters are merged; a score head, a config transformers cannot express and bad paths are refused with nothing
written."""

import dataclasses
import json
import pathlib
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file

from conftest import FAMILY_VARIANTS, HF_VARIANTS
from maxscore import Scorer
from maxscore.scoring import loading
from maxscore.checkpoints import (CheckpointError, ExportError, convert_hf_checkpoint, export_hf_checkpoint,
                                  load_tokenizer, read_metadata)
from maxscore.checkpoints.convert import _global_specs, _layer_specs
from maxscore.checkpoints.export import check_config, hf_config
from maxscore.checkpoints.hf_config import model_config_from_hf
from maxscore.errors import UnsafeOutputError
from maxscore.testing.hf_models import HF_CONFIGS, hf_logits, make_hf_model, save_hf_model

VARIANTS = sorted(HF_VARIANTS) + ["gemma2", "gemma3", "mistral"]  # + sliding windows, soft-caps, two RoPE bases
QUERY, ITEMS, LABELS = [5, 17, 33, 42, 8], [[60, 61, 62], [70, 71], [80, 81, 82, 83], [90]], [10, 20]


def _load(directory):
  import torch
  import transformers
  return transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32,
                                                           attn_implementation="eager").eval()


def _model_configs():
  """(name, ModelConfig) of every family's tiny test model, as conversion reads it."""
  for name, (family, overrides) in {**HF_VARIANTS, **FAMILY_VARIANTS}.items():
    yield name, model_config_from_hf(dict(HF_CONFIGS[family], vocab_size=520, **overrides))


def test_specs_invert_exactly_and_configs_read_back():
  import transformers
  from layers.config import ModelConfig
  rng = np.random.default_rng(0)
  integral = ModelConfig(family="gemma2", layer_pattern="LG", sliding_window=8, rope_theta=10000, rms_norm_eps=1,
                         query_pre_attn_scalar=16.0, attn_logit_softcap=50, final_logit_softcap=30)
  for name, cfg in [*_model_configs(), ("integral_reals", integral)]:
    hf = hf_config(cfg)
    assert model_config_from_hf(hf) == cfg, name
    transformers.AutoConfig.for_model(**hf)  # transformers 5's strict config classes take every key's type
    for _, hf_name, shape, fn in list(_global_specs(cfg)) + list(_layer_specs(cfg)):
      w = rng.standard_normal(shape).astype(np.float32)
      assert np.array_equal(fn.inverse(fn(w), shape), w), (name, hf_name)


@pytest.mark.parametrize("variant", VARIANTS)
def test_export_reproduces_logits_and_gives_back_the_tensors(hf_checkpoints, tmp_path, variant):
  model, hf_dir, ckpt = hf_checkpoints(variant)
  out = export_hf_checkpoint(ckpt, tmp_path / "hf")
  # HF -> maxscore -> HF: the same tensors, bit for bit (a tied lm_head is not saved by either).
  want, got = load_file(hf_dir / "model.safetensors"), load_file(out / "model.safetensors")
  assert sorted(got) == sorted(want)
  for name, w in want.items():
    assert got[name].dtype == np.float32 and np.array_equal(got[name], w), name
  exported = _load(out)
  assert type(exported) is type(model)
  scorer = Scorer.from_checkpoint(ckpt)
  tokens = np.random.default_rng(len(variant)).integers(0, 520, 48)  # beyond every sliding window
  logits = hf_logits(exported, tokens)
  np.testing.assert_allclose(logits, scorer.logits(tokens), atol=1e-4, rtol=0)
  # The same weights and a config that builds the same model: transformers computes what it did before.
  np.testing.assert_array_equal(logits, hf_logits(model, tokens))


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_qwen_sliding_window_layers_export(tmp_path, family):
  """Qwen's windows on the layers from max_window_layers on: layer_types and the legacy keys both written."""
  model = make_hf_model(family, vocab_size=520, use_sliding_window=True, sliding_window=5, max_window_layers=1)
  ckpt = convert_hf_checkpoint(save_hf_model(model, tmp_path / "hf_src"), tmp_path / "ckpt")
  out = export_hf_checkpoint(ckpt, tmp_path / "hf")
  hf = json.loads((out / "config.json").read_text())
  assert (hf["layer_types"], hf["sliding_window"], hf["use_sliding_window"], hf["max_window_layers"]) == (
      ["full_attention", "sliding_attention"], 5, True, 1)
  tokens = np.random.default_rng(3).integers(0, 520, 24)
  logits = hf_logits(_load(out), tokens)
  np.testing.assert_array_equal(logits, hf_logits(model, tokens))
  np.testing.assert_allclose(logits, Scorer.from_checkpoint(ckpt).logits(tokens), atol=1e-4, rtol=0)


def _adapters(ckpt, directory):
  """(adapters dir, merged checkpoint dir): LoRA of rank 4 on every target with random A and B (B nonzero, so
  the adapters change the model), saved against `ckpt`, and the same merged into an ordinary checkpoint."""
  import jax
  from maxscore.checkpoints import restore_checkpoint
  from maxscore.checkpoints import adapters as lora_lib
  base = restore_checkpoint(ckpt)
  lora = lora_lib.lora_config(4, 8.0)
  shapes = jax.eval_shape(lambda key: lora_lib.init_adapters(base.model, lora, key), jax.random.PRNGKey(0))
  rng = np.random.default_rng(1)
  adapters = jax.tree_util.tree_map(lambda x: (0.1 * rng.standard_normal(x.shape)).astype(np.float32), shapes)
  params = lora_lib.add_adapters(base.params, adapters)
  return (lora_lib.save_adapters(directory, params, lora, ckpt),
          lora_lib.save_merged(directory.parent / "merged", params, lora, base.model))


def test_lora_merged_export_scores_as_the_adapted_model(hf_checkpoints, tmp_path):
  from maxscore.checkpoints import adapters as lora_lib
  model, _, ckpt = hf_checkpoints("qwen3_kv2_tied")
  adapters_dir, merged = _adapters(ckpt, tmp_path / "adapters")
  out = export_hf_checkpoint(ckpt, tmp_path / "hf", adapters_dir=adapters_dir)
  adapted = loading.load_adapted(ckpt, adapters_dir, mesh=None)
  exported = _load(out)
  want = adapted.score(QUERY, ITEMS, LABELS, apply_softmax=False).scores
  got = []
  for item in ITEMS:  # docs/ARCHITECTURE.md section 1, on transformers' logits
    lp = hf_logits(exported, QUERY + item)[-1].astype(np.float64)
    got.append(np.exp(lp[LABELS] - np.log(np.exp(lp - lp.max()).sum()) - lp.max()))
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-4, rtol=0)
  np.testing.assert_allclose(np.log(got), np.log(want), atol=1e-4, rtol=0)  # small probabilities, too
  tokens = np.arange(40) * 13 % 520
  np.testing.assert_allclose(hf_logits(exported, tokens), adapted.logits(tokens), atol=1e-4, rtol=0)
  plain = hf_logits(model, tokens)  # the base model (its export is checked above)
  assert np.abs(plain - adapted.logits(tokens)).max() > 1e-2  # the adapters matter: the checks above can fail
  # A trainer's merged export (an ordinary checkpoint) exports to the same tensors.
  from_merged = export_hf_checkpoint(merged, tmp_path / "hf_merged")
  a, b = load_file(out / "model.safetensors"), load_file(from_merged / "model.safetensors")
  assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)


def test_bfloat16_export_and_tokenizer_files(hf_checkpoints, tmp_path, hf_tokenizer_path, load_script, capsys):
  import transformers
  model, _, _ = hf_checkpoints("llama_kv1_tied")
  hf_dir = save_hf_model(model, tmp_path / "hf_src", tokenizer_file=hf_tokenizer_path)
  (hf_dir / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
  ckpt = convert_hf_checkpoint(hf_dir, tmp_path / "ckpt")
  load_script("export_hf_checkpoint").run(["prog", f"--checkpoint_dir={ckpt}", f"--output_dir={tmp_path / 'hf'}",
                                           "--dtype=bfloat16"])
  out = tmp_path / "hf"
  assert capsys.readouterr().out.strip() == str(out.resolve())
  assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
  assert (out / "model.safetensors").stat().st_mode == (out / "config.json").stat().st_mode  # readable as config
  f32, bf16 = load_file(hf_dir / "model.safetensors"), load_file(out / "model.safetensors")
  for name, w in f32.items():
    assert bf16[name].dtype.name == "bfloat16" and np.array_equal(bf16[name], w.astype(bf16[name].dtype)), name
  for name in ("tokenizer.json", "chat_template.jinja"):
    assert (out / name).read_bytes() == (hf_dir / name).read_bytes()
  text = "the quick brown fox jumps over the lazy dog, twice."
  ours = load_tokenizer(read_metadata(ckpt)[1]).encode(text)
  assert list(transformers.AutoTokenizer.from_pretrained(out)(text, add_special_tokens=False)["input_ids"]) == ours


def test_score_head_is_refused_unless_dropped(hf_checkpoints, tmp_path):
  import jax
  from maxscore.checkpoints import head_storage
  from maxscore.heads.head import HeadConfig, init_head
  _, _, ckpt = hf_checkpoints("qwen3_kv2_tied")
  with_head = pathlib.Path(shutil.copytree(ckpt, tmp_path / "ckpt"))
  cfg = HeadConfig(kind="linear", label_token_ids=(10, 20), hidden_size=64, num_outputs=1)
  head_storage.save_head(with_head, cfg, init_head(cfg, jax.random.PRNGKey(0)))
  with pytest.raises(ExportError, match="score head.*--drop_head") as e:
    export_hf_checkpoint(with_head, tmp_path / "hf")
  assert "\n" not in str(e.value) and not (tmp_path / "hf").exists()
  out = export_hf_checkpoint(with_head, tmp_path / "hf", drop_head=True)
  plain = export_hf_checkpoint(ckpt, tmp_path / "plain")
  a, b = load_file(out / "model.safetensors"), load_file(plain / "model.safetensors")
  assert all(np.array_equal(a[k], b[k]) for k in b)


def test_bad_input_is_one_error_with_nothing_written(hf_checkpoints, tmp_path, load_script, capsys):
  _, _, ckpt = hf_checkpoints("qwen3_kv2_tied")
  with pytest.raises(CheckpointError, match="does not exist"):
    export_hf_checkpoint(tmp_path / "nope", tmp_path / "out")
  foreign = tmp_path / "foreign"
  foreign.mkdir()
  (foreign / "keep.txt").write_text("mine")
  with pytest.raises(UnsafeOutputError, match="not written by maxscore"):
    export_hf_checkpoint(ckpt, foreign)
  assert [p.name for p in foreign.iterdir()] == ["keep.txt"]
  with pytest.raises(UnsafeOutputError, match="is inside the input"):
    export_hf_checkpoint(ckpt, ckpt / "hf")
  with pytest.raises(ExportError, match="dtype='float16'"):
    export_hf_checkpoint(ckpt, tmp_path / "out", dtype="float16")
  assert not (tmp_path / "out").exists() and not (ckpt / "hf").exists()
  out = export_hf_checkpoint(ckpt, tmp_path / "out")
  stamp = (out / "model.safetensors").stat().st_mtime_ns
  with pytest.raises(UnsafeOutputError, match="already exists; pass --overwrite"):
    export_hf_checkpoint(ckpt, out)
  assert (out / "model.safetensors").stat().st_mtime_ns == stamp
  export_hf_checkpoint(ckpt, out, overwrite=True)  # an earlier export is replaced when asked
  other = shutil.copytree(ckpt, tmp_path / "other_ckpt")  # a maxscore checkpoint is not replaced by an export
  with pytest.raises(UnsafeOutputError, match="holds a maxscore checkpoint output, not a transformers export"):
    export_hf_checkpoint(ckpt, other, overwrite=True)
  assert (pathlib.Path(other) / "maxscore.json").is_file()
  # The script: one line, exit 2, nothing written.
  script = load_script("export_hf_checkpoint")
  capsys.readouterr()
  for argv, needle in (([f"--checkpoint_dir={tmp_path / 'nope'}"], "does not exist"),
                       ([f"--checkpoint_dir={ckpt}", f"--output_dir={foreign}"], "not written by maxscore"),
                       ([f"--output_dir={tmp_path / 'x'}"], "--checkpoint_dir required")):
    argv = argv if any(a.startswith("--output_dir") for a in argv) else argv + [f"--output_dir={tmp_path / 'x'}"]
    with pytest.raises(SystemExit) as e:
      script.run(["prog", *argv])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and needle in err and "\n" not in err, (argv, err)
  assert not (tmp_path / "x").exists()


def test_configs_transformers_cannot_express_are_refused(tmp_path):
  import jax
  from layers.config import ModelConfig
  from maxscore.checkpoints import storage
  mixed = ModelConfig(family="mistral", layer_pattern="LG", sliding_window=8)  # Mistral windows every layer or none
  params = jax.tree_util.tree_map(lambda x: np.zeros(x.shape, np.float32), storage.abstract_params(mixed))
  ckpt = storage.save_checkpoint(tmp_path / "ckpt", params, mixed)
  with pytest.raises(ExportError, match="layer_pattern='LG' would read back as 'L'") as e:
    export_hf_checkpoint(ckpt, tmp_path / "hf")
  assert "\n" not in str(e.value) and not (tmp_path / "hf").exists()
  with pytest.raises(ExportError, match="rope_local_theta=1000.0 would read back as None"):
    llama = ModelConfig(family="llama", rope_local_theta=1000.0)  # only Gemma 3 has a local RoPE base
    check_config(llama, hf_config(llama))
  unknown = dataclasses.replace(ModelConfig(), family="gpt2")
  with pytest.raises(ExportError, match=r"family 'gpt2' .*supported: \['gemma', 'gemma2'"):
    hf_config(unknown)
