"""Teacher scores for distillation: a maxscore checkpoint scores every group of a group JSONL (positives and
negatives) with the eval's prompt, labels and ranking score, and the groups are written again with
`pos_scores`/`neg_scores` (FlagEmbedding's fields), which `train_reranker.py --loss=distill` trains toward.

    cfg = TeacherConfig(checkpoint_dir="ckpt/big-reranker", groups_file="groups.jsonl", output="teacher.jsonl")
    counts = score_groups(cfg)

Each group is one score call (its query prefix shared by its documents), so a group's scores are those
`eval_rerank.py` gives the same query and documents.
"""

import dataclasses
import json
import pathlib
from typing import Literal, Optional, Sequence

import tqdm

from maxscore.rerank import data, eval as eval_lib, prompts
from maxscore.training import groups as groups_lib
from maxscore.training.mining import MiningError


@dataclasses.dataclass(frozen=True)
class TeacherConfig:
  """scripts/score_teacher.py's settings (configs/teacher.yml documents each key)."""
  checkpoint_dir: Optional[str] = None     # the teacher; None = the embedded default model
  adapters_dir: Optional[str] = None       # LoRA adapters of the teacher checkpoint
  groups_file: Optional[str] = None
  output: Optional[str] = None
  overwrite: bool = False
  template: str = "plain"
  instruction: str = prompts.DEFAULT_INSTRUCTION
  labels: tuple[str, ...] = ()
  score_mode: Literal["p_first", "log_odds", "raw_logit"] = "log_odds"
  max_query_tokens: int = 512
  max_item_tokens: int = 512

  def prompt(self) -> prompts.PromptConfig:
    return prompts.PromptConfig(template=self.template, instruction=self.instruction, labels=self.labels,
                                score_mode=self.score_mode, max_query_tokens=self.max_query_tokens,
                                max_item_tokens=self.max_item_tokens)

  def validate(self) -> "TeacherConfig":
    self.prompt().validate()
    return self


def score_groups(cfg: TeacherConfig, out, overrides: Sequence[str] = (), progress: bool = True) -> int:
  """Writes each group of cfg.groups_file to `out` (a text file) with the teacher's pos_scores and neg_scores;
  returns how many groups were scored. `overrides`: configs/base.yml `key=value` settings of the scorer."""
  cfg = cfg.validate()
  if not cfg.groups_file:
    raise MiningError("groups_file is required: the group JSONL to score (scripts/mine_negatives.py writes one)")
  records = groups_lib.read_groups(cfg.groups_file)
  prompt = cfg.prompt()
  scorer = eval_lib.build_scorer(cfg.checkpoint_dir, overrides, adapters_dir=cfg.adapters_dir)
  template = prompts.get_template(prompt.template)
  label_ids = prompts.resolve_labels(scorer.tokenizer, prompt.labels or template.default_labels)
  builder = prompts.PromptBuilder(scorer.tokenizer, template, prompt.instruction, prompt.max_query_tokens,
                                  prompt.max_item_tokens)
  for n, rec in enumerate(tqdm.tqdm(records, unit="group", desc="teacher", disable=not progress), 1):
    texts = rec["pos"] + rec["neg"]
    query = data.RerankQuery(f"g{n}", rec["query"], tuple((f"d{i}", t) for i, t in enumerate(texts)))
    scores = eval_lib.score_query(scorer, builder, query, label_ids, prompt)["scores"]
    out.write(json.dumps({**rec, "pos_scores": scores[:len(rec["pos"])], "neg_scores": scores[len(rec["pos"]):]},
                         ensure_ascii=False) + "\n")
  return len(records)


def output_path(cfg: TeacherConfig) -> pathlib.Path:
  """The output file, checked: required, not the input, and not replaced without overwrite."""
  if not cfg.output:
    raise MiningError("output is required: the group JSONL to write with the teacher's scores")
  path = pathlib.Path(cfg.output)
  if path.exists() and not cfg.overwrite:
    raise FileExistsError(f"--output {path} exists; pass --overwrite to replace it")
  return path
