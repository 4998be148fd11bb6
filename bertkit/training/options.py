"""The options every training run shares: one dataclass that PretrainConfig and FinetuneConfig
embed (as their base), its checks, and the command-line flags made from it, so that both
commands spell, document and refuse them alike. Importing it does not import torch (the CLI
builds its parser from it)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from ..errors import BertkitError
from ..precision import TRAINING_PRECISIONS


def _option(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass(kw_only=True)
class RunOptions:
    """None: the job's default (pretraining's recipe, fine-tuning's task)."""
    budget: str | float | None = _option(None, "wall-clock budget, e.g. 90s, 10m, 1.5h; warm-up and decay follow "
                                               "its elapsed share")
    lr: float | None = _option(None, "peak learning rate")
    warmup: float | None = _option(None, "share of the run warming up, then linear decay to 0")
    weight_decay: float = _option(0.01, "AdamW's, not on biases and LayerNorm (default 0.01)")
    clip: float = _option(1.0, "gradient norm clipped to (default 1.0)")
    grad_accum: int = _option(1, "micro-batches per step; the batch size stays the same (default 1)")
    seed: int = _option(0, "weights, data order, masks and dropout (default 0)")
    save_every: int | None = _option(None, "steps between checkpoints")
    keep_checkpoints: int = _option(2, "checkpoints kept, the newest (default 2)")
    log_every: int = _option(10, "steps between metrics lines (default 10)")
    resume: bool = _option(False, "continue the run in --out from its last checkpoint")
    progress: bool = True
    # the steps' precision: "auto" is bf16 autocast on a GPU and on a CPU with native bf16 (AMX or
    # AVX512_BF16), else fp32; weights and optimizer state stay fp32
    precision: str = _option("auto", "the training steps' precision (default auto: bf16 autocast on a GPU and on "
                                     "a CPU with native bf16 matmuls, AMX or AVX512_BF16, else fp32; weights and "
                                     "optimizer state stay fp32)")

    def check_run_options(self) -> None:
        """Refuse a bad shared option by its flag (the job's defaults filled in first)."""
        from .step import check_seed, parse_duration  # (torch: the CLI imports this module without it)
        check_seed(self.seed)
        for name in ("grad_accum", "keep_checkpoints", "log_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BertkitError(f"{flag(name)} must be an integer of at least 1, got {value!r}")
        if isinstance(self.save_every, bool) or not isinstance(self.save_every, int) or self.save_every < 0:
            raise BertkitError(f"--save-every must be at least 0 (0: only at the end), got {self.save_every!r}")
        for name, ok, what in (("lr", lambda v: v > 0, "a finite number above 0"),
                               ("clip", lambda v: v > 0, "a finite number above 0"),  # 0: every gradient 0
                               ("warmup", lambda v: 0 <= v <= 1, "a number from 0 to 1"),
                               ("weight_decay", lambda v: v >= 0, "a finite number of at least 0")):
            value = getattr(self, name)
            number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not (number and ok(value)):
                raise BertkitError(f"{flag(name)} must be {what}, got {value!r}")
        if self.budget is not None:
            self.budget = parse_duration(self.budget)
        if self.precision not in TRAINING_PRECISIONS:
            raise BertkitError(f"--precision must be one of {', '.join(TRAINING_PRECISIONS)}, got {self.precision!r}")


def flag(name: str) -> str:
    """An option's flag, as errors name it."""
    return "--" + name.replace("_", "-")


def add_run_flags(parser, **helps: str) -> None:
    """RunOptions' flags on a command's parser: each with the dataclass's help, then what `helps`
    adds for this command (its defaults). Every flag defaults to None: the config's default applies."""
    for f in dataclasses.fields(RunOptions):
        if "help" not in f.metadata:
            continue
        text = f.metadata["help"] + (f"; {helps[f.name]}" if f.name in helps else "")
        if f.name == "resume":
            parser.add_argument(flag(f.name), action="store_true", default=None, help=text)
        elif f.name == "precision":
            parser.add_argument(flag(f.name), choices=list(TRAINING_PRECISIONS), help=text)
        else:
            kind = int if f.type.startswith("int") else float if f.type.startswith("float") else str
            parser.add_argument(flag(f.name), type=kind, help=text)


def run_flags(args) -> dict:
    """The RunOptions a command line gave (those left out are not in the dict)."""
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(RunOptions)
            if getattr(args, f.name, None) is not None}
