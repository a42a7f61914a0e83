"""Score heads: small trainable maps from the scorer's features to scores.

`maxscore.heads.train` (training), `features` (what training reads) and `study` (heads vs no head)
build on `maxscore.rerank` and are imported as modules; this face holds the heads themselves, which
the eval loads.
"""

from maxscore.heads.score_heads import HeadConfig, HeadScorer, has_head, load_head, load_scorer, save_head

__all__ = ["HeadConfig", "HeadScorer", "has_head", "load_head", "load_scorer", "save_head"]
