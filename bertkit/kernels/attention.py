"""softmax(q k^T / sqrt(hs) + mask) v per head: SDPA's fused kernel, or with dropout on a CPU its
math spelled out around bertkit's bulk dropout (dropout.py)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .backend import current
from .dropout import dropout

# Attention with dropout runs a head at a time when each head's score matrices are this large
# (B * T * T elements) and for smaller ones as one batched matmul over head-major copies of q, k,
# v: per head, bmm reads them where they lie in qkv (no copies), but 12 small heads cost more in
# per-call overhead than one copy (fine-tuning MiniLM at batch 16, length 48: 430 against 347 ms
# per step; the tiny preset at batch 512, length 64: 660 against 708 ms).
PER_HEAD_MIN = 1 << 19


def attention(q, k, v, n_head: int, mask, dropout_p: float = 0.0):
    """softmax(q k^T / sqrt(hs) + mask) v per head, the attention probabilities dropped out at
    dropout_p. q: (B, Tq, H) the queries; k, v: (B, T, H) (views of one fused projection, split
    rather than sliced: a slice's backward zero-fills the whole projection's gradient; Tq < T
    for queries at some positions only); mask: (B, 1, 1, T) bool or None; returns (B, Tq, H).
    Off a CPU, and on one without dropout, this is SDPA's fused kernel; with dropout, SDPA's
    math path spelled out (softmax, dropout, matmuls) with bertkit's dropout. Training in bf16
    on a CPU takes the spelled-out path too: SDPA's CPU backward in bf16 is 3x slower (tiny
    preset, batch 512, length 64, forward and backward: 161 against 52 ms; inference is not).
    The REFERENCE backend (no bulk dropout) runs SDPA with its own dropout."""
    B, Tq, H = q.shape
    T, hs = k.size(1), H // n_head
    bf16_training = q.dtype == torch.bfloat16 and q.requires_grad
    if q.device.type != "cpu" or (dropout_p == 0 and not bf16_training) or not current().bulk_dropout:
        q, k, v = (t.unflatten(2, (n_head, hs)).transpose(1, 2) for t in (q, k, v))  # (B, nh, Tq|T, hs)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)  # (B, nh, Tq, hs)
        return y.transpose(1, 2).reshape(B, Tq, H)
    bias = q.new_zeros(1, 1, 1)
    if mask is not None:  # 0 at real keys, -inf at padding: (B, 1, T)
        bias = q.new_zeros(B, 1, T).masked_fill_(~mask.view(B, 1, T), float("-inf"))
    scale = 1.0 / math.sqrt(hs)
    if B * Tq * T >= PER_HEAD_MIN:
        out = []
        for qh, kh, vh in zip(q.split(hs, 2), k.split(hs, 2), v.split(hs, 2)):  # each head where it lies
            scores = torch.baddbmm(bias, qh, kh.transpose(1, 2), alpha=scale)     # (B, Tq, T)
            out.append(torch.bmm(dropout(scores.softmax(-1), dropout_p), vh))     # (B, Tq, hs)
        return torch.cat(out, dim=2)                                               # (B, Tq, H)
    q, k, v = (t.unflatten(2, (n_head, hs)).transpose(1, 2).reshape(B * n_head, -1, hs) for t in (q, k, v))
    bias = bias.view(B, 1, 1, T).expand(B, n_head, 1, T).reshape(B * n_head, 1, T) if mask is not None else bias
    scores = torch.baddbmm(bias, q, k.transpose(1, 2), alpha=scale)                # (B*nh, Tq, T)
    y = torch.bmm(dropout(scores.softmax(-1), dropout_p), v)                       # (B*nh, Tq, hs)
    return y.view(B, n_head, Tq, hs).transpose(1, 2).reshape(B, Tq, H)
