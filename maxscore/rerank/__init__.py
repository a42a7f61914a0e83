"""Reranker evaluation: data sets and first-stage runs, prompt templates, trec_eval metrics, the eval loop."""

from maxscore.rerank.data import DataError, RerankSet, load_rerank_set
from maxscore.rerank.eval import EvalConfig, build_scorer, run_eval
from maxscore.rerank.prompts import PromptBuilder, get_template

__all__ = ["DataError", "EvalConfig", "PromptBuilder", "RerankSet", "build_scorer", "get_template", "load_rerank_set",
           "run_eval"]
