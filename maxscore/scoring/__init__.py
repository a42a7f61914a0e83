"""Scoring: requests, the packed layout, algorithms, the selector, the prefix cache and `Scorer`.

docs/ARCHITECTURE.md sections 1-5. `Scorer` is the entry; the rest is what it is built from.
"""

from maxscore.scoring.requests import TokenRequest, make_request, parse_multi_item_sequence
from maxscore.scoring.scorer import Scorer, ScoreResult, finalize_scores

__all__ = ["Scorer", "ScoreResult", "TokenRequest", "finalize_scores", "make_request", "parse_multi_item_sequence"]
