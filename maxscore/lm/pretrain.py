"""Language-model pretraining: next-token loss on a decoder from configs/models/, on local text.

    summary = pretrain(PretrainConfig(num_steps=600), "tokenizer.model", train_texts, held_out_texts,
                       "out/pretrain", export_dir="out/pretrained")

1. Every text is tokenized, followed by the tokenizer's EOS, and the concatenation is cut into rows
   of `seq_len` tokens (the tail that fills no row is dropped); the held-out texts alike.
2. Each step takes `batch_size` rows in an order drawn per epoch from PRNG(seed, epoch) (the one
   trainer's data order, maxscore/training); loss = mean cross-entropy of tokens 1..T-1 given the ones
   before, over the full vocabulary. Optimizer: the trainer's (clip by global norm, AdamW on warmup +
   cosine). The state lives on a mesh over the visible devices (data parallel by default).
3. Orbax checkpoints in `<workdir>/checkpoints` (params, optimizer state, step, data position) every
   `save_every` steps: a killed run restarted with the same settings resumes and ends bit for bit
   where an uninterrupted one does (float32 on CPU); a workdir holding another run is refused.
4. `<workdir>/metrics.jsonl` + TensorBoard: train loss every `log_every` steps, held-out loss and
   perplexity every `eval_every` steps; `summary.json` adds the unigram baseline's held-out
   perplexity (add-one counts of the training tokens) on the same target tokens, tokens/s, and a
   copy probe (`copy_probe`: held-out text read once and again right after; the second reading is
   only cheaper for a model that copies from its context, which a reranker needs).
5. `export_dir`: a maxscore checkpoint (params, model config, tokenizer) that scoring and the score-
   head trainer load like any other.
"""

import dataclasses
import functools
import json
import math
import os
import pathlib
import time
from typing import Any, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from layers import sharding as sharding_lib
from layers.config import ModelConfig
from layers.decoder import Decoder, init_params
from layers.kernels import SegmentLayout, get_kernel
from maxscore import config as config_lib
from maxscore import training as train_lib
from maxscore.checkpoints import storage
from maxscore.checkpoints.tokenizer import load_tokenizer
from maxscore.config import MeshConfig
from maxscore.datasets import data
from maxscore.errors import TrainError
from maxscore.files import identity, safety
from maxscore.lm import corpus as corpus_lib
from maxscore.lm import tokenizer_training
from maxscore.training import checkpoint, partition, trainer
from maxscore.training.optimizer import OptimizerConfig

FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class PretrainConfig:
  """Model, data mix, optimizer and loop of a pretraining run (configs/pretrain.yml documents each)."""
  model_name: str = "pydoc-qwen3"
  sources: tuple[str, ...] = ("pydoc", "docstrings", "source")
  pydoc_repeats: int = 4
  seq_len: int = 256
  batch_size: int = 16
  num_steps: int = 600
  learning_rate: float = 3e-3
  end_learning_rate: float = 1e-4
  warmup_steps: int = 100
  weight_decay: float = 0.01
  clip_norm: float = 1.0
  seed: int = 0
  log_every: int = 10
  eval_every: int = 250
  save_every: int = 250
  keep_checkpoints: int = 2

  def validate(self) -> "PretrainConfig":
    for name in ("seq_len", "batch_size", "num_steps", "log_every", "keep_checkpoints", "pydoc_repeats"):
      if getattr(self, name) < 1:
        raise TrainError(f"{name}={getattr(self, name)} must be >= 1")
    for name in ("warmup_steps", "eval_every", "save_every"):
      if getattr(self, name) < 0:
        raise TrainError(f"{name}={getattr(self, name)} must be >= 0")
    if self.seq_len < 2:
      raise TrainError(f"seq_len={self.seq_len} must be >= 2")
    OptimizerConfig.of(self).validate()
    unknown = [s for s in self.sources if s not in corpus_lib.SOURCES]
    if unknown or not self.sources:
      raise TrainError(f"sources={list(self.sources)}: need one or more of {list(corpus_lib.SOURCES)}")
    return self

  def model(self, vocab_size: int) -> ModelConfig:
    """configs/models/<model_name>.yml with the tokenizer's vocabulary size."""
    base = config_lib.load_config([f"model_name={self.model_name}"]).model
    return dataclasses.replace(base, vocab_size=vocab_size).validate()


@dataclasses.dataclass(frozen=True)
class PretrainRun:
  """What a pretraining run reads and where it writes (configs/pretrain.yml documents each key)."""
  tokenizer_path: Optional[str] = None
  vocab_size: int = 3072
  jsonl: Optional[str] = None
  held_out_splits: tuple[str, ...] = ("dev", "test")
  tokenizer_chars: int = 4_000_000
  workdir: str = "out/pretrain"
  export_dir: Optional[str] = None
  overwrite: bool = False
  progress: bool = True

  def validate(self) -> "PretrainRun":
    if self.vocab_size < 256 or self.tokenizer_chars < 1:
      raise TrainError(f"need vocab_size >= 256 and tokenizer_chars >= 1; got {self.vocab_size}, "
                       f"{self.tokenizer_chars}")
    return self


def run_pretraining(run: PretrainRun, cfg: PretrainConfig) -> dict[str, Any]:
  """Collects the local text (the held-out sections left out) and pretrains; returns the summary."""
  jsonl = run.jsonl or str(data.DEFAULT_JSONL)
  _check_outputs(pathlib.Path(run.workdir), run.export_dir, run.overwrite,
                 [jsonl] + ([run.tokenizer_path] if run.tokenizer_path else []))  # before collecting the text
  held = corpus_lib.held_out_sections(jsonl, run.held_out_splits)
  corpus = corpus_lib.collect(held, cfg.sources)
  info = {"held_out_sections": len(held), "held_out_from": f"{pathlib.Path(jsonl).name} splits "
          f"{list(run.held_out_splits)}", "sources": corpus.counts(), "dropped_by_leak_check": corpus.dropped}
  return pretrain(
      cfg, run.tokenizer_path, corpus_lib.training_texts(corpus, cfg.pydoc_repeats),
      corpus_lib.held_out_text(corpus_lib.pydoc_sections(), held), run.workdir,
      tokenizer_texts=corpus_lib.tokenizer_texts(corpus, run.tokenizer_chars) if not run.tokenizer_path else (),
      vocab_size=run.vocab_size, export_dir=run.export_dir, overwrite=run.overwrite, progress=run.progress,
      info=info)


# --- data ------------------------------------------------------------------------------------------
def token_rows(tokenizer, texts: Sequence[str], seq_len: int) -> np.ndarray:
  """[rows, seq_len] int32: the texts tokenized, each followed by EOS, concatenated and cut into rows."""
  eos = tokenizer.eos_id if tokenizer.eos_id is not None else 0
  stream = [np.asarray(tokenizer.encode(t) + [eos], np.int32) for t in texts]
  flat = np.concatenate(stream) if stream else np.zeros((0,), np.int32)
  n = len(flat) // seq_len
  return flat[:n * seq_len].reshape(n, seq_len)


def unigram_nll(train_rows: np.ndarray, eval_rows: np.ndarray, vocab_size: int) -> float:
  """Mean negative log-likelihood (nats) of eval_rows' target tokens (1..T-1) under add-one unigram
  counts of the training rows' target tokens."""
  counts = np.bincount(train_rows[:, 1:].ravel(), minlength=vocab_size).astype(np.float64) + 1.0
  logp = np.log(counts / counts.sum())
  return float(-logp[eval_rows[:, 1:].ravel()].mean())


# --- the model's loss --------------------------------------------------------------------------------
def make_decoder(model: ModelConfig) -> Decoder:
  return Decoder(model, get_kernel("reference"))


def token_nll(decoder: Decoder, params, rows_BxT: jax.Array) -> jax.Array:
  """[B, T-1] next-token NLLs (nats): token t+1 given tokens 0..t, full-vocabulary log-softmax."""
  b, t = rows_BxT.shape
  positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  layout = SegmentLayout.causal(jnp.full((b,), t, jnp.int32), t)
  h_BxTxD, _ = decoder.apply({"params": params}, rows_BxT, positions, layout)
  logits = decoder.apply({"params": params}, h_BxTxD[:, :-1], method=Decoder.logits)
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return -jnp.take_along_axis(logp, rows_BxT[:, 1:, None], axis=-1)[..., 0]


def lm_loss(decoder: Decoder, params, rows_BxT: jax.Array, valid_B: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(sum of target-token NLLs, number of target tokens) over the valid rows."""
  weight = valid_B.astype(jnp.float32)[:, None]
  return jnp.sum(token_nll(decoder, params, rows_BxT) * weight), jnp.sum(weight) * (rows_BxT.shape[1] - 1)


def copy_probe(decoder: Decoder, params, rows_RxT: np.ndarray, span: int = 64) -> dict[str, float]:
  """Whether the model copies from its context: mean NLL of each row's first `span` tokens read once
  (`first_read`) and written again right after them (`repeat`, the repeat's first token left out).

  A reranker must find the query's words in the document; a model that can copy from its context
  reads the repeat almost for free (`repeat` near 0), one that cannot reads it as the first time."""
  first = np.asarray(rows_RxT)[:, :span]
  nll = np.asarray(jax.jit(functools.partial(token_nll, decoder))(params, jnp.asarray(np.concatenate([first, first], 1))))
  return {"span": span, "first_read": float(nll[:, :span - 1].mean()), "repeat": float(nll[:, span:].mean())}


def make_loss_fn(decoder: Decoder):
  """loss_fn(params, batch, rng) -> (mean next-token NLL over the valid rows' targets, {})."""

  def loss_fn(params, batch, rng):
    del rng  # no dropout
    total, count = lm_loss(decoder, params, batch["rows"], batch["valid"])
    return total / jnp.maximum(count, 1.0), {}

  return loss_fn


def make_held_out_nll(decoder: Decoder, rows: np.ndarray, batch_size: int):
  """params -> mean next-token NLL (nats) over every target token of `rows`, `batch_size` rows per
  forward (one compiled shape)."""
  fn = jax.jit(functools.partial(lm_loss, decoder))

  def nll(params) -> float:
    total, count = 0.0, 0.0
    for start in range(0, len(rows), batch_size):
      chunk = rows[start:start + batch_size]
      pad = batch_size - len(chunk)
      batch = np.concatenate([chunk, np.zeros((pad, rows.shape[1]), np.int32)]) if pad else chunk
      t, c = fn(params, batch, np.arange(batch_size) < len(chunk))
      total, count = total + float(t), count + float(c)
    return total / max(count, 1.0)

  return nll


# --- the run -----------------------------------------------------------------------------------------
def _fingerprint(cfg: PretrainConfig, model: ModelConfig, rows: np.ndarray, held: np.ndarray) -> dict:
  digest = lambda a: identity.tree_digest({"rows": a})
  return {"format_version": FORMAT_VERSION, "pretrain": json.loads(json.dumps(dataclasses.asdict(cfg))),
          "model": config_lib.model_config_to_dict(model), "data": {"train": digest(rows), "held_out": digest(held)}}


def _check_outputs(workdir: pathlib.Path, export_dir, overwrite: bool, inputs) -> None:
  """Refuses, creating nothing, a workdir or export that would overwrite an input or a foreign directory."""
  safety.refuse_overlap([workdir], inputs, "--workdir")
  if export_dir:
    safety.check_export_dir(export_dir, workdir, inputs, overwrite)
  if not overwrite:  # (--overwrite: remove_owned refuses a foreign workdir)
    safety.check_output_dir(workdir, "lm_pretraining", inputs, "--workdir")


def _prepare_outputs(workdir: pathlib.Path, export_dir, overwrite: bool, inputs) -> None:
  _check_outputs(workdir, export_dir, overwrite, inputs)
  if overwrite:
    safety.remove_owned(workdir, "--workdir")
  safety.prepare_output_dir(workdir, "lm_pretraining", inputs, "--workdir")


def pretrain(cfg: PretrainConfig, tokenizer_path: Optional[os.PathLike], train_texts: Sequence[str],
             held_out_texts: Sequence[str], workdir: os.PathLike, *, tokenizer_texts: Sequence[str] = (),
             vocab_size: int = 3072, export_dir: Optional[os.PathLike] = None, overwrite: bool = False,
             progress: bool = True, info: Optional[dict] = None) -> dict[str, Any]:
  """Pretrains (or resumes) a decoder on `train_texts`; returns the summary (also <workdir>/summary.json).

  `tokenizer_path` None: a sentencepiece tokenizer of `vocab_size` is trained on `tokenizer_texts` into
  <workdir>/tokenizer/ first (deterministic, so a resumed run trains the same one again)."""
  cfg.validate()
  wall_start = time.perf_counter()
  workdir = pathlib.Path(workdir).resolve()
  _prepare_outputs(workdir, export_dir, overwrite, [tokenizer_path] if tokenizer_path else [])
  if tokenizer_path is None:
    if not tokenizer_texts:
      raise TrainError("no tokenizer_path and no tokenizer_texts to train one on")
    t = time.perf_counter()
    tokenizer_path = tokenizer_training.train_sentencepiece(workdir / "tokenizer" / "tokenizer", tokenizer_texts,
                                                            vocab_size)
    logging.info("pretrain: trained %s in %.1f s", tokenizer_path, time.perf_counter() - t)
  tok = load_tokenizer(tokenizer_path)
  model = cfg.model(tok.vocab_size)
  rows = token_rows(tok, train_texts, cfg.seq_len)
  held = token_rows(tok, held_out_texts, cfg.seq_len)
  if len(rows) < cfg.batch_size:
    raise TrainError(f"the training text fills {len(rows)} rows of seq_len={cfg.seq_len}, fewer than "
                     f"batch_size={cfg.batch_size}")
  decoder = make_decoder(model)
  optimizer, schedule = train_lib.make_optimizer(cfg, cfg.num_steps)
  init_key, data_key = jax.random.split(jax.random.PRNGKey(cfg.seed))
  mesh = partition.train_mesh(MeshConfig())
  partition.check_batch(cfg.batch_size, mesh)
  boxed = jax.eval_shape(lambda: init_params(decoder, init_key))
  shardings = sharding_lib.param_shardings(boxed, mesh)
  params = jax.jit(lambda k: nn.unbox(init_params(decoder, k)), out_shardings=shardings)(init_key)  # one compile
  fingerprint = _fingerprint(cfg, model, rows, held)
  run = trainer.start(workdir, cfg.keep_checkpoints, params, shardings, optimizer, data_key, mesh, fingerprint,
                      lambda: sharding_lib.check_divisible(model, mesh))
  evaluate = make_held_out_nll(decoder, held, cfg.batch_size) if len(held) else lambda p: None
  save = lambda s, st: checkpoint.save(run.manager, s, st, fingerprint)
  settings = trainer.LoopSettings(cfg.num_steps, cfg.batch_size, len(rows), cfg.log_every, cfg.eval_every,
                                  cfg.save_every, max(1, cfg.num_steps // 20), "pretrain", progress)
  hooks = trainer.Hooks(lambda idx, step: ({"rows": rows[np.where(idx >= 0, idx, 0)], "valid": idx >= 0}, 0),
                        trainer.placer(run.shardings, mesh, cfg.batch_size), lambda p, step: _held_out(evaluate, p), save,
                        run.log, schedule, partition.local_rows(cfg.batch_size, mesh))
  step_fn = trainer.jit_train_step(make_loss_fn(decoder), optimizer, run.shardings, mesh)
  with trainer.reports_interrupt(run.manager, workdir):
    state, timing = trainer.loop(settings, run.state, step_fn, hooks)
  trainer.finish(run.manager, state, save)
  log, resume_step = run.log, run.resume_step
  log.close()
  final = partition.host_copy(state.params)
  if jax.process_index() != 0:
    return {}
  summary = _summary(cfg, model, workdir, log, rows, held, step=int(state.step), params=final, timing=timing,
                     wall=time.perf_counter() - wall_start, resume_step=resume_step, info=info)
  _carry_timing(summary, trainer.finished_run_summary(workdir, resume_step))
  if len(held) and cfg.seq_len >= 4:
    summary["held_out_copy_probe"] = copy_probe(decoder, final, held[:64], min(64, cfg.seq_len // 2))
  if export_dir:
    ours = safety.exported_by(export_dir, workdir)  # this workdir's earlier (or killed) run wrote it
    summary["export_dir"] = str(storage.save_checkpoint(
        export_dir, jax.device_get(final), model, tokenizer_files=(tokenizer_path,),
        overwrite=overwrite or ours, workdir=str(workdir)))
  safety.atomic_write_text(workdir / "summary.json", json.dumps(summary, indent=2) + "\n")
  return summary


def _held_out(evaluate, params) -> Optional[dict[str, Any]]:
  """The held-out eval line: loss and perplexity (None without held-out text)."""
  nll = evaluate(partition.host_copy(params))
  return None if nll is None else {"split": "held_out", "loss": nll, "perplexity": math.exp(nll)}


def _carry_timing(summary: dict, previous: Optional[dict]) -> None:
  """A run restarted where its last finished process ended (a rebuild over a finished run) keeps that
  process's time: wall_seconds add up, and tokens/s stays the measured one when no step ran now."""
  if previous is None:
    return
  summary["wall_seconds"] += previous.get("wall_seconds") or 0.0
  if summary["tokens_per_s"] is None:
    summary["tokens_per_s"] = previous.get("tokens_per_s")


def _summary(cfg, model, workdir, log, rows, held, *, step, params, timing, wall, resume_step, info) -> dict[str, Any]:
  evals = [r for r in log.records if r["kind"] == "eval"]
  trains = [r for r in log.records if r["kind"] == "train"]
  unigram = unigram_nll(rows, held, model.vocab_size) if len(held) else None
  seconds, steps_timed = timing.step_seconds, timing.steps_timed
  return {
      "workdir": str(workdir),
      "pretrain_config": json.loads(json.dumps(dataclasses.asdict(cfg))),
      "model": config_lib.model_config_to_dict(model),
      "params": model.num_params(),
      "train_rows": int(len(rows)), "train_tokens": int(rows.size),
      "held_out_rows": int(len(held)), "held_out_tokens": int(held.size),
      "epochs": cfg.num_steps * cfg.batch_size / max(len(rows), 1),
      "steps": step,
      "resumed_from_step": resume_step,
      "first_train_loss": trains[0]["loss"] if trains else None,
      "final_train_loss": trains[-1]["loss"] if trains else None,
      "held_out_initial": next((r for r in evals if r["step"] == 0), None),
      "held_out_final": evals[-1] if evals else None,
      "unigram_held_out": None if unigram is None else {"loss": unigram, "perplexity": math.exp(unigram)},
      "params_sha256": identity.tree_digest(jax.device_get(params)),
      "tokens_per_s": steps_timed * cfg.batch_size * cfg.seq_len / seconds if seconds > 0 else None,
      "wall_seconds": wall,
      **({"data": info} if info else {}),
  }
