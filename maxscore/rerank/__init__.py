"""Reranker evaluation: data sets and first-stage runs, prompt templates, trec_eval metrics, the eval loop, listwise
and setwise stages."""

from maxscore.rerank.data import DataError, RerankSet, load_rerank_set
from maxscore.rerank.eval import EvalConfig, build_scorer, run_eval
from maxscore.rerank.listwise import ListwiseConfig, listwise_rerank
from maxscore.rerank.prompts import PromptBuilder, get_template

__all__ = ["DataError", "EvalConfig", "ListwiseConfig", "PromptBuilder", "RerankSet", "build_scorer", "get_template",
           "listwise_rerank", "load_rerank_set", "run_eval"]
