"""Extractive question answering, the non-neural half: SQuAD JSON, windows, span search, metrics.

The model predicts a start and an end logit per token; everything around that lives here:
reading SQuAD v1.1 / v2.0 files strictly, cutting long contexts into overlapping windows
with character offsets, finding the best valid span over all windows of a question, and the
official SQuAD exact-match / F1 scores.
"""
from __future__ import annotations

import collections
import json
import random
import re
import string
import unicodedata
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import BertkitError
from ..inputs import parse_json, read_text
from ..tokenizer import WordPieceTokenizer


@dataclass
class QAExample:
    id: str
    question: str
    context: str
    answers: list[dict]  # [{"text": str, "answer_start": int}]; empty when unanswerable (v2)
    is_impossible: bool
    title: str           # the article: train / eval splits never share one


# ---- reading ----
_KINDS = {str: "a string", int: "an integer", list: "a list", dict: "an object", bool: "true or false"}


def read_squad(path: str | Path) -> list[QAExample]:
    """All questions of a SQuAD v1.1 / v2.0 JSON file, every answer checked against its context."""
    path = Path(path)
    doc = parse_json(read_text(path).removeprefix("\ufeff"), str(path))  # a byte-order mark, as other readers allow

    def get(obj, key, where, kind, default=...):
        if not isinstance(obj, dict):
            raise BertkitError(f"{path}: {where}: expected a JSON object, got {type(obj).__name__}")
        if key not in obj:
            if default is not ...:
                return default
            raise BertkitError(f"{path}: {where}: missing key '{key}'")
        v = obj[key]
        if not isinstance(v, kind) or (isinstance(v, bool) and kind is not bool):
            raise BertkitError(f"{path}: {where}: '{key}' should be {_KINDS[kind]}, got {json.dumps(v)[:60]}")
        return v

    examples: list[QAExample] = []
    seen: set[str] = set()
    # numbered from 1, as every other error names lines and texts
    for i, article in enumerate(get(doc, "data", "top level", list), 1):
        title = get(article, "title", f"article {i}", str)
        for j, para in enumerate(get(article, "paragraphs", f"article {i} ({title!r})", list), 1):
            where = f"article {i} ({title!r}), paragraph {j}"
            context = get(para, "context", where, str)
            for k, qa in enumerate(get(para, "qas", where, list), 1):
                qid = get(qa, "id", f"{where}, question {k}", str)
                if qid in seen:  # predictions are keyed by id: a duplicate would overwrite one silently
                    raise BertkitError(f"{path}: question {qid}: the id occurs twice")
                seen.add(qid)
                at = f"question {qid}"
                question = get(qa, "question", at, str)
                if not question.strip():  # trained on, it taught nothing; predicted, it asked nothing
                    raise BertkitError(f"{path}: {at}: the question is empty")
                impossible = get(qa, "is_impossible", at, bool, default=False)
                answers = get(qa, "answers", at, list, default=[] if impossible else ...)
                if impossible and answers:
                    raise BertkitError(f"{path}: {at}: marked is_impossible but lists {len(answers)} answer(s)")
                if not impossible and not answers:
                    raise BertkitError(f"{path}: {at}: no answers, and not marked is_impossible")
                clean = []
                for a in answers:
                    text = get(a, "text", at, str)
                    start = get(a, "answer_start", at, int)
                    if not text.strip():
                        raise BertkitError(f"{path}: {at}: an answer text is empty")
                    there = context[max(start, 0):start + len(text)]
                    if start < 0 or there != text:
                        raise BertkitError(f"{path}: {at}: answer {text!r} does not occur at answer_start "
                                           f"{start} (the context has {there!r} there)")
                    clean.append({"text": text, "answer_start": start})
                examples.append(QAExample(qid, question, context, clean, impossible, title))
    if not examples:
        raise BertkitError(f"{path}: no questions in the file")
    return examples


# ---- windows ----
@dataclass
class QAFeatures:
    """One row per window: [CLS] question [SEP] context piece [SEP], unpadded."""
    input_ids: list[list[int]] = field(default_factory=list)
    token_type_ids: list[list[int]] = field(default_factory=list)
    attention_mask: list[list[int]] = field(default_factory=list)
    example_index: list[int] = field(default_factory=list)   # the example each window came from
    offsets: list[list[tuple[int, int] | None]] = field(default_factory=list)  # chars in the context; None off it
    start_positions: list[int] = field(default_factory=list)  # answer tokens in the window; 0 ([CLS]) if absent
    end_positions: list[int] = field(default_factory=list)
    pad_id: int = 0

    def __len__(self) -> int:
        return len(self.input_ids)

    def batch(self, rows) -> dict[str, torch.Tensor]:
        """Windows `rows` padded to the longest of them: model inputs plus training targets."""
        rows = list(rows)
        T = max(len(self.input_ids[r]) for r in rows)
        out = {k: torch.tensor([getattr(self, k)[r] + [pad] * (T - len(getattr(self, k)[r])) for r in rows])
               for k, pad in (("input_ids", self.pad_id), ("token_type_ids", 0), ("attention_mask", 0))}  # (B, T)
        out["start_positions"] = torch.tensor([self.start_positions[r] for r in rows])  # (B,)
        out["end_positions"] = torch.tensor([self.end_positions[r] for r in rows])
        return out


def make_windows(examples: list[QAExample], tokenizer: WordPieceTokenizer, max_len: int = 384,
                 doc_stride: int = 128, max_query_len: int = 64) -> QAFeatures:
    """Cut each example into windows of at most max_len tokens; consecutive windows of a long
    context share doc_stride context tokens (the `tokenizers` overflow convention)."""
    if max_query_len < 1 or doc_stride < 0 or max_len - max_query_len - 3 <= doc_stride:
        raise BertkitError(f"max_len {max_len} leaves no room for a context window that moves: it must exceed "
                           f"max_query_len {max_query_len} + doc_stride {doc_stride} + 3 special tokens")
    tok = tokenizer.tok
    tok.no_truncation()  # encode_unpadded leaves truncation on; contexts must come back whole
    # The pair is encoded as two separate sequences, exactly as `tokenizers` does before truncating it.
    qencs = tok.encode_batch([e.question for e in examples], add_special_tokens=False)
    cencs = tok.encode_batch([e.context for e in examples], add_special_tokens=False)
    f = QAFeatures(pad_id=tokenizer.pad_id)
    for n, (ex, qe, ce) in enumerate(zip(examples, qencs, cencs)):
        # an Encoding's ids and offsets are copied out at each read: read them once, not per window
        q, ids, offsets = qe.ids[:max_query_len], ce.ids, ce.offsets
        room = max_len - len(q) - 3                 # context tokens per window
        k = len(q) + 2                              # index of the first context token in a window
        ts = te = None                              # the first answer in context-token indices
        if ex.answers:
            text, s = ex.answers[0]["text"], ex.answers[0]["answer_start"]
            e = s + len(text.rstrip())
            s += len(text) - len(text.lstrip())     # whitespace at the edges has no token
            ts = bisect_right([o[1] for o in offsets], s)          # first token ending after s
            te = bisect_left([o[0] for o in offsets], e) - 1       # last token starting before e
            if ts > te:  # only characters the normalizer deletes: no token to point at
                raise BertkitError(f"question {ex.id}: answer {text!r} has no tokens after tokenization")
        a = 0
        while True:
            b = min(a + room, len(ids))
            f.input_ids.append([tokenizer.cls_id] + q + [tokenizer.sep_id] + ids[a:b] + [tokenizer.sep_id])
            f.token_type_ids.append([0] * k + [1] * (b - a + 1))
            f.attention_mask.append([1] * (k + b - a + 1))
            f.offsets.append([None] * k + offsets[a:b] + [None])
            f.example_index.append(n)
            inside = ts is not None and a <= ts and te < b
            f.start_positions.append(k + ts - a if inside else 0)
            f.end_positions.append(k + te - a if inside else 0)
            if b == len(ids):
                break
            a += room - doc_stride
    return f


# ---- decoding ----
def best_spans(start_logits, end_logits, features: QAFeatures, examples: list[QAExample], n_best: int = 20,
               max_answer_len: int = 30, null_score_diff: float = 0.0,
               version_2: bool = False) -> list[list[dict]]:
    """The n best answer spans per question over all its windows, best (the prediction) first,
    in the order of `examples` (not keyed by id: predict's and serve's ids need not be unique).

    Logits are (windows, T) with T >= the longest window. A span is a (start, end) token pair
    inside the context with end - start < max_answer_len; its score is start + end logit.
    The same characters found in two overlapping windows count once, at the higher score.
    With version_2, an entry {"text": "", "score": null score} is ranked in too: it comes first
    when null_score - best span score > null_score_diff.
    """
    S = torch.as_tensor(start_logits).detach().double().cpu()  # (W, T); float64 so scores add exactly
    E = torch.as_tensor(end_logits).detach().double().cpu()
    if S.dim() != 2 or S.shape != E.shape or S.shape[0] != len(features):
        raise BertkitError(f"logits of shape {tuple(S.shape)} and {tuple(E.shape)} do not match "
                           f"{len(features)} windows")
    if features.example_index and max(features.example_index) >= len(examples):
        raise BertkitError(f"the features come from {max(features.example_index) + 1} or more examples, "
                           f"but only {len(examples)} were given")
    if n_best < 1 or max_answer_len < 1:
        raise BertkitError(f"n_best ({n_best}) and max_answer_len ({max_answer_len}) must be at least 1")
    # no span is longer than a window: a larger max_answer_len (1e9: "no limit") allowed nothing more
    # and sized the band below by it, out of memory
    W, T, A = *S.shape, min(max_answer_len, S.shape[1])
    if any(len(offs) > T for offs in features.offsets):
        raise BertkitError(f"a window is longer than the {T} logits given per window")
    # Span (i, i + d) for d < A as a band (W, T, A) rather than a full (T, T) matrix: exact, and
    # T / A times less work. Padding the ends with invalid positions keeps every row the same length.
    valid = torch.tensor([[o is not None for o in offs] + [False] * (T + A - 1 - len(offs))
                          for offs in features.offsets], dtype=torch.bool).view(W, T + A - 1)
    Epad = torch.nn.functional.pad(E, (0, A - 1), value=float("-inf"))          # (W, T + A - 1)
    cands: list[dict[tuple[int, int], float]] = [{} for _ in examples]
    contexts = [ex.context for ex in examples]
    null = [float("inf")] * len(examples)
    for w, v in enumerate((S[:, 0] + E[:, 0]).tolist()):  # [CLS] as the "no answer" span
        null[features.example_index[w]] = min(null[features.example_index[w]], v)
    for c in range(0, W, 256):  # chunks bound the memory to 256 * T * A scores
        ends = Epad[c:c + 256].unfold(1, A, 1)                                    # (w, T, A): e[i + d]
        ok = valid[c:c + 256, :T, None] & valid[c:c + 256].unfold(1, A, 1)       # (w, T, A)
        scores = (S[c:c + 256, :, None] + ends).masked_fill(~ok, float("-inf"))  # (w, T, A)
        # n_best per window suffices: a span below n_best others in its window is below them overall.
        top = scores.flatten(1).topk(min(n_best, T * A), dim=1)                  # (w, k)
        for w, (vals, idxs) in enumerate(zip(top.values.tolist(), top.indices.tolist()), c):
            offs, cand = features.offsets[w], cands[features.example_index[w]]
            for v, idx in zip(vals, idxs):
                if v == float("-inf"):  # fewer than n_best valid spans in this window
                    break
                i, d = divmod(idx, A)
                key = (offs[i][0], _past_marks(contexts[features.example_index[w]], offs[i + d][1]))
                if v > cand.get(key, float("-inf")):
                    cand[key] = v
    out: list[list[dict]] = []
    seen = set(features.example_index)
    for n, ex in enumerate(examples):
        if n not in seen:
            raise BertkitError(f"question {ex.id}: no window in the features (made from other examples?)")
        spans = sorted(cands[n].items(), key=lambda kv: (-kv[1], kv[0]))[:n_best]
        best = [{"text": ex.context[a:b], "score": v, "start_char": a, "end_char": b} for (a, b), v in spans]
        if version_2:
            # null beats a span only by more than null_score_diff
            pos = sum(1 for d in best if null[n] - d["score"] <= null_score_diff)
            best.insert(pos, {"text": "", "score": null[n], "start_char": None, "end_char": None})
        out.append(best)
    return out


def _past_marks(context: str, end: int) -> int:
    """`end` moved past the combining marks that follow it: an uncased vocabulary's normaliser
    strips accents, so a token's offsets end before a decomposed accent on its last letter
    ("e\u0301te\u0301" would be answered "e\u0301te")."""
    while end < len(context) and unicodedata.category(context[end]) in ("Mn", "Me"):
        end += 1
    return end


def predictions(nbest: list[list[dict]]) -> list[str]:
    """The top text per question ("" when there is no candidate or "no answer" wins)."""
    return [lst[0]["text"] if lst else "" for lst in nbest]


# ---- metrics (the official SQuAD v2.0 evaluation script, which extends v1.1's) ----
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """Lowercase, drop punctuation and the articles a/an/the, squeeze whitespace."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def _golds(golds: list[str]) -> list[str]:
    # v2: golds that normalize to nothing are dropped; none left means "no answer" is right
    return [g for g in golds if normalize_answer(g)] or [""]


def exact_match(pred: str, golds: list[str]) -> float:
    return max(float(normalize_answer(pred) == normalize_answer(g)) for g in _golds(golds))


def _f1(pred: str, gold: str) -> float:
    p, g = normalize_answer(pred).split(), normalize_answer(gold).split()
    if not p or not g:  # "no answer" scores 1 only against "no answer"
        return float(p == g)
    same = sum((collections.Counter(p) & collections.Counter(g)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def f1(pred: str, golds: list[str]) -> float:
    return max(_f1(pred, g) for g in _golds(golds))


def squad_metrics(preds: dict[str, str], examples: list[QAExample], version_2: bool | None = None) -> dict:
    """{"exact", "f1"} in 0-100 and "total"; with v2 (default: when any question is unanswerable)
    also HasAns_* and NoAns_* over the answerable and unanswerable questions."""
    missing = [ex.id for ex in examples if ex.id not in preds]
    if missing:  # the official script scores them 0 with a warning; a gap here is a bug upstream
        raise BertkitError(f"no prediction for {len(missing)} of {len(examples)} questions (first: {missing[0]})")
    if version_2 is None:
        version_2 = any(ex.is_impossible for ex in examples)
    rows = [(ex.is_impossible, exact_match(preds[ex.id], [a["text"] for a in ex.answers]),
             f1(preds[ex.id], [a["text"] for a in ex.answers])) for ex in examples]

    def score(rs):
        n = len(rs)
        return (100.0 * sum(r[1] for r in rs) / n if n else 0.0, 100.0 * sum(r[2] for r in rs) / n if n else 0.0, n)

    out = dict(zip(("exact", "f1", "total"), score(rows)))
    if version_2:
        for name, flag in (("HasAns", False), ("NoAns", True)):
            part = [r for r in rows if r[0] == flag]
            if part:
                out.update(zip((f"{name}_exact", f"{name}_f1", f"{name}_total"), score(part)))
    return out


def split_by_article(examples: list[QAExample], eval_share: float = 0.2,
                     seed: int = 0) -> tuple[list[QAExample], list[QAExample]]:
    """(train, eval): a seeded share of the articles (by title, at least one each side) for eval,
    so no context is seen on both sides. Order within each side is the input order."""
    if not 0 < eval_share < 1:
        raise BertkitError(f"eval share {eval_share} should be between 0 and 1")
    titles = sorted({ex.title for ex in examples})  # sorted: the split does not depend on input order
    if len(titles) < 2:
        raise BertkitError(f"{len(titles)} article(s): splitting by article needs at least 2")
    random.Random(seed).shuffle(titles)
    held = set(titles[:min(max(round(eval_share * len(titles)), 1), len(titles) - 1)])
    return [ex for ex in examples if ex.title not in held], [ex for ex in examples if ex.title in held]
