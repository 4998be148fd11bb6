"""Attention weights of every layer and head, for the attention view.

The model runs attention through scaled_dot_product_attention, which never materialises the
probabilities; this walks the same modules layer by layer and computes them beside it, so the
weights shown are the ones the model used (tests check that probabilities @ values give the
layer's own attention output).
"""
from __future__ import annotations

import math

import torch

from ..model import BertModel


@torch.inference_mode()
def attention_maps(model: BertModel, input_ids, token_type_ids=None, attention_mask=None):
    """-> (probabilities (L, B, nh, T, T), last hidden state (B, T, H)).

    probabilities[l, b, h, i, j]: how much token i attends to token j in layer l, head h;
    each row sums to 1 over the real tokens, and padding keys get 0."""
    if token_type_ids is None:
        token_type_ids = torch.zeros_like(input_ids)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    keep = attention_mask.bool()[:, None, None, :]                      # (B, 1, 1, T)
    x = model.embeddings(input_ids, token_type_ids)                      # (B, T, H)
    maps = []
    for layer in model.layers:
        B, T, H = x.shape
        nh = layer.attn.n_head
        q, k, _ = layer.attn.qkv(x).split(H, dim=2)                      # 2 x (B, T, H)
        q = q.view(B, T, nh, H // nh).transpose(1, 2)                    # (B, nh, T, hs)
        k = k.view(B, T, nh, H // nh).transpose(1, 2)                    # (B, nh, T, hs)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(H // nh)          # (B, nh, T, T)
        maps.append(scores.masked_fill(~keep, float("-inf")).softmax(-1))
        x = layer(x, keep)
    return torch.stack(maps), x
