"""What a training run leaves behind: OUT/metrics.jsonl, OUT/summary.json, OUT/loss.png, and
TensorBoard events on request; and the progress bar it shows. Shared by pretraining and fine-tuning."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from tqdm import tqdm

from ..files import write_file

# where stderr is a file or a pipe, the bar is a line this often (and its last state at the end)
LOG_EVERY_S = 30.0


class TimedLines:
    """tqdm's stream where stderr is not a terminal: a bar redrawn in place (carriage returns)
    would pile up in a log, a thousand redraws for a ten-minute run. Each redraw becomes at most
    one whole line per `every` seconds, and the last one is written when the bar closes; a line
    the same as the one before it is not written again."""

    def __init__(self, stream, every: float = LOG_EVERY_S, clock=time.monotonic):
        self.stream, self.every, self.clock = stream, every, clock
        self.last, self.pending, self.written = None, None, None

    def write(self, s: str) -> None:
        line = s.replace("\r", "").strip()
        if not line:
            if "\n" in s and self.pending:  # the newline that closes the bar: its last state, if not written yet
                self._line(self.pending)
                self.pending = None
            return
        now = self.clock()
        if self.last is None or now - self.last >= self.every:
            self._line(line)
            self.last, self.pending = now, None
        else:
            self.pending = line

    def _line(self, line: str) -> None:
        if line != self.written:
            self.stream.write(line + "\n")
            self.written = line

    def flush(self) -> None:
        self.stream.flush()


def progress_bar(enabled: bool, **kwargs) -> tqdm:
    """tqdm on stderr: live in a terminal, else a line every LOG_EVERY_S seconds (TimedLines)."""
    stream = sys.stderr
    if enabled and not stream.isatty():
        kwargs = {**kwargs, "file": TimedLines(stream), "dynamic_ncols": False, "ncols": 100}
    return tqdm(disable=not enabled, **kwargs)


class MetricsLog:
    def __init__(self, out: Path, tensorboard: bool = False, resume_step: int | None = None):
        self.path = out / "metrics.jsonl"
        if resume_step is not None and self.path.exists():
            self.drop_after(resume_step)  # a resumed run repeats the steps after its checkpoint
        elif resume_step is None:
            write_file(self.path, "")  # a link left in --out is replaced, never written through
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter
            self.writer = SummaryWriter(str(out / "tensorboard"), purge_step=resume_step)

    def drop_after(self, step: int) -> None:
        """Drop the lines of the steps after `step` (a run returned to an earlier checkpoint)."""
        self.drop_records(lambda record: record.get("step", 0) > step)

    def drop_records(self, unwanted) -> None:
        """Drop the records for which unwanted(record) is true, and any line torn by a crash."""
        def keep(line: str) -> bool:
            try:
                return not unwanted(json.loads(line))
            except (ValueError, AttributeError):  # torn: not JSON, or not an object
                return False
        lines = [line for line in self.path.read_text().splitlines() if line.strip() and keep(line)]
        self.path.write_text("".join(line + "\n" for line in lines))

    def write(self, record: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self.writer is not None:
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)):
                    self.writer.add_scalar(k, v, record["step"])

    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def plot_losses(records: list[dict], path: Path, curves: list[tuple[str, str]], title: str) -> None:
    """One line per (key, label) over the steps where the key was logged."""
    # a Figure of its own, not pyplot's: no backend switched under the caller (a notebook keeps its
    # own), and pyplot's import (0.6 s) is not paid at the end of every run
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.2))
    ax = fig.subplots()
    for key, label in curves:
        pts = [(r["step"], r[key]) for r in records if key in r]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, label=label, marker="o" if len(pts) < 30 else None, markersize=3)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    tmp.replace(path)
