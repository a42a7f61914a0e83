"""The cost model (docs/ARCHITECTURE.md section 3): model FLOPs of a scoring request, by algorithm.

All algorithms but serial do the same dense work (`2 * non_embedding_params * tokens`); they
differ in attention pairs. A sliding-window layer counts only the pairs within its window W
(serial positions), so a model's attention work is a per-layer sum. XLA's own cost analysis counts a scanned layer stack once and Pallas
calls as zero, so benchmarks and compile reports take FLOPs from here.
"""

from typing import Any, Optional, Sequence

from layers.config import ModelConfig


def _causal_pairs(n: int, window: Optional[int] = None) -> int:
  """Pairs of a causal block of n tokens, each seeing at most `window` keys (itself included)."""
  if window is None or window >= n:
    return n * (n + 1) // 2
  return window * (window + 1) // 2 + (n - window) * window


def attention_pairs(prefix_len: int, item_lens: Sequence[int], window: Optional[int] = None) -> int:
  """Useful (query, key) pairs: prefix causal, each item token vs the prefix and its own causal block.

  With a window W, item token j (serial position P + j) sees the last max(0, W - 1 - j) prefix keys.
  """
  p = prefix_len
  if window is None:
    return p * (p + 1) // 2 + sum(l * p + l * (l + 1) // 2 for l in item_lens)
  prefix_keys = lambda l: sum(min(p, max(0, window - 1 - j)) for j in range(l))
  return _causal_pairs(p, window) + sum(prefix_keys(l) + _causal_pairs(l, window) for l in item_lens)


def serial_attention_pairs(prefix_len: int, item_lens: Sequence[int], window: Optional[int] = None) -> int:
  """Causal pairs of the N full sequences Q + s + I_i."""
  return sum(_causal_pairs(prefix_len + l, window) for l in item_lens)


def _rates(model_cfg: ModelConfig, lm_head_cols: Optional[int] = None) -> tuple[int, int, int]:
  """FLOPs per token of dense work (all layers), per attention (query, key) pair in one layer, per lm_head row.

  `lm_head_cols`: the lm_head columns computed per row -- None: the full vocabulary (a log-sum-exp
  over it), K: only the label rows (scores that need no vocabulary normalizer)."""
  dense_per_token = 2 * model_cfg.non_embedding_params()
  attn_per_pair = 4 * model_cfg.num_heads * model_cfg.head_dim
  cols = model_cfg.vocab_size if lm_head_cols is None else lm_head_cols
  return dense_per_token, attn_per_pair, 2 * model_cfg.hidden_size * cols


def _layer_windows(model_cfg: ModelConfig) -> tuple[tuple[int, Optional[int]], ...]:
  """(number of layers, their window) for the global layers and the sliding-window (local) layers."""
  windowed = sum(model_cfg.layer_uses_window) if model_cfg.window is not None else 0
  return (model_cfg.num_layers - windowed, None), (windowed, model_cfg.window)


def program_flops(model_cfg: ModelConfig, batch: int, prefix_len: int, slot_len: int, num_slots: int,
                  prefix_cached: bool = False, lm_head_rows: int | None = None,
                  lm_head_cols: int | None = None) -> int:
  """Model FLOPs of one compiled forward at its padded shape: `batch` rows of [prefix P][N slots of L].

  `prefix_cached`: the prefix's K/V are read, not computed (extend). `lm_head_rows` per row
  defaults to N (one score row per slot; a prefill has none); `lm_head_cols` as in `_rates`.
  """
  dense_per_token, attn_per_pair, lm_head_per_row = _rates(model_cfg, lm_head_cols)
  p_computed = 0 if prefix_cached else prefix_len
  pairs = sum(count * (attention_pairs(prefix_len, [slot_len] * num_slots, w)
                       - (_causal_pairs(prefix_len, w) if prefix_cached else 0))
              for count, w in _layer_windows(model_cfg) if count)
  rows = num_slots if lm_head_rows is None else lm_head_rows
  return batch * (dense_per_token * (p_computed + num_slots * slot_len) + attn_per_pair * pairs
                  + lm_head_per_row * rows)


def program_dense_flops(model_cfg: ModelConfig, batch: int, prefix_len: int, slot_len: int, num_slots: int,
                        prefix_cached: bool = False) -> int:
  """The dense-layer (projection) share of `program_flops`: the dots quantization=int8 runs in int8."""
  tokens = (0 if prefix_cached else prefix_len) + num_slots * slot_len
  return batch * _rates(model_cfg)[0] * tokens


def model_flops(model_cfg: ModelConfig, query_len: int, item_lens: Sequence[int], algorithm: str = "packed",
                separator: bool = True, lm_head_cols: Optional[int] = None) -> dict[str, Any]:
  """Model FLOPs of one request (docs/ARCHITECTURE.md section 3, cost model), split into dense, attention and lm_head.

  `algorithm="serial"` gives serial's own work (the query once per item); anything else the
  shared-prefix work that packed and prefill_extend both do. `serial_total` and `flop_ratio`
  (serial / shared) are always included. `lm_head_cols`: None counts the full-vocabulary lm_head,
  K only its label rows (apply_softmax, raw logits); `lm_head` in the result says which.
  """
  p = query_len + (1 if separator else 0)
  n = len(item_lens)
  dense_per_token, attn_per_pair, lm_head_per_row = _rates(model_cfg, lm_head_cols)
  layer_pairs = lambda fn: sum(count * fn(p, item_lens, w) for count, w in _layer_windows(model_cfg) if count)
  lm_head = lm_head_per_row * n

  def parts(tokens: int, pairs: int) -> dict[str, int]:
    dense, attention = dense_per_token * tokens, attn_per_pair * pairs
    return dict(tokens=tokens, dense=dense, attention=attention, lm_head=lm_head, total=dense + attention + lm_head)

  shared = parts(p + sum(item_lens), layer_pairs(attention_pairs))
  serial = parts(n * p + sum(item_lens), layer_pairs(serial_attention_pairs))
  out = dict(serial if algorithm == "serial" else shared)
  out.update(algorithm=algorithm, prefix_len=p, num_items=n, lm_head_cols=lm_head_cols or model_cfg.vocab_size,
             lm_head_mode="vocabulary" if lm_head_cols is None else "labels", serial_total=serial["total"],
             shared_total=shared["total"], flop_ratio=serial["total"] / max(shared["total"], 1))
  return out
