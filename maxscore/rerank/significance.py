"""Paired significance tests over per-query differences d = system - baseline (one value per query).

* `paired_t`: the paired two-sided t-test (scipy.stats.ttest_rel's statistic and p-value).
* `randomization`: the paired two-sided randomization (sign-flip) test on the mean difference: under
  the null each query's difference is as likely negated, so p is the share of the 2^n sign vectors
  whose |mean| reaches the observed |mean|. Enumerated exactly for up to `exact_max_queries` queries,
  else estimated from `num_samples` random sign vectors (the observed one counted, so p > 0).
* `holm`: Holm-Bonferroni adjusted p-values across the comparisons made.
* `effect_size`: Cohen's d for paired samples (mean / standard deviation of d).
* `bootstrap_ci`: a confidence interval of the mean difference, by the percentile bootstrap over queries
  (scipy.stats.bootstrap, `num_samples` resamples, seeded).
"""

import dataclasses
import math
from typing import Optional, Sequence

import numpy as np

EXACT_MAX_QUERIES = 20  # exact up to 2^20 sign vectors (counted by meet in the middle: 2 x 2^10 sums, under 1 ms)


def _diffs(d) -> np.ndarray:
  d = np.asarray(d, np.float64)
  if d.ndim != 1 or d.size == 0:
    raise ValueError(f"paired differences must be a non-empty 1-d array, got shape {d.shape}")
  return d


def paired_t(d) -> tuple[Optional[float], float]:
  """(t, two-sided p) of the paired t-test; all-zero differences give (0, 1), constant nonzero
  ones (±inf, 0), a single query (None, 1): nothing to test."""
  d = _diffs(d)
  if d.size < 2:
    return None, 1.0
  mean, sd = float(d.mean()), float(d.std(ddof=1))
  if sd == 0.0:
    return (0.0, 1.0) if mean == 0.0 else (math.copysign(math.inf, mean), 0.0)
  t = mean / (sd / math.sqrt(d.size))
  from scipy import stats  # pylint: disable=import-outside-toplevel  (seconds to import; only when testing)
  return t, float(2.0 * stats.t.sf(abs(t), d.size - 1))


def _extreme(flipped_sums: np.ndarray, observed: float, tol: float) -> int:
  return int(np.count_nonzero(np.abs(flipped_sums) >= observed - tol))


def _sign_sums(x: np.ndarray) -> np.ndarray:
  """The sums s.x of all 2^len(x) sign vectors s."""
  sums = np.zeros(1)
  for v in x:
    sums = np.concatenate([sums + v, sums - v])
  return sums


def _exact_count(d: np.ndarray, threshold: float) -> int:
  """How many of the 2^n sign vectors s give |s.d| >= threshold, by meet in the middle: the 2^(n/2) sums of
  each half, one half sorted and searched for each sum of the other (O(2^(n/2) n) instead of O(2^n n))."""
  if threshold <= 0:
    return 2 ** d.size
  half = d.size // 2
  a, b = _sign_sums(d[:half]), np.sort(_sign_sums(d[half:]))
  above = b.size - np.searchsorted(b, threshold - a, side="left")  # a + b >= threshold
  below = np.searchsorted(b, -threshold - a, side="right")          # a + b <= -threshold
  return int(above.sum() + below.sum())


def randomization(d, num_samples: int = 10_000, seed: int = 0,
                  exact_max_queries: int = EXACT_MAX_QUERIES) -> tuple[float, str]:
  """(two-sided p, "exact" or "monte_carlo") of the paired sign-flip test on the mean difference."""
  d = _diffs(d)
  n = d.size
  observed = abs(float(d.sum()))
  tol = 1e-9 * max(float(np.abs(d).sum()), 1e-300)  # float noise in the sums, not a real difference
  if n <= exact_max_queries or 2 ** n <= num_samples:
    return _exact_count(d, observed - tol) / 2 ** n, "exact"
  if num_samples < 1:
    raise ValueError(f"num_samples={num_samples} must be >= 1 for {n} queries (> {exact_max_queries} to enumerate)")
  rng = np.random.default_rng(seed)
  count, chunk = 0, max(1, (1 << 22) // n)
  for start in range(0, num_samples, chunk):
    signs = rng.choice(np.array([-1.0, 1.0]), size=(min(chunk, num_samples - start), n))
    count += _extreme(signs @ d, observed, tol)
  return (count + 1) / (num_samples + 1), "monte_carlo"


def holm(p_values: Sequence[float]) -> list[float]:
  """Holm-Bonferroni adjusted p-values, in the input order (reject where adjusted p < alpha)."""
  p = np.asarray(p_values, np.float64)
  order = np.argsort(p, kind="stable")
  m = p.size
  adjusted = np.empty(m)
  running = 0.0
  for rank, i in enumerate(order):
    running = max(running, min(1.0, (m - rank) * p[i]))
    adjusted[i] = running
  return adjusted.tolist()


def effect_size(d) -> Optional[float]:
  """Cohen's d_z = mean(d) / sd(d) (ddof 1); None when it is undefined (one query, or sd 0)."""
  d = _diffs(d)
  if d.size < 2:
    return None
  sd = float(d.std(ddof=1))
  return float(d.mean()) / sd if sd > 0 else None


def bootstrap_ci(d, level: float = 0.95, num_samples: int = 10_000, seed: int = 0) -> tuple[float, float]:
  """(low, high): the percentile bootstrap interval of mean(d) at `level` (scipy.stats.bootstrap, queries
  resampled with replacement); constant differences, one query included, give (d, d)."""
  d = _diffs(d)
  if not 0.0 < level < 1.0:
    raise ValueError(f"level must be in (0, 1), got {level}")
  if np.all(d == d[0]):
    return float(d[0]), float(d[0])
  from scipy import stats  # pylint: disable=import-outside-toplevel  (seconds to import; only when testing)
  r = stats.bootstrap((d,), np.mean, n_resamples=num_samples, confidence_level=level, method="percentile",
                      random_state=np.random.default_rng(seed))
  return float(r.confidence_interval.low), float(r.confidence_interval.high)


@dataclasses.dataclass(frozen=True)
class PairedResult:
  """One system-vs-baseline comparison on one metric (p-values before any correction)."""
  queries: int
  delta: float          # mean of system - baseline
  t: Optional[float]
  p_t: float
  p_randomization: float
  randomization_method: str
  effect_size: Optional[float]
  wins: int
  ties: int
  losses: int
  ci_low: float         # 95% percentile-bootstrap interval of delta (bootstrap_ci)
  ci_high: float


def paired(system: Sequence[float], baseline: Sequence[float], num_samples: int = 10_000,
           seed: int = 0) -> PairedResult:
  """Both tests, the effect size, the delta's 95% bootstrap interval and wins/ties/losses of `system` against `baseline`, query by query."""
  s, b = np.asarray(system, np.float64), np.asarray(baseline, np.float64)
  if s.shape != b.shape:
    raise ValueError(f"paired values need one per query on both sides, got {s.shape} and {b.shape}")
  d = _diffs(s - b)
  t, p_t = paired_t(d)
  p_r, method = randomization(d, num_samples, seed)
  ci_low, ci_high = bootstrap_ci(d, 0.95, num_samples, seed)
  return PairedResult(queries=d.size, delta=float(d.mean()), t=t, p_t=p_t, p_randomization=p_r,
                      randomization_method=method, effect_size=effect_size(d), wins=int(np.sum(d > 0)),
                      ties=int(np.sum(d == 0)), losses=int(np.sum(d < 0)), ci_low=ci_low, ci_high=ci_high)
