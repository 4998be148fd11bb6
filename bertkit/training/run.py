"""The run driver every training job runs under (pretraining/train.py, finetune.py).

A job checks its own `--out` and prepares its data and model; the driver owns what every run
does around the one Loop: its processes, clock and log lines, the options a resume must not
change, restoring a checkpoint's optimizer, RNG and clock, seeding, the metrics log, the Loop
itself, and the closing plot and summary.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from tqdm import tqdm

from ..errors import BertkitError
from .checkpoints import read_state, restore_rng
from .distributed import init_processes
from .log import MetricsLog, plot_losses, write_json
from .loop import MAX_BAD_STEPS, ROLL_BACK, Loop, RunClock, changed_options, seed_rank


def run_log(enabled: bool):
    """A run's notes on stderr, above the progress bar (rank 0 alone; none without --progress)."""
    if not enabled:
        return lambda msg: None
    return lambda msg: tqdm.write(f"bertkit: {msg}", file=sys.stderr)


def exact_options(cfg) -> dict:
    """The options of a config that a resume must not change (its class's EXACT), and the digests
    of the inputs it must find unchanged."""
    return {**{k: getattr(cfg, k) for k in type(cfg).EXACT}, **cfg.digests()}


def refuse_changed(saved: dict, cfg, where: str, subject) -> None:
    """Options recorded `where` ("in the checkpoint") that differ from cfg's are refused by name."""
    changed = changed_options(saved, exact_options(cfg), where)
    if changed:
        raise BertkitError(f"{subject}: cannot resume exactly with changed options ({'; '.join(changed)})")


def restore_state(ckpt: Path, opt, procs) -> dict:
    """A checkpoint's optimizer and this rank's RNG (where it has one); returns its trainer.json.
    The weights are the job's to load: they live in its own files."""
    state, tensors = read_state(ckpt)
    opt.load_state_dict(tensors["optimizer"])
    if procs.rank < len(tensors["torch_rng"]):
        restore_rng(tensors, procs.rank, procs.device)
    return state


class Run:
    """One training run in `cfg.out`: `cfg` is a job's config (RunOptions and its own fields,
    with EXACT naming what a resume must keep). `timer` is the run's clock in seconds (tests
    drive a budget with their own)."""

    def __init__(self, cfg, timer=time.perf_counter):
        self.cfg = cfg
        self.clock = RunClock(timer)
        self.procs = init_processes()
        self.log = run_log(cfg.progress and self.procs.main)
        self.state: dict | None = None  # trainer.json of the checkpoint resumed
        self.metrics: MetricsLog | None = None

    @property
    def out(self) -> Path:
        return Path(self.cfg.out)

    def resume(self, ckpt: Path, opt) -> dict:
        """The optimizer, RNG and spent seconds of a checkpoint (its weights already loaded)."""
        self.state = restore_state(ckpt, opt, self.procs)
        self.clock.spent = self.state["elapsed_s"]
        return self.state

    def start(self, tensorboard: bool = False) -> MetricsLog | None:
        """Each rank's dropout seed, then the metrics log (rank 0), continued after a resume."""
        seed_rank(self.procs, self.cfg.seed, self.state, self.log)
        if self.procs.main:
            step = self.state["step"] if self.state else None
            self.metrics = MetricsLog(self.out, tensorboard, resume_step=step)
        return self.metrics

    def loop(self, job, *, steps: int | None, warmup: float, how_to_continue: str, non_finite: str = ROLL_BACK,
             schedule_can_change: bool = True, on_step=None) -> Loop:
        """The Loop over `job` under the run's shared options."""
        cfg = self.cfg
        return Loop(job, self.procs, self.out, lr=cfg.lr, warmup=warmup, clip=cfg.clip, steps=steps, budget=cfg.budget,
                    clock=self.clock, save_every=cfg.save_every, keep_checkpoints=cfg.keep_checkpoints,
                    log_every=cfg.log_every, options=exact_options(cfg), metrics=self.metrics, log=self.log,
                    progress=cfg.progress, how_to_continue=how_to_continue, non_finite=non_finite,
                    max_bad_steps=MAX_BAD_STEPS, resumed=self.state, schedule_can_change=schedule_can_change,
                    on_step=on_step)

    def finish(self, summary: dict, curves: list[tuple[str, str]], title: str) -> dict:
        """The closing files (rank 0): loss.png from the metrics log, summary.json."""
        plot_losses(self.metrics.records(), self.out / "loss.png", curves, title)
        write_json(self.out / "summary.json", summary)
        self.metrics.close()
        return summary
