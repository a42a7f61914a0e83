"""Reranker evaluation: first-stage runs, prompt templates, trec_eval metrics, the eval loop, listwise and setwise
stages, fusion, significance and reports. The data sets they read are maxscore.datasets'."""

from maxscore.rerank.eval import EvalConfig, run_eval
from maxscore.rerank.listwise import ListwiseConfig, listwise_rerank
from maxscore.rerank.prompts import PromptBuilder, get_template

__all__ = ["EvalConfig", "ListwiseConfig", "PromptBuilder", "get_template", "listwise_rerank", "run_eval"]
