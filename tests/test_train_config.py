"""The reranker recipe's settings in sections (training/reranker/config.py): the flat keys of configs/train.yml
build them and come back from them, a section a run does not have is not built, and runs written before the
sections (tests/fixtures/train_v1, by the flat TrainConfig of before) keep their identities and resume."""

import json
import re
import pathlib
import shutil

import pytest

from maxscore.errors import TrainError
from maxscore.rerank import eval as eval_lib
from maxscore.testing import corpus
from maxscore.training.reranker import train as train_lib
from maxscore.training.reranker.config import KEYS, BackboneConfig, LossConfig, TrainConfig

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "train_v1"
IDENTITIES = json.loads((FIXTURE / "identities.json").read_text())
REFUSALS = json.loads((FIXTURE / "refusals.json").read_text())


def _given(case: dict) -> dict:
  return {k: tuple(v) if isinstance(v, list) else v for k, v in case["given"].items()}


@pytest.mark.parametrize("case", IDENTITIES, ids=lambda c: ",".join(sorted(c["given"])) or "defaults")
def test_a_run_written_before_the_sections_has_the_same_identity(case):
  """The identity a run recorded before (every setting, a later one only away from its earlier behaviour) is the
  one today's settings give, so its workdir resumes."""
  cfg = TrainConfig.of(**_given(case)).with_chat(case["chat"])
  assert json.loads(json.dumps(cfg.identity())) == case["identity"]
  assert json.loads(json.dumps(train_lib.train_identity(cfg))) == case["identity"]


@pytest.mark.parametrize("case", IDENTITIES, ids=lambda c: ",".join(sorted(c["given"])) or "defaults")
def test_the_flat_keys_come_back_from_the_sections(case):
  cfg = TrainConfig.of(**_given(case))
  flat = cfg.flat()
  assert list(flat) == list(KEYS)
  assert TrainConfig.of(**flat) == cfg
  assert {k: flat[k] for k in case["given"]} == _given(case)


def test_a_section_a_run_does_not_have_is_not_built():
  """No window without FIRST's loss, no backbone section for a frozen backbone, no LoRA or match losses at 0."""
  assert TrainConfig() == TrainConfig.of()
  frozen = TrainConfig.of(remat="full", listwise_window=4, coverage_on="score")  # settings of absent sections
  assert frozen.backbone is None and frozen.loss == LossConfig()
  assert frozen.flat()["remat"] == "per_layer" and frozen.flat()["train_backbone"] is False
  full = TrainConfig.of(train_backbone=True, lora_alpha=8.0)
  assert full.backbone == BackboneConfig() and full.lora is None and full.flat()["lora_rank"] == 0
  lora = TrainConfig.of(train_backbone=True, lora_rank=4, lora_alpha=8.0, match_loss_weight=0.5)
  assert (lora.lora.rank, lora.lora.alpha) == (4, 8.0) and lora.backbone.match.weight == 0.5
  first = TrainConfig.of(loss="first_listwise", listwise_window=4)
  assert first.loss.window.size == 4 and first.loss.window.chat is None
  assert first.with_chat(False).loss.window.chat is False and frozen.with_chat(False) == frozen
  with pytest.raises(TypeError, match="unknown keys"):
    TrainConfig.of(kind="lm_labels")


@pytest.mark.parametrize("case", REFUSALS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c["given"].items()))
def test_every_refusal_of_the_flat_config_still_refuses_with_its_message(case):
  """Each refusal the flat TrainConfig had (one input that triggers it, and its message, written by it): a setting
  of a section the run does not have is still checked (remat, LoRA's alpha and targets on a frozen backbone)."""
  given = {k: float(v) if v == "nan" else tuple(v) if isinstance(v, list) else v for k, v in case["given"].items()}
  with pytest.raises(TrainError) as e:
    TrainConfig.of(**given).check_adapters_dir(case.get("adapters_dir"))
  assert str(e.value) == case["message"]


@pytest.mark.slow
def test_a_workdir_written_before_the_sections_resumes_where_it_stopped(tmp_path):
  """The stopped run of the fixture (a frozen head, stopped at step 2 of 4) resumes with today's code from its
  step-2 checkpoint (its fingerprint matches) and ends where the whole run ended: the same losses of steps 3 and 4
  and dev metrics. Within float tolerance, not bit for bit: the fixture was computed under XLA's default flags,
  the suite compiles with cheaper ones (tests/conftest.py)."""
  work = tmp_path / "work"
  shutil.copytree(FIXTURE / "stopped_workdir", work)
  finished = json.loads((FIXTURE / "finished.json").read_text())
  cfg = TrainConfig.of(batch_size=2, num_steps=4, save_every=2, eval_every=2, warmup_steps=0)
  summary = train_lib.train(cfg, eval_lib.EvalConfig(max_query_tokens=8, max_item_tokens=16), None,
                            corpus.split("train", 4), corpus.split("dev", 2), work, progress=False)
  assert summary["resumed_from_step"] == 2 and summary["steps"] == finished["steps"]
  rows = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
  losses = {str(r["step"]): r["loss"] for r in rows if r["kind"] == "train"}
  assert losses == pytest.approx(finished["train_losses"], rel=1e-5)
  assert summary["dev_metrics_final"] == pytest.approx(finished["dev_metrics_final"], abs=1e-6)
