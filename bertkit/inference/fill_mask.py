"""Fill-mask: the MLM head's top predictions for each [MASK] in a text."""
from __future__ import annotations

import torch

from ..errors import BertkitError, check_int
from ..model import BertForPreTraining
from ..tokenizer import MASK, WordPieceTokenizer


@torch.inference_mode()
def fill_mask(model: BertForPreTraining, tokenizer: WordPieceTokenizer, texts: list[str],
              top_k: int = 5) -> list[list[list[dict]]]:
    """For each text, for each [MASK] in it (in order): top_k {"token", "score"} (softmax)."""
    check_int(top_k, "top_k")
    limit = model.config.max_position_embeddings
    batch = tokenizer.encode(texts, max_len=limit)
    is_mask = batch.input_ids == tokenizer.mask_id
    for i, text in enumerate(texts):
        kept = int(is_mask[i].sum())
        given = tokenizer.tokenize_ids(text).count(tokenizer.mask_id)
        if kept < given:
            # the text was cut to the model's limit: a [MASK] past it would otherwise look absent
            raise BertkitError(f"text {i}: {given - kept} of its {given} {MASK} token(s) lie past the model's "
                               f"limit: the text was truncated at {limit} tokens; shorten the text or move "
                               f"the {MASK} nearer its start")
        if not kept:
            raise BertkitError(f"text {i} has no {MASK} token: {text!r}")
    device = next(model.parameters()).device
    positions = [row.nonzero().flatten() for row in is_mask]                 # per text: (M_i,)
    inputs = batch.model_inputs(device)
    model.eval()
    results = []
    for chunk in _chunks([len(p) for p in positions], model.config.vocab_size):
        P = max(len(positions[i]) for i in chunk)
        padded = torch.stack([torch.cat([positions[i], positions[i].new_zeros(P - len(positions[i]))])
                              for i in chunk])                                # (b, P)
        out = model(**{k: v[chunk] for k, v in inputs.items()}, mlm_positions=padded.to(device))
        probs = out.mlm_logits.float().softmax(-1)                           # (b, P, V)
        # a vocabulary padded past the tokenizer's ids (config.json vocab_size larger): those rows
        # are no token, so never a candidate; the others keep their softmax over all V, as in transformers
        probs = probs[..., :tokenizer.vocab_size]
        scores, ids = probs.topk(min(top_k, probs.size(-1)), dim=-1)
        results += [[[{"token": tokenizer.id_to_token(int(t)), "score": float(s)}
                      for t, s in zip(ids[r, j], scores[r, j])] for j in range(len(positions[i]))]
                    for r, i in enumerate(chunk)]
    return results


# scores over the vocabulary held at once: (texts x most [MASK]s in them x vocabulary) floats.
# One pass over 256 texts of 510 [MASK]s each would have held 16 GB with MiniLM's vocabulary.
SCORES_AT_ONCE = 1 << 24


def _chunks(masks: list[int], vocab_size: int) -> list[list[int]]:
    """Consecutive runs of texts whose [MASK] scores fit in SCORES_AT_ONCE (one text at least)."""
    chunks, current, most = [], [], 0
    for i, m in enumerate(masks):
        if current and (len(current) + 1) * max(most, m) * vocab_size > SCORES_AT_ONCE:
            chunks.append(current)
            current, most = [], 0
        current.append(i)
        most = max(most, m)
    return chunks + [current] if current else chunks
