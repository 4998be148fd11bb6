"""Extractive question answering on SQuAD-format data (v1.1 and v2.0).

A linear layer gives every token a start and an end logit; long contexts are cut into
overlapping windows, and the best valid span over all windows of a question is mapped back to
exact characters of the context (squad.py holds the reading, windows, span search and metrics).
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import BertkitError
from ..inputs import jsonl_rows
from .base import Task, TokenCheck, bert_inputs, boolean, finite_number, int_at_least, pad
from .squad import QAExample, QAFeatures, best_spans, make_windows, read_squad, squad_metrics


class SpanHead(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.qa_outputs = nn.Linear(hidden, 2)  # HF BertForQuestionAnswering's name

    def forward(self, h):                        # h: (B, T, H)
        start, end = self.qa_outputs(h).unbind(-1)
        return start, end                        # (B, T) each


class QATask(Task):
    name = "qa"
    primary_metric = "f1"
    feature_per_example = False
    options = {"doc_stride": int_at_least(0), "max_query_len": int_at_least(1), "n_best": int_at_least(1),
               "max_answer_len": int_at_least(1), "null_score_diff": finite_number, "version_2": boolean}
    hf_architecture = "BertForQuestionAnswering"

    def read(self, path):
        return read_squad(path)

    def fit(self, train, options):
        super().fit(train, options)
        self.info.setdefault("version_2", any(ex.is_impossible for ex in train))

    def read_inputs(self, path=None, texts=None):
        if path is None:
            raise BertkitError("qa predictions need --input FILE.jsonl with 'question' and 'context' per line")
        if Path(path).suffix.lower() != ".jsonl":  # a SQuAD .json or a .txt was read as JSON lines
            raise BertkitError(f"{path}: qa predictions read a .jsonl file (an object with 'question' and 'context' "
                               "per line); to score a SQuAD .json file use `bertkit evaluate qa`")
        rows = []
        for lineno, row in jsonl_rows(path):
            if not all(isinstance(row.get(k), str) for k in ("question", "context")):
                raise BertkitError(f"{path}, line {lineno}: expected an object with string fields 'question' and 'context'")
            empty = next((k for k in ("question", "context") if not row[k].strip()), None)
            if empty:
                raise BertkitError(f"{path}, line {lineno}: the {empty} is empty")
            rows.append(QAExample(str(row.get("id", lineno)), row["question"], row["context"], [], False, ""))
        return rows

    def max_query_len(self, max_len: int) -> int:
        """Question tokens a window holds (SQuAD's convention: the rest of a question is cut)."""
        return int(self.info.get("max_query_len", min(64, max_len // 4)))

    def features(self, examples, tokenizer, max_len):
        stride = int(self.info.get("doc_stride", min(128, max_len // 4)))
        query = self.max_query_len(max_len)
        windows = make_windows(examples, tokenizer, max_len=max_len, doc_stride=stride, max_query_len=query)
        return [{"input_ids": windows.input_ids[i], "token_type_ids": windows.token_type_ids[i],
                 "attention_mask": windows.attention_mask[i], "start_positions": windows.start_positions[i],
                 "end_positions": windows.end_positions[i], "has_targets": bool(examples[windows.example_index[i]].answers)
                 or examples[windows.example_index[i]].is_impossible,
                 # what decoding needs: the window's example and its tokens' characters in the context
                 "example_index": windows.example_index[i], "offsets": windows.offsets[i]}
                for i in range(len(windows))]

    def loss_units(self, feat):  # the loss: a mean over windows (all with targets, or none)
        return int(feat["has_targets"])

    def collate(self, feats, tokenizer):
        return pad(feats, {"input_ids": tokenizer.pad_id, "token_type_ids": 0, "attention_mask": 0,
                           "start_positions": 0, "end_positions": 0, "has_targets": 0})

    def head(self, cfg, bert):
        return SpanHead(cfg.hidden_size)

    def forward(self, model, batch):
        h = model.bert(**bert_inputs(batch)).sequence_output
        start, end = (x.float() for x in model.head(h))
        pad_mask = batch["attention_mask"] == 0
        start, end = start.masked_fill(pad_mask, -1e4), end.masked_fill(pad_mask, -1e4)
        loss = None
        if batch["has_targets"].all():
            loss = (F.cross_entropy(start, batch["start_positions"]) + F.cross_entropy(end, batch["end_positions"])) / 2
        return loss, (start.cpu(), end.cpu())

    def decode(self, outputs, feats, examples):
        T = max(s.size(1) for s, _ in outputs)
        start = torch.cat([F.pad(s, (0, T - s.size(1)), value=-1e4) for s, _ in outputs])
        end = torch.cat([F.pad(e, (0, T - e.size(1)), value=-1e4) for _, e in outputs])
        windows = QAFeatures(input_ids=[f["input_ids"] for f in feats], offsets=[f["offsets"] for f in feats],
                             example_index=[f["example_index"] for f in feats])
        nbest = best_spans(start, end, windows, examples, n_best=int(self.info.get("n_best", 20)),
                           max_answer_len=int(self.info.get("max_answer_len", 30)),
                           null_score_diff=float(self.info.get("null_score_diff", 0.0)),
                           version_2=bool(self.info.get("version_2", False)))
        return [{"id": ex.id, "answer": spans[0]["text"] if spans else "", "nbest": spans[:5]}
                for ex, spans in zip(examples, nbest)]

    def metrics(self, predictions, examples):
        return squad_metrics({p["id"]: p["answer"] for p in predictions}, examples)

    def describe(self, prediction, example):
        return {"id": example.id, "question": example.question, "answer": prediction["answer"],
                "nbest": prediction["nbest"]}

    def request_examples(self, inputs: list) -> list:
        """{"question", "context"} objects, with an optional "id" that comes back with the answer
        (as `bertkit predict qa` keeps the JSONL's)."""
        out = []
        for i, x in enumerate(inputs):
            if not (isinstance(x, dict) and isinstance(x.get("question"), str) and isinstance(x.get("context"), str)):
                raise BertkitError(f"inputs[{i}]: the qa task takes objects with string fields 'question' and "
                                   "'context'")
            unknown = sorted(set(x) - {"question", "context", "id"})
            if unknown:  # as classify's objects: a misspelt field is named, not dropped
                raise BertkitError(f"inputs[{i}].{unknown[0]}: not a field; objects have 'question', 'context' "
                                   "and optionally 'id'")
            qid = x.get("id", str(i))
            if isinstance(qid, bool) or not isinstance(qid, (str, int)):
                raise BertkitError(f"inputs[{i}].id: must be a string or an integer")
            out.append(QAExample(str(qid), x["question"], x["context"], [], False, ""))
        return out

    def request_token_checks(self, inputs, examples, max_tokens, max_len):
        # a question past max_query_len is cut; long contexts are read in windows: 8 times the limit
        query = self.max_query_len(max_len) + 2  # with [CLS] and [SEP], as counted
        why = f"the max_query_len of the qa model, {query - 2}, and [CLS] [SEP]" if query < max_tokens else None
        return [TokenCheck([e.question for e in examples], None, "inputs.question", min(max_tokens, query), why),
                TokenCheck([e.context for e in examples], None, "inputs.context", 8 * max_tokens)]
