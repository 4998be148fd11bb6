"""One training loop for every job: pretraining (pretraining/train.py) and fine-tuning (finetune.py).

A job supplies what differs: its batches and where they stand, the gradients of one batch with
their statistics, what follows a step (pretraining's evaluation every N steps) or an epoch
(fine-tuning's evaluation, best model and patience), and what a checkpoint holds. The loop owns
the rest, once: the learning rate by steps or by the elapsed share of a time budget, the guard
against non-finite steps (roll back to the last checkpoint at half the rate, or stop), timing
and the stop test, the log window, the progress bar, checkpoints, SIGINT/SIGTERM and lost
torchrun peers.
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..errors import BertkitError
from .checkpoints import latest_checkpoint, save_checkpoint
from .distributed import Processes
from .log import MetricsLog, progress_bar
from .signals import StopSignals
from .step import Guard, clipped_step, lr_factor, set_lr

ROLL_BACK, STOP = "roll back", "stop"  # what `max_bad_steps` non-finite steps in a row do
MAX_BAD_STEPS = 5  # non-finite steps in a row before a roll-back or a stop: skipping more will not help


class RunClock:
    """A run's seconds: those spent before a resume, then this process's since it began (data
    preparation counts). `timer` is injectable: tests drive the budget with a fake clock."""

    def __init__(self, timer: Callable[[], float] = time.perf_counter):
        self.timer, self.spent, self.t0 = timer, 0.0, timer()

    def __call__(self) -> float:
        return self.spent + self.timer() - self.t0


@dataclass
class StepResult:
    """One optimizer step's gradients, as a job computed them."""
    loss: float | None                 # the global batch's loss; None: nothing in it had a target
    sums: dict = field(default_factory=dict)  # added into the log window when the step is applied
    examples: int = 0                  # pairs or examples in the global batch


class Job:
    """What a training run supplies to the Loop. `model` is what the optimizer `opt` steps (its
    gradients are clipped), `sums` the names of the figures `gradients` returns, summed over the
    log window; `record` turns them into a metrics record's fields."""
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    sums: tuple[str, ...] = ("loss",)
    epoch_checkpoints = False  # True: each epoch's end, and the run's, is a checkpoint (after end_epoch)

    def next_batch(self, loop: "Loop"):
        raise NotImplementedError

    def gradients(self, batch) -> StepResult:
        raise NotImplementedError

    def record(self, window: dict) -> dict:
        return {}

    def postfix(self, record: dict) -> dict:
        return {"loss": f"{record['loss']:.4f}"}

    def after_step(self, loop: "Loop") -> None:
        """After a step's log record, before its checkpoint (an evaluation every N steps)."""

    def epoch_done(self, loop: "Loop") -> bool:
        """An epoch's end is due: end_epoch runs before the next step."""
        return False

    def end_epoch(self, loop: "Loop") -> bool:
        """The epoch's evaluation and policy; True stops the run (patience)."""
        return False

    def save(self, folder: Path) -> None:
        """The model files of a checkpoint."""
        raise NotImplementedError

    def state(self) -> dict:
        """Where the job stands (data position ...), for the checkpoint's trainer.json."""
        return {}

    def restore(self, ckpt: Path) -> dict:
        """Back to a checkpoint (a roll-back): weights, optimizer, RNG, data position; its trainer.json."""
        raise NotImplementedError

    def diverged(self, loop: "Loop") -> str:
        return (f"step {loop.step}: {loop.guard.in_a_row} steps in a row had a non-finite loss or gradient "
                f"({loop.guard.skipped} skipped in all): training diverged; lower --lr")


def changed_options(saved: dict, now: dict, where: str) -> list[str]:
    """The options a run was started with that differ now, each as 'name: then WHERE vs now now'."""
    return [f"{k}: changed since the run began" if k.startswith("content of ") else f"{k}: {v!r} {where} vs "
            f"{now.get(k)!r} now" for k, v in saved.items() if v != now.get(k)]


def seed_rank(procs: Processes, seed: int, state: dict | None, log) -> None:
    """After the weights are built: each rank's own dropout masks. A resumed run's RNG comes from
    its checkpoint, unless it was written by another number of processes: then the same global
    batches and schedule go on with new masks."""
    if state is None:
        if procs.rank:
            torch.manual_seed(seed + procs.rank)
    elif state.get("world_size", 1) != procs.world:
        torch.manual_seed(seed + 1000 * state["step"] + procs.rank)
        log(f"the checkpoint was written by {state.get('world_size', 1)} process(es), resumed in {procs.world}: "
            "the same global batches and schedule; new dropout masks")


class Loop:
    """Runs a Job: `steps` optimizer steps (warm-up over their `warmup` share), or as many as fit
    in `budget` seconds of `clock` (the schedule follows the elapsed share). `resumed` is the
    trainer.json of the checkpoint the run continues (the job restored its own part);
    schedule_can_change: a resume may bring another budget or step count (pretraining), so a
    final checkpoint ends the run only under the schedule it was written with; non_finite:
    ROLL_BACK (to the last checkpoint at half the lr) or STOP after `max_bad_steps` in a row."""

    def __init__(self, job: Job, procs: Processes, out: Path, *, lr: float, warmup: float, clip: float,
                 steps: int | None, budget: float | None, clock: RunClock, save_every: int, keep_checkpoints: int,
                 log_every: int, options: dict, metrics: MetricsLog | None, log, progress: bool,
                 how_to_continue: str, non_finite: str = ROLL_BACK, max_bad_steps: int = MAX_BAD_STEPS,
                 resumed: dict | None = None, schedule_can_change: bool = True, on_step=None):
        self.job, self.procs, self.out, self.clock = job, procs, out, clock
        self.lr, self.warmup, self.clip, self.steps, self.budget = lr, warmup, clip, steps, budget
        self.save_every, self.keep, self.log_every, self.options = save_every, keep_checkpoints, log_every, options
        self.metrics, self.log, self.progress, self.how_to_continue = metrics, log, progress, how_to_continue
        self.non_finite, self.on_step = non_finite, on_step
        self.guard = Guard(max_bad_steps)
        self.step, self.lr_scale, self.last = 0, 1.0, False
        self.window = self._fresh_window()
        state = resumed or {}
        if resumed is not None:
            self.step, self.lr_scale = state["step"], state.get("lr_scale", 1.0)
            self.guard.load(state.get("guard", {}))  # skipped_steps as logged; a run of bad steps across the stop
            self.window = self._fresh_window(state)
        # where the budget's schedule ends and the times it leaves room for: a resumed run goes on with
        # them (from the full budget again, its lr rose until the first evaluation and save); a
        # resumption with another budget, or with steps, starts them afresh
        same = state if state.get("budget") == budget and state.get("steps") == steps else {}
        self.end = same.get("schedule_end", budget)
        self.step_s, self.eval_s, self.save_s = (same.get(k, 0.0) for k in ("step_s", "eval_s", "save_s"))
        # resumed from the final checkpoint: nothing is left to train (a step at lr 0 would still move
        # AdamW's moments and log a step past the end)
        self.finished = bool((same if schedule_can_change else state).get("finished"))
        start = state.get("start_s", 0.0) if resumed is not None else clock()  # when the first step began
        (self.start_s, self.now), _ = procs.agree_with_rank_0([start, clock()], False)
        if budget and self.start_s >= budget:
            raise BertkitError(f"data preparation took {self.start_s:.0f} s, the whole budget of {budget:.0f} s")

    # ---- the parts of a step ----
    def _fresh_window(self, state: dict | None = None) -> dict:
        """An empty log window, or the one a checkpoint saved (the steps since its last record: the
        next record is their mean); a checkpoint's of another shape (an older version) is not used."""
        window = {**{k: 0.0 for k in self.job.sums}, "steps": 0, "examples": 0, "compute": 0.0, "lr": 0.0}
        saved = (state or {}).get("window")
        return dict(saved) if isinstance(saved, dict) and saved.keys() == window.keys() else window

    def closing_s(self) -> float:
        """What the run needs after its last step: the final evaluation and two saves."""
        return self.eval_s + 2 * self.save_s

    def done_share(self) -> float:
        """The share of the schedule behind the run (steps, or the budget's seconds)."""
        if self.budget:
            return (self.now - self.start_s) / max(1e-9, self.end - self.start_s)
        return self.step / self.steps

    def _lr(self) -> float:
        if self.budget:
            # the schedule spans the budget after the first run's data preparation and before the closing
            # work, so the lr reaches 0 as training ends (it only ever moves earlier: a faster save
            # must not raise the lr again)
            self.end = min(self.end, self.budget - self.closing_s())
            factor = lr_factor(self.now - self.start_s, self.end - self.start_s, self.warmup,
                               self.step_s or self.budget / 1000)
        else:
            factor = lr_factor(self.step, self.steps, self.warmup, 1)
        return self.lr * factor * self.lr_scale  # lr_scale: halved by each roll-back

    def write_window(self) -> None:
        """The training figures of the steps since the last record (rank 0), then a new window."""
        w = self.window
        if not (self.procs.main and w["steps"]):
            return
        record = {"step": self.step, "loss": w["loss"] / w["steps"], **self.job.record(w), "lr": w["lr"],
                  "elapsed_s": self.clock(), "pairs_per_s": w["examples"] / max(1e-9, w["compute"]),
                  "skipped_steps": self.guard.skipped}
        self.metrics.write(record)
        self.bar.set_postfix(**self.job.postfix(record))
        self.window = self._fresh_window()

    @contextlib.contextmanager
    def timed(self, what: str):
        """`with loop.timed("eval_s"):` the closing work's duration, which the budget leaves room for."""
        with self.bar_paused():
            t0 = self.clock.timer()
            yield
            setattr(self, what, self.clock.timer() - t0)

    @contextlib.contextmanager
    def bar_paused(self):
        """Work between steps (evaluation, checkpoints): the progress bar's clock stops, so its
        rate and ETA are the steps' own."""
        bar = getattr(self, "bar", None)
        if bar is not None:
            bar.refresh()  # its last draw is now: unpause() drops the time since
        yield
        if bar is not None:
            bar.unpause()

    def save(self, finished: bool) -> None:
        rng = self.procs.rng_states()  # every rank's, for an exact resume
        if self.procs.main:
            with self.timed("save_s"):
                save_checkpoint(self.out, self.step, self.job.save,
                                {"optimizer": self.job.opt.state_dict(), "torch_rng": rng[0], "cuda_rng": rng[1]},
                                {**self.job.state(), "elapsed_s": self.clock(), "start_s": self.start_s,
                                 "lr_scale": self.lr_scale, "world_size": self.procs.world, "options": self.options,
                                 "budget": self.budget, "steps": self.steps, "schedule_end": self.end,
                                 "step_s": self.step_s, "eval_s": self.eval_s, "save_s": self.save_s,
                                 "guard": self.guard.state(), "window": dict(self.window), "finished": finished},
                                self.keep)
        self.procs.barrier()

    def _roll_back(self) -> None:
        """`max_bad_steps` non-finite steps in a row: back to the last checkpoint at half the lr."""
        good = latest_checkpoint(self.out)
        if good is None:
            raise BertkitError(f"step {self.step + 1}: {self.guard.limit} steps in a row with a non-finite loss or "
                               "gradient and no checkpoint to return to; lower --lr")
        state = self.job.restore(good)
        self.step, self.lr_scale = state["step"], self.lr_scale / 2
        self.guard.in_a_row = 0
        self.window = self._fresh_window(state)  # the steps undone are not logged (those before the checkpoint are)
        self.log(f"{self.guard.limit} non-finite steps in a row: back to {good.name} with the learning rate "
                 f"x{self.lr_scale:g}")
        if self.procs.main:
            self.metrics.drop_after(self.step)  # ... and their records go: the steps run again
            self.metrics.write({"step": self.step, "rolled_back_to": good.name, "lr_scale": self.lr_scale,
                                "skipped_steps": self.guard.skipped, "elapsed_s": self.clock()})

    # ---- the loop ----
    def run(self) -> None:
        procs, job = self.procs, self.job
        signals = StopSignals()  # SIGINT (Ctrl-C) and SIGTERM end the run after the current step, with a checkpoint
        signals.install()
        total = round(self.budget or self.steps)
        # a budget's bar counts seconds, never past its total: the last step, evaluation and save may
        # end after the budget (a slow step, a busy machine), and tqdm formats a count past its total
        # without one, which the bar format below cannot print (a traceback at the end, the model unsaved)
        self.bar = progress_bar(self.progress and procs.main, total=total,
                                initial=min(round(self.clock.spent), total) if self.budget else self.step,
                                unit="s" if self.budget else "step", dynamic_ncols=True,
                                bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} s{postfix}" if self.budget else None)
        try:
            while not self.finished:
                if job.epoch_done(self):
                    with self.bar_paused():
                        self.last = job.end_epoch(self) or self.last
                        if job.epoch_checkpoints:
                            self.save(finished=self.last)
                    if self.last:
                        break
                    continue
                if self.last or (self.steps is not None and self.step >= self.steps):
                    break
                lr = self._lr()
                set_lr(job.opt, lr)
                batch = job.next_batch(self)
                t0 = self.clock.timer()
                result = job.gradients(batch)
                # checked before opt.step: a NaN/inf loss or gradient never reaches the weights (nor AdamW's
                # moments); such a step is skipped. A batch with no target steps on zero gradients, unlogged
                finite, _ = clipped_step(job.model, job.opt, self.clip,
                                         result.loss is None or math.isfinite(result.loss), self.guard)
                if not finite and self.non_finite == ROLL_BACK and self.guard.in_a_row >= self.guard.limit:
                    self._roll_back()
                    continue
                self.step += 1
                took = self.clock.timer() - t0
                # smoothed: one slow step must not end a budget early
                self.step_s = 0.8 * self.step_s + 0.2 * took if self.step_s else took
                if not finite:
                    self.log(f"step {self.step}: the loss or gradient norm is not finite; step skipped "
                             f"({self.guard.skipped} so far)")
                    if self.non_finite == STOP and self.guard.in_a_row >= self.guard.limit:
                        raise BertkitError(job.diverged(self))
                elif result.loss is not None:
                    for k, v in result.sums.items():
                        self.window[k] += v
                    self.window["steps"] += 1
                    self.window["examples"] += result.examples
                    self.window["lr"] = lr  # the last step's
                self.window["compute"] += took
                # rank 0's clock and anyone's signal: every rank stops at the same step
                (self.now, self.step_s, self.eval_s, self.save_s), interrupted = procs.agree_with_rank_0(
                    [self.clock(), self.step_s, self.eval_s, self.save_s], bool(signals))
                self.bar.update(min(round(self.now), total) - self.bar.n if self.budget else 1)
                # a budgeted run stops when one more step and the closing work would not fit
                self.last = (self.step >= self.steps if self.steps is not None
                             else self.now + self.step_s > self.budget - self.closing_s())
                if self.step % self.log_every == 0 or self.last or job.epoch_done(self):
                    self.write_window()
                job.after_step(self)
                if ((self.save_every and self.step % self.save_every == 0) or interrupted
                        or (self.last and not job.epoch_checkpoints)):
                    # (a job with epoch checkpoints has its epoch's end still to run)
                    self.save(finished=self.last and not job.epoch_checkpoints)
                if interrupted:
                    signals.stop(self.step, self.how_to_continue)
                if self.on_step is not None:
                    self.on_step(self.step, job.model)
        except RuntimeError as e:
            procs.lost_peer(e, self.out)
            raise
        finally:
            self.bar.close()
            signals.restore()
