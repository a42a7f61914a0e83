"""Score heads: small trainable maps from the scorer's features to scores.

`head` holds what a head computes (HeadConfig, init and apply), `head_storage` its files beside a
checkpoint, `head_scorer` scoring through it. Training them (and the rerankers under them) is
maxscore.training.reranker's; `features` (what training reads) and `study` (heads vs no head) build on
`maxscore.rerank` and are imported as modules; this face holds the heads themselves, which the eval loads.
"""

from maxscore.heads.head import HeadConfig
from maxscore.heads.head_scorer import HeadScorer, load_scorer
from maxscore.heads.head_storage import has_head, load_head, save_head

__all__ = ["HeadConfig", "HeadScorer", "has_head", "load_head", "load_scorer", "save_head"]
