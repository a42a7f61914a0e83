"""The backbone training step the training fit report compiles and the CPU training bench times.

    params = init_params(model, "full", jax.random.PRNGKey(0))
    step = make_step(model, attend, "full", optimizer, dtype=jnp.bfloat16)
    state, metrics = step(make_state(params, optimizer), synthetic_batch(4, 100, 10, 20))

One query per packed row (docs/ARCHITECTURE.md section 2), as backbone fine-tuning in maxscore/training/reranker/model.py
builds it; the loss is that trainer's (the score head on the label log-probs, listwise over the
row's items). Modes:

- `full`: every backbone weight and the head train (f32 master weights, compute in `dtype`);
- `lora`: rank-r adapters A [in, r], B [r, out] per target per layer and the head train; the base
  stays frozen (in its own dtype, e.g. bf16). The adapters run beside the frozen kernels, as the
  trainer's do (layers/lora.py: y = x W + alpha/r (x A) B), so no frozen kernel's gradient is needed;
- `qlora`: `lora` on a frozen int8_weights base (layers/quantization.py: int8 projections and float32 scales,
  the rest in its own dtype); the int8 weights get no gradient (the trainer's allow_int);
- `head`: the frozen backbone's forward (no backward through it) feeds the head, which alone trains.

Frozen leaves get no optimizer state (optax.multi_transform with set_to_zero, driven by a boolean
"trainable" pytree). The LoRA settings (layers/lora.py's LoraConfig), the state and the step are the trainer's
(maxscore/training). The adapters are
kept apart from the backbone in the params ({"backbone", "lora", "head"}) and placed beside their kernels
for each forward (`with_adapters`).
"""

import functools
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from layers.config import ModelConfig
from layers.decoder import Decoder
from layers.lora import TARGETS, LoraConfig
from maxscore.checkpoints import adapters
from maxscore.checkpoints import storage
from maxscore.heads import head
from maxscore.scoring.requests import make_request
from maxscore.scoring.runner import label_logprobs
from maxscore.training import state as state_lib
from maxscore.training.head_features import plan_packed
from maxscore.training.losses import MASK_LOGIT, batch_loss
from maxscore.training.optimizer import make_optimizer
from maxscore.training.reranker.config import TrainConfig
from maxscore.training.state import TrainState
from maxscore.training.trainer import train_step

MODES = ("full", "lora", "qlora", "head")
ADAPTED = ("lora", "qlora")  # the modes that train adapters on a frozen base
LORA_TARGETS = TARGETS  # every projection the trainer's adapters can target (layers/lora.py)
LABELS = (1, 2)  # label token ids of the synthetic workload


# --- params -------------------------------------------------------------------------------------
def _kernel_path(target: str) -> tuple[str, str]:
  return ("attn", target) if target in ("q", "k", "v", "o") else ("mlp", target)


def _in_out(shape: tuple[int, ...], target: str) -> tuple[int, int]:
  """A per-layer kernel's (fan-in, fan-out): q/k/v [D, N, H], o [N, H, D], gate/up [D, F], down [F, D]."""
  if target == "o":
    return shape[0] * shape[1], shape[2]
  return shape[0], int(np.prod(shape[1:]))


def lora_shapes(model: ModelConfig, lora: LoraConfig) -> dict[str, dict[str, jax.ShapeDtypeStruct]]:
  """A [layers, in, r] and B [layers, r, out] (float32) for each target kernel."""
  layers = storage.abstract_params(model)["layers"]
  out = {}
  for t in lora.targets:
    a, b = _kernel_path(t)
    fan_in, fan_out = _in_out(layers[a][b].shape[1:], t)
    out[t] = {"a": jax.ShapeDtypeStruct((model.num_layers, fan_in, lora.rank), jnp.float32),
              "b": jax.ShapeDtypeStruct((model.num_layers, lora.rank, fan_out), jnp.float32)}
  return out


def head_config(model: ModelConfig) -> head.HeadConfig:
  return TrainConfig().head_config(LABELS, model.hidden_size)


def abstract_params(model: ModelConfig, mode: str, lora: Optional[LoraConfig] = None,
                    frozen_dtype: Any = jnp.bfloat16) -> dict:
  """ShapeDtypeStructs of the params `mode` trains with: {"backbone", "head"} and, for lora and qlora, "lora"
  (qlora's backbone: int8 projections with float32 scales, the rest in `frozen_dtype`)."""
  params = {"backbone": storage.abstract_params(model, jnp.float32 if mode == "full" else frozen_dtype,
                                                quantization=base_quantization(mode)),
            "head": jax.eval_shape(lambda: head.init_head(head_config(model), jax.random.PRNGKey(0)))}
  if mode in ADAPTED:
    params["lora"] = lora_shapes(model, lora)
  return params


def base_quantization(mode: str) -> str:
  """The quantization of `mode`'s frozen base: int8_weights for qlora, none otherwise."""
  return "int8_weights" if mode == "qlora" else "none"


def init_params(model: ModelConfig, mode: str, key: jax.Array, lora: Optional[LoraConfig] = None,
                frozen_dtype: Any = jnp.bfloat16) -> dict:
  """Random params of abstract_params' shapes (backbone N(0, 0.02); LoRA A N(0, 1/in), B zero, as usual)."""
  shapes = abstract_params(model, mode, lora, frozen_dtype)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
  keys = jax.random.split(key, len(leaves))

  def init(path, x, k):
    names = [getattr(p, "key", "") for p in path]
    if names[0] == "lora":
      return (jnp.zeros(x.shape, x.dtype) if names[-1] == "b"
              else jax.random.normal(k, x.shape, x.dtype) / np.sqrt(x.shape[1]))
    if names[-1].endswith("norm") or "scale" in names[-1]:
      return jnp.ones(x.shape, x.dtype) * (0.02 / 127 if names[-1].endswith("_scale") else 1)
    if x.dtype == jnp.int8:
      return jax.random.randint(k, x.shape, -127, 128, jnp.int32).astype(jnp.int8)
    return (0.02 * jax.random.normal(k, x.shape, jnp.float32)).astype(x.dtype)
  return jax.tree_util.tree_unflatten(treedef, [init(p, x, k) for (p, x), k in zip(leaves, keys)])


def trainable(params: dict, mode: str) -> dict:
  """True on the leaves the optimizer updates: all (full), adapters and head (lora), head (head)."""
  return {k: jax.tree_util.tree_map(lambda _, on=(k != "backbone" or mode == "full"): on, v)
          for k, v in params.items()}


def make_train_optimizer(params: dict, mode: str, total_steps: int = 1000) -> optax.GradientTransformation:
  """The head trainer's clip + AdamW schedule on the trainable leaves; frozen leaves keep no state."""
  optimizer, _ = make_optimizer(TrainConfig(), total_steps)
  labels = jax.tree_util.tree_map(lambda on: "train" if on else "frozen", trainable(params, mode))
  return optax.multi_transform({"train": optimizer, "frozen": optax.set_to_zero()}, labels)


# --- the forward and the loss ---------------------------------------------------------------------
def with_adapters(backbone: dict, adapters: dict) -> dict:
  """The backbone's params with each target's A [layers, in, r] and B [layers, r, out] reshaped to its kernel's
  layout and placed beside it (`<name>_lora_a`, `<name>_lora_b`), where layers/lora.py's adapter einsums read
  them: y = x W + alpha/r (x A) B, the frozen kernel (float or int8 with its scale) left as it is."""
  layers = dict(backbone["layers"])
  for t, ab in adapters.items():
    module, name = _kernel_path(t)
    w = layers[module][name]  # [layers, contracting dims..., output dims...]
    contracting = 2 if t == "o" else 1
    a = ab["a"].reshape(ab["a"].shape[:1] + w.shape[1:1 + contracting] + ab["a"].shape[-1:])
    b = ab["b"].reshape(ab["b"].shape[:2] + w.shape[1 + contracting:])
    layers[module] = dict(layers[module], **{f"{name}_lora_a": a, f"{name}_lora_b": b})
  return dict(backbone, layers=layers)


def features(decoder: Decoder, params: dict, batch: dict, mode: str, lora: Optional[LoraConfig] = None,
             remat: bool = True):
  """h [B, N, D] (float32) at the score rows and the label log-probs [B, N, K] of one packed forward."""
  backbone = params["backbone"]
  if mode in ADAPTED:
    decoder = adapters.adapt(decoder, lora)
    hidden_BxTxD, _ = decoder.apply({"params": with_adapters(backbone, params["lora"])}, batch["tokens"],
                                    batch["positions"], batch["layout"])
  else:
    hidden_BxTxD, _ = decoder.apply({"params": backbone}, batch["tokens"], batch["positions"], batch["layout"])
  h_BxNxD = jnp.take_along_axis(hidden_BxTxD, batch["score_index"][..., None], axis=1).astype(jnp.float32)
  return h_BxNxD, label_logprobs(decoder, backbone, h_BxNxD, jnp.asarray(LABELS, jnp.int32))


def make_loss_fn(decoder: Decoder, mode: str, lora: Optional[LoraConfig] = None, remat: bool = True) -> Callable:
  """loss_fn(params, batch, rng) -> (loss, aux): the head trainer's listwise loss on the packed forward."""
  head_cfg = head_config(decoder.config)

  def loss_fn(params, batch, rng):
    del rng
    h, lp = features(decoder, params, batch, mode, lora, remat)
    logits = jnp.where(batch["mask"], head.relevance(head.apply_head(head_cfg, params["head"], h, lp)), MASK_LOGIT)
    return batch_loss("listwise", logits, batch["grades"], batch["mask"]), {}
  return loss_fn


def make_decoder(model: ModelConfig, attend: Callable, mode: str, dtype: Any, remat: bool,
                 precision: str = "default") -> Decoder:
  """The Decoder the step applies: compute in `dtype`; with `remat` each scanned layer is rematerialized in
  the backward pass (head mode has none); qlora reads its int8_weights base (the embedding, the final norm
  and an int8 lm_head outside the scan). `features` adds the adapters of lora and qlora."""
  return Decoder(model, attend, dtype=dtype, param_dtype=jnp.float32, precision=precision,
                 remat=remat and mode != "head", quantization=base_quantization(mode))


# --- the step ---------------------------------------------------------------------------------------
def make_state(params: Any, optimizer: optax.GradientTransformation, seed: int = 0) -> TrainState:
  """The trainer's fresh state of `params` (step 0, the optimizer's initial state)."""
  return state_lib.fresh(params, optimizer.init(params), jax.random.PRNGKey(seed))


# --- batches ------------------------------------------------------------------------------------------
def synthetic_batch(batch: int, query_len: int, num_items: int, item_len: int, vocab_size: int,
                    geometry: Optional[tuple[int, int, int]] = None, seed: int = 0) -> dict:
  """`batch` queries of random tokens, one packed row each, at (P, L, N) `geometry` (default: exact)."""
  rng = np.random.default_rng(seed)
  p, l, n = geometry or (query_len, item_len, num_items)
  reqs = [make_request(rng.integers(3, vocab_size, query_len).tolist(),
                       rng.integers(3, vocab_size, (num_items, item_len)).tolist(), list(LABELS), False, False,
                       None, vocab_size) for _ in range(batch)]
  plan = plan_packed(reqs, (p, l, n))
  grades = rng.integers(0, 3, (batch, n)).astype(np.float32)
  grades[:, 0] = np.maximum(grades[:, 0], 1)  # every query has a relevant item (the listwise loss weighs it)
  return dict(plan.batch, mask=jnp.asarray(plan.mask_QxN), grades=jnp.asarray(grades * plan.mask_QxN))


def batch_shapes(batch: int, prefix_len: int, slot_len: int, num_slots: int) -> dict:
  """ShapeDtypeStructs of a batch of `batch` packed rows (what synthetic_batch builds), unplaced."""
  from layers.kernels import SegmentLayout  # pylint: disable=g-import-not-at-top
  t = prefix_len + slot_len * num_slots
  sds = lambda shape, dtype=jnp.int32: jax.ShapeDtypeStruct(shape, dtype)  # noqa: E731
  layout = SegmentLayout(sds((batch,)), sds((batch, num_slots)), prefix_len, slot_len, num_slots)
  return {"tokens": sds((batch, t)), "positions": sds((batch, t)), "layout": layout,
          "score_index": sds((batch, num_slots)), "mask": sds((batch, num_slots), jnp.bool_),
          "grades": sds((batch, num_slots), jnp.float32)}


def jit_step(loss_fn: Callable, optimizer: optax.GradientTransformation, grad_accum_steps: int = 1,
             trainable: Any = None, **jit_kwargs) -> Callable:
  """train_step jitted with the state donated (the update happens in place); `trainable` (`trainable(params,
  mode)`) makes the frozen leaves constants of the loss, so no gradient is formed for them."""
  return jax.jit(functools.partial(train_step, loss_fn=loss_fn, optimizer=optimizer,
                                   grad_accum_steps=grad_accum_steps, trainable=trainable),
                 donate_argnums=0, **jit_kwargs)
