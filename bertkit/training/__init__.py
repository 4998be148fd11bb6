"""The training runtime both loops use (pretraining/train.py and finetune.py): processes and
devices (distributed.py), durable checkpoints (checkpoints.py), the optimizer step with its
non-finite guard, signals and the learning-rate schedule (step.py), what a run leaves
behind (log.py), and malloc settings that keep a step's freed memory for the next (memory.py)."""
