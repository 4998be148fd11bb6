"""Stopping a run cleanly on SIGINT (Ctrl-C) and SIGTERM: the current step ends, a checkpoint is
written, and the run says how to continue."""
from __future__ import annotations

import signal
import threading

from ..errors import Interrupted


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
