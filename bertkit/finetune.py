"""One fine-tuning loop for every task (the folder it saves: tasks/folder.py; running a model
over a task's features: tasks/runner.py).

The loop knows nothing about the task: it asks the task for features, a head, a loss and a
decoding, trains with AdamW (warmup + linear decay), evaluates after each epoch, keeps the best
epoch's model in OUT and stops early when the task's metric stops improving.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import shutil
import time
from pathlib import Path

import torch

from .config import check_max_len, load_config
from .errors import BertkitError
from .folders import load_model
from .optim import adamw
from .outputs import check_output_folder
from .precision import training_precision
from .tasks import default_epochs, get_task, task_defaults
from .tasks.base import Task, TaskModel
from .tasks.folder import load_task_model, save_task_model
from .tasks.options import FinetuneConfig
from .tasks.runner import decode_outputs, length_order, mean_loss, run_task, task_outputs
from .tokenizer import load_tokenizer
from .training.checkpoints import has_checkpoint, latest_checkpoint
from .training.distributed import Processes, gradient_sync
from .training.log import write_json
from .training.loop import STOP, Job, Loop, StepResult, changed_options
from .training.run import Run, exact_options, refuse_changed


def _json_number(value):
    """NaN and infinities as None (JSON has no NaN); every other value unchanged."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # a numpy / torch scalar
        return _json_number(value.item())
    return value


def epoch_groups(feats, batch_size: int, by_length: bool, g: torch.Generator) -> list[list[int]]:
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


def _on_cpu(value):
    """`value` (tensors in lists and tuples) with its tensors on the CPU: gathered by pickling, a CUDA tensor
    comes back on the GPU of the rank that sent it, and rank 0 decodes them all together."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(_on_cpu(v) for v in value)
    return value


def evaluate_in_parts(task: Task, model: TaskModel, feats: list[dict], examples: list, tokenizer, batch_size: int,
              procs: Processes):
    """run_task over several processes: each rank runs a contiguous part of the (length-sorted) features, rank 0
    puts the outputs back in order and decodes them all at once (QA n-best and NER decoding see
    every feature, as in one process). Returns (predictions, mean loss) on rank 0, None elsewhere."""
    if procs.world == 1:
        return run_task(task, model, feats, examples, tokenizer, batch_size)
    order = length_order(task, feats, examples)
    ordered, n = [feats[i] for i in order], len(feats)
    part = slice(procs.rank * n // procs.world, (procs.rank + 1) * n // procs.world)
    mine = task_outputs(task, model, ordered[part], tokenizer, batch_size) if part.stop > part.start else ([], [])
    parts = procs.gather(_on_cpu(mine))
    if not procs.main:
        return None
    outputs = [o for out, _ in parts for o in out]
    losses = [x for _, loss in parts for x in loss]
    return decode_outputs(task, outputs, feats, examples, order), mean_loss(losses)


class TaskStep(torch.nn.Module):
    """The task's forward as a module's: DistributedDataParallel syncs gradients only for
    computations that go through the module it wraps."""

    def __init__(self, task: Task, model: TaskModel):
        super().__init__()
        self.task, self.model = task, model

    def forward(self, batch):
        return self.task.forward(self.model, batch)


def _split(rows: list, parts: int) -> list[list]:
    """rows in `parts` contiguous pieces, as even as possible (the first ones longer)."""
    q, r = divmod(len(rows), parts)
    bounds = [i * q + min(i, r) for i in range(parts + 1)]
    return [rows[bounds[i]:bounds[i + 1]] for i in range(parts)]


def accumulate_gradients(net, task: Task, feats: list[dict], tokenizer, procs: Processes, grad_accum: int,
                         autocast=None) -> float:
    """Forward and backward over this rank's share of a global batch `feats`, in `grad_accum`
    micro-batches; returns the global batch's mean loss (the same on every rank), or None when
    nothing in the batch has a target (the gradients are then zero).

    Each micro-batch's mean loss weighs by its share of the global batch's loss units (examples;
    ner's labelled words, summarize's labelled sentences: Task.loss_units), so the gradient is
    that of the global batch's mean, however it is split into micro-batches and ranks
    (DistributedDataParallel averages over ranks, hence the factor `procs.world`)."""
    autocast = autocast or contextlib.nullcontext()
    mine = _split(list(range(len(feats))), procs.world)[procs.rank]
    micros = [m for m in _split(mine, grad_accum) if m]
    device = procs.device
    units = [sum(task.loss_units(feats[j]) for j in micro) for micro in micros]
    if not micros:  # fewer examples than ranks (a short last batch): this rank has none, but must still join
        # the step's gradient all-reduce: a forward on another rank's example and a zero gradient
        micros, units = [[0]], [0]
    total = torch.tensor(float(sum(units)), dtype=torch.float64, device=device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    if procs.world > 1:
        torch.distributed.all_reduce(total)
    for i, micro in enumerate(micros):
        batch = {k: v.to(device) for k, v in task.collate([feats[j] for j in micro], tokenizer).items()}
        with gradient_sync(net, procs.world, i == len(micros) - 1):
            with autocast:
                loss, _ = net(batch)
            if loss is None or not units[i]:  # no target here: a zero gradient, still a backward
                # (every rank's DistributedDataParallel waits for every parameter's gradient)
                (sum(p.sum() for p in net.parameters() if p.requires_grad) * 0.0).backward()
                continue
            (loss.float() * (units[i] * procs.world / float(total))).backward()
        loss_sum += loss.detach().double() * units[i]
    if procs.world > 1:
        torch.distributed.all_reduce(loss_sum)
    return float(loss_sum / total) if float(total) else None


class _FinetuneJob(Job):
    """A task's fine-tuning for the Loop: shuffled epochs of feature batches (by length), one
    step's gradients, and at each epoch's end the evaluation, the best epoch's model in OUT and
    the patience policy."""
    epoch_checkpoints = True

    def __init__(self, cfg: FinetuneConfig, task: Task, model: TaskModel, opt, procs: Processes, tok,
                 train_feats: list[dict], eval_feats: list[dict], eval_ex: list, metrics, log, autocast,
                 state: dict | None, out: Path):
        self.cfg, self.task, self.model, self.opt, self.procs, self.tok = cfg, task, model, opt, procs, tok
        self.train_feats, self.eval_feats, self.eval_ex = train_feats, eval_feats, eval_ex
        self.metrics, self.log, self.autocast, self.out = metrics, log, autocast, out
        # a task's model may leave parameters out of its loss (the pooler under mean pooling)
        self.net = procs.wrap(TaskStep(task, model), find_unused_parameters=True)
        self.epoch, self.batch = (state["epoch"], state["batch"]) if state else (1, 0)
        self.best, self.best_epoch, self.stale, self.history = (
            (state["best"], state["best_epoch"], state["stale"], state["history"]) if state else (None, 0, 0, []))
        self.groups = self._groups()

    def _groups(self) -> list[list[int]]:
        g = torch.Generator().manual_seed(self.cfg.seed * 1000 + self.epoch)
        return epoch_groups(self.train_feats, self.cfg.batch_size, self.cfg.group_by_length, g)

    def next_batch(self, loop: Loop) -> list[int]:
        self.batch += 1
        return self.groups[self.batch - 1]

    def gradients(self, group: list[int]) -> StepResult:
        loss = accumulate_gradients(self.net, self.task, [self.train_feats[j] for j in group], self.tok, self.procs,
                                    self.cfg.grad_accum, self.autocast)
        return StepResult(loss, {"loss": loss or 0.0}, len(group))

    def record(self, window: dict) -> dict:
        return {"epoch": self.epoch}

    def epoch_done(self, loop: Loop) -> bool:
        return self.batch >= len(self.groups) or loop.last  # the run's end evaluates too (a budget's mid-epoch)

    def end_epoch(self, loop: Loop) -> bool:
        # evaluated in fp32 like `bertkit evaluate`, so the best epoch is picked on the numbers it reports
        with loop.timed("eval_s"):
            evaluated = evaluate_in_parts(self.task, self.model, self.eval_feats, self.eval_ex, self.tok,
                                  self.cfg.eval_batch_size, self.procs)
        self.model.train()
        stop_early = False
        if self.procs.main:
            task, epoch = self.task, self.epoch
            preds, eval_loss = evaluated
            scores = {k: _json_number(v) for k, v in task.metrics(preds, self.eval_ex).items()}
            eval_loss = _json_number(eval_loss)
            self.metrics.write({"step": loop.step, "epoch": epoch, "eval_loss": eval_loss,
                                **{f"eval_{k}": v for k, v in scores.items() if v is None or isinstance(v, (int, float))}})
            self.history.append({"epoch": epoch, **scores, "eval_loss": eval_loss})
            score = scores[task.primary_metric]  # None: the metric was NaN or infinite
            self.log(f"epoch {epoch}: {task.primary_metric} " + (f"{score:.4f}" if score is not None else "NaN")
                     + (f", eval loss {eval_loss:.4f}" if eval_loss else ""))
            # a NaN metric is worse than any number: it never replaces a saved model
            if score is not None and (self.best is None or score > self.best):
                self.best, self.best_epoch, self.stale = score, epoch, 0
                save_task_model(self.model, task, self.tok, self.out)
            else:
                self.stale += 1
                if self.cfg.patience is not None and self.stale >= self.cfg.patience:
                    self.log(f"no improvement for {self.stale} epoch(s): stopping early")
                    stop_early = True
        self.epoch, self.batch = self.epoch + 1, 0  # a checkpoint from here starts the next epoch
        self.groups = self._groups()
        return self.procs.broadcast(stop_early)

    def save(self, folder: Path) -> None:
        save_task_model(self.model, self.task, self.tok, folder)

    def state(self) -> dict:
        return {"epoch": self.epoch, "batch": self.batch, "best": self.best, "best_epoch": self.best_epoch,
                "stale": self.stale, "history": self.history}

    def diverged(self, loop: Loop) -> str:
        return (f"step {loop.step}: {loop.guard.in_a_row} steps in a row had a non-finite loss or gradient "
                f"({loop.guard.skipped} skipped in all): training diverged; lower --lr (it is {self.cfg.lr:g}; "
                f"try {self.cfg.lr / 10:g})")


def _open_out(cfg: FinetuneConfig, run: Run) -> Path | None:
    """The checkpoint to resume from, or None for a new run; refuses what would lose work."""
    out = run.out
    if out.resolve() == Path(cfg.model).resolve():  # --overwrite would replace the base model in place
        raise BertkitError(f"--out {out} is the --model folder: the fine-tuned model would replace the model it "
                           "starts from; choose another --out")
    if not cfg.resume:
        if has_checkpoint(out) and not cfg.overwrite:
            if (out / "pretrain_config.json").is_file():
                raise BertkitError(f"{out} holds a pretraining run with checkpoints; fine-tune it into another --out "
                                   f"(--model {out})")
            raise BertkitError(f"{out} holds a fine-tuning run with checkpoints; pass --resume to continue it "
                               "(or --overwrite to start again)")
        check_output_folder(out, cfg.overwrite)
        shutil.rmtree(out / "checkpoints", ignore_errors=True)  # an overwritten run's: never mixed with ours
        return None
    if (out / "pretrain_config.json").is_file():
        raise BertkitError(f"{out} holds a pretraining run: `bertkit pretrain --resume --out {out}` continues it; "
                           f"fine-tune it into another --out (--model {out})")
    ckpt = latest_checkpoint(out, run.log)
    if ckpt is None:
        raise BertkitError(f"{out}: no checkpoint to resume from (expected {out / 'checkpoints'}/step_*)")
    refuse_changed(json.loads((ckpt / "trainer.json").read_text())["options"], cfg, "in the checkpoint", ckpt)
    check_output_folder(out, overwrite=True)  # still writable?
    return ckpt


def _finished(cfg: FinetuneConfig, out: Path) -> dict | None:
    """On --resume, the summary of a run in OUT that already ran to its end (its checkpoints are
    removed then), so that resuming it ends at once as a resumed pretraining run does."""
    if not cfg.resume or has_checkpoint(out):
        return None
    try:
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        saved = {k: summary["config"][k] for k in FinetuneConfig.EXACT}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    changed = changed_options(saved, exact_options(cfg), "in the finished run")
    if changed:
        raise BertkitError(f"{out}: the run there is finished; a resume with changed options would not continue it "
                           f"({'; '.join(changed)}); start a new run in another --out")
    return summary


def _resume(cfg: FinetuneConfig, run: Run, ckpt: Path, task: Task, model: TaskModel, opt) -> dict:
    """The run in OUT at its checkpoint: weights, optimizer, RNG and clock; refused when the
    training file's labels are no longer those the head was trained on."""
    resumed_task, resumed, _ = load_task_model(ckpt, cfg.task, device=run.procs.device)
    then, now = resumed_task.info.get("labels"), task.info.get("labels")
    if then != now:  # the training file was edited since: the head's rows would mean other labels (or
        # not fit it: a size-mismatch traceback)
        named = lambda xs: ", ".join(map(str, xs[:5])) + (" ..." if len(xs) > 5 else "") or "none"  # noqa: E731
        raise BertkitError(f"{cfg.train}: its labels are not those of the run in {run.out} (new: "
                           f"{named([x for x in now or [] if x not in then])}; gone: "
                           f"{named([x for x in then or [] if x not in now])}); resume with the training file "
                           "the run started with, or start a new run in another --out")
    model.load_state_dict(resumed.state_dict())
    state = run.resume(ckpt, opt)
    run.log(f"resuming {run.out} at step {state['step']} (epoch {state['epoch']}, batch {state['batch']})")
    return state


def _prepare(cfg: FinetuneConfig, run: Run, task: Task, user_options: dict, train_ex: list | None):
    """The tokenizer, the model (the body loaded, the task's head new), the examples and their
    features, and the training precision."""
    procs = run.procs
    model_cfg = load_config(cfg.model)
    check_max_len(cfg.max_len, model_cfg)
    tok = load_tokenizer(cfg.model, model_cfg)
    train_ex, eval_ex = task.read(cfg.train) if train_ex is None else train_ex, task.read(cfg.eval)
    if not train_ex:
        raise BertkitError(f"{cfg.train}: no training examples")
    if not eval_ex:
        raise BertkitError(f"{cfg.eval}: no evaluation examples")
    torch.manual_seed(cfg.seed)
    bert, _ = load_model(cfg.model, heads=False)
    # the task's defaults from the fine-tuning study, then what the user chose: all of it goes into
    # bertkit.json (with what fit() adds, e.g. classify's pooling), so that evaluate and predict
    # run the model as it was trained
    options = {**task_defaults(cfg.task)["options"], "max_len": cfg.max_len, "base_model": str(cfg.model), **user_options}
    task.fit(train_ex, options)
    task.check(eval_ex, cfg.eval)
    model = TaskModel(bert, task.head(bert.config, bert))
    task.init_head(model.head, bert.config)
    model.to(procs.device)
    precision = training_precision(procs.device, cfg.precision)
    train_feats = task.features(train_ex, tok, cfg.max_len)
    if not any(task.loss_units(f) for f in train_feats):  # every step would be a zero gradient
        raise BertkitError(f"{cfg.train}: none of its {len(train_ex)} examples gives the model a target it can "
                           "learn (the word task: every target word is several vocabulary tokens)"
                           if cfg.task == "word" else f"{cfg.train}: none of its examples has a target to learn")
    eval_feats = task.features(eval_ex, tok, cfg.max_len)
    run.log(f"{cfg.task}: {len(train_ex)} training examples ({len(train_feats)} features), {len(eval_ex)} for "
            f"evaluation; training in {precision}{' (bf16 autocast)' if precision == 'bf16' else ''}, evaluation "
            "in fp32")
    return tok, model, (train_ex, eval_ex, train_feats, eval_feats), precision


def finetune(cfg: FinetuneConfig, on_step=None, timer=time.perf_counter) -> dict | None:
    """Fine-tune (or resume fine-tuning) a model folder for a task; returns the summary also
    written to OUT/summary.json (None on the other ranks of a torchrun job: rank 0 writes).
    on_step(step, model) is called after every optimizer step and its checkpoint; timer is the
    run's clock in seconds (tests drive a budget with their own).

    Under torchrun each of the W processes takes its share of every batch (the same global
    batch as one process), DistributedDataParallel averages the gradients, each rank evaluates a
    part of the evaluation set and rank 0 decodes, scores and writes."""
    run = Run(cfg, timer)
    procs, log, out = run.procs, run.log, run.out
    # everything the user gave is checked before any work: options, then where the run writes
    # (a non-empty --out only with overwrite: a user's config.json or vocab.txt is never replaced
    # by accident), then the model folder, then the data
    task = get_task(cfg.task)()
    user_options = task.check_options(cfg.options)
    train_ex = None
    if cfg.epochs is None:  # a model bertkit pretrained, no --epochs: enough steps (tasks.default_epochs)
        train_ex = task.read(cfg.train)  # read once: the data checks below take it as it is
        cfg.epochs = default_epochs(cfg.task, cfg.model, len(train_ex), cfg.batch_size, cfg.options)
    if (summary := _finished(cfg, out)) is not None:
        log(f"the run in {out} is finished (summary.json): nothing to resume; its model is in {out}")
        return summary if procs.main else None
    # rank 0 checks --out (a check writes a probe into it), then every rank takes its answer
    ckpt = procs.broadcast(str(_open_out(cfg, run) or "") if procs.main else None)
    ckpt = Path(ckpt) if ckpt else None
    if cfg.batch_size % procs.world:
        raise BertkitError(f"--batch-size {cfg.batch_size} is not divisible by {procs.world} processes")
    tok, model, data, precision = _prepare(cfg, run, task, user_options, train_ex)
    train_ex, eval_ex, train_feats, eval_feats = data
    opt = adamw(model, cfg.lr, cfg.weight_decay)
    state = _resume(cfg, run, ckpt, task, model, opt) if ckpt is not None else None
    if procs.main:
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "finetune_config.json", dataclasses.asdict(cfg))
    metrics_log = run.start()
    if procs.main and state and state["batch"]:
        # a checkpoint inside its epoch (save_every can land on the epoch's last step): the epoch's
        # evaluation, if it ran before the crash, runs again
        metrics_log.drop_records(lambda r: "eval_loss" in r and r.get("epoch") == state["epoch"])
    job = _FinetuneJob(cfg, task, model, opt, procs, tok, train_feats, eval_feats, eval_ex, metrics_log, log,
                       procs.autocast(precision), state, out)
    per_epoch = math.ceil(len(train_feats) / cfg.batch_size)
    total = per_epoch * cfg.epochs if not cfg.budget else None
    warmup = max(1, int(cfg.warmup * total)) / total if total else cfg.warmup  # as transformers' linear schedule counts it
    loop = run.loop(job, steps=total, warmup=warmup, how_to_continue="continue with the same command and --resume",
                    non_finite=STOP, schedule_can_change=False, on_step=on_step)
    model.train()
    loop.run()
    if not procs.main:
        return None
    return _finish(cfg, run, job, loop, len(train_ex), len(eval_ex), precision)


def _finish(cfg: FinetuneConfig, run: Run, job: _FinetuneJob, loop: Loop, n_train: int, n_eval: int,
            precision: str) -> dict:
    """The closing files: the best epoch's model is in OUT already (or the last one, when no
    epoch had a number to compare), the curves and summary.json; the checkpoints go."""
    task, out = job.task, run.out
    note = None
    if job.best_epoch == 0:
        # no epoch had a number to compare: the run still ends as a model folder (the last model)
        job.best_epoch = len(job.history)
        save_task_model(job.model, task, job.tok, out)
        note = (f"the evaluation {task.primary_metric} was not a number (NaN) after every epoch; "
                f"saved the last epoch's model (epoch {job.best_epoch})")
        run.log(note)
    records = run.metrics.records()
    summary = {"task": cfg.task, "best_epoch": job.best_epoch, f"best_{task.primary_metric}": job.best,
               "best_metrics": job.history[job.best_epoch - 1], "epochs_run": len(job.history), "history": job.history,
               "train_examples": n_train, "eval_examples": n_eval, "steps": loop.step,
               "skipped_steps": loop.guard.skipped, "train_s": run.clock(), "processes": run.procs.world,
               "pairs_per_s": sum(r.get("pairs_per_s", 0) for r in records if "pairs_per_s" in r)
               / max(1, sum(1 for r in records if "pairs_per_s" in r)),
               "device": str(run.procs.device), "precision": precision, "config": dataclasses.asdict(cfg)}
    if note:
        summary["note"] = note
    run.finish(summary, [("loss", "train"), ("eval_loss", "eval")],
               f"fine-tuning {cfg.task} from {Path(cfg.model).name}")
    # the run is complete and its model in OUT: the checkpoints (weights and optimizer) only served a resume
    shutil.rmtree(out / "checkpoints", ignore_errors=True)
    return summary
