"""Score heads: small trainable maps from what the scorer reads at an item's score position to its scores.

A head sees the two things docs/ARCHITECTURE.md section 1 computes at each item's score position: the
final-norm hidden state `h` [D] and the label log-probs `lp` [K] (full-vocabulary log_softmax
of the lm_head logits, at the label ids). It returns new label log-probs `lp'` [K], which
`score()` finalizes exactly as without a head: `softmax(lp')` when apply_softmax, else `exp(lp')`.

  lm_labels  The lm_head rows of the labels, with a trainable delta on the K label logits:
               delta = h @ W + b        delta="full":     W [D, K] (zeros at init)
                       h @ A @ B + b    delta="low_rank": A [D, r] (random), B [r, K] (zeros), for large K
                       b                delta="none":     the bias only (then no hidden state is read)
                                        (b only when use_bias)
               lp'   = log_softmax over the FULL vocabulary of the lm_head logits with the K label
                       logits z_k replaced by z_k + delta_k
             computed exactly from lp, without the [V] logits (p_k = exp(lp_k)):
               lp'_k = lp_k + delta_k - log1p(sum_j (exp(lp_j + delta_j) - p_j))
             A zero delta makes every term of the sum exactly 0, so lp' == lp bit for bit: an untrained
             (or zero) lm_labels head gives exactly the scores of no head, for both apply_softmax values.
  linear     logits = h @ W + c                          [O]
  mlp        logits = gelu(h @ W1 + c1) @ W2 + c2         [O]
             With O = K the head is its own K-way classifier: lp' = log_softmax(logits) over the K
             labels, so `score()` returns softmax(logits) with or without apply_softmax. With O = 1
             the head emits one relevance logit s, read as label logits [s, 0, ..., 0] (K >= 2): for
             K = 2 the scores are [sigmoid(s), sigmoid(-s)] and log p0 - log p1 = s.

Init: every lm_labels delta starts at exactly zero (W, B, b zeros; A random); linear is all zeros
and mlp's output layer is zeros, so an untrained linear/mlp head scores every item equally.
Training computes lp from h through the lm_head (train.py); scoring takes the scorer's own lp: the
two agree within 1e-5 (docs/ARCHITECTURE.md section 1), and at zero delta scoring is the scorer bit for bit.

A head is stored beside its backbone (head_storage.py) and scores through a `HeadScorer` (head_scorer.py).
"""

import dataclasses
import functools
from typing import Any, Callable, Literal, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np

# exp(lp + delta) is evaluated at most at this exponent: a label logit 80 nats above the
# vocabulary's log-sum-exp is far outside anything a model produces, and exp(88) overflows float32.
_MAX_EXPONENT = 80.0


@dataclasses.dataclass(frozen=True)
class HeadConfig:
  """What a head computes; stored in head.json. `label_token_ids` are the labels it was trained for."""
  kind: Literal["lm_labels", "linear", "mlp"] = "lm_labels"
  label_token_ids: tuple[int, ...] = ()
  hidden_size: int = 0                  # D, the backbone's hidden size
  delta: Literal["full", "low_rank", "none"] = "full"  # lm_labels: the hidden-state term of the delta
  rank: int = 8                         # lm_labels with delta="low_rank": rank of h @ A @ B
  use_bias: bool = True                 # lm_labels: a trainable bias on the K label logits
  num_outputs: int = 0                  # linear/mlp: 1 = one relevance logit, K (or 0 = K) = label logits
  mlp_hidden: int = 256                 # mlp: width of the hidden layer

  @property
  def num_labels(self) -> int:
    return len(self.label_token_ids)

  @property
  def outputs(self) -> int:
    return self.num_outputs or self.num_labels

  @property
  def reads_hidden(self) -> bool:
    """Whether the head needs the hidden states (lm_labels with only a bias reads just lp)."""
    return self.kind != "lm_labels" or self.delta != "none"

  @property
  def reads_logprobs(self) -> bool:
    return self.kind == "lm_labels"

  def validate(self) -> "HeadConfig":
    if self.kind not in HEADS:
      raise ValueError(f"head kind={self.kind!r} is not one of {sorted(HEADS)}")
    if self.num_labels < 1:
      raise ValueError("a head needs label_token_ids (the labels it scores), got none")
    if self.hidden_size < 1:
      raise ValueError(f"hidden_size={self.hidden_size} must be the backbone's hidden size (>= 1)")
    if self.delta not in ("full", "low_rank", "none"):
      raise ValueError(f"delta={self.delta!r} is not one of ['full', 'low_rank', 'none']")
    if self.delta == "low_rank" and self.rank < 1:
      raise ValueError(f"rank={self.rank} must be >= 1 for delta='low_rank'")
    if self.kind == "lm_labels" and self.delta == "none" and not self.use_bias:
      raise ValueError("an lm_labels head with delta='none' and use_bias=false has nothing to train")
    if self.kind != "lm_labels" and self.num_outputs not in (0, 1, self.num_labels):
      raise ValueError(f"num_outputs={self.num_outputs} must be 1 (a relevance logit) or the number of "
                       f"labels {self.num_labels} (0 = the number of labels)")
    if self.kind != "lm_labels" and self.outputs == 1 and self.num_labels < 2:
      raise ValueError("a relevance-logit head (num_outputs=1) needs at least 2 labels")
    if self.kind == "mlp" and self.mlp_hidden < 1:
      raise ValueError(f"mlp_hidden={self.mlp_hidden} must be >= 1")
    return self

  def to_dict(self) -> dict[str, Any]:
    d = dataclasses.asdict(self)
    d["label_token_ids"] = list(self.label_token_ids)
    return d

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> "HeadConfig":
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - known
    if unknown:
      raise ValueError(f"unknown head config keys {sorted(unknown)}; known: {sorted(known)}")
    d = dict(d)
    d["label_token_ids"] = tuple(int(x) for x in d.get("label_token_ids", ()))
    return cls(**d).validate()


# --- the heads: init(cfg, key) -> params, apply(cfg, params, h_xD, lp_xK) -> lp'_xK --------------
def _label_logits_to_logprobs(cfg: HeadConfig, logits_xO: jax.Array) -> jax.Array:
  if cfg.outputs == 1:
    zeros = jnp.zeros(logits_xO.shape[:-1] + (cfg.num_labels - 1,), logits_xO.dtype)
    logits_xO = jnp.concatenate([logits_xO, zeros], axis=-1)
  return jax.nn.log_softmax(logits_xO, axis=-1)


def _init_lm_labels(cfg: HeadConfig, key: jax.Array) -> dict:
  params = {}
  if cfg.delta == "full":
    params["W"] = jnp.zeros((cfg.hidden_size, cfg.num_labels), jnp.float32)
  elif cfg.delta == "low_rank":
    params["A"] = jax.random.normal(key, (cfg.hidden_size, cfg.rank), jnp.float32) / np.sqrt(cfg.hidden_size)
    params["B"] = jnp.zeros((cfg.rank, cfg.num_labels), jnp.float32)
  if cfg.use_bias:
    params["b"] = jnp.zeros((cfg.num_labels,), jnp.float32)
  return params


def label_delta(cfg: HeadConfig, params: Mapping, h_xD: Optional[jax.Array], lp_xK: jax.Array) -> jax.Array:
  """The lm_labels delta on the K label logits, [..., K]."""
  delta = jnp.zeros(lp_xK.shape, jnp.float32)
  if cfg.delta == "full":
    delta = delta + jnp.einsum("...D,DK->...K", h_xD.astype(jnp.float32), params["W"],
                               precision=jax.lax.Precision.HIGHEST)
  elif cfg.delta == "low_rank":
    delta = delta + jnp.einsum("...D,DR,RK->...K", h_xD.astype(jnp.float32), params["A"], params["B"],
                               precision=jax.lax.Precision.HIGHEST)
  if cfg.use_bias:
    delta = delta + params["b"]
  return delta


def shift_label_logits(lp_xK: jax.Array, delta_xK: jax.Array) -> jax.Array:
  """Full-vocabulary label log-probs after adding `delta` to the K label logits (exact at delta = 0)."""
  lp_xK = lp_xK.astype(jnp.float32)
  moved = jnp.exp(jnp.minimum(lp_xK + delta_xK, _MAX_EXPONENT)) - jnp.exp(lp_xK)
  return lp_xK + delta_xK - jnp.log1p(jnp.sum(moved, axis=-1, keepdims=True))


def _apply_lm_labels(cfg: HeadConfig, params: Mapping, h_xD, lp_xK):
  return shift_label_logits(lp_xK, label_delta(cfg, params, h_xD, lp_xK))


def _init_linear(cfg: HeadConfig, key: jax.Array) -> dict:
  del key
  return {"W": jnp.zeros((cfg.hidden_size, cfg.outputs), jnp.float32), "c": jnp.zeros((cfg.outputs,), jnp.float32)}


def _apply_linear(cfg: HeadConfig, params: Mapping, h_xD, lp_xK):
  del lp_xK
  logits = jnp.einsum("...D,DO->...O", h_xD.astype(jnp.float32), params["W"],
                      precision=jax.lax.Precision.HIGHEST) + params["c"]
  return _label_logits_to_logprobs(cfg, logits)


def _init_mlp(cfg: HeadConfig, key: jax.Array) -> dict:
  w1 = jax.random.normal(key, (cfg.hidden_size, cfg.mlp_hidden), jnp.float32) / np.sqrt(cfg.hidden_size)
  return {"W1": w1, "c1": jnp.zeros((cfg.mlp_hidden,), jnp.float32),
          "W2": jnp.zeros((cfg.mlp_hidden, cfg.outputs), jnp.float32), "c2": jnp.zeros((cfg.outputs,), jnp.float32)}


def _apply_mlp(cfg: HeadConfig, params: Mapping, h_xD, lp_xK):
  del lp_xK
  hp = jax.lax.Precision.HIGHEST
  x = jax.nn.gelu(jnp.einsum("...D,DF->...F", h_xD.astype(jnp.float32), params["W1"], precision=hp) + params["c1"])
  return _label_logits_to_logprobs(cfg, jnp.einsum("...F,FO->...O", x, params["W2"], precision=hp) + params["c2"])


# kind -> (init, apply)
HEADS: dict[str, tuple[Callable, Callable]] = {
    "lm_labels": (_init_lm_labels, _apply_lm_labels),
    "linear": (_init_linear, _apply_linear),
    "mlp": (_init_mlp, _apply_mlp),
}


def init_head(cfg: HeadConfig, key: jax.Array) -> dict:
  """Fresh head params (a dict of float32 arrays) for `cfg`."""
  return HEADS[cfg.validate().kind][0](cfg, key)


def apply_head(cfg: HeadConfig, params: Mapping, h_xD: Optional[jax.Array], lp_xK: Optional[jax.Array]) -> jax.Array:
  """Label log-probs lp' [..., K] from hidden states [..., D] and the backbone's label log-probs [..., K]."""
  return HEADS[cfg.kind][1](cfg, params, h_xD, lp_xK)


@functools.lru_cache(maxsize=None)
def jit_apply(cfg: HeadConfig) -> Callable:
  """apply_head for `cfg`, jitted once per config (params, h, lp) -> lp'."""
  return jax.jit(lambda p, h, lp: apply_head(cfg, p, h, lp))


def relevance(lp_xK: jax.Array) -> jax.Array:
  """One ranking logit per item: log-odds of the first label within the label softmax,
  lp_0 - logsumexp(lp_1:). It orders items as eval's p_first does, and equals log_odds for K = 2."""
  if lp_xK.shape[-1] < 2:
    raise ValueError("ranking needs at least 2 labels (positive first)")
  return lp_xK[..., 0] - jax.nn.logsumexp(lp_xK[..., 1:], axis=-1)
