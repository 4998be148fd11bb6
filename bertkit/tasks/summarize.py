"""Extractive summarization: score every sentence of a document in context, pick the best.

The document is one input, "[CLS] s1 [SEP] [CLS] s2 [SEP] ...", segment ids alternating per
sentence (BertSum, Liu & Lapata 2019), so each sentence's [CLS] vector has seen its neighbours.
A linear layer scores each [CLS]; the summary is the top k sentences (or as many as fit a word
budget), in document order. Sentences past the length limit cannot be scored and are counted.
"""
from __future__ import annotations

import sys

import torch.nn.functional as F
from torch import nn

from ..errors import BertkitError
from .base import Task, TokenCheck, bert_inputs, int_at_least, pad, probability


class SentenceScorer(nn.Module):
    def __init__(self, hidden: int, dropout: float):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden, 1)

    def forward(self, h):                              # h: (B, S, H) at each sentence's [CLS]
        return self.classifier(self.drop(h))[..., 0]   # (B, S)


class SummarizeTask(Task):
    name = "summarize"
    primary_metric = "rouge2"
    options = {"k": int_at_least(1), "max_words": int_at_least(1), "dropout": probability}

    def read(self, path):
        from ..data.readers import read_summarize
        return read_summarize(path)

    def read_inputs(self, path=None, texts=None):
        from ..text import split_sentences
        if path is not None:
            from ..inputs import read_single_texts
            texts = read_single_texts(path, self.name)
        docs = [split_sentences(t) for t in texts]
        for i, sentences in enumerate(docs):
            if not sentences:  # nothing to score: a summary of it would be an error deep in the model
                raise BertkitError(f"{path}, line {i + 1}: no sentences in the text" if path is not None else
                                   f"text {i + 1}: no sentences in {texts[i][:40]!r}")
        return [{"sentences": sentences, "labels": None} for sentences in docs]

    def features(self, examples, tokenizer, max_len):
        feats, cut = [], 0
        for ex in examples:
            ids, types, cls_at = [], [], []
            for i, sentence in enumerate(ex["sentences"]):
                pieces = tokenizer.tokenize_ids(sentence)[:max(1, max_len // 4)]  # no one sentence fills the input
                if len(ids) + len(pieces) + 2 > max_len:
                    break
                cls_at.append(len(ids))
                ids += [tokenizer.cls_id, *pieces, tokenizer.sep_id]
                types += [i % 2] * (len(pieces) + 2)
            cut += len(cls_at) < len(ex["sentences"])
            labels = (ex["labels"] or [])[:len(cls_at)]
            feats.append({"input_ids": ids, "token_type_ids": types, "attention_mask": [1] * len(ids),
                          "cls_at": cls_at, "sentence_labels": labels if ex["labels"] else [-100] * len(cls_at),
                          "n_sentences": len(ex["sentences"])})
        if cut:
            print(f"bertkit: {cut} document(s) longer than {max_len} pieces: their later sentences are not "
                  "scored (never selected)", file=sys.stderr)
        return feats

    def loss_units(self, feat):  # the loss: a mean over labelled sentences
        return sum(lab != -100 for lab in feat["sentence_labels"])

    def collate(self, feats, tokenizer):
        return pad(feats, {"input_ids": tokenizer.pad_id, "token_type_ids": 0, "attention_mask": 0,
                           "cls_at": 0, "sentence_labels": -100})

    def head(self, cfg, bert):
        return SentenceScorer(cfg.hidden_size, self.info.get("dropout", 0.1))

    def forward(self, model, batch):
        h = model.bert(**bert_inputs(batch)).sequence_output                       # (B, T, H)
        cls = h.gather(1, batch["cls_at"][..., None].expand(-1, -1, h.size(-1)))   # (B, S, H)
        scores = model.head(cls).float()                                           # (B, S)
        labels = batch["sentence_labels"]
        valid = labels != -100
        loss = F.binary_cross_entropy_with_logits(scores[valid], labels[valid].float()) if valid.any() else None
        counts = (batch["cls_at"] > 0).sum(1) + 1                                  # the first [CLS] is at 0
        return loss, [row[:int(n)] for row, n in zip(scores.tolist(), counts.tolist())]

    def decode(self, outputs, feats, examples):
        k = int(self.info.get("k", 3))
        budget = self.info.get("max_words")
        preds = []
        for scores, ex in zip((r for out in outputs for r in out), examples):
            ranked = sorted(range(len(scores)), key=lambda i: -scores[i])
            if budget:
                chosen, words = [], 0
                for i in ranked:
                    n = len(ex["sentences"][i].split())
                    if words + n <= int(budget) or not chosen:
                        chosen.append(i)
                        words += n
            else:
                chosen = ranked[:k]
            chosen.sort()  # document order
            preds.append({"selected": chosen, "summary": [ex["sentences"][i] for i in chosen],
                          "scores": scores})
        return preds

    def metrics(self, predictions, examples):
        from rouge_score import rouge_scorer

        from ..data.readers import RougeTokenizer
        # rouge-score's F-measures, stemmed (ROUGE-1.5.5's -m, as summarization papers report), rougeL
        # over each summary joined into one text (not rougeLsum); its tokenizer dropped every letter
        # outside a-z (Russian scored 0)
        scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], tokenizer=RougeTokenizer(use_stemmer=True))
        totals = {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
        for p, ex in zip(predictions, examples):
            reference = ex.get("summary") or " ".join(s for s, lab in zip(ex["sentences"], ex["labels"]) if lab)
            scores = scorer.score(reference, " ".join(p["summary"]))
            for key in totals:
                totals[key] += scores[key].fmeasure
        n = max(1, len(examples))
        return {**{k: v / n for k, v in totals.items()}, "documents": len(examples)}

    def request_token_checks(self, inputs, examples, max_tokens, max_len):
        # a long document's later sentences are not scored (the task's rule, which describe reports)
        return [TokenCheck(list(inputs), None, "inputs", max_tokens)]

    def describe(self, prediction, example):
        # a document longer than max_len is scored on its first sentences only: say how many
        return {"summary": prediction["summary"], "selected": prediction["selected"],
                "sentences": len(example["sentences"]), "sentences_scored": len(prediction["scores"])}
