"""The training runtime both jobs run on (pretraining/train.py and finetune.py): the one loop
(loop.py), the options every run shares (options.py), processes and devices (distributed.py),
durable checkpoints (checkpoints.py), the optimizer step with its non-finite guard, signals and
the learning-rate schedule (step.py), what a run leaves behind (log.py), and malloc settings
that keep a step's freed memory for the next (memory.py)."""
