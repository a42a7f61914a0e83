"""Where a score head's inputs come from during training: two feature sources behind one interface, built once
by `prepare`, so that the loss, batches, dev metrics, init, shardings and export ask the source instead of
testing which kind of run this is.

- `Frozen`: the backbone stays frozen; each item's hidden state and label log-probs were computed once before
  the loop by the scorer's own forward (features.py, optionally cached in an npz), and a batch carries them.
- `Backbone`: the backbone trains with the head (whole, or LoRA adapters in place): a batch packs each query in
  one row of its split's fixed geometry (docs/ARCHITECTURE.md section 2), and the head reads the packed forward
  of the scorer's decoder, differentiable in the backbone's params; optionally with the auxiliary match losses.

    h, lp, parts = source.step_features(mesh, labels_K)(params, batch)   # inside the loss
    loss, parts = source.aux_losses(params, batch, loss, logits, h, parts)
"""

import dataclasses
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from layers import quantization as quant
from layers import sharding as sharding_lib
from layers.decoder import Decoder
from layers.kernels import get_kernel
from layers.kernels.base import training_kernel
from maxscore.checkpoints import adapters as lora_lib
from maxscore.scoring.runner import DTYPES
from maxscore.scoring.scorer import Scorer
from maxscore.training.reranker import features
from maxscore.training.reranker.batches import BackboneBatch, FrozenBatch
from maxscore.training.reranker.config import BackboneConfig
from maxscore.training.reranker.features import Examples, Features
from maxscore.training.reranker.losses import batch_loss, probe_bce, probe_logits


@dataclasses.dataclass(frozen=True)
class Frozen:
  """A frozen backbone's features per split (hidden [Q, N, D], label log-probs [Q, N, K]); no backbone param.
  `abstract`: the run's params are ShapeDtypeStructs (the fit report's source, on an abstract scorer)."""
  feats: dict[str, Features]
  abstract: bool = False

  trains_backbone = False

  @property
  def feature_seconds(self) -> float:
    """Seconds the frozen forward took (0 when every split was read from the cache)."""
    return sum(f.seconds for f in self.feats.values())

  @property
  def from_cache(self) -> bool:
    return all(f.cached for f in self.feats.values())

  base = None  # no backbone params

  def init_params(self, key: jax.Array, base: None) -> dict[str, Any]:
    del key, base
    return {}

  def param_shardings(self, params: dict[str, Any], mesh: Mesh) -> dict[str, Any]:
    del params, mesh
    return {}

  def trainable(self, params: dict[str, Any]) -> Optional[Any]:
    del params
    return None

  def check_mesh(self, mesh: Mesh) -> None:
    del mesh

  def attention(self) -> Optional[dict]:
    return None

  def make_batch(self, examples: Examples, split: str, idx: np.ndarray, targets: dict) -> FrozenBatch:
    safe = np.where(idx >= 0, idx, 0)
    return FrozenBatch(**targets, hidden=self.feats[split].hidden[safe], logprobs=self.feats[split].logprobs[safe])

  def step_features(self, mesh: Mesh, labels_K: jax.Array) -> Callable:
    del mesh, labels_K
    return lambda params, batch: (batch.hidden, batch.logprobs, {})

  def aux_losses(self, params, batch, loss, logits, h, parts) -> tuple[jax.Array, dict]:
    del params, batch, logits, h
    return loss, parts

  def dev_features(self, params, split: str, examples: Examples, labels_K, batch_size: int):
    del params, examples, labels_K, batch_size
    return self.feats[split].hidden, self.feats[split].logprobs

  def export_backbone(self, final: dict[str, Any]) -> None:
    del final
    return None


@dataclasses.dataclass(frozen=True)
class Backbone:
  """The scorer's backbone trained with the head: each split's packed geometry (P, L, N), and how the decoder
  trains (`settings`: LoRA adapters, dtypes, what the backward recomputes, the match losses)."""
  scorer: Scorer
  geometry: dict[str, tuple[int, int, int]]
  settings: BackboneConfig
  group_rows: bool = False             # a train row packs only the group drawn for the step
  _decoders: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

  trains_backbone = True
  feature_seconds = 0.0
  from_cache = False

  @property
  def abstract(self) -> bool:
    return self.scorer.abstract

  def decoder(self, mesh: Optional[Mesh] = None) -> Decoder:
    """The scorer's decoder for training (one per mesh, kept): its attention kernel run per shard of `mesh`
    (None: unsharded, for the dev eval on a host copy), compute in `compute_dtype` on params of `param_dtype`,
    each scanned layer rematerialized unless remat=none, with the LoRA adapters in place."""
    if mesh not in self._decoders:
      config = self.scorer.config
      kernel, _ = training_kernel(config.kernel.attention, self.scorer.platform)
      attend = sharding_lib.shard_kernel(get_kernel(kernel, config.kernel.options()), mesh)
      decoder = Decoder(config.model, attend, dtype=DTYPES[self.settings.compute_dtype or config.runtime.dtype],
                        param_dtype=DTYPES[self.settings.param_dtype or config.runtime.dtype],
                        precision=config.runtime.matmul_precision, remat=self.settings.remat != "none",
                        quantization=self.scorer.quantization, quantization_group=self.scorer.quantization_group)
      self._decoders[mesh] = lora_lib.adapt(decoder, self.settings.lora)
    return self._decoders[mesh]

  @property
  def base(self) -> Any:
    """The scorer's params (ShapeDtypeStructs from an abstract scorer), which init_params starts from."""
    return self.scorer.params

  def init_params(self, key: jax.Array, base: Any) -> dict[str, Any]:
    """The backbone's params `base` in param_dtype, and the adapters (from `key`, the head's init key) and the match
    probes when on."""
    # A QLoRA base's int8 weights and their float32 scales keep their dtypes (they stay frozen).
    keeps = lambda path: self.scorer.quantization != "none" and quant.is_quantized_leaf(path)
    dtype = self.settings.param_dtype
    cast = lambda path, x: jnp.asarray(x, DTYPES[dtype]) if dtype and not keeps(path) else jnp.asarray(x)
    params = {"backbone": jax.tree_util.tree_map_with_path(cast, base)}
    model_cfg = self.scorer.config.model
    if self.settings.lora is not None:  # adapters in float32 (A random, B zero: step 0 is the base model exactly)
      params["backbone"] = lora_lib.add_adapters(params["backbone"], lora_lib.init_adapters(
          model_cfg, self.settings.lora, jax.random.fold_in(key, 1)))
    if self.settings.match is not None:
      probe = lambda: {"w": jnp.zeros((model_cfg.hidden_size,), jnp.float32), "b": jnp.zeros((), jnp.float32)}
      params["match_probe"] = {"token": probe(), **({"coverage": probe()} if self.settings.match.coverage_on == "probe"
                                                    else {})}
    return params

  def param_shardings(self, params: dict[str, Any], mesh: Mesh) -> dict[str, Any]:
    """The backbone (and its adapters) by the logical-axis rules; the probes are replicated as the head is."""
    del params
    model_cfg = self.scorer.config.model
    out = sharding_lib.model_param_shardings(model_cfg, mesh, quantization=self.scorer.quantization,
                                             quantization_group=self.scorer.quantization_group)
    if self.settings.lora is not None:
      out = lora_lib.add_adapters(out, lora_lib.adapter_shardings(model_cfg, self.settings.lora, mesh))
    return {"backbone": out}

  def trainable(self, params: dict[str, Any]) -> Optional[Any]:
    """The boolean trainable pytree the optimizer freezes the rest by (None: everything trains). With LoRA it
    is the head and probes plus the adapter leaves of the backbone (maxscore/checkpoints/adapters.py's
    trainable_mask)."""
    if self.settings.lora is None:
      return None
    mask = jax.tree_util.tree_map(lambda _: True, params)
    mask["backbone"] = lora_lib.trainable_mask(params["backbone"])
    return mask

  def check_mesh(self, mesh: Mesh) -> None:
    sharding_lib.check_divisible(self.scorer.config.model, mesh)

  def attention(self) -> dict:
    """The attention kernel the training backbone differentiates, and why."""
    kernel, reason = training_kernel(self.scorer.config.kernel.attention, self.scorer.platform)
    return dict(kernel=kernel, reason=reason)

  def make_batch(self, examples: Examples, split: str, idx: np.ndarray, targets: dict) -> BackboneBatch:
    """The batch's queries packed at the split's geometry (with group rows, only the items drawn), and the match
    targets when the match losses are on."""
    reqs = [examples.requests[i] if i >= 0 else None for i in idx]
    width = targets["grades"].shape[1]
    if self.group_rows and split == "train":
      plan = features.plan_packed(reqs, self.geometry[split], columns=[np.nonzero(m)[0] for m in targets["mask"]],
                                  num_columns=width)
    else:
      plan = features.plan_packed(reqs, self.geometry[split])
    extra = {}
    if self.settings.match is not None:
      match, candidate, coverage = features.match_targets(plan, reqs)
      extra = dict(match=match, match_mask=candidate, coverage=coverage[:, :width])
    return BackboneBatch(**targets, packed=plan.batch, gather=plan.gather_QxN[:, :width], **extra)

  def step_features(self, mesh: Mesh, labels_K: jax.Array) -> Callable:
    """fn(params, batch) -> (h [B, N, D], label log-probs [B, N, K], parts): one packed forward on `mesh`'s
    decoder; with the match losses, `parts` holds the token-match loss of a probe halfway up the stack."""
    decoder = self.decoder(mesh)

    def forward(backbone, batch, residuals):
      # One packed request per row (row q holds request q): the gather index of its item j is q * N + slot, where
      # q counts from the first row of this (micro-)batch, whichever process built it.
      n = batch.packed["score_index"].shape[1]
      gather = jnp.arange(batch.gather.shape[0])[:, None] * n + batch.gather % n
      return features.packed_features(decoder, backbone, batch.packed, gather, labels_K, residuals=residuals)
    if self.settings.remat == "full":
      forward = jax.checkpoint(forward, static_argnums=(2,))

    def fn(params, batch):
      if self.settings.match is None:
        return (*forward(params["backbone"], batch, False), {})
      h, lp, residual_LxBxTxD = forward(params["backbone"], batch, True)
      # Probed halfway up the stack, so the layers above can gather the matches at the score position.
      middle = residual_LxBxTxD[(residual_LxBxTxD.shape[0] - 1) // 2]
      return h, lp, {"match_loss": probe_bce(params["match_probe"]["token"], middle, batch.match, batch.match_mask)}
    return fn

  def aux_losses(self, params, batch, loss, logits, h, parts) -> tuple[jax.Array, dict]:
    """With the match losses: the ranking loss plus weight x (token match + coverage ranking), and each part."""
    if self.settings.match is None:
      return loss, parts
    match = self.settings.match
    coverage = logits if match.coverage_on == "score" else probe_logits(params["match_probe"]["coverage"], h)
    parts["coverage_loss"] = batch_loss("pairwise", coverage, batch.coverage, batch.mask)
    parts["rank_loss"] = loss
    return loss + match.weight * (parts["match_loss"] + parts["coverage_loss"]), parts

  def dev_features(self, params, split: str, examples: Examples, labels_K, batch_size: int):
    """Every query's features through the current backbone (a host copy), `batch_size` queries per forward."""
    return features.backbone_features(self.decoder(), params["backbone"], examples, self.geometry[split], labels_K,
                                      batch_size)

  def export_backbone(self, final: dict[str, Any]) -> Any:
    """The trained backbone on the host, the adapters merged (W + alpha / rank * A @ B) with LoRA."""
    backbone = jax.device_get(final["backbone"])
    return backbone if self.settings.lora is None else jax.device_get(lora_lib.merge(backbone, self.settings.lora))


Source = Frozen | Backbone
