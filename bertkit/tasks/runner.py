"""Running a task's model over features: batched, length-sorted where each feature is its
example, predictions back in input order (run_task); and scoring a folder on a data file."""
from __future__ import annotations

import torch

from ..precision import precision_context
from .base import Task, TaskModel
from .folder import load_task_model, task_max_len


def feature_batches(feats, task, tokenizer, batch_size, device, groups=None):
    groups = groups or [list(range(s, min(s + batch_size, len(feats)))) for s in range(0, len(feats), batch_size)]
    for group in groups:
        yield {k: v.to(device) for k, v in task.collate([feats[i] for i in group], tokenizer).items()}



@torch.no_grad()
def task_outputs(task: Task, model: TaskModel, feats: list[dict], tokenizer, batch_size=64,
                 precision: str = "fp32") -> tuple[list, list[tuple[float, int]]]:
    """The task's raw outputs per batch, and when the features carry targets each batch's
    (loss x loss units, loss units): mean_loss weighs the batches by what their losses average
    over, so the mean does not depend on the batch size (a short last batch counted as a full one)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    autocast = precision_context(device, precision)
    outputs, losses = [], []
    groups = [list(range(s, min(s + batch_size, len(feats)))) for s in range(0, len(feats), batch_size)]
    for group, batch in zip(groups, feature_batches(feats, task, tokenizer, batch_size, device, groups)):
        with autocast:
            loss, out = task.forward(model, batch)
        outputs.append(out)
        units = sum(task.loss_units(feats[i]) for i in group)
        if loss is not None and units:
            losses.append((loss.item() * units, units))
    model.train(was_training)
    return outputs, losses


def mean_loss(losses: list[tuple[float, int]]) -> float | None:
    return sum(s for s, _ in losses) / sum(n for _, n in losses) if losses else None


def length_order(task: Task, feats: list[dict], examples: list) -> list[int]:
    """The order evaluation runs the features in: by length where each feature is its example
    (batches of similar length pad little: predictions come back in input order), else as given."""
    if task.feature_per_example and len(feats) == len(examples):
        return sorted(range(len(feats)), key=lambda i: len(feats[i]["input_ids"]))
    return list(range(len(feats)))


def decode_outputs(task: Task, outputs: list, feats: list[dict], examples: list, order: list[int]) -> list:
    """task.decode over outputs computed in `order`, the predictions in input order."""
    if order == list(range(len(feats))):
        return task.decode(outputs, feats, examples)
    ranked = task.decode(outputs, [feats[i] for i in order], [examples[i] for i in order])
    preds = [None] * len(ranked)
    for k, i in enumerate(order):
        preds[i] = ranked[k]
    return preds


def run_task(task: Task, model: TaskModel, feats: list[dict], examples: list, tokenizer, batch_size=64,
             precision: str = "fp32"):
    """Predictions (and the mean loss when the features carry targets) over all features, in
    length-sorted batches. fp32 by default, also on a GPU: bf16 moves scores and can flip close
    predictions."""
    order = length_order(task, feats, examples)
    outputs, losses = task_outputs(task, model, [feats[i] for i in order], tokenizer, batch_size, precision)
    return decode_outputs(task, outputs, feats, examples, order), mean_loss(losses)


def evaluate_folder(task_name: str, folder, data_path, batch_size: int = 64, max_len: int | None = None,
                    precision: str = "fp32") -> dict:
    task, model, tok = load_task_model(folder, task_name)
    max_len = task_max_len(task, model, max_len)  # before reading the data
    examples = task.read(data_path)
    task.check(examples, str(data_path))
    feats = task.features(examples, tok, max_len)
    preds, loss = run_task(task, model, feats, examples, tok, batch_size, precision)
    metrics = task.metrics(preds, examples)
    if loss is not None:
        metrics["loss"] = loss
    return metrics
