"""Score heads: small trainable maps from the scorer's features to scores (`head`: HeadConfig, init and apply).

A head's files beside a checkpoint are maxscore/checkpoints/head_storage.py's, scoring through it is
maxscore/scoring/head_scorer.py's (loaded by maxscore/scoring/loading.py), and training it is
maxscore/training/reranker/'s (with the features it reads, maxscore/training/reranker/features.py).
"""

from maxscore.heads.head import HeadConfig

__all__ = ["HeadConfig"]
