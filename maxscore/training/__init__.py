"""One trainer for score heads, adapters, whole models and LM pretraining (docs/ARCHITECTURE.md section 12).

`trainer` holds the top-level `init`, `train_step`, `restore` and `loop` (and `start`, which resumes or
starts a run in a workdir); `state` the TrainState; `optimizer` the clip + AdamW schedule; `partition`
where state and batches live on the mesh; `checkpoint` the per-process Orbax checkpoints; `metrics_log`
metrics.jsonl and TensorBoard (the LoRA adapters they train are maxscore/checkpoints/adapters.py's). Each task
brings only its loss, data, eval and export: the `reranker` recipe (a sub-package holding all of it: score heads
and rerankers; the groups files it may train on are maxscore/groups/'s) and maxscore.lm.pretrain.
The trainer's errors, TrainError and ResumeError, are maxscore/errors.py's.
"""

from maxscore.training.optimizer import make_optimizer
from maxscore.training.state import TrainState
from maxscore.training.trainer import init, loop, restore, start, train_step

__all__ = ["TrainState", "init", "loop", "make_optimizer", "restore", "start", "train_step"]
