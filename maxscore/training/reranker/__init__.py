"""The reranker recipe of the one trainer (maxscore/training): a score head on a frozen backbone, or the backbone
too (whole, or LoRA adapters). `config` holds its settings (TrainConfig, TrainRun), `prepare` a run's inputs
built once, `model` the params, loss and batches of a step, `evaluation` the dev metrics, `outputs` the
summary and exports, and `train` the run itself; the state, step, loop, optimizer, checkpoints and mesh are the
trainer's core.
"""
