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


def get_task(name: str):
    if name not in TASKS:
        raise BertkitError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
    module, cls = TASKS[name].split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)
