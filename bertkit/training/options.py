"""Options declared once. Each job's config is a dataclass whose fields carry their metadata
(option(): the help, whether a resume must keep it, argparse's choices); the command-line
flags, the TOML reader and the resume check are made from it. RunOptions holds the options
every training run shares. Importing this module does not import torch (the CLI builds its
parser from it)."""
from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from ..errors import BertkitError
from ..precision import TRAINING_PRECISIONS


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


REQUIRED = dataclasses.MISSING  # option(REQUIRED, ...): a field without a default


def option(default=None, help: str | None = None, *, exact: bool = False, **flag_args):
    """A config field declared once: `help` gives it a command-line flag (and its --help line),
    `exact` says a resume must keep it (a change is refused by name), `flag_args` go to
    argparse (choices; flag and const for a flag that stores a constant: --shuffled-batches)."""
    metadata = {"exact": exact, **({"help": help} if help is not None else {}), **flag_args}
    if default is REQUIRED:
        return field(metadata=metadata)
    if callable(default):  # a default made anew for each config (a dict)
        return field(default_factory=default, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(kw_only=True)
class RunOptions:
    """None: the job's default (pretraining's recipe, fine-tuning's task). RESUME_MAY_CHANGE: the
    exact options that a job lets a resume change (pretraining: the budget)."""
    RESUME_MAY_CHANGE: ClassVar[tuple[str, ...]] = ()
    TOML_TABLE: ClassVar[str] = "run"  # a --config file's table for this job's options
    budget: str | float | None = option(None, "wall-clock budget, e.g. 90s, 10m, 1.5h; warm-up and decay follow "
                                               "its elapsed share", exact=True)
    lr: float | None = option(None, "peak learning rate", exact=True)
    warmup: float | None = option(None, "share of the run warming up, then linear decay to 0", exact=True)
    weight_decay: float = option(0.01, "AdamW's, not on biases and LayerNorm (default 0.01)", exact=True)
    clip: float = option(1.0, "gradient norm clipped to (default 1.0)", exact=True)
    grad_accum: int = option(1, "micro-batches per step; the batch size stays the same (default 1)", exact=True)
    seed: int = option(0, "weights, data order, masks and dropout (default 0)", exact=True)
    save_every: int | None = option(None, "steps between checkpoints")
    keep_checkpoints: int = option(2, "checkpoints kept, the newest (default 2)")
    log_every: int = option(10, "steps between metrics lines (default 10)")
    resume: bool = option(False, "continue the run in --out from its last checkpoint")
    progress: bool = True
    # the steps' precision: "auto" is bf16 autocast on a GPU and on a CPU with native bf16 (AMX or
    # AVX512_BF16), else fp32; weights and optimizer state stay fp32
    precision: str = option("auto", "the training steps' precision (default auto: bf16 autocast on a GPU and on "
                                     "a CPU with native bf16 matmuls, AMX or AVX512_BF16, else fp32; weights and "
                                     "optimizer state stay fp32)", choices=TRAINING_PRECISIONS, exact=True)

    def check_run_options(self) -> None:
        """Refuse a bad shared option by its flag (the job's defaults filled in first)."""
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

    def digests(self) -> dict:
        """The content of the inputs the run depends on (a job's files and model folder), which a
        resume must find unchanged, as {name: digest}; none by default."""
        return {}

    def check_types(self) -> None:
        """A TOML or JSON value of the wrong type is an error naming the option, not a crash later."""
        kinds = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            allowed = tuple(t for name, ts in kinds.items() if name in str(f.type) for t in ts)
            # a TOML `steps = true` is no count (Python's bool is an int)
            if (isinstance(value, bool) and bool not in allowed) or (allowed and not isinstance(value, allowed)):
                raise BertkitError(f"option {f.name} ({flag(f.name)}): expected {f.type.replace(' | None', '')}, "
                                   f"got {value!r}")

    @classmethod
    def from_toml(cls, path: str | Path, command: dict | None = None, **overrides):
        """The run's options from a TOML file (top level or a table named as the command, e.g.
        [pretrain]); flags (overrides) win. command: the command's own options that the file may
        hold too (pretrain's no_samples), with their defaults; the file's values are written into it."""
        path = Path(path)
        command = {} if command is None else command
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise BertkitError(f"{path}: no such file") from None
        except OSError as e:  # a folder, unreadable
            raise BertkitError(f"{path}: cannot read the file ({e.strerror or e})") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise BertkitError(f"{path}: not valid TOML ({e})") from None
        raw = raw.get(cls.TOML_TABLE, raw)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values = {}
        for key, value in raw.items():
            name = key.replace("-", "_")
            if name in command:
                if type(value) is not type(command[name]):
                    raise BertkitError(f"{path}: option {name} ({flag(name)}): expected "
                                       f"{type(command[name]).__name__}, got {value!r}")
                command[name] = value
                continue
            if name not in fields:
                raise BertkitError(f"{path}: unknown key {key!r}; known keys: {', '.join([*fields, *command])}")
            values[name] = value
        try:
            return cls(**{**values, **{k: v for k, v in overrides.items() if v is not None}})
        except BertkitError as e:
            raise BertkitError(f"{path}: {e}") from None


def flag(name: str) -> str:
    """An option's flag, as errors name it."""
    return "--" + name.replace("_", "-")


def exact_names(cls) -> tuple[str, ...]:
    """The options of a config class that a resume must keep."""
    return tuple(f.name for f in dataclasses.fields(cls)
                 if f.metadata.get("exact") and f.name not in cls.RESUME_MAY_CHANGE)


def _kind(f: dataclasses.Field):
    """A field's Python type, read from its annotation (a string under `from __future__ import annotations`)."""
    text = str(f.type)
    return next((t for t in (bool, int, float) if text.startswith(t.__name__)), str)


def add_flags(parser, cls, skip: tuple[str, ...] = (), **helps: str) -> None:
    """The flags of a config class's fields that have a help, each with the field's help and then
    what `helps` adds for this command. Every flag defaults to None: the config's default applies."""
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if "help" not in meta or f.name in skip:
            continue
        text = meta["help"] + (f"; {helps[f.name]}" if f.name in helps else "")
        name = meta.get("flag", flag(f.name))
        if "const" in meta:  # a flag that sets the option to a constant (--shuffled-batches: group_by_length False)
            parser.add_argument(name, dest=f.name, action="store_const", const=meta["const"], default=None, help=text)
        elif _kind(f) is bool:
            parser.add_argument(name, dest=f.name, action="store_true", default=None, help=text)
        elif "choices" in meta:
            parser.add_argument(name, dest=f.name, choices=list(meta["choices"]), help=text)
        else:
            parser.add_argument(name, dest=f.name, type=_kind(f), required=meta.get("required", False), help=text)


def flags_given(args, cls) -> dict:
    """The options of a config class that a command line gave (those left out are not in the dict)."""
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)
            if "help" in f.metadata and getattr(args, f.name, None) is not None}


def add_run_flags(parser, **helps: str) -> None:
    """RunOptions' flags on a command's parser."""
    add_flags(parser, RunOptions, **helps)


def run_flags(args) -> dict:
    """The RunOptions a command line gave."""
    return flags_given(args, RunOptions)
