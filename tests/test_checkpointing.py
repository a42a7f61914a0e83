"""Orbax checkpoints: bit-exact round trip, self-description, clear errors for broken ones."""

import json
import pathlib
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from layers.decoder import Decoder, init_params
from layers.kernels import get_kernel
from maxscore.checkpoints.storage import CheckpointError, restore_checkpoint, save_checkpoint
from maxscore.config import load_config
from maxscore.errors import UnsafeOutputError


@pytest.fixture(scope="module")
def model_and_params():
  cfg = load_config(["model_name=tiny-llama"]).model
  return cfg, nn.unbox(init_params(Decoder(cfg, get_kernel("reference")), jax.random.PRNGKey(3)))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_round_trip_is_bit_exact(tmp_path, model_and_params, dtype):
  cfg, params = model_and_params
  params = jax.tree_util.tree_map(lambda x: x.astype(dtype), params)
  save_checkpoint(tmp_path / "ckpt", params, cfg)
  restored = restore_checkpoint(tmp_path / "ckpt")
  assert restored.model == cfg and restored.tokenizer_path is None
  for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(restored.params)):
    assert a.dtype == b.dtype
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_restore_into_given_shardings(tmp_path, model_and_params):
  cfg, params = model_and_params
  save_checkpoint(tmp_path / "ckpt", params, cfg)
  sharding = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",)),
                                        jax.sharding.PartitionSpec())
  restored = restore_checkpoint(tmp_path / "ckpt", shardings=jax.tree_util.tree_map(lambda _: sharding, params))
  assert all(x.sharding == sharding for x in jax.tree_util.tree_leaves(restored.params))


def test_existing_directory_is_not_overwritten_silently(tmp_path, model_and_params):
  cfg, params = model_and_params
  save_checkpoint(tmp_path / "ckpt", params, cfg)
  with pytest.raises(UnsafeOutputError, match="already exists"):
    save_checkpoint(tmp_path / "ckpt", params, cfg)
  save_checkpoint(tmp_path / "ckpt", params, cfg, overwrite=True)


def test_missing_and_corrupt_checkpoints_are_named(tmp_path, model_and_params):
  cfg, params = model_and_params
  with pytest.raises(CheckpointError, match="does not exist"):
    restore_checkpoint(tmp_path / "missing")
  ckpt = save_checkpoint(tmp_path / "ckpt", params, cfg)
  meta = ckpt / "maxscore.json"
  good = meta.read_text()
  meta.write_text("{not json")
  with pytest.raises(CheckpointError, match="maxscore.json is corrupt"):
    restore_checkpoint(ckpt)
  meta.write_text(good)
  for f in (ckpt / "params").rglob("*"):
    if f.is_file() and f.stat().st_size > 1000:
      f.write_bytes(b"\0" * 64)  # truncate the data files
  with pytest.raises(CheckpointError, match="params"):
    restore_checkpoint(ckpt)
  shutil.rmtree(ckpt / "params")
  with pytest.raises(CheckpointError, match="params"):
    restore_checkpoint(ckpt)


def test_mismatched_shapes_name_the_parameter(tmp_path, model_and_params):
  cfg, params = model_and_params
  ckpt = save_checkpoint(tmp_path / "ckpt", params, cfg)
  meta = json.loads((ckpt / "maxscore.json").read_text())
  meta["model"]["mlp_dim"] = 96
  (ckpt / "maxscore.json").write_text(json.dumps(meta))
  with pytest.raises(CheckpointError, match=r"layers/mlp/gate has shape \(2, 64, 128\), the model config needs "
                                            r"\(2, 64, 96\)"):
    restore_checkpoint(ckpt)
  bad = dict(params, final_norm={"scale": jnp.ones((3,))})
  with pytest.raises(CheckpointError, match="final_norm/scale"):
    save_checkpoint(tmp_path / "bad", bad, cfg)


def test_relative_paths_round_trip_through_every_orbax_call(tmp_path, monkeypatch, model_and_params):
  """Orbax refuses a relative path ("Checkpoint path should be absolute"), and the docs pass relative ones
  (eval_rerank.py --adapters_dir=out/lora3_adapters, --packaged_reranker=out/pkg1): a checkpoint, its head, LoRA
  adapters, a checkpoint's raw files and a trainer's checkpoint manager are written and read back through paths
  relative to the working directory."""
  import optax  # pylint: disable=g-import-not-at-top
  from maxscore.checkpoints import adapters, head_storage, storage  # pylint: disable=g-import-not-at-top
  from maxscore.heads.head import HeadConfig, init_head  # pylint: disable=g-import-not-at-top
  from maxscore.training import checkpoint  # pylint: disable=g-import-not-at-top
  from maxscore.training.state import fresh  # pylint: disable=g-import-not-at-top
  cfg, params = model_and_params
  monkeypatch.chdir(tmp_path)
  save_checkpoint("out/ckpt", params, cfg)
  np.testing.assert_array_equal(restore_checkpoint("out/ckpt").params["final_norm"]["scale"],
                                params["final_norm"]["scale"])
  assert storage.stored_dtypes("out/ckpt") == {"float32"}  # package_reranker.py --base_dir=out/smol_l16
  (tmp_path / "out" / "raw").mkdir()
  storage.write_checkpoint_files(pathlib.Path("out/raw"), params, cfg)
  assert restore_checkpoint("out/raw").digest == restore_checkpoint("out/ckpt").digest

  lora = adapters.lora_config(2, 4.0)
  trained = jax.tree_util.tree_map(lambda x: x + 1, adapters.init_adapters(cfg, lora, jax.random.PRNGKey(1)))
  adapters.save_adapters("out/lora", adapters.add_adapters(params, trained), lora, "out/ckpt")
  got, got_lora, _ = adapters.load_adapters_for("out/ckpt", "out/lora")
  assert got_lora == lora
  for a, b in zip(jax.tree_util.tree_leaves(trained), jax.tree_util.tree_leaves(got)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

  head_cfg = HeadConfig(label_token_ids=(5, 17), hidden_size=cfg.hidden_size)
  head = init_head(head_cfg, jax.random.PRNGKey(2))
  head_storage.save_head("out/ckpt", head_cfg, head)
  assert head_storage.load_head("out/ckpt")[0] == head_cfg

  state = fresh({"w": np.arange(4, dtype=np.float32)}, optax.sgd(0.1).init({"w": np.zeros(4, np.float32)}),
                jax.random.PRNGKey(3))
  mgr = checkpoint.manager(pathlib.Path("out/run"), 1)
  checkpoint.save(mgr, 0, state, {"run": 1})
  mgr.wait_until_finished()
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype, sharding=device),
                                  state)
  restored = checkpoint.restore(checkpoint.manager(pathlib.Path("out/run"), 1), 0, target)
  np.testing.assert_array_equal(restored.params["w"], state.params["w"])
  assert (tmp_path / "out" / "run" / "checkpoints" / "0").is_dir()
