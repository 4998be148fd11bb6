"""Fill-mask: the MLM head's top predictions for each [MASK] in a text."""
from __future__ import annotations

import torch

from ..errors import BertkitError
from ..model import BertForPreTraining
from ..tokenizer import MASK, WordPieceTokenizer


@torch.inference_mode()
def fill_mask(model: BertForPreTraining, tokenizer: WordPieceTokenizer, texts: list[str],
              top_k: int = 5) -> list[list[list[dict]]]:
    """For each text, for each [MASK] in it (in order): top_k {"token", "score"} (softmax)."""
    if top_k < 1:
        raise BertkitError(f"top_k must be at least 1, got {top_k}")
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
    P = max(len(p) for p in positions)
    padded = torch.stack([torch.cat([p, p.new_zeros(P - len(p))]) for p in positions])  # (B, P)
    model.eval()
    out = model(**batch.model_inputs(device), mlm_positions=padded.to(device))
    probs = out.mlm_logits.float().softmax(-1)                               # (B, P, V)
    k = min(top_k, probs.size(-1))
    scores, ids = probs.topk(k, dim=-1)
    return [[[{"token": tokenizer.id_to_token(int(t)), "score": float(s)}
              for t, s in zip(ids[i, j], scores[i, j])] for j in range(len(positions[i]))]
            for i in range(len(texts))]
