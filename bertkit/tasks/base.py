"""What every task shares: the model (BERT body + a task head), padding a batch of features,
and the interface the one fine-tuning loop calls.

A task turns examples into features (token ids plus task fields), defines its head, its loss and
its decoding back to the user's terms, and its metrics. Heads carry HF's tensor names where HF
has the same head (classifier.*, qa_outputs.*), so the saved folder loads in transformers too.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from ..config import BertConfig
from ..errors import BertkitError
from ..model import BertModel, init_weights


class TaskModel(nn.Module):
    def __init__(self, bert: BertModel, head: nn.Module):
        super().__init__()
        self.bert = bert
        self.head = head
        self.config: BertConfig = bert.config


def pad(feats: list[dict], fields: dict[str, int]) -> dict[str, torch.Tensor]:
    """Stack list-valued fields of the features, right-padded with the given value, and
    scalar fields as they are. fields: name -> padding value."""
    out = {}
    for name, value in fields.items():
        rows = [f[name] for f in feats]
        if isinstance(rows[0], (list, tuple)):
            T = max(len(r) for r in rows)
            t = torch.full((len(rows), T), value, dtype=torch.long)
            for i, r in enumerate(rows):
                t[i, :len(r)] = torch.as_tensor(r, dtype=torch.long)
            out[name] = t
        else:
            out[name] = torch.as_tensor(rows)
    return out


# ---- task options (`finetune --option KEY=VALUE`): each task declares its keys and checks ----
# A check takes the value (JSON-decoded by the CLI: 3 -> int, 0.2 -> float, true -> bool, mlp -> str)
# and returns it, or raises ValueError saying what is wrong.
OptionCheck = Callable[[Any], Any]


def int_at_least(low: int) -> OptionCheck:
    def check(v):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"expected an integer, got {v!r}")
        if v < low:
            raise ValueError(f"must be at least {low}, got {v}")
        return v
    return check


def finite_number(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"expected a finite number, got {v!r}")
    return float(v)


def probability(v):
    v = finite_number(v)
    if not 0 <= v < 1:
        raise ValueError(f"must be at least 0 and below 1, got {v}")
    return v


def boolean(v):
    if not isinstance(v, bool):
        raise ValueError(f"expected true or false, got {v!r}")
    return v


def one_of(*choices: str) -> OptionCheck:
    def check(v):
        if v not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {v!r}")
        return v
    return check


class Task:
    """The interface of a task; each tasks/<name>.py subclasses it."""
    name = ""
    primary_metric = ""          # the metric that picks the best epoch (higher is better)
    hf_architecture = "BertModel"
    # decode(outputs, feats, examples) pairs the i-th feature with the i-th example, so evaluation
    # may run the features in any order and put the predictions back (qa: windows of a question)
    feature_per_example = True

    # the keys `finetune --option KEY=VALUE` accepts for this task, each with its check
    options: dict[str, OptionCheck] = {}

    def __init__(self, info: dict | None = None):
        self.info: dict[str, Any] = dict(info or {})

    def check_options(self, options: dict, source: str | None = None) -> dict:
        """The user's task options, checked before any data is read: an unknown key is named with
        the valid ones, a bad value with what is wrong. Returns them normalised. source: the file
        they were read from (a fine-tuned folder's bertkit.json), else they came as --option."""
        checked = {}
        valid = ", ".join(sorted(self.options)) or "none"
        for key, value in options.items():
            if key not in self.options:
                raise BertkitError(f"--option {key}: not an option of the {self.name} task; "
                                   f"valid keys: {valid}")
            try:
                checked[key] = self.options[key](value)
            except ValueError as e:
                raise BertkitError(f"{source}: {key!r}: {e}" if source else f"--option {key}={value!r}: {e}") from None
        return checked

    # data
    def read(self, path) -> list:                        # training / evaluation file
        raise NotImplementedError

    def read_inputs(self, path=None, texts=None) -> list:  # predict's --input file or TEXT arguments
        raise NotImplementedError

    def fit(self, train: list, options: dict) -> None:   # learn the label set etc. into self.info
        self.info.update(options)

    def check(self, examples: list, source: str) -> None:  # e.g. labels unknown to the model
        pass

    def features(self, examples: list, tokenizer, max_len: int) -> list[dict]:
        raise NotImplementedError

    def collate(self, feats: list[dict], tokenizer) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    # model
    def head(self, cfg: BertConfig, bert: BertModel) -> nn.Module:
        raise NotImplementedError

    def init_head(self, head: nn.Module, cfg: BertConfig) -> None:
        """A new head's weights before fine-tuning: BERT's initialisation (a task may start
        parts from the base model's folder, self.info["base_model"])."""
        init_weights(head, cfg)

    def forward(self, model: TaskModel, batch: dict) -> tuple[torch.Tensor | None, Any]:
        """(loss or None when the batch has no targets, outputs for decode)."""
        raise NotImplementedError

    def loss_units(self, feat: dict) -> int:
        """How many of the things forward()'s loss is a mean over this feature holds (an example
        with a label by default; ner: labelled words, summarize: labelled sentences): gradient
        accumulation and ranks weigh each micro-batch's mean loss by them, so a step's gradient
        is that of the whole batch's mean however the batch is split."""
        return int(feat["labels"] != -100)

    def decode(self, outputs: list, feats: list[dict], examples: list) -> list:
        raise NotImplementedError

    def metrics(self, predictions: list, examples: list) -> dict:
        raise NotImplementedError

    def hf_config(self) -> dict:  # extra config.json keys (id2label ...) for transformers
        return {}

    def describe(self, prediction, example) -> Any:  # one JSON-able prediction for `predict`
        return prediction

    # the server's /predict: what a request may hold, and what of it is counted against its limits
    def request_examples(self, inputs: list) -> list:
        """A request's inputs (JSON values) as the task's examples: strings for most tasks. A bad
        input is a BertkitError naming inputs[i] (the server answers 422)."""
        for i, x in enumerate(inputs):
            if not isinstance(x, str):
                raise BertkitError(f"inputs[{i}]: the {self.name} task takes strings")
        return self.read_inputs(texts=list(inputs))

    def request_token_checks(self, inputs: list, examples: list, max_tokens: int,
                             max_len: int) -> list[TokenCheck]:
        """The token counts the server checks before it queues a request (max_tokens: its
        --max-tokens; max_len: what the model reads of a text). By default a text past max_len
        is refused: it would be cut off, and answered as if read whole."""
        return [TokenCheck(list(inputs), None, "inputs", *_read_whole(self, max_tokens, max_len))]


@dataclass
class TokenCheck:
    """Texts (and their pairs) of a request that the server counts against `limit` tokens each,
    named `field` in its errors; `limit_name` says what the limit is (None: --max-tokens)."""
    texts: list[str]
    pairs: list[str | None] | None
    field: str
    limit: int
    limit_name: str | None = None


def _read_whole(task: Task, max_tokens: int, max_len: int) -> tuple[int, str | None]:
    """The limit of a text the model reads whole: the server's, or the model's max_len if lower."""
    if max_len < max_tokens:
        return max_len, f"the max_len the {task.name} model was fine-tuned with"
    return max_tokens, None


def bert_inputs(batch: dict) -> dict:
    return {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
