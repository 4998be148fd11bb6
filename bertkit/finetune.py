"""One fine-tuning loop for every task, and loading a fine-tuned folder for evaluate / predict.

The loop knows nothing about the task: it asks the task for features, a head, a loss and a
decoding, trains with AdamW (warmup + linear decay), evaluates after each epoch, keeps the best
epoch's model in OUT and stops early when the task's metric stops improving.
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from .checkpoint import load_config, load_model, load_tokenizer, save_model
from .encode import folder_pooling, precision_context
from .errors import BertkitError
from .inputs import parse_json, read_text
from .model import init_weights
from .optim import adamw, warmup_linear
from .outputs import check_output_folder
from .tasks import get_task
from .tasks.base import Task, TaskModel
from .tokenizer import WordPieceTokenizer
from .training_log import MetricsLog, plot_losses, write_json


@dataclass
class FinetuneConfig:
    task: str
    model: str                     # a model folder (HF layout): pretrained BERT or a bertkit run
    train: str
    eval: str
    out: str
    epochs: int = 3
    batch_size: int = 32
    eval_batch_size: int = 64
    lr: float = 5e-5
    max_len: int = 128
    warmup: float = 0.1            # share of steps warming up, then linear decay to 0
    weight_decay: float = 0.01
    clip: float = 1.0
    patience: int | None = None    # stop after this many epochs without a better eval metric
    group_by_length: bool = True   # batch examples of similar length together: less padding
    log_every: int = 10
    seed: int = 0
    progress: bool = True
    options: dict = field(default_factory=dict)  # task options: head, dropout, pooling, k, doc_stride ...
    overwrite: bool = False        # write into a non-empty --out folder

    def __post_init__(self):
        # named as the command line spells them: the CLI passes its options straight through
        for name in ("epochs", "batch_size", "eval_batch_size", "max_len", "log_every", "patience"):
            value = getattr(self, name)
            if value is None and name == "patience":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BertkitError(f"--{name.replace('_', '-')} must be an integer of at least 1, got {value!r}")
        for name, ok, what in (("lr", lambda v: v > 0, "a finite number above 0"),
                               ("clip", lambda v: v > 0, "a finite number above 0"),
                               ("warmup", lambda v: 0 <= v <= 1, "a number from 0 to 1"),
                               ("weight_decay", lambda v: v >= 0, "a finite number of at least 0")):
            value = getattr(self, name)
            number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not (number and ok(value)):
                raise BertkitError(f"--{name.replace('_', '-')} must be {what}, got {value!r}")


# this many non-finite steps in a row stop the run: the model diverged, skipping will not help
MAX_SKIPPED_IN_A_ROW = 5


def _json_number(value):
    """NaN and infinities as None (JSON has no NaN); every other value unchanged."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # a numpy / torch scalar
        return _json_number(value.item())
    return value


def check_max_len(max_len: int, cfg, option: str = "--max-len") -> int:
    """A sequence length the model can take: at least 1, at most its position embeddings."""
    limit = cfg.max_position_embeddings
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise BertkitError(f"{option} must be an integer of at least 1, got {max_len!r}")
    if max_len > limit:
        raise BertkitError(f"{option} {max_len} exceeds the model's limit of {limit} positions "
                           f"(config.json max_position_embeddings); use at most {limit}")
    return max_len


def _head_state(model: TaskModel) -> dict[str, torch.Tensor]:
    """Head tensors to save, less those tied to the encoder (the word task's decoder)."""
    shared = {id(p) for p in model.bert.parameters()}
    return {k: v for k, v in model.head.state_dict(keep_vars=True).items() if id(v) not in shared}


def save_task_model(model: TaskModel, task: Task, tokenizer: WordPieceTokenizer, out: Path) -> None:
    save_model(model.bert, out, tokenizer, bertkit_info={"task": task.name, **task.info},
               extra_tensors={k: v.detach() for k, v in _head_state(model).items()},
               architecture=task.hf_architecture, config_extra=task.hf_config())


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
    if task_name is not None and name != task_name:
        raise BertkitError(f"{folder} was fine-tuned for {name!r}, not {task_name!r}")
    task = get_task(name)(info)
    tokenizer = load_tokenizer(folder)
    bert, extra = load_model(folder, heads=False)
    model = TaskModel(bert, task.head(bert.config, bert))
    wanted = _head_state(model)
    missing = [k for k in wanted if k not in extra]
    if missing:
        raise BertkitError(f"{folder / 'model.safetensors'}: the {name} head's tensor {missing[0]!r} is missing")
    model.head.load_state_dict({k: extra[k] for k in wanted}, strict=False)
    model.to(device or ("cuda" if torch.cuda.is_available() else "cpu")).eval()
    return task, model, tokenizer


def task_max_len(task: Task, model: TaskModel, max_len: int | None) -> int:
    """--max-len for evaluate / predict: the one given, else the one the model was fine-tuned
    with; within the model's position limit either way."""
    if max_len is None:
        return min(task.info.get("max_len", 128), model.config.max_position_embeddings)
    return check_max_len(max_len, model.config)


def _batches(feats, task, tokenizer, batch_size, device, groups=None):
    groups = groups or [list(range(s, min(s + batch_size, len(feats)))) for s in range(0, len(feats), batch_size)]
    for group in groups:
        yield {k: v.to(device) for k, v in task.collate([feats[i] for i in group], tokenizer).items()}


def _epoch_groups(feats, batch_size: int, by_length: bool, g: torch.Generator) -> list[list[int]]:
    """A shuffled epoch as batches of indices. By length: the shuffled examples are sorted by
    length within windows of 50 batches, cut into batches, and the batches shuffled again, so
    each batch pads little while the order stays random (as HF's group_by_length)."""
    order = torch.randperm(len(feats), generator=g).tolist()
    window = batch_size * 50 if by_length else len(order)
    groups = []
    for s in range(0, len(order), window):
        part = order[s:s + window]
        if by_length:
            part.sort(key=lambda i: len(feats[i]["input_ids"]))
        groups += [part[j:j + batch_size] for j in range(0, len(part), batch_size)]
    if by_length:
        groups = [groups[i] for i in torch.randperm(len(groups), generator=g).tolist()]
    return groups


@torch.no_grad()
def run_task(task: Task, model: TaskModel, feats: list[dict], examples: list, tokenizer, batch_size=64,
             precision: str = "fp32"):
    """Predictions (and the mean loss when the features carry targets) over all features.
    fp32 by default, also on a GPU: bf16 moves scores and can flip close predictions."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    autocast = precision_context(device, precision)
    outputs, losses = [], []
    for batch in _batches(feats, task, tokenizer, batch_size, device):
        with autocast:
            loss, out = task.forward(model, batch)
        outputs.append(out)
        if loss is not None:
            losses.append(loss.item())
    model.train(was_training)
    return task.decode(outputs, feats, examples), (sum(losses) / len(losses) if losses else None)


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


def finetune(cfg: FinetuneConfig) -> dict:
    out = Path(cfg.out)
    log = (lambda msg: tqdm.write(f"bertkit: {msg}", file=sys.stderr)) if cfg.progress else (lambda msg: None)
    # everything the user gave is checked before any work: options, then where the run writes
    # (a non-empty --out only with overwrite: a user's config.json or vocab.txt is never replaced
    # by accident), then the model folder, then the data
    task = get_task(cfg.task)()
    user_options = task.check_options(cfg.options)
    check_output_folder(out, cfg.overwrite)
    model_cfg = load_config(cfg.model)
    check_max_len(cfg.max_len, model_cfg)
    tok = load_tokenizer(cfg.model, model_cfg)
    train_ex, eval_ex = task.read(cfg.train), task.read(cfg.eval)
    if not train_ex:
        raise BertkitError(f"{cfg.train}: no training examples")
    if not eval_ex:
        raise BertkitError(f"{cfg.eval}: no evaluation examples")
    torch.manual_seed(cfg.seed)
    bert, _ = load_model(cfg.model, heads=False)
    # a sentence-transformers checkpoint was trained for its own pooling; its pooler may be untrained
    options = {"pooling": folder_pooling(cfg.model) or "pooler", "max_len": cfg.max_len, "base_model": str(cfg.model),
               **user_options}
    task.fit(train_ex, options)
    task.check(eval_ex, cfg.eval)
    model = TaskModel(bert, task.head(bert.config, bert))
    init_weights(model.head, bert.config)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")
    train_feats = task.features(train_ex, tok, cfg.max_len)
    eval_feats = task.features(eval_ex, tok, cfg.max_len)
    log(f"{cfg.task}: {len(train_ex)} training examples ({len(train_feats)} features), {len(eval_ex)} for evaluation")

    opt = adamw(model, cfg.lr, cfg.weight_decay)
    total = math.ceil(len(train_feats) / cfg.batch_size) * cfg.epochs
    sched = warmup_linear(opt, int(cfg.warmup * total), total)
    out.mkdir(parents=True, exist_ok=True)
    metrics_log = MetricsLog(out)
    write_json(out / "finetune_config.json", dataclasses.asdict(cfg))

    step, best, best_epoch, stale = 0, None, 0, 0
    skipped, skipped_in_a_row = 0, 0
    history = []
    t_start = time.perf_counter()
    window = {"loss": 0.0, "n": 0, "examples": 0, "compute": 0.0}
    bar = tqdm(total=total, disable=not cfg.progress, unit="step", dynamic_ncols=True)
    for epoch in range(1, cfg.epochs + 1):
        model.train()
        g = torch.Generator().manual_seed(cfg.seed * 1000 + epoch)
        groups = _epoch_groups(train_feats, cfg.batch_size, cfg.group_by_length, g)
        for batch in _batches(train_feats, task, tok, cfg.batch_size, device, groups):
            t0 = time.perf_counter()
            with autocast:
                loss, _ = task.forward(model, batch)
            step += 1
            bar.update(1)
            # checked before opt.step: a NaN/inf loss or gradient never reaches the weights (nor
            # AdamW's moments); such a step is skipped, and a run of them stops the run
            loss = loss.float()
            finite = bool(torch.isfinite(loss))
            if finite:
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
                finite = bool(torch.isfinite(grad_norm))
            if finite:
                skipped_in_a_row = 0
                opt.step()
                sched.step()
                window["loss"] += loss.item()
                window["n"] += 1
                window["examples"] += len(batch["input_ids"])
                window["compute"] += time.perf_counter() - t0
            else:
                skipped += 1
                skipped_in_a_row += 1
                log(f"step {step}: the loss or gradient norm is not finite; step skipped ({skipped} so far)")
                if skipped_in_a_row >= MAX_SKIPPED_IN_A_ROW:
                    raise BertkitError(
                        f"step {step}: {skipped_in_a_row} steps in a row had a non-finite loss or gradient "
                        f"({skipped} skipped in all): training diverged; lower --lr (it is {cfg.lr:g}; "
                        f"try {cfg.lr / 10:g})")
            opt.zero_grad(set_to_none=True)
            # a window of only skipped steps has no loss to log: it is logged with the next window
            if (step % cfg.log_every == 0 or step == total) and window["n"]:
                rec = {"step": step, "epoch": epoch, "loss": window["loss"] / window["n"], "lr": sched.get_last_lr()[0],
                       "elapsed_s": time.perf_counter() - t_start,
                       "pairs_per_s": window["examples"] / window["compute"], "skipped_steps": skipped}
                metrics_log.write(rec)
                bar.set_postfix(loss=f"{rec['loss']:.4f}")
                window = {"loss": 0.0, "n": 0, "examples": 0, "compute": 0.0}
        # evaluated in fp32 like `bertkit evaluate`, so the best epoch is picked on the numbers it reports
        preds, eval_loss = run_task(task, model, eval_feats, eval_ex, tok, cfg.eval_batch_size)
        scores = {k: _json_number(v) for k, v in task.metrics(preds, eval_ex).items()}
        eval_loss = _json_number(eval_loss)
        rec = {"step": step, "epoch": epoch, "eval_loss": eval_loss,
               **{f"eval_{k}": v for k, v in scores.items() if v is None or isinstance(v, (int, float))}}
        metrics_log.write(rec)
        history.append({"epoch": epoch, **scores, "eval_loss": eval_loss})
        score = scores[task.primary_metric]  # None: the metric was NaN or infinite
        log(f"epoch {epoch}: {task.primary_metric} " + (f"{score:.4f}" if score is not None else "NaN")
            + (f", eval loss {eval_loss:.4f}" if eval_loss else ""))
        # a NaN metric is worse than any number: it never replaces a saved model
        if score is not None and (best is None or score > best):
            best, best_epoch, stale = score, epoch, 0
            save_task_model(model, task, tok, out)
        else:
            stale += 1
            if cfg.patience is not None and stale >= cfg.patience:
                log(f"no improvement for {stale} epoch(s): stopping early")
                break
    bar.close()
    note = None
    if best_epoch == 0:
        # no epoch had a number to compare: the run still ends as a model folder (the last model)
        best_epoch = len(history)
        save_task_model(model, task, tok, out)
        note = (f"the evaluation {task.primary_metric} was not a number (NaN) after every epoch; "
                f"saved the last epoch's model (epoch {best_epoch})")
        log(note)
    records = metrics_log.records()
    plot_losses(records, out / "loss.png", [("loss", "train"), ("eval_loss", "eval")],
                f"fine-tuning {cfg.task} from {Path(cfg.model).name}")
    summary = {"task": cfg.task, "best_epoch": best_epoch, f"best_{task.primary_metric}": best,
               "best_metrics": history[best_epoch - 1], "epochs_run": len(history), "history": history,
               "train_examples": len(train_ex), "eval_examples": len(eval_ex), "steps": step,
               "skipped_steps": skipped, "train_s": time.perf_counter() - t_start,
               "pairs_per_s": sum(r.get("pairs_per_s", 0) for r in records if "pairs_per_s" in r)
               / max(1, sum(1 for r in records if "pairs_per_s" in r)),
               "device": str(device), "config": dataclasses.asdict(cfg)}
    if note:
        summary["note"] = note
    write_json(out / "summary.json", summary)
    metrics_log.close()
    return summary
