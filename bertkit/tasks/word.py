"""A short phrase to one word ("large" -> "size", "very heavy" -> "weight").

The default head, `head=encoder`, makes it a reverse dictionary over any candidate words, those no
example trained on included (candidates.py; options words and temperature). A folder whose
bertkit.json names no head has the head the rest of this note is about, `head=vocab`, the right
choice for a closed label set:

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
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import BertkitError
from .base import Task, bert_inputs, boolean, one_of, pad
from .candidates import CandidateHead, contrastive_loss, encode_words, ranks, refresh

WORD_MAX_LEN = 16  # tokens a candidate word is read in, [CLS] and [SEP] included


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
TEMPERATURE = 0.05  # head=encoder: cosines are divided by it in the loss


def candidate_words(words_file: str | None, train: list[dict]) -> list[str]:
    """head=encoder's candidate vocabulary: the words of `words_file` (one per line), else WordNet's
    one-word lemmas where WordNet is installed; the training file's targets always among them."""
    targets = {ex["word"] for ex in train if ex["word"]}
    if words_file is not None:
        from ..inputs import read_text
        path = Path(words_file)
        if not path.is_file():
            raise BertkitError(f"--option words={words_file}: no such file")
        words = set()
        for lineno, line in enumerate(read_text(path).split("\n"), 1):
            if line.strip() and len(line.split()) != 1:
                raise BertkitError(f"{path}, line {lineno}: one word per line, found {line.strip()[:60]!r}")
            words.update(line.split())
        if not words:
            raise BertkitError(f"{path}: no words in it")
        return sorted(words | targets)
    try:
        from ..data.wordnet_definitions import definition_pairs
        return sorted({r["word"] for r in definition_pairs()} | targets)
    except BertkitError:  # WordNet is not installed
        print("bertkit: warning: WordNet is not installed, so the candidate words are the training targets "
              "alone; --option words=FILE gives a vocabulary", file=sys.stderr)
        return sorted(targets)


def _padded(mask: torch.Tensor, size: int) -> torch.Tensor:
    """A (V,) token mask over `size` logits: embedding rows past the tokenizer's ids (a vocabulary
    padded to a multiple of 8) are no token, never a prediction."""
    return torch.cat([mask, mask.new_zeros(size - mask.numel())]) if mask.numel() < size else mask


def _temperature(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
        raise ValueError(f"must be a number in (0, 1], got {v!r}")
    return float(v)


def _words_file(v):
    if not isinstance(v, str) or not v:
        raise ValueError(f"must be a file of words, one per line, got {v!r}")
    return v


class WordTask(Task):
    name = "word"
    primary_metric = "acc@1"
    options = {"head": one_of("vocab", "encoder"), "words": _words_file, "temperature": _temperature,
               "tied": boolean, "bias": boolean, "frozen_decoder": boolean, "hub_correction": boolean,
               "transform": one_of("random", "mlm"), "negatives": one_of("vocabulary", "targets")}

    top_k = 10  # words per prediction (`predict --top-k`, the server's top_k)
    # each head's own options: given with the other head, they would do nothing
    HEAD_OPTIONS = {"encoder": ("words", "temperature"),
                    "vocab": ("tied", "bias", "frozen_decoder", "hub_correction", "transform", "negatives")}

    @property
    def encoder_head(self) -> bool:
        return self.info.get("head", "vocab") == "encoder"  # no head named: the vocabulary head

    def fit(self, train, options):
        head = options.get("head", "vocab")
        for other, keys in self.HEAD_OPTIONS.items():
            if other != head and (given := [k for k in keys if k in options]):
                raise BertkitError(f"--option {given[0]}: an option of head={other}, and this run's head is {head}; "
                                   f"give --option head={other} as well, or leave {given[0]} out")
        super().fit(train, options)
        if options.get("negatives") == "targets":  # kept in bertkit.json: a resumed run trains the same way
            self.info["train_targets"] = sorted({ex["word"] for ex in train if ex["word"]})
        if self.encoder_head and "candidate_words" not in self.info:
            self.info["candidate_words"] = candidate_words(options.get("words"), train)
            if "pooling" not in self.info:
                from ..pooling import folder_pooling
                base = self.info.get("base_model")
                self.info["pooling"] = (folder_pooling(base) if base else None) or "cls"

    def read(self, path):
        from ..data.readers import read_word
        return read_word(path)

    def read_inputs(self, path=None, texts=None):
        if path is not None:
            from ..inputs import read_single_texts
            texts = read_single_texts(path, self.name)
        return [{"text": t, "word": None} for t in texts]

    def features(self, examples, tokenizer, max_len):
        if self.encoder_head:
            return self._candidate_features(examples, tokenizer, max_len)
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

    def _candidate_features(self, examples, tokenizer, max_len):
        words = self.info["candidate_words"]
        if getattr(self, "_tokenized_for", None) is not tokenizer:  # every candidate, tokenized once
            self._candidate_ids = [e.ids for e in tokenizer.encode_unpadded(words, None, WORD_MAX_LEN)]
            self._pad_id, self._tokenized_for = tokenizer.pad_id, tokenizer
            self._index = {w: i for i, w in enumerate(words)}
        targets = [ex["word"] for ex in examples]
        target_ids = tokenizer.encode_unpadded([w or "" for w in targets], None, WORD_MAX_LEN)
        encs = tokenizer.encode_unpadded([ex["text"] for ex in examples], None, max_len)
        feats, outside, others = [], [], {}
        for word, e, w in zip(targets, encs, target_ids):
            label = self._index.get(word, -100) if word else -100
            if word and label == -100:
                outside.append(word)
            # a word's identity in the batch: its candidate row, or a number of its own past them
            key = label if label != -100 else len(words) + others.setdefault(word, len(others))
            feats.append({"input_ids": e.ids, "token_type_ids": [0] * len(e.ids), "attention_mask": [1] * len(e.ids),
                          "labels": label, "word_ids": w.ids if word else [], "key": key})
        if outside:
            missing = sorted(set(outside))
            named = ", ".join(map(repr, missing[:5])) + (", ..." if len(missing) > 5 else "")
            print(f"bertkit: {len(outside)} of {len(examples)} target word(s) are not among the {len(words):,} "
                  f"candidate words ({named}): they train, but are never predicted and count as wrong", file=sys.stderr)
        return feats

    def loss_units(self, feat):
        return int(bool(feat["word_ids"])) if self.encoder_head else super().loss_units(feat)

    def collate(self, feats, tokenizer):
        if self.encoder_head:
            batch = pad(feats, {"input_ids": tokenizer.pad_id, "token_type_ids": 0, "attention_mask": 0,
                                "labels": -100, "key": 0})
            words = pad([{"input_ids": f["word_ids"] or [tokenizer.pad_id]} for f in feats],
                        {"input_ids": tokenizer.pad_id})["input_ids"]
            batch["word_ids"] = words
            batch["has_word"] = torch.tensor([bool(f["word_ids"]) for f in feats])
            return batch
        batch = pad(feats, {"input_ids": tokenizer.pad_id, "token_type_ids": 0, "attention_mask": 0, "labels": -100})
        batch["candidates"] = feats[0]["candidates"]  # (V,) bool: whole-word tokens
        if feats[0].get("negatives") is not None:
            batch["negatives"] = feats[0]["negatives"]  # (V,) bool: the words the training loss ranks the target among
        return batch

    def head(self, cfg, bert):
        if self.encoder_head:
            return CandidateHead(len(self.info["candidate_words"]), cfg.hidden_size)
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

    def _forward_encoder(self, model, batch):
        pooling, temperature, head = self.info["pooling"], self.info.get("temperature", TEMPERATURE), model.head
        phrases = encode_words(model.bert, batch["input_ids"], batch["attention_mask"], pooling)   # (B, H)
        labels = batch["labels"]
        if model.training:
            if not getattr(head, "filled", False) and not head.vectors.any():  # a new head: its first cache
                refresh(model, self._candidate_ids, self._pad_id, pooling)
            head.filled = True
            has = batch["has_word"]
            if not has.any():
                return None, None
            words = batch["word_ids"][has]
            targets = encode_words(model.bert, words, (words != self._pad_id).long(), pooling)    # (B', H)
            head.fresh.fill_(0.0)
            loss = contrastive_loss(phrases[has], targets, head.vectors, batch["key"][has], labels[has], temperature)
            return loss, None
        if not head.fresh:  # training moved the encoder since the cache was made
            refresh(model, self._candidate_ids, self._pad_id, pooling)
        scores = phrases @ head.vectors.T                                                          # (B, N)
        loss = F.cross_entropy(scores / temperature, labels) if (labels != -100).any() else None
        top = scores.topk(min(self.top_k, scores.size(1)), dim=-1)
        return loss, (top.indices.cpu(), top.values.cpu(), ranks(scores, labels).cpu())

    def forward(self, model, batch):
        if self.encoder_head:
            return self._forward_encoder(model, batch)
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
        probs, ids = logits.softmax(-1).topk(min(self.top_k, int(candidates.sum())), dim=-1)
        return loss, (ids.cpu(), probs.cpu())

    def decode(self, outputs, feats, examples):
        if self.encoder_head:
            words = self.info["candidate_words"]
            ids = torch.cat([o[0] for o in outputs]).tolist()
            scores = torch.cat([o[1] for o in outputs]).tolist()
            rank = torch.cat([o[2] for o in outputs]).tolist()
            # "rank": the target's among the candidates (None when it is none of them)
            return [{"word": words[row[0]], "top": [{"word": words[i], "score": p} for i, p in zip(row, ps)],
                     "target": words[f["labels"]] if f["labels"] != -100 else None,
                     "rank": r if f["labels"] != -100 else None}
                    for row, ps, r, f in zip(ids, scores, rank, feats)]
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
        if not self.encoder_head:
            return {"acc@1": hits1 / n, "acc@5": hits5 / n, "examples": len(examples)}
        # a target that is no candidate ranks past them all
        worst = len(self.info["candidate_words"]) + 1
        rank = sorted(p["rank"] or worst for p in predictions)
        return {"acc@1": hits1 / n, "acc@5": hits5 / n, "acc@10": sum(r <= 10 for r in rank) / n,
                "acc@100": sum(r <= 100 for r in rank) / n, "median_rank": rank[len(rank) // 2] if rank else None,
                "not_candidates": sum(p["rank"] is None for p in predictions), "candidates": worst - 1,
                "examples": len(examples)}

    def describe(self, prediction, example):
        return {"text": example["text"], "word": prediction["word"], "top": prediction["top"]}
