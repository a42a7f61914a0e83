"""LRU cache of PrefixStates under a byte budget, keyed by the prefix tokens."""

import collections
import dataclasses
import threading
from typing import Callable, Hashable

from maxscore.scoring.runner import PrefixState


@dataclasses.dataclass
class CacheStats:
  hits: int = 0
  misses: int = 0
  evictions: int = 0


class PrefixCache:
  """Keeps the most recently used PrefixStates whose total bytes fit `max_bytes` (0 disables it)."""

  def __init__(self, max_bytes: int):
    self.max_bytes = max_bytes
    self.stats = CacheStats()
    self._entries: "collections.OrderedDict[Hashable, PrefixState]" = collections.OrderedDict()
    self._bytes = 0
    self._lock = threading.Lock()

  @property
  def nbytes(self) -> int:
    return self._bytes

  def __len__(self) -> int:
    return len(self._entries)

  def __contains__(self, key: Hashable) -> bool:
    return key in self._entries

  def has_prefix(self, prefix) -> bool:
    """Whether a state for these prefix tokens is cached (keys are (tokens, bucket))."""
    prefix = tuple(prefix)
    with self._lock:
      return any(k[0] == prefix for k in self._entries)

  def get_or_compute(self, key: Hashable, compute: Callable[[], PrefixState]) -> PrefixState:
    """The cached state for `key`, or `compute()` stored (evicting least recently used) if it fits."""
    with self._lock:
      if key in self._entries:
        self._entries.move_to_end(key)
        self.stats.hits += 1
        return self._entries[key]
      self.stats.misses += 1
    state = compute()
    with self._lock:
      if 0 < state.nbytes <= self.max_bytes and key not in self._entries:
        while self._bytes + state.nbytes > self.max_bytes:
          _, old = self._entries.popitem(last=False)
          self._bytes -= old.nbytes
          self.stats.evictions += 1
        self._entries[key] = state
        self._bytes += state.nbytes
    return state

  def clear(self) -> None:
    with self._lock:
      self._entries.clear()
      self._bytes = 0
