"""The reranker recipe of the one trainer (maxscore/training): a score head on a frozen backbone, or the backbone
too (whole, or LoRA adapters). `config` holds its settings (TrainConfig, TrainRun), `prepare` a run's inputs
built once, `features` what a head reads (frozen features, or the packed forward of a training backbone),
`model` the params, loss and jitted step, `batches` a step's batch, `losses` the ranking losses,
`first_listwise` FIRST's windows and loss, `evaluation` the dev metrics, `selection` the checkpoint kept,
`outputs` the summary and exports, and `train` the run itself; the state, step, loop, optimizer, checkpoints and
mesh are the trainer's core.
"""
