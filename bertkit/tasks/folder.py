"""A fine-tuned model folder: the encoder with its task's head (save_task_model), read back
with the task it was fine-tuned for (load_task_model), for evaluate, predict, the server and export."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..config import check_max_len
from ..errors import BertkitError
from ..files import weights_path
from ..folders import load_model, save_model
from ..inputs import parse_json, read_text
from ..tokenizer import WordPieceTokenizer, load_tokenizer
from . import get_task
from .base import Task, TaskModel


def _head_state(model: TaskModel) -> dict[str, torch.Tensor]:
    """Head tensors to save, less those tied to the encoder (the word task's decoder)."""
    shared = {id(p) for p in model.bert.parameters()}
    return {k: v for k, v in model.head.state_dict(keep_vars=True).items() if id(v) not in shared}


# the prefix of a head's tensors where no transformers class runs that head (classify on [CLS] or the
# mean or with an MLP, the CRF tagger, summarize, word): under transformers' own names, a classifier
# on the mean loaded into BertForSequenceClassification without a word and ran on the pooler there
OWN_HEAD = "bertkit_head."


def save_task_model(model: TaskModel, task: Task, tokenizer: WordPieceTokenizer, out: Path) -> None:
    prefix = OWN_HEAD if task.hf_architecture == "BertModel" else ""
    save_model(model.bert, out, tokenizer, bertkit_info={"task": task.name, **task.info},
               extra_tensors={prefix + k: v.detach() for k, v in _head_state(model).items()},
               architecture=task.hf_architecture, config_extra=task.hf_config())


def fine_tuned_task(folder: str | Path) -> str | None:
    """The task a folder was fine-tuned for (its bertkit.json), or None: no bertkit.json, or a
    pretraining run's ("task": "pretraining")."""
    from . import TASKS
    try:
        info = json.loads((Path(folder) / "bertkit.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    task = info.get("task") if isinstance(info, dict) else None
    return task if task in TASKS else None


def load_task_model(folder: str | Path, task_name: str | None = None, device=None):
    """A fine-tuned folder -> (task, model in eval mode, tokenizer)."""
    folder = Path(folder)
    info_path = folder / "bertkit.json"
    if not info_path.is_file():
        raise BertkitError(f"{folder}: no bertkit.json: not a fine-tuned bertkit model (run `bertkit finetune`)")
    info = parse_json(read_text(info_path), str(info_path))
    if not isinstance(info, dict):
        raise BertkitError(f"{info_path}: expected a JSON object")
    name = info.pop("task", None)
    from . import TASKS
    if name not in TASKS:
        raise BertkitError(f"{folder} is not fine-tuned for a task (its bertkit.json has task {name!r}); "
                           f"run `bertkit finetune {task_name or 'TASK'}` on it first")
    if task_name is not None and name != task_name:
        raise BertkitError(f"{folder} was fine-tuned for {name!r}, not {task_name!r}")
    labels = info.get("labels")
    if labels is not None and not (isinstance(labels, list) and len(labels) >= (2 if name == "classify" else 1)
                                   and all(isinstance(x, (str, int)) and not isinstance(x, bool) for x in labels)):
        raise BertkitError(f"{info_path}: 'labels' must be a list of strings or integers (two or more to classify), "
                           f"found {json.dumps(labels)[:80]}")
    if labels is not None and len({str(x) for x in labels}) != len(labels):  # their scores would collapse into one
        twice = next(x for i, x in enumerate(labels) if str(x) in {str(y) for y in labels[:i]})
        raise BertkitError(f"{info_path}: label {twice!r} occurs twice in 'labels'; each label must be one output")
    task = get_task(name)(info)
    # the task options it records, checked as `--option` checks them: a hand-edited "k": 0 summarized
    # every document as nothing, "n_best": "5" ended in a ValueError deep in decoding
    task.info.update(task.check_options({k: info[k] for k in sorted(task.options.keys() & info.keys())}, info_path))
    tokenizer = load_tokenizer(folder)
    bert, extra = load_model(folder, heads=False)
    try:
        model = TaskModel(bert, task.head(bert.config, bert))
    except KeyError as e:
        raise BertkitError(f"{info_path}: no {e.args[0]!r} field, which the {name} head is built from") from None
    wanted = _head_state(model)
    extra = {k.removeprefix(OWN_HEAD): v for k, v in extra.items()}  # folders saved before the prefix: without it
    missing = [k for k in wanted if k not in extra]
    if missing:
        raise BertkitError(f"{weights_path(folder)}: the {name} head's tensor {missing[0]!r} is missing")
    for k, t in wanted.items():
        if extra[k].shape != t.shape:  # the head as bertkit.json describes it (its labels ...) is another
            raise BertkitError(f"{weights_path(folder)}: the {name} head's tensor {k!r} has shape "
                               f"{tuple(extra[k].shape)}, but bertkit.json describes one of {tuple(t.shape)}"
                               + (f" ({len(labels)} labels)" if labels is not None else ""))
    model.head.load_state_dict({k: extra[k] for k in wanted}, strict=False)
    model.to(device or ("cuda" if torch.cuda.is_available() else "cpu")).eval()
    return task, model, tokenizer


def task_max_len(task: Task, model: TaskModel, max_len: int | None) -> int:
    """--max-len for evaluate / predict: the one given, else the one the model was fine-tuned
    with; within the model's position limit either way."""
    if max_len is None:
        return check_max_len(min(task.info.get("max_len", 128), model.config.max_position_embeddings),
                             model.config, "bertkit.json's max_len")
    return check_max_len(max_len, model.config)
