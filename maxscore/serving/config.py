"""What scripts/serve.py is started with (configs/serve.yml documents each key): the server's own
knobs (ServeConfig) and the /v1/rerank prompt (RerankPrompt, the eval's template, labels and score mode)."""

import dataclasses
from typing import Literal, Optional

from maxscore.rerank import prompts
from maxscore.scoring import model_names


class ServeError(ValueError):
  """The server cannot start as asked (several JAX processes, a prompt the checkpoint cannot build)."""


@dataclasses.dataclass(frozen=True)
class ServeConfig:
  """Where to listen, how requests are batched and bounded, and what is compiled before the first request."""
  checkpoint_dir: Optional[str] = None       # None = the embedded default model; "none" = random init
  use_head: bool = True
  served_model_name: tuple[str, ...] = ()    # names requests may give, the first reported; () = the checkpoint's
  host: str = "127.0.0.1"
  port: int = 8000
  max_batch_requests: int = 32
  max_batch_wait_ms: float = 5.0
  max_queue: int = 256
  request_timeout_s: float = 60.0
  max_items: int = 1024
  max_items_per_run: int = 64                # larger requests run in parts, taking turns with others; 0 = whole
  warmup_query_tokens: tuple[int, ...] = (32,)
  warmup_items: tuple[int, ...] = (24,)
  warmup_item_tokens: tuple[int, ...] = (64,)
  log_level: Literal["critical", "error", "warning", "info", "debug"] = "warning"

  def validate(self) -> "ServeConfig":
    for name in ("max_batch_requests", "max_queue", "max_items"):
      if getattr(self, name) < 1:
        raise ServeError(f"{name}={getattr(self, name)} must be >= 1")
    if not 0 <= self.port <= 65535:
      raise ServeError(f"port={self.port} must be in [0, 65535] (0 = any free port)")
    if self.max_batch_wait_ms < 0:
      raise ServeError(f"max_batch_wait_ms={self.max_batch_wait_ms} must be >= 0")
    if self.max_items_per_run < 0:
      raise ServeError(f"max_items_per_run={self.max_items_per_run} must be >= 0 (0 = run each request whole)")
    if self.request_timeout_s <= 0:
      raise ServeError(f"request_timeout_s={self.request_timeout_s} must be > 0")
    try:
      model_names.served_names(self.served_model_name, "the checkpoint's name")
    except ValueError as e:
      raise ServeError(str(e)) from None
    for name in ("warmup_query_tokens", "warmup_items", "warmup_item_tokens"):
      if any(x < 0 for x in getattr(self, name)):
        raise ServeError(f"{name}={list(getattr(self, name))} must hold non-negative integers")
    return self


@dataclasses.dataclass(frozen=True)
class RerankPrompt:
  """How /v1/rerank turns (query, documents) into a request and a ranking score: the same keys and
  meaning as scripts/eval_rerank.py's, so the server ranks as the eval does."""
  template: str = prompts.template_setting()
  instruction: str = prompts.DEFAULT_INSTRUCTION
  labels: tuple[str, ...] = ()
  score_mode: Literal["p_first", "log_odds", "raw_logit"] = "p_first"
  max_query_tokens: int = 512
  max_item_tokens: int = 512

  def prompt_config(self) -> prompts.PromptConfig:
    return prompts.PromptConfig(**dataclasses.asdict(self))

  def validate(self) -> "RerankPrompt":
    self.prompt_config().validate()
    return self
