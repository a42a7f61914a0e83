"""The transformers baseline: the same random weights in a Hugging Face model, scored the way a good
transformers user would (prefix K/V computed once and reused for every batch of items)."""

import dataclasses
import inspect
import os
import pathlib
import time
from typing import Any, Optional

import numpy as np

from layers.config import ModelConfig
from maxscore.bench.measure import RssSampler
from maxscore.config import Config, to_flat_dict
from maxscore.scoring.scorer import Scorer


def _cache_argument(module) -> str:
  """The name the model's forward takes its K/V cache by: `cache` since transformers deprecated `past_key_values`
  (a FutureWarning from 5.x), `past_key_values` before (the GPU images' releases)."""
  return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


def hf_label_logprobs(model, request: dict, batch_size: int, separator: Optional[int]) -> np.ndarray:
  """Label log-probs [N, K] the way a good transformers user computes them.

  Prefill Q + s once with use_cache=True; then batches of items (right-padded, attention
  mask over prefix + item) run against the prefix K/V expanded to the batch; the lm_head
  runs only at each item's last token; float32 log_softmax; pick the labels.
  """
  import torch
  from transformers import DynamicCache
  prefix = list(request["query"]) + ([separator] if separator is not None else [])
  dev = model.device
  items, labels = request["items"], torch.tensor(request["label_token_ids"], device=dev)
  p = len(prefix)
  cache_arg = _cache_argument(model.model)
  out = np.zeros((len(items), len(labels)), np.float32)
  with torch.inference_mode():  # no_grad, minus version-counter bookkeeping
    pre = model.model(input_ids=torch.tensor([prefix], device=dev), use_cache=True)
    kv = [(layer.keys, layer.values) for layer in pre.past_key_values.layers]
    last_prefix_D = pre.last_hidden_state[0, -1]
    for start in range(0, len(items), batch_size):
      chunk = items[start:start + batch_size]
      b, lens = len(chunk), torch.tensor([len(x) for x in chunk], device=dev)
      l = int(lens.max())
      rows = last_prefix_D.expand(b, -1).clone()  # an empty item reads the prefix's last token
      if l:
        ids = torch.zeros((b, l), dtype=torch.long)
        for i, x in enumerate(chunk):
          ids[i, :len(x)] = torch.tensor(x, dtype=torch.long)
        ids = ids.to(dev)
        mask = torch.cat([torch.ones((b, p), dtype=torch.long, device=dev),
                          (torch.arange(l, device=dev)[None, :] < lens[:, None]).long()], dim=1)
        cache = DynamicCache(ddp_cache_data=[(k.expand(b, -1, -1, -1), v.expand(b, -1, -1, -1)) for k, v in kv])
        h = model.model(input_ids=ids, attention_mask=mask, position_ids=(p + torch.arange(l, device=dev)).expand(b, -1),
                        use_cache=True, **{cache_arg: cache}).last_hidden_state
        has = lens > 0
        rows[has] = h[torch.arange(b, device=dev)[has], lens[has] - 1]
      lp = torch.log_softmax(model.lm_head(rows).float(), dim=-1)[:, labels]
      out[start:start + b] = lp.cpu().numpy()  # on a GPU, the copy also waits for the batch
  return out


def run_hf_baseline(model, request: dict, batch_size: int, repeats: int, peak_flops: Optional[float],
                    flops_per_request: float, separator: Optional[int]) -> dict[str, Any]:
  """Times hf_label_logprobs (after one untimed warm-up batch) on the whole request."""
  import torch
  torch.set_num_threads(os.cpu_count())
  hf_label_logprobs(model, dict(request, items=request["items"][:batch_size]), batch_size, separator)
  times, lp = [], None
  with RssSampler() as rss:
    for _ in range(max(repeats, 1)):
      t0 = time.perf_counter()
      lp = hf_label_logprobs(model, request, batch_size, separator)
      times.append(time.perf_counter() - t0)
  best, n = min(times), len(request["items"])
  row = dict(name=f"hf_transformers(b={batch_size})", algorithm="hf_prefix_reuse", lm_head="vocabulary", items_timed=n,
             subset=False,
             repeats=len(times), best_s=best, median_s=float(np.median(times)), items_per_s=n / best,
             ms_per_request=1e3 * best, flops_per_request=flops_per_request, useful_flops_per_request=flops_per_request,
             flops_per_s=flops_per_request / best, useful_flops_per_s=flops_per_request / best,
             rss_peak_bytes=rss.peak, rss_delta_bytes=rss.peak - rss.base, torch_threads=torch.get_num_threads(),
             device=str(model.device), dtype=str(model.dtype).removeprefix("torch."),
             attn_implementation=getattr(model.config, "_attn_implementation", None))
  if peak_flops:
    row["pct_peak"] = row["useful_pct_peak"] = 100 * row["flops_per_s"] / peak_flops
  row["label_logprobs"] = [lp]
  return row


def hf_model_like(model_cfg: ModelConfig, seed: int = 0):
  """A random float32 transformers Qwen3/Llama model with `model_cfg`'s dimensions and HF's default init
  (the benchmark's baseline: the same weights are converted for maxscore)."""
  import torch
  import transformers
  classes = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
             "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM)}
  if model_cfg.family not in classes or model_cfg.rope_scaling_type is not None:
    raise ValueError(f"HF baseline supports unscaled {sorted(classes)} models, not {model_cfg.family} "
                     f"with rope_scaling_type={model_cfg.rope_scaling_type}")
  config_cls, model_cls = classes[model_cfg.family]
  config = config_cls(vocab_size=model_cfg.vocab_size, hidden_size=model_cfg.hidden_size,
                      intermediate_size=model_cfg.mlp_dim, num_hidden_layers=model_cfg.num_layers,
                      num_attention_heads=model_cfg.num_heads, num_key_value_heads=model_cfg.num_kv_heads,
                      head_dim=model_cfg.head_dim, rms_norm_eps=model_cfg.rms_norm_eps,
                      rope_theta=model_cfg.rope_theta, max_position_embeddings=model_cfg.max_position_embeddings,
                      tie_word_embeddings=model_cfg.tie_word_embeddings, attention_bias=model_cfg.attention_bias)
  torch.manual_seed(seed)
  return model_cls(config).eval()


def resolve_hf_device(device: str) -> str:
  """"auto": the GPU when JAX runs on one and torch sees one (the same chip for both), else the CPU."""
  if device != "auto":
    return device
  import jax
  import torch
  return "cuda" if jax.default_backend() == "gpu" and torch.cuda.is_available() else "cpu"


def hf_scorer(model_cfg: ModelConfig, config: Config, workdir: pathlib.Path, seed: int, device: str = "cpu"):
  """(HF model, Scorer) on the same random weights: built in transformers (float32), saved, converted; the
  HF model then runs on `device` in the scorer's compute dtype."""
  import torch
  import transformers

  from maxscore.checkpoints.convert import convert_hf_checkpoint
  transformers.utils.logging.disable_progress_bar()
  model = hf_model_like(model_cfg, seed)
  model.save_pretrained(workdir / "hf", safe_serialization=True)
  ckpt = convert_hf_checkpoint(workdir / "hf", workdir / "ckpt")
  model_keys = {f.name for f in dataclasses.fields(ModelConfig)}
  flat = {k: v for k, v in to_flat_dict(config).items() if k not in model_keys and k != "checkpoint_dir"}
  dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[config.runtime.dtype]
  return model.to(device=resolve_hf_device(device), dtype=dtype), Scorer.from_checkpoint(ckpt, **flat)
