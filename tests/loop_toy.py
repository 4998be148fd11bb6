"""A toy job for the training loop's tests (test_loop.py), importable by a torchrun script:
least squares on 64 fixed rows, batches drawn from (epoch, batch), a dropout-like input mask
(so a resume must restore the RNG), and a fake clock each step advances by one second."""
from __future__ import annotations

from pathlib import Path

import torch

from bertkit.training.checkpoints import read_state, restore_rng
from bertkit.training.distributed import gradient_sync, micro_batches
from bertkit.training.loop import Job, Loop, RunClock, StepResult


class FakeTimer:
    """The loop's timer: only the toy job moves it (1 s a step, `save_s` a checkpoint)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class ToyJob(Job):
    def __init__(self, procs, timer: FakeTimer, *, rows: int = 64, batch_size: int = 8, grad_accum: int = 1,
                 poison: tuple = (), epochs: bool = False, patience: int | None = None, save_s: float = 0.0,
                 dropout: bool = True):
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 1)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=0.0, weight_decay=0.0)
        self.net = procs.wrap(self.model)
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(rows, 4, generator=g)
        self.y = self.x @ torch.tensor([1.0, -2.0, 3.0, 0.5]) + 0.1 * torch.randn(rows, generator=g)
        self.procs, self.timer, self.batch_size, self.grad_accum = procs, timer, batch_size, grad_accum
        self.poison, self.calls, self.save_s = set(poison), 0, save_s  # calls of gradients() whose loss is NaN
        self.epoch_checkpoints, self.patience, self.dropout = epochs, patience, dropout
        self.epoch, self.batch, self.per_epoch = 1, 0, rows // batch_size
        self.evals, self.stale, self.best = [], 0, None

    def next_batch(self, loop):
        if self.batch == self.per_epoch:  # (a job without epoch ends runs on into the next epoch)
            self.epoch, self.batch = self.epoch + 1, 0
        order = torch.randperm(len(self.x), generator=torch.Generator().manual_seed(self.epoch))
        self.batch += 1
        return order[(self.batch - 1) * self.batch_size:self.batch * self.batch_size]

    def gradients(self, rows) -> StepResult:
        self.calls += 1
        self.timer.now += 1.0
        world, rank = self.procs.world, self.procs.rank
        mine = rows.chunk(world)[rank]
        batch = {"x": self.x[mine], "y": self.y[mine]}
        total = torch.zeros((), dtype=torch.float64)
        for mb, last in micro_batches(batch, self.grad_accum):
            with gradient_sync(self.net, world, last):
                keep = (torch.rand(mb["x"].shape) > 0.1).float() if self.dropout else 1.0  # the RNG matters
                err = (self.net(mb["x"] * keep).squeeze(-1) - mb["y"]) ** 2
                loss = err.sum() / len(rows) * world  # the global batch's mean (DDP averages over ranks)
                loss.backward()
            total += err.detach().double().sum()
        if world > 1:
            torch.distributed.all_reduce(total)
        value = float(total) / len(rows)
        if self.calls in self.poison:
            for p in self.model.parameters():
                p.grad.fill_(float("nan"))
            value = float("nan")
        return StepResult(value, {"loss": value}, len(rows))

    def record(self, window: dict) -> dict:
        return {"epoch": self.epoch}

    def epoch_done(self, loop) -> bool:
        return self.epoch_checkpoints and (self.batch == self.per_epoch or loop.last)

    def end_epoch(self, loop) -> bool:
        with torch.no_grad():
            score = round(-float(((self.model(self.x).squeeze(-1) - self.y) ** 2).mean()), 1)
        self.evals.append((self.epoch, loop.step))
        if self.best is None or score > self.best:
            self.best, self.stale = score, 0
        else:
            self.stale += 1
        self.epoch, self.batch = self.epoch + 1, 0
        return self.patience is not None and self.stale >= self.patience

    def save(self, folder: Path) -> None:
        self.timer.now += self.save_s
        torch.save(self.model.state_dict(), folder / "model.pt")

    def state(self) -> dict:
        return {"epoch": self.epoch, "batch": self.batch, "calls": self.calls, "best": self.best, "stale": self.stale,
                "evals": self.evals}

    def restore(self, ckpt: Path) -> dict:
        state, tensors = read_state(ckpt)
        self.model.load_state_dict(torch.load(ckpt / "model.pt", weights_only=True))
        self.opt.load_state_dict(tensors["optimizer"])
        restore_rng(tensors, self.procs.rank, self.procs.device)
        self.epoch, self.batch = state["epoch"], state["batch"]
        self.best, self.stale, self.evals = state["best"], state["stale"], [tuple(e) for e in state["evals"]]
        return state


def run(procs, out: Path, *, resume: bool = False, timer: FakeTimer | None = None, job_options: dict | None = None,
        **loop_options):
    """The toy job under the Loop in OUT (resumed from its last checkpoint): (job, loop)."""
    from bertkit.training.checkpoints import latest_checkpoint
    from bertkit.training.log import MetricsLog
    timer = timer or FakeTimer()
    clock = RunClock(timer)
    job = ToyJob(procs, timer, **(job_options or {}))
    state = None
    if resume:
        state = job.restore(latest_checkpoint(out))
        clock.spent = state["elapsed_s"]
        job.calls = state["calls"]
    out.mkdir(parents=True, exist_ok=True)
    metrics = MetricsLog(out, resume_step=state["step"] if state else None) if procs.main else None
    options = dict(lr=0.1, warmup=0.1, clip=1.0, steps=20, budget=None, save_every=5, keep_checkpoints=2,
                   log_every=1, options={"toy": 1}, progress=False, how_to_continue="resume it")
    options.update(loop_options)
    loop = Loop(job, procs, out, clock=clock, metrics=metrics, log=lambda msg: None, resumed=state, **options)
    loop.run()
    return job, loop
