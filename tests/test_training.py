"""The one trainer (maxscore/training): the step against its oracles, the sharded state, and runs on 1
device, 2 host devices and 2 processes (127.0.0.1) that agree within 1e-5 (float32), a checkpoint that
2 processes wrote resumed by 1, and the one-line errors."""

import json
import pathlib
import re
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from layers.kernels.base import training_kernel
from maxscore.checkpoints import head_storage
from maxscore.checkpoints import storage
from maxscore.distributed.processes import coordinator_flags, free_port, run_processes
from maxscore.errors import TrainError
from maxscore.scoring import loading
from maxscore.training import partition, trainer
from maxscore.training.optimizer import make_optimizer
from maxscore.training.reranker import train as train_lib
from maxscore.training.reranker.config import TrainConfig
from maxscore.training.state import TrainState, fresh

REPO = pathlib.Path(__file__).resolve().parent.parent
# Full fine-tuning of the embedded default (a tiny Qwen3) on 4 train queries, 2 per step, no dev eval. The
# head has no label bias: the listwise loss does not depend on it (it shifts every item of a query alike),
# so its gradient is rounding noise, which Adam scales up to steps of the learning rate's size.
FLAGS = ["--train_backbone", "--use_bias=false", "--max_train_queries=4", "--dev_split=", "--max_query_tokens=8",
         "--max_item_tokens=16", "--batch_size=2", "--num_steps=4", "--eval_every=0", "--save_every=2",
         "--keep_checkpoints=3", "--warmup_steps=0", "--learning_rate=1e-4", "--noprogress"]


# --- the step ----------------------------------------------------------------------------------------------
def _toy():
  """A least-squares loss (mean over rows) and its params and batch."""
  rng = np.random.default_rng(0)
  params = {"w": jnp.asarray(rng.normal(size=(3, 2)), jnp.float32), "b": jnp.zeros((2,), jnp.float32)}
  batch = {"x": rng.normal(size=(8, 3)).astype(np.float32), "y": rng.normal(size=(8, 2)).astype(np.float32)}

  def loss_fn(p, b, rng):
    del rng
    err = b["x"] @ p["w"] + p["b"] - b["y"]
    return jnp.mean(err ** 2), {"abs": jnp.mean(jnp.abs(err))}
  return params, batch, loss_fn


def test_grad_accumulation_equals_the_whole_batch():
  params, batch, loss_fn = _toy()
  opt = optax.adamw(1e-2)
  state = fresh(params, opt.init(params), jax.random.PRNGKey(0))
  one, m1 = trainer.train_step(state, batch, loss_fn=loss_fn, optimizer=opt)
  four, m4 = jax.jit(lambda s, b: trainer.train_step(s, b, loss_fn=loss_fn, optimizer=opt, grad_accum_steps=4))(
      state, batch)
  for k in ("loss", "grad_norm", "abs"):
    np.testing.assert_allclose(m4[k], m1[k], rtol=1e-6)
  for a, b in zip(jax.tree_util.tree_leaves(four.params), jax.tree_util.tree_leaves(one.params)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  assert int(four.step) == int(one.step) == 1


def test_frozen_leaves_keep_their_bytes():
  params, batch, loss_fn = _toy()
  opt, _ = make_optimizer(TrainConfig(), 10, trainable={"w": False, "b": True})
  state = fresh(params, opt.init(params), jax.random.PRNGKey(0))
  for _ in range(2):
    state, _ = trainer.train_step(state, batch, loss_fn=loss_fn, optimizer=opt)
  assert np.asarray(state.params["w"]).tobytes() == np.asarray(params["w"]).tobytes()
  assert not np.array_equal(state.params["b"], params["b"])


def test_frozen_leaves_are_constants_of_the_loss():
  """With `trainable`, a frozen weight's gradient is never formed: the compiled step holds no dot of its
  [3, 2] shape; the update is the same, and grad_norm is the trainable leaves' norm."""
  params, batch, loss_fn = _toy()
  trainable = {"w": False, "b": True}
  opt, _ = make_optimizer(TrainConfig(), 10, trainable=trainable)
  state = fresh(params, opt.init(params), jax.random.PRNGKey(0))
  step = lambda t: jax.jit(lambda s, b: trainer.train_step(s, b, loss_fn=loss_fn, optimizer=opt, trainable=t))
  masked, m_masked = step(trainable)(state, batch)
  plain, m_plain = step(None)(state, batch)
  for a, b in zip(jax.tree_util.tree_leaves(masked.params), jax.tree_util.tree_leaves(plain.params)):
    np.testing.assert_array_equal(a, b)
  grads = jax.grad(lambda p: loss_fn(p, batch, None)[0])(params)
  np.testing.assert_allclose(m_masked["grad_norm"], np.linalg.norm(grads["b"]), rtol=1e-6)
  assert m_plain["grad_norm"] > m_masked["grad_norm"]
  dot_shapes = lambda t: re.findall(r"= f32\[([\d,]*)\]\{[\d,]*\} dot\(", step(t).lower(state, batch).compile().as_text())
  assert "3,2" in dot_shapes(None) and "3,2" not in dot_shapes(trainable)


def test_adam_moments_take_their_params_shardings():
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1, 1), ("data", "fsdp", "tensor"))
  params = {"a": {"w": np.zeros((4, 2), np.float32)}, "b": np.zeros((3,), np.float32)}
  spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp", None))
  shardings = {"a": {"w": spec}, "b": partition.replicated(mesh)}
  opt = optax.adamw(1e-3)
  abstract = trainer.abstract_state(params, opt, jax.random.PRNGKey(0))
  out = partition.state_shardings(abstract, shardings, mesh)
  adam = out.opt_state[0]
  assert adam.mu["a"]["w"] == spec and adam.nu["a"]["w"] == spec and adam.count == partition.replicated(mesh)


def test_restore_refuses_shapes_the_mesh_cannot_hold():
  mesh = jax.sharding.AbstractMesh((1, 3, 1), ("data", "fsdp", "tensor"))
  target = {"w": jax.ShapeDtypeStruct((64, 8), np.float32, sharding=jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec("fsdp", None)))}
  stored = {"w": jax.ShapeDtypeStruct((64, 8), np.float32)}
  with pytest.raises(TrainError, match=r"w of stored shape \(64, 8\).*fsdp=3.*64 is not divisible"):
    partition.check_restorable(stored, target, "checkpoint")
  with pytest.raises(TrainError, match=r"stored with shape \(32, 8\)"):
    partition.check_restorable({"w": jax.ShapeDtypeStruct((32, 8), np.float32)}, target, "checkpoint")


def test_train_state_checkpoint_form_is_the_plain_dict():
  s = TrainState(1, 2, 3, 4, 5, 6)
  assert TrainState.from_dict(s.to_dict()) == s and list(s.to_dict()) == ["params", "opt_state", "step", "epoch",
                                                                          "index", "rng"]


# --- runs ----------------------------------------------------------------------------------------------------


def _train(root, *extra, count: int = 1, devices: int = 1, expect: int = 0) -> list[str]:
  """scripts/train_reranker.py (workdir <root>/work, export <root>/export) in `count` processes of `devices` CPU
  devices each; their stderr."""
  cmd = [sys.executable, str(REPO / "scripts" / "train_reranker.py"), f"--workdir={root / 'work'}",
         f"--export_dir={root / 'export'}", *FLAGS, *extra]
  port = free_port()
  results = run_processes(lambda i: cmd + (coordinator_flags(port, count, i, 30) if count > 1 else []), count,
                          devices)
  assert [r.code for r in results] == [expect] * count, [r.stderr[-3000:] for r in results]
  return [r.stderr for r in results]


def _losses(root, key: str = "loss") -> list[float]:
  return _losses_of(root / "work", key)


def _final_params(export) -> list[np.ndarray]:
  _, head, _ = head_storage.load_head(export)
  return [np.asarray(x, np.float32) for x in jax.tree_util.tree_leaves((storage.restore_checkpoint(export).params,
                                                                          head))]


def _assert_same_run(a, b, tol=1e-5):
  """Per-step losses and gradient norms, and the final params, within `tol` (float32)."""
  np.testing.assert_allclose(_losses(b), _losses(a), rtol=tol, atol=tol)
  np.testing.assert_allclose(_losses(b, "grad_norm"), _losses(a, "grad_norm"), rtol=tol)
  for x, y in zip(_final_params(a / "export"), _final_params(b / "export")):
    np.testing.assert_allclose(y, x, rtol=tol, atol=tol)


def _interrupt_after_step_2(work: pathlib.Path) -> pathlib.Path:
  """A finished 4-step workdir as a run killed after its step-2 checkpoint leaves it."""
  shutil.rmtree(work / "checkpoints" / "4")
  lines = (work / "metrics.jsonl").read_text().splitlines()
  (work / "metrics.jsonl").write_text("\n".join(lines[:2]) + "\n")
  (work / "summary.json").unlink()
  return work


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
  root = tmp_path_factory.mktemp("one_device")
  _train(root)
  assert len(_losses(root)) == 4
  return root


@pytest.mark.slow
def test_two_host_devices_equal_one_device(one_device, tmp_path):
  _train(tmp_path, devices=2)
  _assert_same_run(one_device, tmp_path)


@pytest.mark.slow
def test_one_process_checkpoint_resumes_in_two_processes(one_device, tmp_path):
  shutil.copytree(one_device / "work", tmp_path / "work")
  work = _interrupt_after_step_2(tmp_path / "work")
  _train(tmp_path, count=2)
  assert json.loads((work / "summary.json").read_text())["resumed_from_step"] == 2
  _assert_same_run(one_device, tmp_path)


def _script_error(tmp_path, *extra, devices: int = 1) -> str:
  err = _train(tmp_path, *extra, devices=devices, expect=2)[0].strip().splitlines()
  assert len(err) == 1 and not (tmp_path / "work").exists(), err
  return err[0]


def test_lora_rank_without_train_backbone_is_a_one_line_error(load_script, tmp_path, capsys):
  module = load_script("train_reranker")
  with pytest.raises(SystemExit) as e:
    module.run(["x", f"--workdir={tmp_path / 'work'}", "--lora_rank=8", "--noprogress"])
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2 and len(err) == 1 and "lora_rank=8" in err[0] and "train_backbone" in err[0]
  assert not (tmp_path / "work").exists()


def test_a_refused_export_only_writes_nothing(load_script, tmp_path, capsys):
  """--export_only on a workdir that holds no checkpoint (a run stopped before its first save) or on none is
  refused before the workdir is created or its logs opened, and so is --overwrite with it (which would remove
  the run first): the stopped run's metrics.jsonl and TensorBoard events stay as they were."""
  from maxscore.files import safety  # pylint: disable=import-outside-toplevel
  module = load_script("train_reranker")
  stopped = tmp_path / "stopped"
  (stopped / "checkpoints" / "2.orbax-checkpoint-tmp-1").mkdir(parents=True)  # a save in flight is no checkpoint
  (stopped / "tensorboard").mkdir()
  (stopped / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "loss": 0.5}\n')
  (stopped / "tensorboard" / "events.out.tfevents.1.host").write_bytes(b"the stopped run's events")
  safety.mark_owned(stopped, "head_training")
  before = {p: p.read_bytes() for p in stopped.rglob("*") if p.is_file()}
  for workdir, extra, says in ((stopped, [], "holds no checkpoint"), (tmp_path / "missing", [], "holds no checkpoint"),
                               (stopped, ["--overwrite"], "--overwrite would remove it")):
    with pytest.raises(SystemExit) as e:
      module.run(["x", f"--workdir={workdir}", "--export_only", *extra, *FLAGS])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "--export_only" in err[0] and says in err[0], err
    assert {p: p.read_bytes() for p in stopped.rglob("*") if p.is_file()} == before, (workdir, extra)
    assert not (tmp_path / "missing").exists(), (workdir, extra)


@pytest.mark.slow
def test_mesh_errors_are_one_line(tmp_path, one_device):
  # A global batch that data x fsdp does not divide.
  err = _script_error(tmp_path, "--batch_size=3", "ici_data_parallelism=2", devices=2)
  assert "batch_size=3" in err and "data x fsdp = 2 x 1 = 2" in err
  # A resume whose mesh cannot hold the stored shapes (4 attention heads over tensor=3).
  resumed = tmp_path / "resume"
  shutil.copytree(one_device / "work", resumed / "work")
  before = (resumed / "work" / "metrics.jsonl").read_text()
  err = _train(resumed, "ici_data_parallelism=1", "ici_tensor_parallelism=3", devices=3,
               expect=2)[0].strip().splitlines()
  # The model check (the scorer's, then the trainer's) or the stored-shape check, whichever meets it first.
  assert len(err) == 1 and re.search(r"(does not fit|cannot be split over) the mesh", err[0]), err
  assert "tensor=3" in err[0], err
  assert (resumed / "work" / "metrics.jsonl").read_text() == before
  assert sorted(p.name for p in (resumed / "work" / "checkpoints").iterdir() if p.name.isdigit()) == ["2", "4"]


@pytest.mark.slow
def test_scale_knobs_keep_the_loss(tmp_path):
  """remat none/full and 2 accumulated micro-batches give per_layer's losses; bf16 compute on f32 weights trains
  with losses near float32's."""
  from maxscore.datasets import data  # pylint: disable=import-outside-toplevel
  from maxscore.rerank import eval as eval_lib
  train = data.load_jsonl(data.DEFAULT_JSONL, split="train")
  train.queries = train.queries[:4]
  prompt = eval_lib.EvalConfig(max_query_tokens=8, max_item_tokens=16)
  base = dict(train_backbone=True, batch_size=2, num_steps=2, eval_every=0, save_every=0, warmup_steps=0)

  def run(name, **kw):
    train_lib.train(TrainConfig.of(**base, **kw), prompt, None, train, None, tmp_path / name, progress=False)
    return _losses_of(tmp_path / name)
  reference = run("per_layer")
  for name, kw in {"none_accum": dict(remat="none", grad_accum_steps=2), "full": dict(remat="full")}.items():
    np.testing.assert_allclose(run(name, **kw), reference, rtol=1e-5, err_msg=name)
  bf16 = run("bf16", compute_dtype="bfloat16", param_dtype="float32")
  np.testing.assert_allclose(bf16, reference, rtol=5e-2)
  assert all(np.isfinite(bf16))


def _losses_of(workdir, key: str = "loss") -> list[float]:
  lines = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  return [r[key] for r in lines if r["kind"] == "train"]


# --- LoRA through the trainer -------------------------------------------------------------------------------
LORA = ["--lora_rank=4", "--lora_alpha=8", "--lora_targets=q,v,up"]


@pytest.fixture(scope="module")
def lora_one_process(tmp_path_factory):
  root = tmp_path_factory.mktemp("lora_one")
  _train(root, *LORA, f"--adapters_dir={root / 'adapters'}")
  assert len(_losses(root)) == 4
  return root


def _checkpointed_backbone(work: pathlib.Path) -> dict:
  """The backbone params (base and adapters) of the workdir's latest training checkpoint, as numpy."""
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  step = max(int(p.name) for p in (work / "checkpoints").iterdir() if p.name.isdigit())
  state = ocp.StandardCheckpointer().restore(work / "checkpoints" / str(step) / "state")
  return jax.tree_util.tree_map(np.asarray, state["params"]["backbone"])


@pytest.mark.slow
def test_lora_trains_only_the_adapters_and_exports_them_merged(lora_one_process):
  from maxscore.datasets import data  # pylint: disable=import-outside-toplevel
  from maxscore.checkpoints import adapters as lora_lib  # pylint: disable=import-outside-toplevel
  base_before = jax.tree_util.tree_map(np.asarray, storage.restore_checkpoint(data.DEFAULT_CHECKPOINT).params)
  trained = _checkpointed_backbone(lora_one_process / "work")
  base_after, adapters = lora_lib.split_adapters(trained)
  flat_before, flat_after = (jax.tree_util.tree_leaves_with_path(t) for t in (base_before, base_after))
  assert [p for p, _ in flat_before] == [p for p, _ in flat_after]
  for (path, x), (_, y) in zip(flat_before, flat_after):  # the frozen base: the same bytes
    assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), path
  b_leaves = [v for p, v in jax.tree_util.tree_leaves_with_path(adapters) if str(p[-1].key).endswith("_lora_b")]
  assert b_leaves and all(np.abs(b).max() > 0 for b in b_leaves)  # B starts at zero: every one trained
  # The export is the merged model: base + alpha / rank * A @ B, an ordinary checkpoint.
  merged = lora_lib.merge(trained, lora_lib.lora_config(4, 8.0, ("q", "v", "up")))
  exported = storage.restore_checkpoint(lora_one_process / "export").params
  for x, y in zip(jax.tree_util.tree_leaves(merged), jax.tree_util.tree_leaves(exported)):
    np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_lora_adapters_exported_by_the_script_score_as_the_merged_export(lora_one_process):
  """--adapters_dir writes what eval_rerank.py --adapters_dir reads (adapters + the trained head)."""
  from maxscore.datasets import data  # pylint: disable=import-outside-toplevel
  from maxscore.rerank import eval as eval_lib
  adapters = lora_one_process / "adapters"
  assert (adapters / "lora.json").is_file() and (adapters / "head" / "head.json").is_file()
  merged = loading.build_scorer(str(lora_one_process / "export"), ["attention=shared_prefix"])
  with_adapters = loading.build_scorer(str(data.DEFAULT_CHECKPOINT), ["attention=shared_prefix"],
                                        adapters_dir=str(adapters))
  base = loading.build_scorer(str(data.DEFAULT_CHECKPOINT), ["attention=shared_prefix"])
  query, items = "the for statement", ["for x in y: pass", "while loops", "class bodies"]
  score = lambda s: s.score(query, items).scores
  np.testing.assert_allclose(score(with_adapters), score(merged), rtol=0, atol=1e-5)
  assert np.abs(score(base) - score(merged)).max() > 1e-5  # the comparison sees the training


@pytest.mark.slow
def test_lora_two_processes_equal_one_process(lora_one_process, tmp_path):
  _train(tmp_path, *LORA, count=2)
  _assert_same_run(lora_one_process, tmp_path)


@pytest.mark.slow
def test_a_warm_start_begins_at_the_earlier_runs_adapters_and_head(lora_one_process, tmp_path):
  """--init_from starts from an earlier run's --adapters_dir: at a learning rate of 1e-30 (steps far below a float32
  param's rounding; the config refuses 0) the run's params stay the ones it started from, so its checkpointed
  adapters are the earlier run's final ones, byte for byte, its head the stored head, and its merged export the
  earlier export. Two processes start from the same params (their losses equal one process's). Resumed without
  --init_from, the workdir is refused."""
  from maxscore.checkpoints import adapters as lora_lib  # pylint: disable=import-outside-toplevel
  adapters = lora_one_process / "adapters"
  _train(tmp_path, *LORA, f"--init_from={adapters}", "--learning_rate=1e-30", "--num_steps=2")
  _, started = lora_lib.split_adapters(_checkpointed_backbone(tmp_path / "work"))
  _, earlier = lora_lib.split_adapters(_checkpointed_backbone(lora_one_process / "work"))
  for (path, x), (_, y) in zip(*(jax.tree_util.tree_leaves_with_path(t) for t in (started, earlier))):
    assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), path
  np.testing.assert_array_equal(np.concatenate([p.ravel() for p in _final_params(tmp_path / "export")]),
                                np.concatenate([p.ravel() for p in _final_params(lora_one_process / "export")]))
  summary = json.loads((tmp_path / "work" / "summary.json").read_text())
  assert summary["init_from"]["dir"] == str(adapters)
  _train(tmp_path / "two", *LORA, f"--init_from={adapters}", "--learning_rate=1e-30", "--num_steps=2", count=2)
  _assert_same_run(tmp_path, tmp_path / "two")
  stderr = _train(tmp_path, *LORA, "--learning_rate=1e-30", "--num_steps=2", expect=2)[0]
  assert "init_from" in stderr, stderr[-2000:]


@pytest.mark.slow  # the earlier run is lora_one_process's training
def test_a_warm_start_is_refused_when_the_run_differs_from_the_stored_one(lora_one_process, tmp_path, capsys,
                                                                           load_script):
  """Another LoRA rank, another head, or no LoRA at all: a one-line error before any step."""
  adapters = lora_one_process / "adapters"
  script = load_script("train_reranker")
  args = [f"--workdir={tmp_path / 'w'}", *FLAGS, f"--init_from={adapters}"]
  cases = {"rank 4, alpha 8": [*LORA[1:], "--lora_rank=2"], "other settings (use_bias)": [*LORA, "--use_bias"],
           "needs --train_backbone and --lora_rank > 0": []}
  for want, extra in cases.items():
    with pytest.raises(SystemExit) as e:
      script.run(["train_reranker.py", *args, *extra, "--overwrite"])
    assert e.value.code == 2
    assert want in capsys.readouterr().err


def test_training_kernel_is_the_platforms_kernel_with_its_backward():
  """auto trains with splash on TPU and pallas_gpu on GPU (both with a Pallas backward), shared_prefix on CPU; a
  named kernel trains as named, since every registered kernel has a backward pass."""
  assert [training_kernel("auto", p)[0] for p in ("tpu", "gpu", "cpu")] == ["splash", "pallas_gpu", "shared_prefix"]
  for name in ("reference", "shared_prefix", "splash", "pallas_gpu"):
    assert training_kernel(name, "cpu")[0] == name
  with pytest.raises(ValueError, match="attention='flash'"):
    training_kernel("flash", "cpu")
