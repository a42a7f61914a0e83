"""The training fit report: the step's cost model, the recipe's step on CPU (the one the trainer runs), and real
TPU compiles.

Tests marked `tpu_aot` compile the training step with libtpu for described TPU topologies; nothing
runs on a TPU.
"""

import copy
import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax.sharding import Mesh

from layers import sharding
from layers.config import ModelConfig
from layers.lora import LoraConfig
from maxscore.bench import compile_report, train_compile
from maxscore.config import load_config
from maxscore.rerank import eval as eval_lib
from maxscore.scoring import cost_model
from maxscore.scoring.scorer import Scorer
from maxscore.testing import corpus, scripts
from maxscore.training import trainer
from maxscore.training.reranker import features, sources
from maxscore.training.reranker import model as reranker_model
from maxscore.training.reranker import train as train_lib

compile_check = scripts.load_script("compile_check")

# tiny-qwen3 widened so TPU tile padding of its small arrays is negligible next to the weights.
WIDE = ("dtype=bfloat16", "weight_dtype=bfloat16", "vocab_size=8192", "hidden_size=256", "head_dim=128",
        "mlp_dim=1024")
GEOMETRY = "60x8x16"


# --- the cost model ---------------------------------------------------------------------------------
def test_step_flops_multipliers():
  cfg = ModelConfig(vocab_size=50, hidden_size=8, num_layers=3, num_heads=2, num_kv_heads=1, head_dim=4, mlp_dim=16)
  b, p, l, n = 2, 11, 3, 5
  fwd = cost_model.program_flops(cfg, b, p, l, n)
  full = train_compile.step_flops(cfg, b, p, l, n, "full")
  assert full["forward"] == fwd
  # 6N-style: forward + backward (2x) + one remat forward of the layers; the lm_head is not rematerialized.
  assert full["total"] == 4 * fwd - full["lm_head"] / 3
  assert train_compile.step_flops(cfg, b, p, l, n, "full", remat=False)["total"] == 3 * fwd
  # head trains the head alone on frozen features: its forward and weight gradient, no backbone
  head = train_compile.step_flops(cfg, b, p, l, n, "head")
  assert head["total"] == head["head"] == 2 * head["forward"] == 4 * cfg.hidden_size * 2 * b * n
  lora = train_compile.step_flops(cfg, b, p, l, n, "lora", lora=LoraConfig(rank=2, alpha=4.0))
  assert fwd < lora["total"] - lora["adapters"] < full["total"] and lora["adapters"] > 0
  assert lora["dense"] == 3 * full["dense"] / 4  # no weight gradients for the frozen base


def test_bad_train_options_name_the_field():
  for kwargs, field in [(dict(train="fine"), "train="), (dict(train="lora", lora_targets=("q", "qkv")), "gate"),
                        (dict(train="lora", lora_rank=0), "lora_rank"), (dict(train="full", remat="some"), "remat"),
                        (dict(train="full", batch_size=6, grad_accum_steps=4), "grad_accum_steps")]:
    with pytest.raises(ValueError, match=field):
      train_compile.TrainCompileOptions(**kwargs).validate()


# --- the step on CPU -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
  """tiny-qwen3 at full matmul precision with the CPU training kernel, and a one-device training mesh."""
  config = load_config({"model_name": "tiny-qwen3", "matmul_precision": "highest", "attention": "shared_prefix"})
  return config, Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1), sharding.MESH_AXES)


def _steps(tiny, mode, lora=None, n=2, accum=1):
  """n steps of the recipe's `mode` on 2 queries of 7 + 3 x 4 tokens (packed 8 + 4 x 4): (params before, the
  state after, the trainable mask, the losses, or with accum != 1 (-1: one batch) (loss, grad norm) per step)."""
  config, mesh = tiny
  if mode == "qlora":
    config = config.replace(quantization="int8_weights")
  cfg = train_compile.recipe(mode, 2, lora=lora, grad_accum_steps=max(accum, 1))
  scorer = Scorer.from_config(config, mesh=mesh)
  head_cfg = train_compile.head_config(cfg, config.model)
  prep = train_compile.synthetic_prepared(cfg, scorer, 2, 7, 3, 4, (8, 4, 4))
  if mode == "head":  # the frozen backbone's own features, as the trainer extracts them before its loop
    prep.source = sources.Frozen({"train": features.extract_features(scorer, prep.examples["train"])})
  prog = reranker_model.program(cfg, head_cfg, prep.source, mesh, train_compile.TOTAL_STEPS)
  batch, _ = reranker_model.make_batch(prep, np.arange(2), 0, cfg)
  key = jax.random.PRNGKey(0)
  _, shardings = trainer.placed_abstract_state(prog.params, prog.param_shardings, prog.optimizer, key, mesh)
  step = reranker_model.jit_step(cfg, head_cfg, prep.source, mesh, prog, shardings,
                                 jnp.asarray(train_compile.LABELS, jnp.int32))
  state, batch = trainer.placer(shardings, mesh, 2)(trainer.init(prog.params, shardings, prog.optimizer, key), batch)
  before = jax.tree_util.tree_map(lambda x: np.array(x, copy=True), prog.params)
  metrics = []
  for i in range(n):
    consumed, (state, m) = state, step(state, batch)
    metrics.append((float(m["loss"]), float(m["grad_norm"])))
    # the step donates the state: the update is made in place, the state passed in is gone
    assert all(x.is_deleted() for x in jax.tree_util.tree_leaves((consumed.params, consumed.opt_state))), i
  return before, state, prog.trainable, [loss for loss, _ in metrics] if accum == 1 else metrics


@pytest.mark.slow
def test_lora_and_head_steps_train_only_their_params(tiny):
  lora = LoraConfig(rank=4, alpha=8.0)
  *_, full_losses = _steps(tiny, "full", n=1)
  for mode in ("lora", "qlora", "head"):
    before, state, trainable, losses = _steps(tiny, mode, lora if mode in train_compile.ADAPTED else None, n=3)
    if mode != "qlora":  # B starts at zero: the first loss is the plain model's (qlora's base is another, int8)
      assert losses[0] == pytest.approx(full_losses[0], abs=1e-6)
    assert losses[-1] < losses[0]
    after = jax.tree_util.tree_map(np.asarray, state.params)
    mask = trainable if trainable is not None else jax.tree_util.tree_map(lambda _: True, before)
    flat = lambda tree: dict(jax.tree_util.tree_leaves_with_path(tree))
    for (path, a), b, on in zip(flat(before).items(), flat(after).values(), flat(mask).values()):
      if not on:
        assert a.tobytes() == b.tobytes(), path  # the frozen base is bit-identical
    assert ("backbone" in before) == (mode != "head")
    if mode != "head":
      base_leaves = [on for path, on in flat(mask).items() if path[0].key == "backbone"]
      assert not all(base_leaves) and any(base_leaves)  # the adapters train, the base does not
    assert not np.array_equal(before["head"]["b"], after["head"]["b"])
    if mode in train_compile.ADAPTED:
      q_b = lambda p: p["backbone"]["layers"]["attn"]["q_lora_b"]
      assert not np.array_equal(q_b(before), q_b(after))
    # no optimizer state for frozen leaves
    opt_size = sum(x.size for x in jax.tree_util.tree_leaves(state.opt_state))
    trained = sum(x.size for x, on in zip(jax.tree_util.tree_leaves(after), jax.tree_util.tree_leaves(mask)) if on)
    assert opt_size <= 2 * trained + 8


@pytest.mark.slow
def test_grad_accumulation_matches_one_batch(tiny):
  """Two micro-batches of one query each: the same loss and gradient norm as the whole batch, step by step."""
  *_, whole = _steps(tiny, "full", n=3, accum=-1)
  *_, split = _steps(tiny, "full", n=3, accum=2)
  np.testing.assert_allclose(np.asarray(whole), np.asarray(split), rtol=1e-5)


class _Lowered(Exception):
  """Stops a training run once its first step has been lowered."""


@pytest.mark.parametrize("mode", ["lora", "head"])
def test_fit_report_lowers_the_program_the_trainer_runs(mode, monkeypatch, tmp_path):
  """train_reranker's first step, lowered inside a real run (the embedded default, its data), equals the step
  the fit report lowers from an abstract scorer of the same config and a synthetic batch of the same shapes:
  one program, and the memory the report states is the trainer's."""
  cfg = dataclasses.replace(train_compile.recipe(mode, 2, lora=LoraConfig(4, 8.0) if mode == "lora" else None),
                            num_steps=3)
  seen = {}
  prepare = train_lib.prepare

  def recording_prepare(cfg_, prompt, scorer, *args, **kwargs):
    seen.update(scorer=scorer, prep=prepare(cfg_, prompt, scorer, *args, **kwargs))
    return seen["prep"]

  def lowering_loop(settings, state, step_fn, hooks):
    idx = trainer.batch_indices(state, settings.num_examples, settings.batch_size)
    seen["batch"], _ = hooks.make_batch(idx, 0)
    placed_state, placed_batch = hooks.place(state, seen["batch"])
    seen.update(text=step_fn.lower(placed_state, placed_batch).as_text(), total=settings.total_steps,
                mesh=jax.tree_util.tree_leaves(placed_state.params)[0].sharding.mesh)
    raise _Lowered
  monkeypatch.setattr(train_lib, "prepare", recording_prepare)
  monkeypatch.setattr(trainer, "loop", lowering_loop)
  with pytest.raises(_Lowered):
    train_lib.train(cfg, eval_lib.EvalConfig(max_query_tokens=8, max_item_tokens=24), None,
                    corpus.split("train", 4), None, tmp_path / "work", progress=False)
  scorer, prep, mesh = seen["scorer"], seen["prep"], seen["mesh"]
  abstract = compile_report.abstract_scorer(scorer.config, mesh)
  grades, _ = prep.grids["train"]
  synthetic = train_compile.synthetic_prepared(cfg, abstract, 2, 4, grades.shape[1], 4,
                                               prep.source.geometry["train"] if prep.source.trains_backbone else None)
  prog = reranker_model.program(cfg, prep.head_cfg, synthetic.source, mesh, seen["total"])
  assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree_util.tree_leaves(prog.params))
  batch, _ = reranker_model.make_batch(synthetic, np.arange(2), 0, cfg)
  shapes = lambda b: jax.tree_util.tree_map(lambda x: (np.shape(x), jax.dtypes.canonicalize_dtype(x.dtype)), b)
  assert shapes(batch) == shapes(seen["batch"])  # make_batch's structure, shapes and dtypes, as the loop's
  lowered, _ = train_compile.lower_step(synthetic.source, cfg, prep.head_cfg, prog, mesh,
                                        train_compile.abstract_batch(batch, mesh), prep.label_ids)
  assert lowered.as_text() == seen["text"]


@pytest.mark.parametrize("mode", ["full", "lora"])
def test_step_program_size_does_not_grow_with_depth(mode):
  """The compile-size guard: the scanned training step's optimized HLO grows by under 10% from 2 to 8 layers
  (a layer unrolled into the graph, or an adapter merged per layer outside the scan, would multiply it)."""
  counts = {n: train_compile.local_step_op_counts(load_config({"model_name": "tiny-qwen3", "num_layers": n}), mode)
            for n in (2, 8)}
  assert counts[2]["optimized"] > 1000 and counts[2]["lowered"] > 1000, counts
  assert counts[8]["optimized"] < 1.1 * counts[2]["optimized"], counts
  assert counts[8]["lowered"] < 1.1 * counts[2]["lowered"], counts


def test_hlo_op_counts_count_instructions():
  lowered = jax.jit(lambda x: jnp.sin(x) * 2 + 1).lower(jnp.ones(3))
  counts = train_compile.hlo_op_counts(lowered, lowered.compile())
  # lowered: parameter, sine, 2 x (constant, broadcast), multiply, add; optimized: the fusion's body (the same
  # eight less the parameter plus its own) and the entry's parameter and fusion call
  assert 6 <= counts["lowered"] <= 10 and 4 <= counts["optimized"] <= 12, counts


# --- real TPU compiles ------------------------------------------------------------------------------
def _report(topology, mode, *overrides, batch_size=4):
  """The train-compile report of one configuration; each is compiled once per worker (several tests read the
  v6e:1x1 LoRA step) and handed out as a copy."""
  return copy.deepcopy(_compiled_report(topology, mode, overrides, batch_size))


@functools.cache
def _compiled_report(topology, mode, overrides, batch_size):
  opts = compile_report.CompileOptions(topology=topology, model="tiny-qwen3", geometries=(GEOMETRY,),
                                       overrides=WIDE + overrides)
  train = train_compile.TrainCompileOptions(train=mode, batch_size=batch_size, lora_rank=8, max_batch_size=0)
  return train_compile.run(opts, train.validate())


@pytest.mark.tpu_aot
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["full", "lora"])
def test_train_step_compiles_fits_and_shards_with_fsdp(mode):
  one = _report("v6e:1x1", mode)
  four = _report("v6e:2x2", mode, "ici_fsdp_parallelism=4")
  assert four["mesh"] == dict(data=1, fsdp=4, tensor=1)
  for r in (one, four):
    (s,) = r["steps"]
    assert s["error"] is None and s["fits"] and r["fits"], s
    assert 0 < s["hbm_bytes"] < s["hbm_capacity"] and s["roofline_s"] > 0 and s["tokens_per_s"] > 0
  s1, s4 = one["steps"][0], four["steps"][0]
  m1, m4 = s1["memory"], s4["memory"]
  cfg = load_config({"model_name": "tiny-qwen3", **{k: int(v) for k, v in (o.split("=") for o in WIDE[2:])}}).model
  if mode == "full":  # f32 master weights, Adam mu and nu
    assert m1["params"] > 4 * cfg.num_params() and m1["optimizer"] >= 2 * 4 * cfg.num_params()
  else:  # frozen bf16 base, state only for the adapters and the head
    assert 2 * cfg.num_params() <= m1["params"] < 2.2 * cfg.num_params() and m1["optimizer"] < 0.2 * m1["params"]
  # fsdp=4 splits the embed axis of every backbone weight: per-chip params, optimizer state and the total shrink.
  assert m4["params"] < 0.3 * m1["params"] and s4["hbm_bytes"] < s1["hbm_bytes"]
  if mode == "full":
    assert m4["optimizer"] < 0.3 * m1["optimizer"]
  # the cost model's work is split over the 4 chips (batch over fsdp)
  assert s4["flops_per_device"] == pytest.approx(s1["flops_per_device"] / 4)


@pytest.mark.tpu_aot
@pytest.mark.slow
def test_train_step_runs_splash_forward_and_backward_kernels():
  """attention=auto trains with splash on TPU: the compiled step holds splash's Pallas fwd, dq and dkv calls."""
  report = _report("v6e:1x1", "lora")
  (step,) = report["steps"]
  assert report["attention"] == "splash" and step["error"] is None and step["fits"], step
  phases = {re.match(r"splash_mha_(fwd|dq|dkv)_", name).group(1) for name in step["pallas_kernels"]}
  assert phases == {"fwd", "dq", "dkv"}, step["pallas_kernels"]
  assert step["compile"]["hlo_ops"]["optimized"] > 0 and step["compile"]["compile_s"] > 0
  shared = _report("v6e:1x1", "lora", "attention=shared_prefix")
  assert shared["attention"] == "shared_prefix" and shared["steps"][0]["pallas_kernels"] == []


@pytest.mark.tpu_aot
def test_script_bad_train_flags_are_one_line_errors(capsys, tmp_path):
  out = tmp_path / "r.json"
  for args, words in [(["--train=lora", "--lora_targets=q,qkv"], ["lora_targets", "gate"]),
                      (["--train=full", "--topology=v6e:2x2", "--batch_size=6", "ici_fsdp_parallelism=4"],
                       ["batch_size=6", "data x fsdp", "4"]),
                      (["--train=full", "--geometries=60x8x16x4"], ["--batch_size"]),
                      (["--train=full", "attention=pallas_gpu"], ["attention=pallas_gpu", "GPU", "splash"]),
                      (["--train=qlora", "--quantization=int8"], ["int8", "adapters"]),
                      (["--train=full", "--quantization=int8_weights"], ["int8_weights", "train=full"])]:
    with pytest.raises(SystemExit) as e:
      compile_check.run(["compile_check", "--model=tiny-qwen3", f"--output_json={out}", *args])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("error:") and "\n" not in err, err
    assert all(w in err for w in words), err
  assert not out.exists()


@pytest.mark.tpu_aot
@pytest.mark.slow
def test_qlora_step_holds_an_int8_base_and_state_only_for_the_adapters():
  """train=qlora: the frozen base is int8 projections + float32 scales (a byte per projection weight less than
  lora's bf16 base), the optimizer state is lora's (adapters and head only); the verdict follows the chip's HBM."""
  lora, qlora = _report("v6e:1x1", "lora"), _report("v6e:1x1", "qlora")
  assert qlora["quantization"] == "int8_weights" and lora["quantization"] == "none"
  (sl,), (sq,) = lora["steps"], qlora["steps"]
  assert sq["error"] is None and sq["fits"] and qlora["fits"] and train_compile.summary(qlora).endswith("\nFITS\n")
  cfg = load_config({"model_name": "tiny-qwen3", **{k: int(v) for k, v in (o.split("=") for o in WIDE[2:])}}).model
  ml, mq = sl["memory"], sq["memory"]
  assert ml["params"] - mq["params"] == pytest.approx(cfg.non_embedding_params(), rel=0.05)
  assert mq["optimizer"] == ml["optimizer"] < 0.2 * mq["params"]
  assert sq["flops"] == sl["flops"]  # the same adapters on the same shapes

  # On a chip with less HBM than the step needs the verdict is DOES NOT FIT.
  opts = compile_report.CompileOptions(topology="v6e:1x1", model="tiny-qwen3", geometries=(GEOMETRY,),
                                       quantization="int8_weights", overrides=WIDE)
  config = compile_report.build_config(opts)
  mesh = train_compile.mesh_lib.create_mesh(config.mesh, compile_report.describe_topology("v6e:1x1"))
  squeezed = dataclasses.replace(compile_report.chips.CHIPS["v6e"], hbm_bytes=sq["hbm_bytes"] // 2)
  train = train_compile.TrainCompileOptions(train="qlora", batch_size=4, lora_rank=8, max_batch_size=0)
  small = train_compile.compile_step(train_compile.make_target(config, mesh, squeezed, 1, train), 4, (60, 8, 16))
  assert not small["fits"] and small["hbm_bytes"] == sq["hbm_bytes"]
  assert "=> DOES NOT FIT" in "\n".join(train_compile._step_lines(small))
