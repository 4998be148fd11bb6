"""What a pretrained model learned, shown on held-out text: fill-mask predictions and the
context-sensitivity of its token vectors."""
from __future__ import annotations

import numpy as np

from ..inference.encode import Encoder, cosine
from ..inference.fill_mask import fill_mask
from ..model import BertForPreTraining
from ..tokenizer import MASK, WordPieceTokenizer
from .shards import TokenStore


def held_out_cloze(store: TokenStore, tokenizer: WordPieceTokenizer, n: int = 4,
                   min_tokens: int = 10, max_tokens: int = 30) -> list[tuple[str, str]]:
    """(text with one [MASK], the hidden word) from held-out sentences: the middle-most whole
    alphabetic word of each of the first n sentences of a suitable length."""
    shard = store.shard(0)
    out = []
    docs = shard.documents
    for d in range(len(docs) - 1):  # one sentence per document, for variety
        for s in range(int(docs[d]), int(docs[d + 1])):
            ids = [int(t) for t in shard.tokens[shard.sentences[s]:shard.sentences[s + 1]]]
            if not min_tokens <= len(ids) <= max_tokens:
                continue
            pieces = [tokenizer.id_to_token(i) for i in ids]
            words = [j for j, p in enumerate(pieces) if p.isalpha() and len(p) > 2
                     and (j + 1 == len(pieces) or not pieces[j + 1].startswith("##"))]
            if not words:
                continue
            j = min(words, key=lambda k: abs(k - len(ids) / 2))
            text = f"{tokenizer.decode(ids[:j])} {MASK} {tokenizer.decode(ids[j + 1:])}".strip()
            out.append((text, pieces[j]))
            break
        if len(out) == n:
            break
    return out


def show(model: BertForPreTraining, tokenizer: WordPieceTokenizer, eval_store: TokenStore, print_=print) -> dict:
    result = {}
    cloze = held_out_cloze(eval_store, tokenizer) if eval_store.meta["documents"] else []
    if cloze:
        preds = fill_mask(model, tokenizer, [t for t, _ in cloze], top_k=5)
        print_("fill-mask on held-out sentences (top 5; * marks the hidden word):")
        hits = 0
        for (text, truth), p in zip(cloze, preds):
            tops = [c["token"] for c in p[0]]
            hits += truth in tops
            print_(f"  {text}\n    hidden: {truth}  predicted: " +
                   ", ".join(f"{c['token']}{'*' if c['token'] == truth else ''} {c['score']:.2f}" for c in p[0]))
        result["cloze"] = [{"text": t, "hidden": h, "top5": [c["token"] for c in p[0]]}
                           for (t, h), p in zip(cloze, preds)]
        result["cloze_top5_hits"] = hits
    encoder = Encoder(model.bert, tokenizer, pooling="cls", device=next(model.parameters()).device)
    texts = ["a crane is flying", "a crane driver came", "the crane flew south for the winter"]
    vecs = [tv.find("crane") for tv in encoder.token_vectors(texts)]
    sims = {f"{texts[i]} | {texts[j]}": cosine(vecs[i], vecs[j])
            for i in range(3) for j in range(i + 1, 3)}
    print_("cosine of the vectors for 'crane' in different contexts:")
    for k, v in sims.items():
        print_(f"  {v:.3f}  {k}")
    result["crane_cosines"] = sims
    result["crane_same_vector"] = bool(np.isclose(min(sims.values()), 1.0))
    return result
