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

A head lives in a checkpoint directory next to the backbone:
  <ckpt>/head/head.json   {"format_version", "config": HeadConfig fields, "info": provenance}
  <ckpt>/head/params/     Orbax StandardCheckpointer tree of the head params

`load_scorer(dir)` returns a `HeadScorer` (a Scorer that applies the head) when the directory
has a head, else a plain `Scorer`; `eval.build_scorer` goes through it. A head scores the labels
it was trained for; requests for other labels get the backbone's scores, as without a head.
"""

import dataclasses
import functools
import json
import os
import pathlib
import shutil
import tempfile
from typing import Any, Callable, Literal, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from maxscore.checkpoints import storage as checkpointing
from maxscore.errors import ScoreInputError, UnsafeOutputError
from maxscore.files import identity, safety
from maxscore.scoring.requests import TokenRequest, validate_batch
from maxscore.scoring.scorer import ScoreResult, Scorer, finalize_scores, score_output

FORMAT_VERSION = 1
HEAD_DIR = "head"
HEAD_JSON = "head.json"
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


# --- storage -----------------------------------------------------------------------------------
def has_head(checkpoint_dir: os.PathLike) -> bool:
  return (pathlib.Path(checkpoint_dir) / HEAD_DIR / HEAD_JSON).is_file()


def save_head(checkpoint_dir: os.PathLike, cfg: HeadConfig, params: Mapping,
              info: Optional[Mapping[str, Any]] = None) -> pathlib.Path:
  """Writes (replaces) `<checkpoint_dir>/head/`: head.json and the Orbax params, built beside it and
  renamed into place. An existing head/ without head.json is not maxscore's and is refused."""
  out = pathlib.Path(checkpoint_dir).resolve() / HEAD_DIR
  if out.exists() and not (out / HEAD_JSON).is_file():
    raise UnsafeOutputError(f"{out} exists but holds no {HEAD_JSON}: it is not a maxscore score head; "
                            f"left untouched")
  tmp = pathlib.Path(tempfile.mkdtemp(prefix=".head.", suffix=".tmp", dir=out.parent))
  try:
    checkpointer = checkpointing.local_checkpointer()
    checkpointer.save(tmp / "params", jax.tree_util.tree_map(np.asarray, dict(params)))
    checkpointer.wait_until_finished()
    meta = {"format_version": FORMAT_VERSION, "config": cfg.to_dict(), "info": dict(info or {})}
    (tmp / HEAD_JSON).write_text(json.dumps(meta, indent=2) + "\n")
    safety.swap_dir(tmp, out)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return out


def load_head(checkpoint_dir: os.PathLike) -> tuple[HeadConfig, dict, dict]:
  """(config, params, info) of `<checkpoint_dir>/head/`; CheckpointError when missing or corrupt."""
  d = pathlib.Path(checkpoint_dir).resolve() / HEAD_DIR
  try:
    meta = json.loads((d / HEAD_JSON).read_text())
    cfg = HeadConfig.from_dict(meta["config"])
  except FileNotFoundError:
    raise checkpointing.CheckpointError(f"{d} has no {HEAD_JSON}") from None
  except (OSError, KeyError, TypeError, ValueError, RecursionError) as e:
    raise checkpointing.CheckpointError(f"{d / HEAD_JSON} is corrupt: {e}") from None
  want = jax.eval_shape(lambda: init_head(cfg, jax.random.PRNGKey(0)))
  checkpointer = ocp.StandardCheckpointer()
  try:
    stored = checkpointer.metadata(d / "params").item_metadata.tree
    shapes = {k: tuple(v.shape) for k, v in stored.items()}
  except Exception as e:  # orbax raises several types for unreadable metadata
    raise checkpointing.CheckpointError(f"cannot read Orbax metadata in {d / 'params'}: {str(e)[:300]}") from None
  if shapes != {k: tuple(v.shape) for k, v in want.items()}:
    raise checkpointing.CheckpointError(f"{d / 'params'} holds {shapes}, the head config needs "
                                        f"{ {k: tuple(v.shape) for k, v in want.items()} }")
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])  # each process loads its own copy
  target = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=device) for k, v in want.items()}
  try:
    params = checkpointer.restore(d / "params", target)
  except Exception as e:  # orbax raises several types for unreadable or truncated data
    raise checkpointing.CheckpointError(f"cannot restore {d / 'params'}: {type(e).__name__}: {str(e)[:300]}") from None
  return cfg, dict(params), dict(meta.get("info", {}))


def export_checkpoint(base_dir: os.PathLike, out_dir: os.PathLike, cfg: HeadConfig, params: Mapping,
                      info: Optional[Mapping[str, Any]] = None, backbone_params: Any = None,
                      overwrite: bool = False, **marker_info: Any) -> pathlib.Path:
  """A scorer checkpoint with the head: a copy of `base_dir` (or `base_dir` itself when out_dir is
  it) plus head/. With `backbone_params` (train_backbone), those replace the copied params.

  The checkpoint is built beside `out_dir` and renamed into place; an existing `out_dir` is replaced
  only with `overwrite` and only when maxscore wrote it (maxscore/files/safety.py)."""
  base, out = pathlib.Path(base_dir).resolve(), pathlib.Path(out_dir).resolve()
  model, tok_path = checkpointing.read_metadata(base)
  if out == base and backbone_params is None:
    save_head(out, cfg, params, info)
    return out
  inputs = () if out == base else (base,)
  with safety.replace_dir(out, "checkpoint", overwrite or out == base, inputs, "export directory",
                          **marker_info) as tmp:
    if backbone_params is None:
      shutil.copytree(base, tmp, ignore=shutil.ignore_patterns(HEAD_DIR, safety.MARKER), dirs_exist_ok=True)
    else:
      tok_dir = base / "tokenizer"
      main = tok_path.name if tok_path else None  # the file maxscore.json names comes first
      tok_files = tuple(sorted(tok_dir.iterdir(), key=lambda p: (p.name != main, p.name))) if tok_dir.is_dir() else ()
      checkpointing.write_checkpoint_files(tmp, backbone_params, model, tok_files)
    save_head(tmp, cfg, params, info)
  return out


# --- scoring with a head -------------------------------------------------------------------------
class HeadScorer:
  """A Scorer whose scores go through a trained head. Everything but scoring is the wrapped
  scorer's (config, tokenizer, runner, prefix_cache, hidden_states, ...), request validation included.

  The head scores the labels it was trained for (`label_token_ids=None` in `score()` picks them);
  a request for any other labels is scored by the backbone exactly as without a head. Forwards:
  one for linear/mlp (hidden states) and for bias-only lm_labels (label log-probs); two for
  lm_labels with a hidden-state delta (label log-probs and hidden states), so the log-probs are the scorer's
  own and a zero delta reproduces them bit for bit.
  """

  def __init__(self, scorer: Scorer, cfg: HeadConfig, params: Mapping, info: Optional[Mapping] = None):
    cfg.validate()
    if cfg.hidden_size != scorer.config.model.hidden_size:
      raise checkpointing.CheckpointError(f"the head reads hidden size {cfg.hidden_size}, the model has "
                                          f"{scorer.config.model.hidden_size}")
    self.scorer = scorer
    self.head_config = cfg
    self.head_params = {k: jnp.asarray(v) for k, v in params.items()}
    self.head_info = dict(info or {})

  def __getattr__(self, name: str) -> Any:
    return getattr(self.scorer, name)

  def label_logits(self, *args, **kwargs):
    """Refused: a head gives label log-probs, not raw lm_head logits (score mode raw_logit)."""
    raise ScoreInputError("score_mode=raw_logit ranks by the backbone's raw label logits, which a trained score "
                          "head does not produce; score without the head (--nouse_head) or use p_first/log_odds")

  label_logits_requests = label_logits

  @property
  def head_fingerprint(self) -> dict[str, Any]:
    """What the head contributes to a score (for resume identity): its config and a params digest."""
    return {"config": self.head_config.to_dict(), "params_sha256": identity.tree_digest(self.head_params)}

  def score(self, query: Any, items: Any, label_token_ids: Optional[Sequence[int]] = None,
            apply_softmax: Optional[bool] = None, item_first: bool = False, algorithm: Optional[str] = None,
            separator_token_id: Any = "config") -> ScoreResult:
    """Scorer.score through the head (see the module docstring for what the scores are)."""
    labels = self.head_config.label_token_ids if label_token_ids is None else label_token_ids
    req = self.scorer.make_request(query, items, labels, apply_softmax, item_first, separator_token_id)
    return self.score_requests([req], algorithm=algorithm)[0]

  def score_batch(self, requests: Sequence[Mapping[str, Any]], algorithm: Optional[str] = None) -> list[ScoreResult]:
    return self.score_requests(validate_batch(requests, self.scorer.validate), algorithm=algorithm)

  def score_requests(self, reqs: Sequence[TokenRequest], algorithm: Optional[str] = None) -> list[ScoreResult]:
    cfg = self.head_config
    mine = [i for i, r in enumerate(reqs) if tuple(r.label_ids) == cfg.label_token_ids]
    others = [i for i in range(len(reqs)) if tuple(reqs[i].label_ids) != cfg.label_token_ids]
    out: list = [None] * len(reqs)
    if others:
      for i, res in zip(others, self.scorer.score_requests([reqs[i] for i in others], algorithm)):
        out[i] = res
    if not mine:
      return out
    for output in sorted({score_output(reqs[i].apply_softmax) for i in mine}):
      idx = [i for i in mine if score_output(reqs[i].apply_softmax) == output]
      for i, res in zip(idx, self._head_scores([reqs[i] for i in idx], algorithm, output)):
        out[i] = res
    return out

  def _head_scores(self, head_reqs: Sequence[TokenRequest], algorithm: Optional[str], output: str):
    """Head scores of requests that share a score output (Scorer.score_requests).

    With apply_softmax ("logits") the head reads the label logits shifted by their row max instead of
    the full-vocabulary log-probs: the two differ by a per-row constant, which lm_labels' lp' keeps
    and the labels' softmax cancels; so the vocabulary log-sum-exp is skipped and a zero delta still
    reproduces the scorer's scores bit for bit."""
    cfg = self.head_config
    # The scorer's forwards (Scorer._run): per request (output, algorithm name).
    lps = self.scorer._run(head_reqs, algorithm, output) if cfg.reads_logprobs else None
    hs = self.scorer._run(head_reqs, algorithm, "hidden") if cfg.reads_hidden else None
    out = []
    for j, r in enumerate(head_reqs):
      name = (lps or hs)[j][1]
      lp = lps[j][0] if lps else np.zeros((len(r.items), cfg.num_labels), np.float32)
      if lps and output == "logits" and lp.size:
        lp = lp - lp.max(axis=-1, keepdims=True)
      h = hs[j][0] if hs else np.zeros((len(r.items), 0), np.float32)
      new_lp = np.asarray(jit_apply(cfg)(self.head_params, h, lp)) if len(r.items) else lp
      out.append(ScoreResult(finalize_scores(new_lp, r.apply_softmax), name, self.scorer._usage(r, name)))
    return out


def load_scorer(checkpoint_dir: os.PathLike, use_head: bool = True, **overrides: Any):
  """`Scorer.from_checkpoint`, wrapped in a HeadScorer when the checkpoint has a head (and use_head)."""
  scorer = Scorer.from_checkpoint(checkpoint_dir, **overrides)
  if use_head and has_head(checkpoint_dir):
    cfg, params, info = load_head(checkpoint_dir)
    return HeadScorer(scorer, cfg, params, info)
  return scorer
