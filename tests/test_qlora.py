"""QLoRA (docs/ARCHITECTURE.md section 15): float LoRA adapters trained on a frozen int8_weights base. Only the
adapters move (the int8 weights and their scales stay byte-identical, with no optimizer state), the loss falls,
the merged model is float (the base dequantized) and scores as the QLoRA model does, and full fine-tuning of a
quantized base stays refused by name.

Built on tests/test_lora.py's tiny model, packed row and label loss, through the trainer's own train_step and
optimizer."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from layers import quantization as quant
from layers.config import ModelConfig
from layers.decoder import Decoder, init_params
from layers.kernels import get_kernel
from maxscore.checkpoints import adapters as lora_lib
from maxscore.errors import TrainError
from maxscore.scoring import loading
from maxscore.testing import corpus
from maxscore.training import trainer
from maxscore.training.optimizer import OptimizerConfig, make_optimizer
from maxscore.training.state import fresh
from tests import test_lora as lora_tests

MODE = "int8_weights"
# |QLoRA - merged float| label log-probability (the tiny random model's label probabilities are near 1 / vocab,
# so they are compared as logs). The two differ only in where float32 rounds: (x @ Wq) * s + c * (x @ A) @ B
# against x @ (Wq * s + c * A @ B). Measured 0 (float32 on CPU); the int8 rounding itself moves them by 3.9e-4.
MERGE_ATOL = 1e-5


def _qlora_decoder(lora):
  return lora_lib.adapt(Decoder(ModelConfig(), get_kernel("reference"), quantization=MODE), lora)


@functools.lru_cache(maxsize=None)
def _qlora_train(steps: int = 4):
  """(lora, int8 base, params before, params after, losses, opt_state) of `steps` trainer steps on the packed row."""
  _, lora, base, adapters = lora_tests._setup()
  qbase = quant.quantize_params(base, MODE)
  params = lora_lib.add_adapters(qbase, adapters)
  settings = OptimizerConfig(learning_rate=1e-2, end_learning_rate=1e-2, warmup_steps=0, weight_decay=0.0,
                             clip_norm=1.0)
  optimizer, _ = make_optimizer(settings, steps, lora_lib.trainable_mask(params))
  step = jax.jit(functools.partial(trainer.train_step, loss_fn=lora_tests._loss_fn(_qlora_decoder(lora)),
                                   optimizer=optimizer))
  state = fresh(params, optimizer.init(params), jax.random.PRNGKey(2))
  batch, losses = lora_tests._packed_batch(), []
  for _ in range(steps):
    state, metrics = step(state, batch)
    losses.append(float(metrics["loss"]))
    assert np.isfinite(float(metrics["grad_norm"]))
  return lora, qbase, params, jax.device_get(state.params), losses, state.opt_state


def _flat(tree) -> dict:
  return dict(jax.tree_util.tree_flatten_with_path(tree)[0])


def test_a_qlora_step_moves_only_the_adapters():
  lora, qbase, before, after, losses, opt_state = _qlora_train()
  b, a = _flat(before), _flat(after)
  int8 = [p for p in b if b[p].dtype == jnp.int8]
  scales = [p for p in b if str(p[-1].key).endswith("_scale")]
  assert len(int8) == len(scales) == 7  # q/k/v/o and gate/up/down (the default model ties its lm_head)
  for p in b:
    if not lora_lib.is_adapter(p):  # the int8 weights, their scales and the float norms and embeddings
      assert a[p].dtype == b[p].dtype and np.asarray(a[p]).tobytes() == np.asarray(b[p]).tobytes(), p
  b_leaves = [p for p in b if str(p[-1].key).endswith("_lora_b")]
  assert b_leaves and all(np.any(a[p] != b[p]) and a[p].dtype == jnp.float32 for p in b_leaves)
  assert losses[-1] < losses[0], losses
  # Adam holds moments for the adapters only: two float32 copies of them, nothing of the int8 base.
  adapter_size = sum(x.size for x in jax.tree_util.tree_leaves(lora_lib.split_adapters(before)[1]))
  moments = [x for x in jax.tree_util.tree_leaves(opt_state) if np.ndim(x) > 0]
  assert all(x.dtype == jnp.float32 for x in moments)
  assert sum(x.size for x in moments) == 2 * adapter_size


@pytest.mark.parametrize("grad_accum_steps", [1, 2])
def test_integer_params_get_no_gradient_and_keep_their_bytes(grad_accum_steps):
  """The trainer's step on a toy with an int8 weight beside a float one (QLoRA's shape, in small): the int8
  leaf's gradient is an int8 zero (no float copy of it, accumulated or not) and it leaves the step unchanged."""
  rng = np.random.default_rng(0)
  params = {"wq": jnp.asarray(rng.integers(-127, 128, (3, 2)), jnp.int8), "b": jnp.zeros((2,), jnp.float32)}
  batch = {"x": rng.normal(size=(4, 3)).astype(np.float32), "y": rng.normal(size=(4, 2)).astype(np.float32)}
  loss_fn = lambda p, b, _: (jnp.mean((b["x"] @ p["wq"].astype(jnp.float32) * 0.01 + p["b"] - b["y"]) ** 2), {})
  settings = OptimizerConfig(learning_rate=1e-2, end_learning_rate=1e-2, warmup_steps=0, weight_decay=0.0,
                             clip_norm=1.0)
  optimizer, _ = make_optimizer(settings, 2, {"wq": False, "b": True})
  state = fresh(params, optimizer.init(params), jax.random.PRNGKey(0))
  step = jax.jit(functools.partial(trainer.train_step, loss_fn=loss_fn, optimizer=optimizer,
                                   grad_accum_steps=grad_accum_steps))
  grads = jax.eval_shape(trainer._value_and_float_grad(loss_fn), params, batch, None)[1]
  assert grads["wq"].dtype == jnp.int8
  for _ in range(2):
    state, metrics = step(state, batch)
  assert state.params["wq"].dtype == jnp.int8
  assert np.asarray(state.params["wq"]).tobytes() == np.asarray(params["wq"]).tobytes()
  assert np.any(state.params["b"] != 0) and np.isfinite(float(metrics["grad_norm"]))


def test_the_merged_qlora_model_is_float_and_scores_as_the_qlora_model(tmp_path):
  from maxscore.checkpoints import storage
  from maxscore.scoring.scorer import Scorer
  model, _, base, _ = lora_tests._setup()
  lora, qbase, _, after, _, _ = _qlora_train()
  merged = lora_lib.merge(after, lora)
  flat = _flat(merged)
  assert all(x.dtype == jnp.float32 for x in flat.values())
  assert not any(str(p[-1].key).endswith(("_scale", "_lora_a", "_lora_b")) for p in flat)
  # With B = 0 the merge is the dequantized base exactly: merging adds no rounding of its own.
  zero_b = jax.tree_util.tree_map_with_path(
      lambda p, x: jnp.zeros_like(x) if str(p[-1].key).endswith("_lora_b") else x, after)
  deq = quant.dequantize_params(qbase)
  assert jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, lora_lib.merge(zero_b, lora), deq))
  assert np.abs(deq["layers"]["attn"]["k"] - base["layers"]["attn"]["k"]).max() > 0  # int8 rounding was there

  # The oracle: the QLoRA model itself (int8 base + adapters, unmerged) on each Q + I_i as a causal row.
  decoder = _qlora_decoder(lora)
  oracle = lora_tests.serial_logprobs(decoder, after)
  kw = dict(mesh=None, attention="shared_prefix")
  lora_lib.save_merged(tmp_path / "merged", after, lora, model)
  score = lambda s: np.log(s.score(lora_tests.QUERY, lora_tests.ITEMS, lora_tests.LABELS, apply_softmax=False,
                                   algorithm="packed").scores)
  merged_scorer = Scorer.from_checkpoint(tmp_path / "merged", **kw)
  assert merged_scorer.config.runtime.quantization == "none"
  np.testing.assert_allclose(score(merged_scorer), oracle, rtol=0, atol=MERGE_ATOL)
  # Base + adapters as eval_rerank.py --adapters_dir loads them: lora.json names the int8_weights base, so the
  # float base is quantized as in training before the merge.
  base_dir = storage.save_checkpoint(tmp_path / "base", base, model)
  lora_lib.save_adapters(tmp_path / "adapters", after, lora, base_dir, base_quantization=MODE)
  _, _, meta = lora_lib.load_adapters(tmp_path / "adapters")
  assert meta["base_quantization"] == MODE
  np.testing.assert_allclose(score(loading.load_adapted(base_dir, tmp_path / "adapters", **kw)), oracle, rtol=0,
                             atol=MERGE_ATOL)
  # export_hf_checkpoint.py --adapters_dir merges them alike: the same tensors as the merged checkpoint's export.
  from safetensors.numpy import load_file
  from maxscore.checkpoints.export import export_hf_checkpoint
  a = load_file(export_hf_checkpoint(base_dir, tmp_path / "hf", adapters_dir=tmp_path / "adapters") /
                "model.safetensors")
  b = load_file(export_hf_checkpoint(tmp_path / "merged", tmp_path / "hf_merged") / "model.safetensors")
  assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
  # Merged onto the float base instead, the scores move by the int8 rounding: the comparisons above see it.
  float_merged = Scorer(merged_scorer.config, lora_lib.merge(lora_lib.add_adapters(
      base, lora_lib.split_adapters(after)[1]), lora), mesh=None)
  assert np.abs(score(float_merged) - oracle).max() > 10 * MERGE_ATOL


def test_dequantize_params_inverts_quantize_params_up_to_half_a_step():
  _, _, base, _ = lora_tests._setup()
  tree = dict(base, lm_head=jnp.linspace(-1.0, 1.0, 64 * 8).reshape(64, 8))  # a separate lm_head too
  q = quant.quantize_params(tree, MODE)
  deq = quant.dequantize_params(q)
  assert jax.tree_util.tree_structure(deq) == jax.tree_util.tree_structure(tree)
  w, s = q["layers"]["mlp"]["up"], q["layers"]["mlp"]["up_scale"]
  err = np.abs(np.asarray(deq["layers"]["mlp"]["up"]) - np.asarray(base["layers"]["mlp"]["up"]))
  assert w.dtype == jnp.int8 and np.all(err <= np.asarray(s)[:, None, :] / 2 + 1e-7)
  assert np.abs(deq["lm_head"] - tree["lm_head"]).max() <= q["lm_head_scale"].max() / 2 + 1e-7
  assert deq["embed"]["embedding"] is base["embed"]["embedding"]  # float leaves pass through


def test_full_fine_tuning_of_a_quantized_base_is_still_one_clear_error():
  from maxscore.scoring.loading import build_scorer
  from maxscore.training.reranker import prepare as reranker_prepare
  from maxscore.training.reranker.config import TrainConfig
  from maxscore.rerank import eval as eval_lib
  train = corpus.split("train", 2)
  prompt = eval_lib.EvalConfig(max_query_tokens=8, max_item_tokens=16)
  with pytest.raises(TrainError, match=r"quantization='int8_weights' is for scoring only, and train_backbone trains "
                                       r"the whole backbone; use quantization=none, or train LoRA adapters") as e:
    reranker_prepare.prepare(TrainConfig.of(train_backbone=True), prompt,
                             build_scorer(None, ["quantization=int8_weights"], use_head=False), train, None)
  assert "\n" not in str(e.value)
  with pytest.raises(TrainError, match=r"quantization='int8' \(w8a8\) rounds the activations"):
    reranker_prepare.prepare(TrainConfig.of(train_backbone=True, lora_rank=4), prompt,
                             build_scorer(None, ["quantization=int8"], use_head=False), train, None)
  # The layers refuse alike: w8a8 under adapters, and a rematerialized (training) decoder without them.
  with pytest.raises(ValueError, match=r"quantization='int8' \(w8a8\)"):
    init_params(lora_lib.adapt(Decoder(ModelConfig(), get_kernel("reference"), quantization="int8"),
                               lora_lib.lora_config(4, 8.0)), jax.random.PRNGKey(0))
  with pytest.raises(ValueError, match="quantization='int8_weights' is for scoring only"):
    init_params(Decoder(ModelConfig(), get_kernel("reference"), quantization=MODE, remat=True), jax.random.PRNGKey(0))


@pytest.mark.slow
@pytest.mark.parametrize("group", [0, 32])
def test_qlora_through_the_trainer_exports_a_float_model(tmp_path, group):
  """train_reranker.py's path: train_backbone + lora_rank on quantization=int8_weights (per channel, and per
  group of 32); the checkpointed int8 base is the scorer's, the export is float and the adapters directory names
  its int8_weights base and group size, so base + adapters load as the export scores."""
  from maxscore.checkpoints import storage
  from maxscore.training.reranker import train as train_lib
  from maxscore.training.reranker.config import TrainConfig
  from maxscore.datasets import data
  from maxscore.rerank import eval as eval_lib
  train = data.load_jsonl(data.DEFAULT_JSONL, split="train")
  train.queries = train.queries[:4]
  prompt = eval_lib.EvalConfig(max_query_tokens=8, max_item_tokens=16)
  cfg = TrainConfig.of(train_backbone=True, lora_rank=4, lora_alpha=8.0, batch_size=2, num_steps=3, eval_every=0,
                    save_every=0, warmup_steps=0, learning_rate=1e-3, use_bias=False)
  summary = train_lib.train(cfg, prompt, str(data.DEFAULT_CHECKPOINT), train, None, tmp_path / "work",
                            overrides=[f"quantization={MODE}", f"quantization_group_size={group}"],
                            export_dir=tmp_path / "export",
                            adapters_dir=tmp_path / "adapters", progress=False)
  assert summary["steps"] == 3 and np.isfinite(summary["final_train_loss"])
  exported = storage.restore_checkpoint(tmp_path / "export").params
  assert not quant.holds_int8(exported) and storage.stored_quantization(tmp_path / "export") == "none"
  meta = lora_lib.load_adapters(tmp_path / "adapters")[2]
  assert (meta["base_quantization"], meta["base_quantization_group_size"]) == (MODE, group)
  if group:
    from maxscore.scoring.scorer import Scorer
    kw = dict(mesh=None, separator_token_id=3)
    request = ([4, 9, 33, 7], [[5, 6], [100, 200, 300]], [5, 17])
    exported_scorer = Scorer.from_checkpoint(tmp_path / "export", **kw)
    loaded = loading.load_adapted(data.DEFAULT_CHECKPOINT, tmp_path / "adapters", **kw)
    np.testing.assert_allclose(loaded.score(*request).scores, exported_scorer.score(*request).scores, rtol=1e-5)
