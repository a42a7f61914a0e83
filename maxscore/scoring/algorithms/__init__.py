"""Scoring algorithms (docs/ARCHITECTURE.md section 3), each `run(ctx, requests) -> [label log-probs [N_i, K]]`."""

from maxscore.scoring.algorithms import packed, prefill_extend, serial
from maxscore.scoring.algorithms.common import AlgorithmContext

ALGORITHMS = {"serial": serial.run, "packed": packed.run, "prefill_extend": prefill_extend.run}

__all__ = ["ALGORITHMS", "AlgorithmContext"]
