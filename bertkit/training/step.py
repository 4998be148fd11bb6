"""What every optimizer step shares: clipping, the guard against non-finite losses and
gradients, the learning-rate schedule (by steps or by the elapsed share of a time budget), and
stopping cleanly on SIGINT / SIGTERM."""
from __future__ import annotations

import math
import signal
import threading

import torch

from ..errors import BertkitError, Interrupted


def parse_duration(value) -> float:
    """Seconds from 600, "600", "90s", "10m" or "1.5h"."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        text = str(value).strip().lower()
        unit = {"s": 1, "m": 60, "h": 3600}.get(text[-1:], None)
        try:
            seconds = float(text[:-1] if unit else text) * (unit or 1)
        except ValueError:
            raise BertkitError(f"budget {value!r}: expected a duration such as 90s, 10m or 1.5h") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise BertkitError(f"budget {value!r}: must be a positive duration")
    return seconds


MAX_SEED = 2**32 - 1  # the runs derive seeds from it (seed x 1000 + epoch ...), all within torch's 64 bits


def check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise BertkitError(f"--seed must be an integer from 0 to {MAX_SEED} (2^32 - 1), got {seed!r}")
    return seed


def lr_factor(done: float, total: float, warmup: float, unit: float) -> float:
    """Share of the peak learning rate for the step that starts after `done` of `total` (steps
    or seconds): linear warm-up over the first `warmup` share, then linear decay to 0 at the end.
    `unit` is one step (1 step, or its expected seconds): warm-up lasts at least one."""
    w = max(unit, warmup * total)
    # capped at 1: a step starting just before the end of warm-up would otherwise overshoot
    return max(0.0, min(1.0, (done + unit) / w, (total - done) / max(unit, total - w)))


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr


class Guard:
    """Counts steps whose loss or gradient is not finite: such a step is never applied (nor does
    it reach AdamW's moments); `limit` of them in a row means the run diverged."""

    def __init__(self, limit: int = 5):
        self.limit, self.skipped, self.in_a_row = limit, 0, 0

    def record(self, finite: bool) -> bool:
        """True when the run must give up (or roll back)."""
        if finite:
            self.in_a_row = 0
            return False
        self.skipped += 1
        self.in_a_row += 1
        return self.in_a_row >= self.limit

    def state(self) -> dict:
        return {"skipped": self.skipped, "in_a_row": self.in_a_row}

    def load(self, state: dict) -> None:
        self.skipped, self.in_a_row = state.get("skipped", 0), state.get("in_a_row", 0)


def clipped_step(model: torch.nn.Module, opt: torch.optim.Optimizer, clip: float, loss_finite: bool,
                 guard: Guard) -> tuple[bool, float]:
    """Clip the gradients and apply them if the loss and their norm are finite; zero them either
    way. Returns (applied, gradient norm)."""
    norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)) if loss_finite else math.nan
    finite = loss_finite and math.isfinite(norm)
    if finite:
        opt.step()
    opt.zero_grad(set_to_none=True)
    guard.record(finite)
    return finite, norm


class StopSignals:
    """SIGINT (Ctrl-C) and SIGTERM while training: noted, so that the loop saves a checkpoint
    after the current step and stops. Outside the main thread (tests) nothing is installed."""

    def __init__(self):
        self.caught: list[int] = []
        self.previous = {}

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.previous[sig] = signal.signal(sig, lambda signum, frame: self.caught.append(signum))

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous = {}

    def __bool__(self) -> bool:
        return bool(self.caught)

    @property
    def first(self) -> signal.Signals:
        return signal.Signals(self.caught[0] if self.caught else signal.SIGTERM)

    def stop(self, step: int, how_to_continue: str) -> None:
        """End the run (the caller saved its checkpoint): one line and the signal's exit code."""
        raise Interrupted(f"stopped by {self.first.name} at step {step}; the checkpoint is saved: {how_to_continue}",
                          self.first)
