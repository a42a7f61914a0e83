"""The training fit report: the step's cost model, the step itself on CPU, and real TPU compiles.

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

from layers.config import ModelConfig
from layers.kernels import get_kernel
from layers.lora import LoraConfig
from maxscore.bench import compile_report, train_compile
from maxscore.bench import train_program as tp
from maxscore.config import load_config
from maxscore.scoring import cost_model
from maxscore.testing import scripts

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
  assert train_compile.step_flops(cfg, b, p, l, n, "head")["total"] == fwd
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
  cfg = load_config({"model_name": "tiny-qwen3"}).model
  return cfg, tp.synthetic_batch(2, 7, 3, 4, cfg.vocab_size, geometry=(8, 4, 4))


def _steps(cfg, batch, mode, lora=None, n=2, accum=1):
  """n steps of `mode`; the losses, or with accum != 1 (-1: one batch) (loss, grad norm) per step."""
  params = tp.init_params(cfg, mode, jax.random.PRNGKey(0), lora, frozen_dtype=jnp.float32)
  decoder = tp.make_decoder(cfg, get_kernel("shared_prefix"), mode, jnp.float32, True, "highest")
  optimizer = tp.make_train_optimizer(params, mode)
  step = tp.jit_step(tp.make_loss_fn(decoder, mode, lora), optimizer, max(accum, 1), tp.trainable(params, mode))
  state, metrics = tp.make_state(params, optimizer), []
  before = jax.tree_util.tree_map(np.asarray, params)
  for _ in range(n):
    state, m = step(state, batch)
    metrics.append((float(m["loss"]), float(m["grad_norm"])))
  return before, state, [loss for loss, _ in metrics] if accum == 1 else metrics


@pytest.mark.slow
def test_lora_and_head_steps_train_only_their_params(tiny):
  cfg, batch = tiny
  lora = LoraConfig(rank=4, alpha=8.0)
  _, _, full_losses = _steps(cfg, batch, "full", n=1)
  for mode in ("lora", "qlora", "head"):
    before, state, losses = _steps(cfg, batch, mode, lora if mode in tp.ADAPTED else None, n=3)
    if mode != "qlora":  # B starts at zero: the first loss is the plain model's (qlora's base is another, int8)
      assert losses[0] == pytest.approx(full_losses[0], abs=1e-6)
    assert losses[-1] < losses[0]
    after = jax.tree_util.tree_map(np.asarray, state.params)
    for a, b in zip(jax.tree_util.tree_leaves(before["backbone"]), jax.tree_util.tree_leaves(after["backbone"])):
      assert a.tobytes() == b.tobytes()  # the frozen base is bit-identical
    assert not np.array_equal(before["head"]["b"], after["head"]["b"])
    if mode in tp.ADAPTED:
      assert not np.array_equal(before["lora"]["q"]["b"], after["lora"]["q"]["b"])
    # no optimizer state for frozen leaves
    opt_bytes = sum(x.size for x in jax.tree_util.tree_leaves(state.opt_state))
    trainable = sum(x.size for k, v in after.items() if k != "backbone" for x in jax.tree_util.tree_leaves(v))
    assert opt_bytes <= 2 * trainable + 8


@pytest.mark.slow
def test_grad_accumulation_matches_one_batch(tiny):
  """Two micro-batches of one query each: the same loss and gradient norm as the whole batch, step by step."""
  cfg, batch = tiny
  _, _, whole = _steps(cfg, batch, "full", n=3, accum=-1)
  _, _, split = _steps(cfg, batch, "full", n=3, accum=2)
  np.testing.assert_allclose(np.asarray(whole), np.asarray(split), rtol=1e-5)


@pytest.mark.parametrize("mode", ["full", "lora"])
def test_step_program_size_does_not_grow_with_depth(mode):
  """The compile-size guard: the scanned training step's optimized HLO grows by under 10% from 2 to 8 layers
  (a layer unrolled into the graph, or an adapter merged per layer outside the scan, would multiply it)."""
  counts = {n: train_compile.local_step_op_counts(load_config({"model_name": "tiny-qwen3", "num_layers": n}).model,
                                                  mode) for n in (2, 8)}
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
