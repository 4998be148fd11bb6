"""A short phrase to one vocabulary word through [CLS] ("large" -> "size", "very heavy" -> "weight").

The [CLS] vector goes through a transform like the MLM head's (dense, GELU, LayerNorm) and is
projected onto the vocabulary, by default with the word embeddings themselves (tied), so a
target never seen in training can still be predicted from what its embedding means. Targets must
be single vocabulary tokens; predictions range over whole-word tokens (no [unused], specials or
'##' pieces).

Training pulls the outputs toward the targets it sees, and away from every other word: a learned
output bias, and target embeddings moved by the head, each favour the seen targets. The options
that let a target outside the training file win (`finetune --option KEY=VALUE`; the measurements
behind the defaults are in docs/finetuning.md):
- bias=false: no output bias (the seen targets cannot be raised for every input at once);
- frozen_decoder=true: the head reads the word embeddings but does not move them;
- hub_correction=true: at prediction, each word's mean score over the training inputs is taken
  off its score, so a word that wins for every input (a "hub", as in CSLS, Conneau et al. 2018)
  stops crowding out the rest;
- transform=mlm: the head's transform starts from the folder's trained MLM head, which already
  maps a hidden state onto the embedding space;
- negatives=targets: the training loss is a softmax over the training file's target words only,
  so every other word, the targets it never saw among them, is not pushed down at each step
  (prediction still ranges over every whole word).
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import BertkitError
from .base import Task, bert_inputs, boolean, one_of, pad


class WordHead(nn.Module):
    def __init__(self, cfg, word_embeddings: nn.Embedding, tied: bool = True, bias: bool = True,
                 frozen_decoder: bool = False, hub_correction: bool = False):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.decoder = word_embeddings.weight if tied else nn.Parameter(
            torch.randn(cfg.vocab_size, cfg.hidden_size) * cfg.initializer_range)
        if bias:
            self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        else:  # kept in the weights (zeros) so that every word head's folder has the same tensors
            self.register_buffer("bias", torch.zeros(cfg.vocab_size))
        self.frozen_decoder, self.hub_correction = frozen_decoder, hub_correction
        if hub_correction:  # each word's mean score over the training inputs, a running mean of the last
            # ~100 batches (a buffer: saved with the head, so evaluate and predict correct as training did)
            self.register_buffer("hub", torch.zeros(cfg.vocab_size))

    def forward(self, cls):                                   # cls: (B, H)
        h = self.norm(F.gelu(self.dense(cls)))                 # (B, H)
        decoder = self.decoder.detach() if self.frozen_decoder else self.decoder
        logits = F.linear(h, decoder, self.bias)               # (B, V)
        if not self.hub_correction:
            return logits
        if self.training:  # the loss reads the scores as they are; the mean is kept for prediction
            with torch.no_grad():
                self.hub.lerp_(logits.detach().float().mean(0), HUB_MOMENTUM)
            return logits
        return logits - self.hub.to(logits.dtype)


HUB_MOMENTUM = 0.01  # the running mean's weight on each new batch


def _padded(mask: torch.Tensor, size: int) -> torch.Tensor:
    """A (V,) token mask over `size` logits: embedding rows past the tokenizer's ids (a vocabulary
    padded to a multiple of 8) are no token, never a prediction."""
    return torch.cat([mask, mask.new_zeros(size - mask.numel())]) if mask.numel() < size else mask


class WordTask(Task):
    name = "word"
    primary_metric = "acc@1"
    options = {"tied": boolean, "bias": boolean, "frozen_decoder": boolean, "hub_correction": boolean,
               "transform": one_of("random", "mlm"), "negatives": one_of("vocabulary", "targets")}

    def fit(self, train, options):
        super().fit(train, options)
        if options.get("negatives") == "targets":  # kept in bertkit.json: a resumed run trains the same way
            self.info["train_targets"] = sorted({ex["word"] for ex in train if ex["word"]})

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
        negatives = None
        if self.info.get("negatives") == "targets":  # (V,) bool: the training targets, the training softmax's words
            negatives = torch.zeros_like(candidates)
            for word in self.info.get("train_targets", []):
                i = tokenizer.token_to_id(normalize(word).strip())
                if i is not None:
                    negatives[i] = True
        for ex, e in zip(examples, encs):
            # the target as the tokenizer sees text (an uncased vocabulary strips accents too:
            # "café" is the token "cafe"), then looked up whole
            # ("中" normalizes to " 中 ": Chinese characters are spaced apart, hence the strip)
            target = tokenizer.token_to_id(normalize(ex["word"]).strip()) if ex["word"] else None
            unreachable += ex["word"] is not None and target is None
            feats.append({"input_ids": e.ids, "token_type_ids": e.type_ids, "attention_mask": [1] * len(e.ids),
                          "labels": -100 if target is None else target,
                          # what forward and decode need, shared by every feature (one object each)
                          "candidates": candidates, "vocabulary": vocabulary, "negatives": negatives})
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
        if feats[0].get("negatives") is not None:
            batch["negatives"] = feats[0]["negatives"]  # (V,) bool: the words the training loss ranks the target among
        return batch

    def head(self, cfg, bert):
        return WordHead(cfg, bert.embeddings.word, tied=self.info.get("tied", True), bias=self.info.get("bias", True),
                        frozen_decoder=self.info.get("frozen_decoder", False),
                        hub_correction=self.info.get("hub_correction", False))

    def init_head(self, head, cfg):
        super().init_head(head, cfg)
        if self.info.get("transform", "random") == "mlm":
            from ..folders import has_trained_mlm_head, load_model
            base = self.info.get("base_model")
            if base is None or not has_trained_mlm_head(base):
                raise BertkitError(f"--option transform=mlm: {base} has no trained MLM head (cls.predictions.*) "
                                   "to start the transform from; leave the option out (transform=random)")
            mlm = load_model(base, heads=True, quiet=True)[0].mlm
            with torch.no_grad():
                head.dense.load_state_dict(mlm.dense.state_dict())
                head.norm.load_state_dict(mlm.norm.state_dict())

    def forward(self, model, batch):
        # the head reads the last layer at [CLS] alone: it runs there only
        out = model.bert(**bert_inputs(batch), last_layer_rows=torch.zeros_like(batch["input_ids"][:, :1]))
        logits = model.head(out.sequence_output[:, 0]).float()                 # (B, V)
        labels = batch["labels"]
        candidates = _padded(batch["candidates"], logits.size(-1))
        scored = logits
        if model.training and "negatives" in batch:  # evaluation's loss still ranges over the whole vocabulary
            scored = logits.masked_fill(~_padded(batch["negatives"], logits.size(-1)), float("-inf"))
        loss = F.cross_entropy(scored, labels, ignore_index=-100) if (labels != -100).any() else None
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
