"""What every optimizer step shares: clipping, the guard against non-finite losses and
gradients, and the learning-rate schedule (by steps or by the elapsed share of a time budget)."""
from __future__ import annotations

import math

import torch


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
