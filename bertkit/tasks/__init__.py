"""Fine-tuning tasks: one file per task."""
from __future__ import annotations

import importlib

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
    "ner": "dropout",
    "tag": "dropout",
    "qa": "doc_stride, max_query_len, n_best, max_answer_len, null_score_diff, version_2",
    "summarize": "k, max_words, dropout",
    "word": "tied",
}


def get_task(name: str):
    if name not in TASKS:
        raise BertkitError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
    module, cls = TASKS[name].split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)
