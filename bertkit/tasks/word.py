"""A short phrase to one vocabulary word through [CLS] ("large" -> "size", "very heavy" -> "weight").

The [CLS] vector goes through a transform like the MLM head's (dense, GELU, LayerNorm) and is
projected onto the vocabulary, by default with the word embeddings themselves (tied), so a
target never seen in training can still be predicted from what its embedding means. Targets must
be single vocabulary tokens; predictions range over whole-word tokens (no [unused], specials or
'##' pieces).
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import nn

from .base import Task, bert_inputs, boolean, pad


class WordHead(nn.Module):
    def __init__(self, cfg, word_embeddings: nn.Embedding, tied: bool):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.decoder = word_embeddings.weight if tied else nn.Parameter(
            torch.randn(cfg.vocab_size, cfg.hidden_size) * cfg.initializer_range)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, cls):                                   # cls: (B, H)
        h = self.norm(F.gelu(self.dense(cls)))                 # (B, H)
        return F.linear(h, self.decoder, self.bias)            # (B, V)


class WordTask(Task):
    name = "word"
    primary_metric = "acc@1"
    options = {"tied": boolean}

    def read(self, path):
        from ..data.readers import read_word
        return read_word(path)

    def read_inputs(self, path=None, texts=None):
        if path is not None:
            from ..inputs import read_single_texts
            texts = read_single_texts(path, self.name)
        return [{"text": t, "word": None} for t in texts]

    def features(self, examples, tokenizer, max_len):
        encs = tokenizer.encode_unpadded([ex["text"] for ex in examples], None, max_len)
        candidates = self._whole_words(tokenizer)
        vocabulary = [tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)]
        unreachable = 0
        feats = []
        normalizer = tokenizer.tok.normalizer
        normalize = normalizer.normalize_str if normalizer is not None else (lambda w: w)
        for ex, e in zip(examples, encs):
            # the target as the tokenizer sees text (an uncased vocabulary strips accents too:
            # "café" is the token "cafe"), then looked up whole
            # ("中" normalizes to " 中 ": Chinese characters are spaced apart, hence the strip)
            target = tokenizer.token_to_id(normalize(ex["word"]).strip()) if ex["word"] else None
            unreachable += ex["word"] is not None and target is None
            feats.append({"input_ids": e.ids, "token_type_ids": e.type_ids, "attention_mask": [1] * len(e.ids),
                          "labels": -100 if target is None else target,
                          # what forward and decode need, shared by every feature (one object each)
                          "candidates": candidates, "vocabulary": vocabulary})
        if unreachable:
            # kept (they score as misses), never silently dropped
            print(f"bertkit: {unreachable} of {len(examples)} target word(s) are not single vocabulary tokens: "
                  "they cannot be predicted and count as wrong", file=sys.stderr)
        return feats

    @staticmethod
    def _whole_words(tokenizer) -> torch.Tensor:
        allowed = torch.zeros(tokenizer.vocab_size, dtype=torch.bool)
        for token, i in tokenizer.tok.get_vocab().items():
            allowed[i] = not token.startswith("##") and not (token.startswith("[") and token.endswith("]"))
        return allowed

    def collate(self, feats, tokenizer):
        batch = pad(feats, {"input_ids": tokenizer.pad_id, "token_type_ids": 0, "attention_mask": 0, "labels": -100})
        batch["candidates"] = feats[0]["candidates"]  # (V,) bool: whole-word tokens
        return batch

    def head(self, cfg, bert):
        return WordHead(cfg, bert.embeddings.word, tied=self.info.get("tied", True))

    def forward(self, model, batch):
        # the head reads the last layer at [CLS] alone: it runs there only
        out = model.bert(**bert_inputs(batch), last_layer_rows=torch.zeros_like(batch["input_ids"][:, :1]))
        logits = model.head(out.sequence_output[:, 0]).float()                 # (B, V)
        labels = batch["labels"]
        loss = F.cross_entropy(logits, labels, ignore_index=-100) if (labels != -100).any() else None
        candidates = batch["candidates"]
        if candidates.numel() < logits.size(-1):  # embedding rows past the tokenizer's ids (a vocabulary
            # padded to a multiple of 8): no token, never a prediction
            candidates = torch.cat([candidates, candidates.new_zeros(logits.size(-1) - candidates.numel())])
        logits = logits.masked_fill(~candidates, float("-inf"))
        probs, ids = logits.softmax(-1).topk(10, dim=-1)
        return loss, (ids.cpu(), probs.cpu())

    def decode(self, outputs, feats, examples):
        ids = torch.cat([o[0] for o in outputs]).tolist()
        probs = torch.cat([o[1] for o in outputs]).tolist()
        vocabulary = feats[0]["vocabulary"] if feats else []
        # "target": the gold word as a vocabulary token (None without one, or when it is not a
        # single token: such a target is never hit)
        return [{"word": vocabulary[row[0]], "top": [{"word": vocabulary[i], "score": p} for i, p in zip(row, ps)],
                 "target": vocabulary[f["labels"]] if f["labels"] != -100 else None}
                for row, ps, f in zip(ids, probs, feats)]

    def metrics(self, predictions, examples):
        hits1 = hits5 = 0
        for p in predictions:
            top5 = [t["word"] for t in p["top"][:5]]
            hits1 += p["target"] is not None and top5[0] == p["target"]
            hits5 += p["target"] is not None and p["target"] in top5
        n = max(1, len(examples))
        return {"acc@1": hits1 / n, "acc@5": hits5 / n, "examples": len(examples)}

    def describe(self, prediction, example):
        return {"text": example["text"], "word": prediction["word"], "top": prediction["top"]}
