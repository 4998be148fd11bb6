"""What every task shares: the model (BERT body + a task head), padding a batch of features,
and the interface the one fine-tuning loop calls.

A task turns examples into features (token ids plus task fields), defines its head, its loss and
its decoding back to the user's terms, and its metrics. Heads carry HF's tensor names where HF
has the same head (classifier.*, qa_outputs.*), so the saved folder loads in transformers too.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..config import BertConfig
from ..model import BertModel


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


class Task:
    """The interface of a task; each tasks/<name>.py subclasses it."""
    name = ""
    primary_metric = ""          # the metric that picks the best epoch (higher is better)
    hf_architecture = "BertModel"

    def __init__(self, info: dict | None = None):
        self.info: dict[str, Any] = dict(info or {})

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

    def forward(self, model: TaskModel, batch: dict) -> tuple[torch.Tensor | None, Any]:
        """(loss or None when the batch has no targets, outputs for decode)."""
        raise NotImplementedError

    def decode(self, outputs: list, feats: list[dict], examples: list) -> list:
        raise NotImplementedError

    def metrics(self, predictions: list, examples: list) -> dict:
        raise NotImplementedError

    def hf_config(self) -> dict:  # extra config.json keys (id2label ...) for transformers
        return {}

    def describe(self, prediction, example) -> Any:  # one JSON-able prediction for `predict`
        return prediction


def bert_inputs(batch: dict) -> dict:
    return {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
