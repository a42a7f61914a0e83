"""LoRA adapters (layers/lora.py, maxscore/checkpoints/adapters.py): exact at step 0, only adapters train, and the
merged and the base + adapters exports score alike (and like the unmerged adapted model).

The 2-device check runs this file as a script in a subprocess (`python tests/test_lora.py devices`), as
tests/test_mesh.py does, since conftest.py pins the test process to one device.
"""

import functools
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
QUERY, ITEMS = [5, 17, 33, 42, 8], [[60, 61, 62], [70, 71], [80, 81, 82, 83], [90]]
LABELS, RELEVANT = [10, 20], [1, 0, 0, 1]  # label ids (relevant first); per item: relevant or not
LORA_KW = dict(rank=4, alpha=8.0)


@functools.lru_cache(maxsize=None)
def _setup(targets=None):
  """(model config, LoraConfig, base params, adapters) of the tiny default model, fixed seeds (built once)."""
  import jax  # pylint: disable=g-import-not-at-top  (the script mode sets XLA_FLAGS first)
  from layers.config import ModelConfig
  from layers.decoder import Decoder, init_params
  from layers.kernels import get_kernel
  from maxscore.checkpoints import adapters as lora_lib
  model = ModelConfig()
  lora = lora_lib.lora_config(targets=targets or lora_lib.TARGETS, **LORA_KW)
  decoder = lora_lib.adapt(Decoder(model, get_kernel("reference")), lora)
  base, adapters = jax.jit(lambda key: lora_lib.split_adapters(init_params(decoder, key)))(jax.random.PRNGKey(0))
  return model, lora, base, adapters


def _packed_batch():
  """The one request as a packed row (docs/ARCHITECTURE.md section 2), and the item labels."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from layers.kernels import SegmentLayout
  from maxscore.scoring import layout as layout_lib
  row = layout_lib.RowSpec(0, tuple(QUERY), tuple(range(len(ITEMS))), tuple(map(tuple, ITEMS)), 4)
  b = layout_lib.pack_rows([row], 8, 4, len(ITEMS), 1)
  seg = SegmentLayout(jnp.asarray(b.prefix_valid_B), jnp.asarray(b.slot_valid_BxN), b.prefix_len, b.slot_len,
                      b.num_slots)
  return dict(tokens=jnp.asarray(b.tokens_BxT), positions=jnp.asarray(b.positions_BxT), layout=seg,
              score_index=jnp.asarray(b.score_index_BxN), target=jnp.asarray([[1 - r for r in RELEVANT]]))


def _loss_fn(decoder):
  """A label-logit loss on packed candidates: softmax cross-entropy over the two labels per item."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import optax
  from maxscore.scoring.runner import label_logits, packed_hidden

  def loss_fn(params, batch, rng):
    del rng
    h = packed_hidden(decoder, params, batch["tokens"], batch["positions"], batch["layout"], batch["score_index"])
    logits_BxNxK = label_logits(decoder, params, h, jnp.asarray(LABELS))
    return optax.softmax_cross_entropy_with_integer_labels(logits_BxNxK, batch["target"]).mean(), {}
  return loss_fn


def _adapted_decoder(lora):
  from layers.decoder import Decoder  # pylint: disable=g-import-not-at-top
  from layers.kernels import get_kernel
  from layers.config import ModelConfig
  from maxscore.checkpoints import adapters as lora_lib
  return lora_lib.adapt(Decoder(ModelConfig(), get_kernel("reference")), lora)


def _optimizer(params):
  """Adam on the adapters, nothing on the base (the trainable mask drives it)."""
  import jax  # pylint: disable=g-import-not-at-top
  import optax
  from maxscore.checkpoints import adapters as lora_lib
  labels = jax.tree_util.tree_map(lambda t: "train" if t else "freeze", lora_lib.trainable_mask(params))
  return optax.multi_transform({"train": optax.adam(1e-2), "freeze": optax.set_to_zero()}, labels)


def _train_step(state, batch, *, loss_fn, optimizer, grad_accum_steps=1):
  """Local stand-in for maxscore.training.train_step (same signature); one micro-batch only."""
  import jax  # pylint: disable=g-import-not-at-top
  import optax
  assert grad_accum_steps == 1
  (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"], batch, state["rng"])
  updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
  new = dict(state, params=optax.apply_updates(state["params"], updates), opt_state=opt_state,
             step=state["step"] + 1)
  return new, {"loss": loss, **aux}


def _train(steps: int, targets=None, base_dtype=None):
  """(model, lora, base params, params before, params after, losses) of a few steps on one packed row;
  `base_dtype` casts the base (not the adapters) first."""
  import jax  # pylint: disable=g-import-not-at-top
  from maxscore.checkpoints import adapters as lora_lib
  model, lora, base, adapters = _setup(targets)
  if base_dtype is not None:
    base = jax.tree_util.tree_map(lambda x: x.astype(base_dtype), base)
  params = lora_lib.add_adapters(base, adapters)
  optimizer = _optimizer(params)
  step = jax.jit(functools.partial(_train_step, loss_fn=_loss_fn(_adapted_decoder(lora)), optimizer=optimizer))
  state = dict(params=params, opt_state=optimizer.init(params), step=0, rng=jax.random.PRNGKey(2))
  batch, losses = _packed_batch(), []
  for _ in range(steps):
    state, metrics = step(state, batch)
    losses.append(float(metrics["loss"]))
  return model, lora, base, params, state["params"], losses


# --- tests (pytest) ----------------------------------------------------------------------------
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from maxscore.scoring import loading
from maxscore.distributed import processes  # noqa: E402


@pytest.fixture(scope="module")
def trained():
  return _train(steps=4)


def test_unknown_target_is_a_one_line_error_naming_the_valid_ones():
  from maxscore.errors import TrainError
  from maxscore.training.reranker.config import TrainConfig
  from maxscore.checkpoints import adapters as lora_lib
  with pytest.raises(lora_lib.LoraError) as e:
    lora_lib.lora_config(4, 8.0, ("q", "qkv"))
  assert "\n" not in str(e.value) and "'qkv'" in str(e.value)
  assert all(repr(t) in str(e.value) for t in lora_lib.TARGETS)
  with pytest.raises(TrainError) as e:
    TrainConfig.of(train_backbone=True, lora_rank=4, lora_targets=("q", "gate_proj")).validate()
  assert "\n" not in str(e.value) and all(repr(t) in str(e.value) for t in lora_lib.TARGETS)


def test_lora_rank_needs_train_backbone_and_sane_values():
  from maxscore.config import ConfigError, load_entry
  from maxscore.errors import TrainError
  from maxscore.training.reranker.config import TrainConfig, TrainRun
  from maxscore.rerank.prompts import PromptConfig
  with pytest.raises(TrainError, match=r"lora_rank=8 .*train_backbone=true"):
    TrainConfig.of(lora_rank=8).validate()
  for bad in (dict(lora_rank=-1), dict(lora_rank=4, lora_alpha=0.0), dict(lora_rank=4, lora_targets=())):
    with pytest.raises(TrainError):
      TrainConfig.of(train_backbone=True, **bad).validate()
  assert TrainConfig.of(train_backbone=True, lora_rank=8, lora_targets=("q", "v")).validate().lora.rank == 8
  with pytest.raises(ConfigError, match="train_backbone"):  # the entry's yml carries the keys, checked on load
    load_entry("train", {"run": TrainRun, "train": TrainConfig, "prompt": PromptConfig}, {"lora_rank": 8})


def test_train_script_refuses_lora_settings_in_one_line_before_writing(load_script, tmp_path, capsys):
  module = load_script("train_score_head")
  for flags, needle in ((["--lora_rank=4"], "train_backbone=true"),
                        (["--train_backbone", "--lora_rank=4", "--lora_targets=q,qkv"], "valid targets")):
    with pytest.raises(SystemExit) as e:
      module.run(["prog", f"--workdir={tmp_path / 'w'}", *flags])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and needle in err and "\n" not in err, (flags, err)
  assert not (tmp_path / "w").exists()


def test_eval_script_refuses_a_bad_adapters_dir_in_one_line(load_script, tmp_path, capsys):
  module = load_script("eval_rerank")
  with pytest.raises(SystemExit) as e:
    module.run(["prog", f"--adapters_dir={tmp_path}", f"--output_dir={tmp_path / 'o'}", "--noprogress"])
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2 and len(err) == 1 and "lora.json is missing" in err[0], err
  assert not (tmp_path / "o").exists()


def test_adapters_dir_given_a_checkpoint_points_to_checkpoint_dir(load_script, tmp_path, capsys):
  from maxscore.datasets import data
  module = load_script("eval_rerank")
  with pytest.raises(SystemExit) as e:
    module.run(["prog", f"--adapters_dir={data.DEFAULT_CHECKPOINT}", f"--output_dir={tmp_path / 'o'}", "--noprogress"])
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2 and len(err) == 1, err
  assert "is a checkpoint" in err[0] and f"--checkpoint_dir={data.DEFAULT_CHECKPOINT}" in err[0], err


def test_train_script_refuses_adapters_dir_without_lora_in_one_line(load_script, tmp_path, capsys):
  module = load_script("train_reranker")
  with pytest.raises(SystemExit) as e:
    module.run(["prog", f"--workdir={tmp_path / 'w'}", f"--adapters_dir={tmp_path / 'a'}", "--noprogress"])
  err = capsys.readouterr().err.strip()
  assert e.value.code == 2 and "--adapters_dir" in err and "--lora_rank" in err and "\n" not in err, err
  assert not (tmp_path / "w").exists() and not (tmp_path / "a").exists()


def test_rank_zero_means_no_adapters():
  import jax
  from maxscore.checkpoints import adapters as lora_lib
  model, _, base, _ = _setup()
  assert lora_lib.lora_config(0, 8.0) is None
  decoder = _adapted_decoder(None)
  assert decoder.lora is None
  assert not any(jax.tree_util.tree_leaves(lora_lib.trainable_mask(base)))
  assert lora_lib.split_adapters(base)[1] == {}


def test_only_targets_get_adapters_shaped_like_their_weights():
  from flax import traverse_util
  import jax
  from maxscore.checkpoints import adapters as lora_lib
  model, lora = _setup()[0], lora_lib.lora_config(4, 8.0, ("q", "o", "down"))
  adapters = lora_lib.init_adapters(model, lora, jax.random.PRNGKey(1))
  names = {k[-1] for k in traverse_util.flatten_dict(adapters)}
  assert names == {"q_lora_a", "q_lora_b", "o_lora_a", "o_lora_b", "down_lora_a", "down_lora_b"}
  attn = adapters["layers"]["attn"]
  assert attn["q_lora_a"].shape == (model.num_layers, model.hidden_size, lora.rank)
  assert attn["o_lora_a"].shape == (model.num_layers, model.num_heads, model.head_dim, lora.rank)
  assert not np.any(np.asarray(attn["q_lora_b"]))  # B starts at zero


def test_adapted_model_equals_base_exactly_at_step_0():
  import jax
  from maxscore.checkpoints import adapters as lora_lib
  _, lora, base, adapters = _setup()
  batch = _packed_batch()
  params = lora_lib.add_adapters(base, adapters)
  hidden = lambda decoder, p: np.asarray(jax.jit(lambda p: decoder.apply(
      {"params": p}, batch["tokens"], batch["positions"], batch["layout"])[0])(p))
  assert np.array_equal(hidden(_adapted_decoder(lora), params), hidden(_adapted_decoder(None), base))
  # A nonzero B changes the output: the adapters are on the path.
  bumped = jax.tree_util.tree_map_with_path(
      lambda path, x: x + 0.05 if str(path[-1].key).endswith("_lora_b") else x, params)
  assert not np.allclose(hidden(_adapted_decoder(lora), bumped), hidden(_adapted_decoder(None), base), atol=1e-4)


def test_training_changes_only_adapters(trained):
  import jax
  from maxscore.checkpoints import adapters as lora_lib
  _, _, base, before, after, losses = trained
  assert losses[-1] < losses[0]
  flat = lambda t: dict(jax.tree_util.tree_flatten_with_path(t)[0])
  b, a = flat(before), flat(after)
  base_paths = [p for p in b if not lora_lib.is_adapter(p)]
  assert base_paths and all(np.asarray(b[p]).tobytes() == np.asarray(a[p]).tobytes() for p in base_paths)
  assert all(np.asarray(b[p]).tobytes() == np.asarray(x).tobytes()
             for p, x in flat(base).items())  # the base tree given to add_adapters is the one kept
  b_leaves = [p for p in b if str(p[-1].key).endswith("_lora_b")]
  assert b_leaves and all(np.any(np.asarray(a[p]) != np.asarray(b[p])) for p in b_leaves)


@pytest.mark.slow
def test_bf16_base_stays_frozen_while_f32_adapters_train():
  import jax
  import jax.numpy as jnp
  from maxscore.checkpoints import adapters as lora_lib
  _, _, base, before, after, losses = _train(steps=2, base_dtype=jnp.bfloat16)
  assert np.isfinite(losses).all()
  for path, x in jax.tree_util.tree_flatten_with_path(after)[0]:
    assert x.dtype == (jnp.float32 if lora_lib.is_adapter(path) else jnp.bfloat16), path
  base_after = lora_lib.split_adapters(after)[0]
  assert jax.tree_util.tree_all(jax.tree_util.tree_map(
      lambda a, b: np.asarray(a).tobytes() == np.asarray(b).tobytes(), base, base_after))
  assert not jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, lora_lib.split_adapters(before)[1],
                                                           lora_lib.split_adapters(after)[1]))


def serial_logprobs(decoder, params) -> np.ndarray:
  """Each Q + I_i as its own causal row (right-padded) through `decoder`; full-vocabulary label log-probs at its
  last token."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp
  from layers.kernels import SegmentLayout
  from maxscore.scoring.runner import label_logprobs
  seqs = [QUERY + item for item in ITEMS]
  t = max(map(len, seqs))
  tokens = jnp.asarray([s + [0] * (t - len(s)) for s in seqs], jnp.int32)
  valid = jnp.asarray([len(s) for s in seqs], jnp.int32)

  @jax.jit
  def fn(params):
    positions = jnp.broadcast_to(jnp.arange(t), tokens.shape)
    h_NxTxD, _ = decoder.apply({"params": params}, tokens, positions, SegmentLayout.causal(valid, t))
    h_NxD = jnp.take_along_axis(h_NxTxD, (valid - 1)[:, None, None], axis=1)[:, 0]
    return label_logprobs(decoder, params, h_NxD, jnp.asarray(LABELS))
  return np.asarray(fn(params))


def _serial_unmerged_scores(lora, params) -> np.ndarray:
  """The oracle: serial_logprobs through the adapted, unmerged decoder, as probabilities."""
  return np.exp(serial_logprobs(_adapted_decoder(lora), params))


def test_merged_and_adapter_exports_score_equally(trained, tmp_path):
  from maxscore.checkpoints import storage
  from maxscore.scoring.scorer import Scorer
  from maxscore.checkpoints import adapters as lora_lib
  model, lora, base, _, after, _ = trained
  base_dir = storage.save_checkpoint(tmp_path / "base", base, model)
  lora_lib.save_merged(tmp_path / "merged", after, lora, model)
  lora_lib.save_adapters(tmp_path / "adapters", after, lora, base_dir)
  kw = dict(mesh=None, attention="shared_prefix")
  merged = Scorer.from_checkpoint(tmp_path / "merged", **kw)
  with_adapters = loading.load_adapted(base_dir, tmp_path / "adapters", **kw)
  score = lambda s, alg: s.score(QUERY, ITEMS, LABELS, apply_softmax=False, algorithm=alg).scores
  oracle = _serial_unmerged_scores(lora, after)
  for alg in ("packed", "prefill_extend"):
    np.testing.assert_allclose(score(merged, alg), oracle, rtol=0, atol=1e-5)
  np.testing.assert_allclose(score(with_adapters, "packed"), score(merged, "packed"), rtol=0, atol=1e-5)
  from maxscore.scoring.loading import build_scorer  # what eval_rerank.py --adapters_dir builds
  eval_scorer = build_scorer(str(base_dir), ["attention=shared_prefix"], adapters_dir=str(tmp_path / "adapters"))
  np.testing.assert_allclose(score(eval_scorer, "packed"), score(merged, "packed"), rtol=0, atol=1e-5)
  assert eval_scorer.adapters == {"dir": str(tmp_path / "adapters"), "rank": lora.rank, "alpha": lora.alpha,
                                  "targets": list(lora.targets), "base_quantization": "none"}
  # Training moved the scores, so the comparisons above see the adapters.
  plain = Scorer.from_checkpoint(base_dir, **kw)
  assert np.abs(score(plain, "packed") - oracle).max() > 1e-4
  assert with_adapters.params_digest not in (plain.params_digest, "")
  assert plain.adapters is None and merged.adapters is None  # a merged export is a checkpoint of its own


def test_loading_reads_the_base_once_and_builds_one_scorer(trained, tmp_path, monkeypatch):
  """Scorer.from_checkpoint and load_adapted read the base's maxscore.json once and restore its params once; the
  adapted scorer is the one Scorer built, its adapters given to it as it is built."""
  from maxscore.checkpoints import storage
  from maxscore.checkpoints import adapters as lora_lib
  from maxscore.scoring.scorer import Scorer
  model, lora, base, _, after, _ = trained
  base_dir = storage.save_checkpoint(tmp_path / "base", base, model).resolve()
  lora_lib.save_adapters(tmp_path / "adapters", after, lora, base_dir)
  reads, restores, built = [], [], []
  read_meta, restore_params, init = storage._read_meta, storage.restore_params, Scorer.__init__
  monkeypatch.setattr(storage, "_read_meta", lambda d: reads.append(pathlib.Path(d).resolve()) or read_meta(d))
  monkeypatch.setattr(storage, "restore_params", lambda metadata, *args, **kwargs: restores.append(
      metadata.directory) or restore_params(metadata, *args, **kwargs))

  def counted_init(self, *args, **kwargs):
    built.append(kwargs.get("adapters"))
    init(self, *args, **kwargs)
  monkeypatch.setattr(Scorer, "__init__", counted_init)
  plain = Scorer.from_checkpoint(base_dir, mesh=None)
  assert (reads, restores, built) == ([base_dir], [base_dir], [None]) and plain.adapters is None
  reads.clear(), restores.clear(), built.clear()
  scorer = loading.load_adapted(base_dir, tmp_path / "adapters", mesh=None)
  info = {"dir": str(tmp_path / "adapters"), "rank": lora.rank, "alpha": lora.alpha, "targets": list(lora.targets),
          "base_quantization": "none"}
  assert (reads, restores, built) == ([base_dir], [base_dir], [info])
  assert scorer.adapters == info and scorer.params_digest not in (plain.params_digest, "")
  assert scorer.model_name == plain.model_name == "base" and scorer.config.runtime.checkpoint_dir == str(base_dir)


def test_adapters_refuse_another_base(trained, tmp_path):
  import jax
  from maxscore.checkpoints import storage
  from maxscore.checkpoints import adapters as lora_lib
  model, lora, base, _, after, _ = trained
  base_dir = storage.save_checkpoint(tmp_path / "base", base, model)
  other = storage.save_checkpoint(tmp_path / "other", jax.tree_util.tree_map(lambda x: x * 2, base), model)
  lora_lib.save_adapters(tmp_path / "adapters", after, lora, base_dir)
  with pytest.raises(lora_lib.LoraError, match="trained on base params") as e:
    loading.load_adapted(other, tmp_path / "adapters", mesh=None)
  assert "\n" not in str(e.value)
  meta_path = tmp_path / "adapters" / lora_lib.METADATA_FILE
  meta = json.loads(meta_path.read_text())
  meta_path.write_text(json.dumps(dict(meta, rank=8)))  # adapters of rank 4 described as rank 8
  with pytest.raises(lora_lib.LoraError, match="rank 8 needs"):
    lora_lib.load_adapters(tmp_path / "adapters")


@pytest.mark.slow
def test_two_device_mesh_matches_one_device():
  env = processes.subprocess_env(2)
  proc = subprocess.run([sys.executable, __file__, "devices"], env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert result["devices"] == 2
  for name, diff in result["max_abs_diff"].items():
    assert diff <= 1e-5, (name, diff)


# --- script mode: the same steps on a 2-device mesh and on one device ---------------------------
def _devices_main() -> None:
  import jax  # pylint: disable=g-import-not-at-top
  from layers import sharding
  _, _, _, _, after_1, losses_1 = _train(steps=2)
  model, lora, base, adapters = _setup()
  from maxscore.checkpoints import adapters as lora_lib  # pylint: disable=g-import-not-at-top
  devices = np.asarray(jax.devices()).reshape(1, 2, 1)
  mesh = jax.sharding.Mesh(devices, sharding.MESH_AXES)  # fsdp=2
  placed_base = sharding.place_params(base, model, mesh)
  placed_adapters = jax.tree_util.tree_map(jax.device_put, adapters, lora_lib.adapter_shardings(model, lora, mesh))
  assert any(len(x.sharding.device_set) == 2 and not x.sharding.is_fully_replicated
             for x in jax.tree_util.tree_leaves(placed_adapters))
  params = lora_lib.add_adapters(placed_base, placed_adapters)
  optimizer = _optimizer(params)
  step = jax.jit(functools.partial(_train_step, loss_fn=_loss_fn(_adapted_decoder(lora)), optimizer=optimizer))
  state = dict(params=params, opt_state=optimizer.init(params), step=0, rng=jax.random.PRNGKey(2))
  batch, losses = _packed_batch(), []
  with sharding.activate(mesh):
    for _ in range(2):
      state, metrics = step(state, batch)
      losses.append(float(metrics["loss"]))
  diff = jax.tree_util.tree_map(lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()), after_1,
                                state["params"])
  print(json.dumps({"devices": len(jax.devices()), "max_abs_diff": {
      "loss": float(np.abs(np.asarray(losses) - np.asarray(losses_1)).max()),
      "params": max(jax.tree_util.tree_leaves(diff))}}))


if __name__ == "__main__":
  sys.path.insert(0, str(ROOT))
  if sys.argv[1:] == ["devices"]:
    _devices_main()
