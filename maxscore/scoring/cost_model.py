"""The cost model (DESIGN.md section 3): model FLOPs of a scoring request, by algorithm.

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


def model_flops(model_cfg: ModelConfig, query_len: int, item_lens: Sequence[int], algorithm: str = "packed",
                separator: bool = True) -> dict[str, Any]:
  """Model FLOPs of one request (DESIGN.md cost model), split into dense, attention and lm_head.

  `algorithm="serial"` gives serial's own work (the query once per item); anything else the
  shared-prefix work that packed and prefill_extend both do. `serial_total` and `flop_ratio`
  (serial / shared) are always included.
  """
  p = query_len + (1 if separator else 0)
  n = len(item_lens)
  dense_per_token = 2 * model_cfg.non_embedding_params()
  attn_per_pair = 4 * model_cfg.num_heads * model_cfg.head_dim  # per layer
  local = sum(model_cfg.layer_is_local) if model_cfg.window is not None else 0
  per_layer = ((model_cfg.num_layers - local, None), (local, model_cfg.window))
  pairs = lambda fn: sum(count * fn(p, item_lens, w) for count, w in per_layer if count)
  lm_head = 2 * model_cfg.hidden_size * model_cfg.vocab_size * n

  def parts(tokens: int, pairs: int) -> dict[str, int]:
    dense, attention = dense_per_token * tokens, attn_per_pair * pairs
    return dict(tokens=tokens, dense=dense, attention=attention, lm_head=lm_head, total=dense + attention + lm_head)

  shared = parts(p + sum(item_lens), pairs(attention_pairs))
  serial = parts(n * p + sum(item_lens), pairs(serial_attention_pairs))
  out = dict(serial if algorithm == "serial" else shared)
  out.update(algorithm=algorithm, prefix_len=p, num_items=n, serial_total=serial["total"],
             shared_total=shared["total"], flop_ratio=serial["total"] / max(shared["total"], 1))
  return out
