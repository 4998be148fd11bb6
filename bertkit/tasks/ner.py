"""Token classification: named entities (`ner`, a linear layer per token) and tagging with a
linear-chain CRF on top (`tag`).

Words are split into pieces; a word's label sits on its first piece and the other pieces are
ignored in the loss. Predictions are read at first pieces and mapped back to words by word id
(`Encoding.word_ids`), so there is always exactly one prediction per input word. Words the model
never sees are predicted "O" and counted on stderr: words cut off by the length limit, and words
that tokenize to no piece at all (a zero-width space "\u200b", a soft hyphen "\u00ad", a
variation selector "\ufe0f": the normaliser drops them). Keying by word id keeps such a word
from shifting every later label onto the next word.

Tags are read as BIO (IOB2). Data in IOB1 (CoNLL-2003 as distributed: I-X begins an entity,
B-X only where one directly follows another of the same type) is told apart by its entity
starts, trained and decoded as BIO, and its predictions given back in IOB1: read as BIO, the
constrained decoding would forbid its entity starts (no entity at all where it has no B- tag)
and the CRF's loss would be about 1e4 per sentence. A stray I-X that begins an entity in BIO
data is read as B-X, as seqeval reads it.

Tags in BIOES (B-, I-, E- last, S- single word) or BILOU (L- last, U- unit) are learned and
decoded in their own scheme: every type gets all of the scheme's prefixes, and the constraints
of the CRF and of BIO decoding keep an entity open until its E-X / L-X. Entity spans are read by
one function, `entities`, for every scheme (as seqeval reads BIO, IOB1 and BIOES, and BILOU
alike); evaluation scores those spans, and a training sequence that breaks its scheme is learned
as those spans written validly (counted on stderr).

`ner` decodes BIO (or BIOES, BILOU) tags by default as the best valid tag sequence under its
softmax (Viterbi over the per-word log-probabilities, I-X only after B-X or I-X): the same weights
as transformers' BertForTokenClassification, without its invalid spans. `--option decode=argmax`
takes each word's most likely tag instead.
"""
from __future__ import annotations

import sys

import torch.nn.functional as F
from torch import nn

from ..errors import BertkitError
from .base import Task, bert_inputs, one_of, pad, probability
from .crf import CRF, SCHEMES, label_scheme, scheme_constraints


def _kind(tag: str) -> str | None:
    return tag[2:] if tag[:2] in ("B-", "I-") and len(tag) > 2 else None


def to_iob1(tags: list[str]) -> list[str]:
    """BIO to IOB1: B-X stays only where an entity directly follows another of type X."""
    out, prev = [], "O"
    for t in tags:
        out.append("I-" + t[2:] if t.startswith("B-") and _kind(prev) != _kind(t) else t)
        prev = t
    return out


def _parse(tag: str) -> tuple[str, str | None]:
    """(prefix, type) of a tag, L- read as E- and U- as S-; ("O", None) for O and for a tag of no
    scheme."""
    if tag[:1] in "BIESLU" and tag[1:2] == "-" and len(tag) > 2:
        return {"L": "E", "U": "S"}.get(tag[0], tag[0]), tag[2:]
    return "O", None


def entities(tags: list[str]) -> list[tuple[str, int, int]]:
    """Entity spans (type, start, end), end exclusive, of tags in BIO, IOB1, BIOES or BILOU, read
    as seqeval's default mode (and conlleval) reads them: an entity begins at B-X or S-X / U-X, or
    at an I-X or E-X / L-X that does not continue an open entity of type X; it ends after E-X / L-X
    or S-X / U-X, or before a tag that does not continue it. A broken sequence is read too
    (an argmax decoding's), as they read it."""
    spans, kind, begin = [], None, 0
    for i, tag in enumerate([*tags, "O"]):
        prefix, t = _parse(tag)
        continues = kind is not None and t == kind and prefix in "IE"
        if kind is not None and not continues:
            spans.append((kind, begin, i))
            kind = None
        if t is not None and not continues:
            kind, begin = t, i
        if kind is not None and prefix in "ES":  # E-X and S-X close their entity at this word
            spans.append((kind, begin, i + 1))
            kind = None
    return spans


def write_entities(spans: list[tuple[str, int, int]], n: int, scheme: str) -> list[str]:
    """n tags in `scheme` ("bio", "bioes" or "bilou") that hold exactly these spans (as entities
    gives them)."""
    # BIO: B-X alone and B-X I-X ... I-X
    begin, inside, last, unit = "BIIB" if scheme == "bio" else SCHEMES[scheme]
    tags = ["O"] * n
    for kind, start, end in spans:
        if end - start == 1:
            tags[start] = f"{unit}-{kind}"
            continue
        tags[start:end] = [f"{begin}-{kind}"] + [f"{inside}-{kind}"] * (end - start - 2) + [f"{last}-{kind}"]
    return tags


def to_bio(tags: list[str]) -> list[str]:
    """Tags of any scheme (IOB1, BIO with stray I- tags, BIOES, BILOU) as BIO holding the same
    entities: an I-X that begins an entity (first word, after O or after another type) becomes B-X."""
    return write_entities(entities(tags), len(tags), "bio")


def tag_scheme(sequences) -> str:
    """"iob1" when entities begin with I- and never with B- (B- only between two of a type), else "bio"."""
    b_starts = i_starts = 0
    for tags in sequences:
        prev = "O"
        for t in tags:
            if _kind(t) is not None and _kind(prev) != _kind(t):  # an entity begins here
                b_starts += t.startswith("B-")
                i_starts += t.startswith("I-")
            prev = t
    return "iob1" if i_starts and not b_starts else "bio"


class TokenHead(nn.Module):
    def __init__(self, hidden: int, n_labels: int, dropout: float, crf: CRF | None = None):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden, n_labels)  # HF BertForTokenClassification's name
        self.crf = crf

    def forward(self, h):                  # h: (B, T, H)
        return self.classifier(self.drop(h))  # (B, T, n_labels)


class NerTask(Task):
    name = "ner"
    primary_metric = "f1"
    options = {"dropout": probability, "decode": one_of("bio", "argmax")}
    hf_architecture = "BertForTokenClassification"
    use_crf = False

    def read(self, path):
        from ..data.readers import read_conll
        return [{"words": w, "tags": t, "lines": n} for w, t, n in read_conll(path, lines=True)]

    def read_inputs(self, path=None, texts=None):
        # one sentence per line (or JSONL "text"), split on whitespace into words
        if path is not None:
            from ..inputs import read_single_texts
            texts = read_single_texts(path, self.name)
        return [{"words": t.split(), "tags": None} for t in texts]

    def fit(self, train, options):
        super().fit(train, options)
        names = sorted({t for ex in train for t in ex["tags"]})
        scheme = not_scheme = None  # the labels' scheme, or why they are in none (a label not O / B-X / ...)
        try:
            scheme = label_scheme(names)
        except ValueError as e:
            not_scheme = e
        if scheme:
            # BIO-shaped labels may be IOB1: told apart by how entities begin
            self.info["scheme"] = tag_scheme(ex["tags"] for ex in train) if scheme == "bio" else scheme
            broken = sum(a != b for ex in train for a, b in zip(ex["tags"], self._as_learned(ex["tags"])))
            if self.info["scheme"] == "bio" and broken:
                print(f"bertkit: {broken} training tag(s) I-X begin an entity (after O or another type): "
                      "read as B-X", file=sys.stderr)
            elif scheme != "bio" and broken:  # as entities() reads them: B-X O is the one-word S-X
                print(f"bertkit: {broken} training tag(s) break the {scheme.upper()} scheme (an entity left "
                      "open, or continued without a beginning): learned as the entities they mark", file=sys.stderr)
        if not_scheme and not self.use_crf:
            self._io_tags(train, names)
        labels = {t for ex in train for t in self._as_learned(ex["tags"])}
        if scheme:  # every prefix of the scheme for every type: a type seen only in one-word entities
            # refused an evaluation file's I-X (or E-X) as a tag the model did not know
            labels |= {f"{p}-{t[2:]}" for t in labels if t != "O" for p in SCHEMES[scheme]}
        order = SCHEMES[scheme] if scheme else None  # a type's tags in its scheme's order: B-X, I-X, E-X, S-X
        labels = sorted(labels, key=lambda t: (t != "O", t[2:], order.index(t[0]) if order and t != "O" else 0, t[:2]))
        if not_scheme and self.use_crf:
            raise BertkitError(f"the CRF's transition constraints need BIO (or BIOES, BILOU) tags: {not_scheme}") from None
        if not self.use_crf:
            if self.info.get("decode") == "bio" and not_scheme:
                raise BertkitError(f"--option decode=bio needs BIO tags (or BIOES, BILOU): {not_scheme}") from None
            # the study (benchmarks/finetune_study.py) measured BIO decoding on wnut16; folders
            # from before it have no "decode" key and keep the argmax they were trained with
            self.info.setdefault("decode", "argmax" if not_scheme else "bio")
        self.info["labels"] = labels

    def _as_learned(self, tags: list[str]) -> list[str]:
        """Tags as the model learns them: the entities they mark, written validly in the scheme
        learned (BIO for IOB1 data). A folder from before "scheme" was recorded, or with labels of
        no scheme, reads them as they are, and so does a sequence with a tag of no scheme (which
        check() then names)."""
        scheme = self.info.get("scheme")
        if scheme is None or any(t != "O" and _parse(t)[1] is None for t in tags):
            return tags
        return write_entities(entities(tags), len(tags), "bio" if scheme == "iob1" else scheme)

    def check(self, examples, source):
        known = set(self.info["labels"])
        for i, ex in enumerate(examples):
            tags = ex["tags"] or []
            bad = [(j, t) for j, (t, learned) in enumerate(zip(tags, self._as_learned(tags))) if learned not in known]
            if bad:
                j, tag = bad[0]
                where = f"line {ex['lines'][j]}" if ex.get("lines") else f"sentence {i + 1}"
                raise BertkitError(f"{source}, {where}: tag {tag!r} is not one the model knows "
                                   f"({', '.join(self.info['labels'])})")

    def features(self, examples, tokenizer, max_len):
        tok = tokenizer.tok
        tok.enable_truncation(max_len)
        encs = tok.encode_batch([ex["words"] for ex in examples], is_pretokenized=True)
        index = {t: i for i, t in enumerate(self.info["labels"])}
        feats, cut, empty = [], 0, 0
        for ex, e in zip(examples, encs):
            # first piece of each word that has pieces: positions and the word ids they belong to
            starts, start_words, seen = [], [], set()
            for pos, w in enumerate(e.word_ids):
                if w is not None and w not in seen:
                    seen.add(w)
                    starts.append(pos)
                    start_words.append(w)
            last = max(start_words, default=-1)
            missing = [w for w in range(len(ex["words"])) if w not in seen]
            # a missing word after the last one seen in a truncated sentence was cut off;
            # any other missing word tokenized to nothing
            # (`overflowing` builds every cut-off window anew at each read: once per sentence)
            cut_here = sum(1 for w in missing if w > last) if missing and e.overflowing else 0
            cut += cut_here > 0
            empty += len(missing) - cut_here
            labels = [-100] * len(e.ids)
            # by word id, never by rank: a zero-piece word must not shift later labels
            tags = self._as_learned(ex["tags"]) if ex["tags"] else None
            word_labels = [index[tags[w]] for w in start_words] if tags else [0] * len(starts)
            for pos, lab in zip(starts, word_labels):
                labels[pos] = lab
            feats.append({"input_ids": e.ids, "token_type_ids": [0] * len(e.ids), "attention_mask": [1] * len(e.ids),
                          "labels": labels if ex["tags"] else [-100] * len(e.ids), "word_starts": starts,
                          "word_ids": start_words, "word_labels": word_labels, "word_mask": [1] * len(starts),
                          "n_words": len(ex["words"])})
        if cut:
            print(f"bertkit: {cut} sentence(s) longer than {max_len} pieces: their last words are predicted 'O'",
                  file=sys.stderr)
        if empty:
            print(f"bertkit: {empty} word(s) tokenize to no word piece (e.g. a zero-width space): "
                  f"they are predicted 'O'", file=sys.stderr)
        return feats

    def loss_units(self, feat):
        if self.use_crf:  # the CRF's loss: a mean over sentences with at least one word to score
            return int(bool(feat["word_starts"]) and any(lab != -100 for lab in feat["labels"]))
        return sum(lab != -100 for lab in feat["labels"])  # cross-entropy: a mean over labelled words

    def collate(self, feats, tokenizer):
        return pad(feats, {"input_ids": tokenizer.pad_id, "token_type_ids": 0, "attention_mask": 0, "labels": -100,
                           "word_starts": 0, "word_labels": 0, "word_mask": 0})

    def head(self, cfg, bert):
        n = len(self.info["labels"])
        crf = CRF(n, scheme_constraints(self.info["labels"])) if self.use_crf else None
        return TokenHead(cfg.hidden_size, n, self.info.get("dropout", 0.1), crf)

    def forward(self, model, batch):
        h = model.bert(**bert_inputs(batch)).sequence_output
        logits = model.head(h).float()                                         # (B, T, L)
        has_targets = bool((batch["labels"] != -100).any())
        # per word: the logits of its first piece
        starts = batch["word_starts"]                                           # (B, W)
        emissions = logits.gather(1, starts[..., None].expand(-1, -1, logits.size(-1)))  # (B, W, L)
        mask = batch["word_mask"].bool()                                        # (B, W)
        if self.use_crf:
            loss = None
            if has_targets and mask.size(1) and mask[:, 0].any():
                rows = mask[:, 0]  # a sentence whose words all tokenize to nothing has no word to score
                loss = model.head.crf(emissions[rows], batch["word_labels"][rows], mask[rows])
            return loss, _viterbi(model.head.crf, emissions, mask)
        loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100) if has_targets else None
        if self.info.get("decode", "argmax") == "bio":
            if getattr(self, "_bio", None) is None:  # constraints only: no learned transitions
                self._bio = CRF(logits.size(-1), scheme_constraints(self.info["labels"]))
            return loss, _viterbi(self._bio.to(logits.device), emissions.log_softmax(-1), mask)
        words = emissions.argmax(-1)                                            # (B, W)
        return loss, [row[:int(n)] for row, n in zip(words.tolist(), mask.sum(1).tolist())]

    def decode(self, outputs, feats, examples):
        rows = [r for out in outputs for r in out]
        labels = self.info["labels"]
        preds = []
        for row, f in zip(rows, feats):
            # row[k] belongs to the k-th word with pieces: place it by word id, "O" elsewhere
            tags = ["O"] * f["n_words"]
            for w, i in zip(f["word_ids"], row):
                tags[w] = labels[i]
            preds.append(to_iob1(tags) if self.info.get("scheme") == "iob1" else tags)
        return preds

    def _io_tags(self, train, names: list[str]) -> None:
        """Tags of no scheme: a prefix written in lower case ("b-per") is refused by its line; tags
        with no prefix at all ("PER") are read as IO, a run of one type being one entity."""
        lower = next((t for t in names if t[:1] in "bieslu" and t[1:2] == "-" and len(t) > 2), None)
        if lower is not None:
            ex, i = next((ex, i) for ex in train for i, t in enumerate(ex["tags"]) if t == lower)
            where = f"line {ex['lines'][i]}" if ex.get("lines") else "the training file"
            raise BertkitError(f"{where}: tag {lower!r}: entity prefixes are upper case (B-, I-, E-, S-, L-, U-), "
                               f"as in {lower[0].upper() + lower[1:]!r}")
        if all(t == "O" or _parse(t)[1] is None for t in names) and len(names) > 1:
            self.info["io"] = True
            print("bertkit: the tags have no B-/I- prefixes: read as IO (a run of one type is one entity) for "
                  "the entity scores", file=sys.stderr)

    def metrics(self, predictions, examples):
        from seqeval.metrics import f1_score, precision_score, recall_score
        gold = [ex["tags"] for ex in examples]
        # seqeval scores the spans entities() reads, given to it as BIO: read by seqeval itself,
        # BILOU's L-X and U-X do not end an entity (two U-X in a row were one entity)
        scored = "scheme" in self.info
        g, p = ([to_bio(t) for t in gold], [to_bio(t) for t in predictions]) if scored else (gold, predictions)
        if self.info.get("io"):  # IO tags: each as I-X, which seqeval reads as runs of one type
            g, p = ([[t if t == "O" else f"I-{t}" for t in seq] for seq in tags] for tags in (g, p))
        # no entity predicted (or none in gold): 0, seqeval's value, without its warning to the user
        score = lambda metric: metric(g, p, zero_division=0)  # noqa: E731
        return {"precision": score(precision_score), "recall": score(recall_score),
                "f1": score(f1_score), "sentences": len(gold),
                "token_accuracy": sum(p == g for ps, gs in zip(predictions, gold) for p, g in zip(ps, gs))
                / max(1, sum(len(g) for g in gold))}

    def hf_config(self):
        labels = self.info["labels"]
        return {"id2label": {str(i): lab for i, lab in enumerate(labels)},
                "label2id": {lab: i for i, lab in enumerate(labels)}}

    def describe(self, prediction, example):
        out = {"words": example["words"], "tags": prediction}
        if "scheme" in self.info:  # tags of an entity scheme: its spans too, read as evaluation reads them
            words = example["words"]
            out["entities"] = [{"type": kind, "start": start, "end": end, "text": " ".join(words[start:end])}
                               for kind, start, end in entities(prediction)]  # word indices, end exclusive
        return out


def _viterbi(crf: CRF, emissions, mask) -> list[list[int]]:
    """The CRF's best path per sentence (emissions (B, W, L), mask (B, W)); [] for a sentence
    with no word to run over."""
    paths = [[] for _ in range(len(mask))]
    rows = mask[:, 0].nonzero().flatten().tolist() if mask.size(1) else []
    if rows:
        for r, path in zip(rows, crf.decode(emissions[rows], mask[rows])):
            paths[r] = path
    return paths


class TagTask(NerTask):
    name = "tag"
    options = {"dropout": probability}  # the CRF decodes within the tag scheme always
    use_crf = True
    hf_architecture = "BertModel"  # transformers has no CRF head
