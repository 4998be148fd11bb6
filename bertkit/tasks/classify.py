"""Sentence (or sentence-pair) classification, any number of labels; sentiment is this task.

The sentence vector is, by default, the one the checkpoint was trained to give: for a
sentence-transformers folder its declared pooling (MiniLM: mean), else BERT's tanh pooler. The
fine-tuning study chose it (MiniLM, 3 seeds: mean beat the pooler on rotten-tomatoes and tweets);
`pooling = "pooler" | "cls" | "mean"` chooses any of them. A pooling the folder declares and
bertkit cannot run (max) is warned of, as encode and serve warn of it, and the pooler taken
instead. Then dropout and a linear layer, or
an MLP head (hidden layer, ReLU, dropout) with `head = "mlp"`.
"""
from __future__ import annotations

import re

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..errors import BertkitError
from ..inputs import read_text_inputs
from ..pooling import folder_pooling, pool, unsupported_pooling, warn_unsupported
from .base import Task, TokenCheck, _read_whole, bert_inputs, one_of, pad, probability


class ClassifierHead(nn.Module):
    def __init__(self, hidden: int, n_labels: int, dropout: float, mlp: bool):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        # "classifier" is HF BertForSequenceClassification's name: a linear head loads there too
        self.hidden = nn.Linear(hidden, hidden) if mlp else None
        self.classifier = nn.Linear(hidden, n_labels)

    def forward(self, x):                                 # x: (B, H) sentence vectors
        if self.hidden is not None:
            x = self.drop(F.relu(self.hidden(self.drop(x))))
        return self.classifier(self.drop(x))              # (B, n_labels)


def _label(value) -> str:
    return str(value).strip()


class ClassifyTask(Task):
    name = "classify"
    primary_metric = "accuracy"
    options = {"head": one_of("linear", "mlp"), "dropout": probability, "pooling": one_of("pooler", "cls", "mean")}

    @property
    def hf_architecture(self):
        # transformers' classifier is pooler + dropout + linear: the same network only then
        linear_on_pooler = self.info.get("head", "linear") == "linear" and self.info.get("pooling") == "pooler"
        return "BertForSequenceClassification" if linear_on_pooler else "BertModel"

    def read(self, path):
        from ..data.readers import read_classify
        rows = read_classify(path)
        for r in rows:
            r["label"] = _label(r["label"])
        return rows

    def read_inputs(self, path=None, texts=None):
        if path is not None:
            inputs = read_text_inputs(path, blank_lines="refuse")  # predict's row i is line i
            pairs = inputs.pairs or [None] * len(inputs.texts)  # blank lines refused: row i is line i + 1
            return [{"text": t, "text_pair": p, "line": i + 1} for i, (t, p) in enumerate(zip(inputs.texts, pairs))]
        return [{"text": t, "text_pair": None} for t in texts]

    def fit(self, train, options):
        super().fit(train, options)
        base = self.info.get("base_model")
        chosen = "pooling" in self.info
        if not chosen:  # the checkpoint's own sentence vector (the fine-tuning study)
            self.info["pooling"] = (folder_pooling(base) if base else None) or "pooler"
        if base:  # a pooling it declares and bertkit cannot run (max) fell back to the pooler without a word;
            # its modules after pooling do not matter (the head is trained anew on the pooled vector)
            vector = {"pooler": "the tanh pooler", "cls": "[CLS]", "mean": "the mean"}[self.info["pooling"]]
            outcome = (f"classify is fine-tuned on {vector} instead (--option pooling=pooler|cls|mean chooses)"
                       if not chosen and unsupported_pooling(base) else f"classify is fine-tuned on {vector}")
            warn_unsupported(base, "fine-tunes classify", outcome, modules=False, pooling=not chosen)
        labels = sorted({r["label"] for r in train})
        if all(re.fullmatch(r"-?[0-9]+", lab) for lab in labels):  # numbers in their order ("²".isdigit() too)
            labels.sort(key=int)
        if len(labels) < 2:
            raise BertkitError(f"classification needs at least two labels in the training data, found {labels}")
        self.info["labels"] = labels
        paired = {r.get("text_pair") is not None for r in train}  # what the model learns to read
        self.info["inputs"] = "both" if len(paired) > 1 else "pairs" if True in paired else "texts"

    def check(self, examples, source):
        known = set(self.info["labels"])
        unknown = [(i, r) for i, r in enumerate(examples) if r.get("label") is not None and r["label"] not in known]
        if unknown:
            i, r = unknown[0]
            where = f"line {r['line']}" if "line" in r else f"row {i + 1}"
            raise BertkitError(f"{source}, {where}: label {r['label']!r} is not one the model knows "
                               f"({', '.join(self.info['labels'])}); {len(unknown)} such row(s)")
        # a model fine-tuned on single texts scored on pairs (or the reverse) reads inputs it never saw
        kind = self.info.get("inputs")  # None: a folder from before it was recorded
        if kind in ("texts", "pairs"):
            other = [(i, r) for i, r in enumerate(examples) if (r.get("text_pair") is not None) != (kind == "pairs")]
            if other:
                i, r = other[0]
                where = f"line {r['line']}" if "line" in r else f"row {i + 1}"
                raise BertkitError(f"{source}, {where}: " + ("a single text" if kind == "pairs" else "a text pair")
                                   + " (text_pair), but the model was fine-tuned on "
                                   + ("text pairs" if kind == "pairs" else "single texts") + f"; {len(other)} such row(s)")

    def features(self, examples, tokenizer, max_len):
        # single texts and pairs apart: a single text is [CLS] A [SEP] whatever else is in the call
        # (the server joins different clients' requests into one call)
        singles = [i for i, r in enumerate(examples) if r.get("text_pair") is None]
        paired = [i for i, r in enumerate(examples) if r.get("text_pair") is not None]
        encs = {}
        if singles:
            encs.update(zip(singles, tokenizer.encode_unpadded([examples[i]["text"] for i in singles], None, max_len)))
        if paired:
            encs.update(zip(paired, tokenizer.encode_unpadded([examples[i]["text"] for i in paired],
                                                              [examples[i]["text_pair"] for i in paired], max_len)))
        encs = [encs[i] for i in range(len(examples))]
        index = {lab: i for i, lab in enumerate(self.info["labels"])}
        return [{"input_ids": e.ids, "token_type_ids": e.type_ids, "attention_mask": [1] * len(e.ids),
                 "labels": index.get(r.get("label"), -100)} for e, r in zip(encs, examples)]

    def collate(self, feats, tokenizer):
        return pad(feats, {"input_ids": tokenizer.pad_id, "token_type_ids": 0, "attention_mask": 0, "labels": -100})

    def head(self, cfg, bert):
        return ClassifierHead(cfg.hidden_size, len(self.info["labels"]), self.info.get("dropout", 0.1),
                              self.info.get("head", "linear") == "mlp")

    def forward(self, model, batch):
        pooling = self.info.get("pooling", "pooler")
        # the pooler and [CLS] read the last layer at position 0 alone: it runs there only
        rows = torch.zeros_like(batch["input_ids"][:, :1]) if pooling in ("pooler", "cls") else None
        out = model.bert(**bert_inputs(batch), last_layer_rows=rows)
        vec = pool(out.sequence_output, out.pooled_output, batch["attention_mask"], pooling)
        logits = model.head(vec).float()
        labels = batch["labels"]
        loss = F.cross_entropy(logits, labels) if (labels != -100).any() else None
        return loss, logits.softmax(-1)

    def decode(self, outputs, feats, examples):
        probs = torch.cat(outputs).cpu().numpy()
        return [{"label": self.info["labels"][int(p.argmax())],
                 "scores": {lab: float(s) for lab, s in zip(self.info["labels"], p)}} for p in probs]

    def metrics(self, predictions, examples):
        labels = self.info["labels"]
        index = {lab: i for i, lab in enumerate(labels)}
        gold = np.array([index[r["label"]] for r in examples])
        pred = np.array([index[p["label"]] for p in predictions])
        return classification_metrics(gold, pred, labels)

    def hf_config(self):
        labels = self.info["labels"]
        return {"id2label": {str(i): lab for i, lab in enumerate(labels)},
                "label2id": {lab: i for i, lab in enumerate(labels)}}

    def describe(self, prediction, example):
        return {"text": example["text"], **({"text_pair": example["text_pair"]} if example.get("text_pair") else {}),
                **prediction}

    def request_examples(self, inputs: list) -> list:
        """Strings, or {"text", "text_pair"} objects for pairs; a classifier fine-tuned on single
        texts given pairs, or the reverse, reads inputs it never saw: refused, as `bertkit predict`
        and `evaluate` refuse them."""
        texts, pairs = self._request_texts(inputs)
        kind = self.info.get("inputs")
        if kind in ("texts", "pairs"):
            other = [i for i, p in enumerate(pairs) if (p is not None) != (kind == "pairs")]
            if other:
                raise BertkitError(f"inputs[{other[0]}]: " + ("a single text" if kind == "pairs" else
                                                              "a text pair (text_pair)")
                                   + ", but the model was fine-tuned on " + ("text pairs" if kind == "pairs" else
                                                                             "single texts")
                                   + f"; {len(other)} such input(s)")
        examples = self.read_inputs(texts=texts)
        for ex, pair in zip(examples, pairs):
            if pair is not None:
                ex["text_pair"] = pair
        return examples

    @staticmethod
    def _request_texts(inputs: list) -> tuple[list[str], list[str | None]]:
        texts, pairs = [], []
        for i, x in enumerate(inputs):
            if isinstance(x, dict) and isinstance(x.get("text"), str):
                unknown = sorted(set(x) - {"text", "text_pair"})
                if unknown:  # a misspelt text_pair would otherwise be dropped without a word
                    raise BertkitError(f"inputs[{i}].{unknown[0]}: not a field; objects have 'text' "
                                       "and optionally 'text_pair'")
                if x.get("text_pair") is not None and not isinstance(x["text_pair"], str):
                    raise BertkitError(f"inputs[{i}].text_pair: must be a string")
                if x.get("text_pair") is not None and not x["text_pair"].strip():  # as an empty text is
                    raise BertkitError(f"inputs[{i}].text_pair: empty text")
                texts.append(x["text"])
                pairs.append(x.get("text_pair"))
            elif isinstance(x, str):
                texts.append(x)
                pairs.append(None)
            else:
                raise BertkitError(f"inputs[{i}]: the classify task takes strings or {{\"text\", \"text_pair\"}} "
                                   "objects")
        return texts, pairs

    def request_token_checks(self, inputs, examples, max_tokens, max_len):
        # a text_pair counts with its text, as they are read together
        texts, pairs = self._request_texts(inputs)
        return [TokenCheck(texts, pairs if any(p is not None for p in pairs) else None, "inputs",
                           *_read_whole(self, max_tokens, max_len))]


def classification_metrics(gold: np.ndarray, pred: np.ndarray, labels: list[str]) -> dict:
    """Accuracy, macro-F1 (mean per-label F1 over the labels present in gold or predictions, as
    scikit-learn computes it) and the confusion matrix [gold][predicted]."""
    n = len(labels)
    confusion = np.zeros((n, n), dtype=np.int64)
    np.add.at(confusion, (gold, pred), 1)
    tp = np.diag(confusion).astype(float)
    precision = np.divide(tp, confusion.sum(0), out=np.zeros(n), where=confusion.sum(0) > 0)
    recall = np.divide(tp, confusion.sum(1), out=np.zeros(n), where=confusion.sum(1) > 0)
    f1 = np.divide(2 * precision * recall, precision + recall, out=np.zeros(n), where=(precision + recall) > 0)
    present = (confusion.sum(0) + confusion.sum(1)) > 0
    return {"accuracy": float(tp.sum() / max(1, len(gold))),
            "macro_f1": float(f1[present].mean()) if present.any() else 0.0,
            "per_label_f1": {lab: float(v) for lab, v in zip(labels, f1)},
            "confusion_matrix": {"labels": labels, "rows_gold_cols_predicted": confusion.tolist()},
            "examples": int(len(gold))}
