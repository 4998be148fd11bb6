"""Fine-tuning tasks: one file per task."""
from __future__ import annotations

import importlib
import json
import math
from pathlib import Path

from ..errors import BertkitError

# task name -> "module:class"; imported on use so that one task's dependencies never slow another
TASKS = {
    "classify": "classify:ClassifyTask",
    "ner": "ner:NerTask",
    "tag": "ner:TagTask",
    "qa": "qa:QATask",
    "summarize": "summarize:SummarizeTask",
    "word": "word:WordTask",
}


# each task's `--option` keys, for `bertkit finetune --help` without importing the tasks (a test
# checks them against the tasks' own declarations)
OPTION_KEYS = {
    "classify": "head, dropout, pooling",
    "ner": "dropout, decode",
    "tag": "dropout",
    "qa": "doc_stride, max_query_len, n_best, max_answer_len, null_score_diff, version_2",
    "summarize": "k, max_words, dropout",
    "word": "head, words, temperature, tied, bias, frozen_decoder, hub_correction, transform, negatives",
}


# each task's fine-tuning defaults, chosen by benchmarks/finetune_study.py over 3 seeds (the
# README's "Fine-tuning defaults" says why each is what it is); every flag overrides them.
# Options: a task option's default when the user gives none (written into bertkit.json).
DEFAULTS = {
    "classify": dict(epochs=3, batch_size=32, lr=5e-5, max_len=128, options={}),  # pooling: see ClassifyTask.fit
    # ner's lr: the study's 1e-4, then 3e-4 from benchmarks/pretrain_value.py's grid on the whole
    # wnut16 (MiniLM, 3 seeds, entity F1 dev / test): 3e-5 0.259 / 0.211, 1e-4 0.526 / 0.392,
    # 3e-4 0.547 / 0.426, 1e-3 diverged (0 / 0, seed 0). decode: see NerTask.fit
    "ner": dict(epochs=3, batch_size=16, lr=3e-4, max_len=128, options={}),
    "tag": dict(epochs=3, batch_size=16, lr=5e-5, max_len=128, options={}),
    "qa": dict(epochs=2, batch_size=16, lr=1e-4, max_len=256, options={}),
    "summarize": dict(epochs=3, batch_size=4, lr=1e-4, max_len=512, options={}),  # lr: the study (ROUGE-2)
    # word: head=encoder, the reverse dictionary (benchmarks/reverse_dictionary.py); 1 epoch: on
    # wordnet-attributes its 3-epoch run scored best after the first (seen fold), and one pass over
    # wordnet-definitions' 118,615 pairs reaches an unseen median rank of 50
    "word": dict(epochs=1, batch_size=32, lr=1e-4, max_len=32, options={"head": "encoder"}),
}
# defaults that change with a task option the user gives: the word task's head=vocab, a closed
# label set learned from a few thousand pairs, keeps the 3 epochs the fine-tuning study chose for it
OPTION_DEFAULTS = {"word": {("head", "vocab"): dict(epochs=3)}}


def task_defaults(task: str, options: dict | None = None) -> dict:
    """DEFAULTS[task] for a run given `options` (the user's --option values)."""
    defaults = dict(DEFAULTS.get(task, DEFAULTS["classify"]))
    for (key, value), changes in OPTION_DEFAULTS.get(task, {}).items():
        if (options or {}).get(key, defaults["options"].get(key)) == value:
            defaults |= changes
    return defaults


# The learning rate of a model that bertkit pretrained from random weights (checkpoint.
# pretraining_origin), at hidden size 128 (tiny). Such a model has had minutes or hours of
# pretraining, not a published checkpoint's days: it has little to forget and learns its task at
# 20x the rate that suits MiniLM. benchmarks/pretrain_value.py's grid (rotten-tomatoes, 3 seeds,
# test accuracy) on the 10-minute tiny: 3e-5 0.610, 1e-4 0.695, 3e-4 0.747, 1e-3 0.761, 3e-3
# diverged. Wider models take it scaled by 128 / hidden size, as Adam's best rate falls with width
# (muP): mini 5e-4 (random weights: 0.767, one seed; measured on classify, the other tasks unmeasured).
SCRATCH_LR_AT_128 = 1e-3


def default_lr(task: str, folder: str | Path) -> float:
    """`finetune`'s learning rate when --lr is not given: the task's (chosen on MiniLM, as for any
    published checkpoint), or for a model bertkit pretrained from scratch SCRATCH_LR_AT_128 x 128 /
    its hidden size."""
    from ..folders import pretraining_origin
    if pretraining_origin(folder) is not None:
        try:
            hidden = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))["hidden_size"]
        except (OSError, ValueError, KeyError, TypeError):
            hidden = None  # finetune names what is wrong with config.json when it loads the model
        if isinstance(hidden, int) and not isinstance(hidden, bool) and hidden > 0:
            return SCRATCH_LR_AT_128 * 128 / hidden
    return DEFAULTS.get(task, DEFAULTS["classify"])["lr"]


# The fewest optimizer steps a model bertkit pretrained from random weights is fine-tuned for when
# --epochs is not given: such a model learns its task mostly from the labels, and a small training
# set's 3 epochs are too few steps for that. About as many as rotten-tomatoes' 3 epochs, where the
# scratch lr was chosen (319 steps an epoch: 957). benchmarks/pretrain_value.py, the 10-minute tiny
# on wnut16 (1,915 tweets, 120 steps an epoch), test entity F1 at lr 1e-3: 3 epochs 0.03
# (0.00-0.05, 3 seeds), 8 epochs 0.16 (0.14-0.18), 10 epochs 0.21 (seed 0). Larger sets (tweets:
# 954 steps an epoch) keep the task's epochs.
SCRATCH_MIN_STEPS = 950


def default_epochs(task: str, folder: str | Path, n_train: int, batch_size: int, options: dict | None = None) -> int:
    """`finetune`'s epochs when --epochs is not given: the task's, or for a model bertkit pretrained
    from scratch enough epochs of n_train examples to reach SCRATCH_MIN_STEPS steps."""
    from ..folders import pretraining_origin
    epochs = task_defaults(task, options)["epochs"]
    if pretraining_origin(folder) is None or n_train < 1:
        return epochs
    return max(epochs, math.ceil(SCRATCH_MIN_STEPS / math.ceil(n_train / batch_size)))


def get_task(name: str):
    if name not in TASKS:
        raise BertkitError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
    module, cls = TASKS[name].split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)
