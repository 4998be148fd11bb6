"""A fine-tuning run's options (FinetuneConfig), declared once: the `bertkit finetune` flags, a
--config file's keys and what a resume must keep come from its fields. Importing it does not
import torch (the CLI builds its parser from it)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import BertkitError
from ..training.options import REQUIRED, RunOptions, exact_names, option
from . import default_lr, task_defaults


@dataclass
class FinetuneConfig(RunOptions):
    """A fine-tuning run's options: the shared ones of RunOptions (budget instead of epochs, lr,
    warmup 0.1, seed, checkpoints at each epoch's end, precision), then these. The precision's
    "auto" was chosen by the study: the same quality, 1.7x faster steps on an AMX CPU, a MiniLM
    step 2.2x faster on a Zen 4 with AVX512_BF16; evaluation is fp32."""
    task: str = option(REQUIRED, exact=True)  # the CLI's positional TASK
    model: str = option(REQUIRED, "model folder (HF layout): a published BERT or a bertkit run", exact=True,
                        required=True)
    train: str = option(REQUIRED, "the training file", exact=True, required=True)
    eval: str = option(REQUIRED, "the evaluation file (the best epoch is chosen on it)", exact=True, required=True)
    out: str = option(REQUIRED, "output folder: the best epoch's model, checkpoints, metrics", required=True)
    # None: the task's default (tasks.DEFAULTS, chosen by the fine-tuning study)
    epochs: int | None = option(None, "epochs over the training set", exact=True)
    batch_size: int | None = option(None, "examples per step", exact=True)
    eval_batch_size: int = option(64, "examples per evaluation batch (default 64)")
    max_len: int | None = option(None, "tokens per example", exact=True)
    patience: int | None = option(None, "stop after N epochs without improvement")
    # batch examples of similar length together: less padding
    group_by_length: bool = option(True, "plain shuffled batches instead of length-grouped ones (less padding, the "
                                         "default)", exact=True, flag="--shuffled-batches", const=False)
    options: dict = option(dict, exact=True)  # task options (--option, --head): head, dropout, pooling, k, doc_stride ...
    overwrite: bool = option(False, "write into --out even when it is not empty (its files may be replaced)")

    TOML_TABLE = "finetune"

    def digests(self) -> dict:
        """The training and evaluation files' bytes and the model folder's: a resume on edited data
        (the same path, other rows) or other weights is refused by name."""
        if not hasattr(self, "_digests"):  # once: a run asks at its start and when its Loop is built
            from ..files import folder_digest, sha256
            self._digests = {"content of --train": sha256(Path(self.train)),
                             "content of --eval": sha256(Path(self.eval)),
                             "content of --model": folder_digest(self.model)}
        return self._digests

    def __post_init__(self):
        from ..folders import pretraining_origin  # (torch: the CLI builds its parser from this module without it)
        if self.budget is not None and self.epochs is not None:  # the budget ends the run: epochs would be ignored
            raise BertkitError("give --epochs or --budget, not both")
        # lr below; a model bertkit pretrained takes its epochs from the training set's size, known in
        # finetune() (tasks.default_epochs), unless a budget ends the run
        later = {"options", "lr"}
        if self.budget is None and pretraining_origin(self.model) is not None:
            later.add("epochs")
        for name, value in task_defaults(self.task, self.options).items():
            if name not in later and getattr(self, name) is None:
                setattr(self, name, value)
        if self.lr is None:  # by what the model is: a published checkpoint or one bertkit pretrained
            self.lr = default_lr(self.task, self.model)
        if self.warmup is None:
            self.warmup = 0.1
        if self.save_every is None:
            self.save_every = 0  # at each epoch's end only
        # named as the command line spells them: the CLI passes its options straight through
        for name in ("epochs", "batch_size", "eval_batch_size", "max_len", "patience"):
            value = getattr(self, name)
            if value is None and name in ("patience", "epochs"):  # no patience; epochs: see default_epochs
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BertkitError(f"--{name.replace('_', '-')} must be an integer of at least 1, got {value!r}")
        self.check_run_options()
        if self.batch_size % self.grad_accum:
            raise BertkitError(f"--batch-size {self.batch_size} is not divisible by --grad-accum {self.grad_accum}")


FinetuneConfig.EXACT = exact_names(FinetuneConfig)  # what a resume must keep
