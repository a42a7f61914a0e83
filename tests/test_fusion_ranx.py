"""The eval's fusion (maxscore/rerank/fusion.py) does ranx's arithmetic without ranx: the same float64 scores as
ranx.fuse, and neither ranx nor numba imported."""

import json
import subprocess
import sys

import numpy as np

from maxscore.distributed import processes
from maxscore.rerank import fusion

_RANX_ORACLE = """
import json, sys, warnings
import ranx
cases, reranked, first = json.load(sys.stdin)
trec_ranks = lambda run: {q: {d: float(len(docs) - i) for i, d in enumerate(sorted(docs, key=lambda d: (docs[d], d),
                                                                                     reverse=True))}
                          for q, docs in run.items()}
out = []
for method, alpha, rrf_k in cases:
  runs = (reranked, first) if method == "interpolate" else (trec_ranks(reranked), trec_ranks(first))
  runs = [ranx.Run({q: {d: float(s) for d, s in docs.items()} for q, docs in r.items()}, name=n)
          for r, n in zip(runs, ("reranked", "first"))]
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="unsafe cast from uint64 to int64")
    if method == "interpolate":
      fused = ranx.fuse(runs, norm="min-max", method="wsum", params={"weights": [alpha, 1.0 - alpha]})
    else:
      fused = ranx.fuse(runs, method="rrf", params={"k": rrf_k})
  out.append(fused.to_dict())
json.dump(out, sys.stdout)
"""


def _ranx_fuse(reranked, first, cases):
  """The oracle: ranx.fuse as the fusion called it before it did ranx's arithmetic itself (rrf on trec_eval's
  ranks), one fused run per (method, alpha, rrf_k) case. It runs in a child with numba's JIT off (ranx's numba
  code compiles for over a minute per process; interpreted, its float64 arithmetic is the same IEEE operations),
  and JSON carries every float64 exactly."""
  done = subprocess.run([sys.executable, "-c", _RANX_ORACLE], input=json.dumps([cases, reranked, first]),
                        capture_output=True, text=True, timeout=300,
                        env=dict(processes.subprocess_env(1), NUMBA_DISABLE_JIT="1"))
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout)


def test_fusion_equals_ranx_bit_for_bit():
  """fusion.fuse does ranx's arithmetic without ranx (whose numba compiles for most of a minute per process):
  the same float64 scores as ranx.fuse, on runs with ties, a query whose scores are all equal, float32 scores
  and docids that sort differently as strings and by score."""
  rng = np.random.default_rng(0)
  reranked, first = {}, {}
  for i in range(12):
    docs = [f"d{j}" for j in rng.permutation(40)[:int(rng.integers(2, 30))]]
    reranked[f"q{i}"] = {d: float(np.float32(rng.normal())) for d in docs}
    first[f"q{i}"] = {d: float(rng.integers(0, 6)) for d in docs}  # many ties
  reranked["q0"] = dict.fromkeys(reranked["q0"], 0.25)
  cases = [("interpolate", 0.3, 60), ("interpolate", 0.0, 60), ("interpolate", 1.0, 60), ("interpolate", 0.55, 60),
           ("rrf", 0.5, 60), ("rrf", 0.5, 1.5)]
  for (method, alpha, k), want in zip(cases, _ranx_fuse(reranked, first, cases), strict=True):
    got = fusion.fuse(reranked, first, method, alpha=alpha, rrf_k=k)
    assert got.keys() == want.keys()
    for q in got:
      assert got[q] == want[q], (method, alpha, k, q)  # every score equal, not within a tolerance


def test_fusion_does_not_import_ranx():
  """The eval's fusion needs neither ranx nor numba (a new venv would compile ranx's numba code for about a
  minute in every process that fuses, and numba warns NumbaTypeSafetyWarning mid-report as it does)."""
  code = ("import sys\nfrom maxscore.rerank import fusion\n"
          "fusion.fuse({'q': {'a': 1.0, 'b': 2.0}}, {'q': {'a': 3.0, 'b': 1.0}}, 'rrf')\n"
          "fusion.fuse({'q': {'a': 1.0, 'b': 2.0}}, {'q': {'a': 3.0, 'b': 1.0}}, 'interpolate', alpha=0.3)\n"
          "print(sorted(m for m in ('ranx', 'numba') if m in sys.modules))")
  done = subprocess.run([sys.executable, "-W", "default", "-c", code], capture_output=True, text=True,
                        timeout=300, env=processes.subprocess_env(1))
  assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr[-3000:]
  assert "Warning" not in done.stderr, done.stderr[-3000:]
