"""The vocabulary projection fused with its cross-entropy, and sampling from its softmax.

A third of a tiny-BERT step on a CPU is the vocabulary projection: LinearCrossEntropy computes
the loss and its gradients a chunk of rows at a time, never storing the (N, V) logits.
"""
from __future__ import annotations

import torch

from .linear import linear, onednn_path

MLM_ROWS_MULTIPLE = 64


def sample_rows(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """A column per row of probs (n, V), drawn by inverse CDF: one uniform number per row
    (torch.multinomial draws V exponentials per row, 128 ms for 512 x 8192 on a 2-core CPU)."""
    cdf = probs.float().cumsum(-1)                                                      # (n, V)
    u = torch.rand(cdf.size(0), 1, generator=generator, device=probs.device) * cdf[:, -1:]  # (n, 1)
    return torch.searchsorted(cdf, u).clamp_(max=cdf.size(1) - 1)[:, 0]                 # (n,)


class LinearCrossEntropy(torch.autograd.Function):
    """sum over rows of cross_entropy(h @ W.T + b, labels) / denominator, with the gradients
    computed in the forward pass, a chunk of rows at a time, so the (N, V) logits are never
    stored: torch's softmax kernel (one pass for max, sum and output) turns each chunk of logits
    into its own gradient. It saves the passes over the logits that log_softmax, nll_loss and
    their backward make (a third of a tiny-BERT step on a CPU is the vocabulary projection).
    Returns the loss and, per row, whether the label is the most likely token as argmax reads the
    logits (the row's maximum, the first of tied ones): training needs only that hit, and a max
    without indices is several times faster than an argmax on a CPU."""

    @staticmethod
    def forward(ctx, h, weight, bias, labels, denominator: float, chunk: int = 512, samples=None, sampler=None):
        # h: (M, H), weight: (V, H), bias: (V,), labels: (N,) token ids of h's first N <= M rows;
        # the rows after them are padding (no loss, zero gradient). samples: (N,) long, filled with
        # a token drawn from each row's softmax (ELECTRA's generator; sampler: its torch.Generator),
        # which the gradient is computed from anyway: no second pass over the vocabulary.
        # Everything runs in h's dtype (bf16 under autocast) except the sums, which are fp32:
        # torch's CPU softmax computes in fp32 and rounds only its output. In bf16 each row's
        # loss, -log p(label), has the 3 significant digits of a bf16 probability (unbiased
        # rounding: the mean over 4,548 rows moved by 6e-6 of itself against fp32 sums of exp).
        w, b = weight.to(h.dtype), bias.to(h.dtype)
        dh, dw, db = torch.empty_like(h), torch.zeros_like(weight), torch.zeros_like(bias)
        loss = h.new_zeros((), dtype=torch.float32)
        hit = torch.empty_like(labels, dtype=torch.bool)
        with torch.autocast(h.device.type, enabled=False):
            for i in range(0, h.size(0), chunk):
                hc, yc = h[i:i + chunk], labels[i:i + chunk]
                rows = torch.arange(yc.size(0), device=h.device)               # the chunk's real rows
                if onednn_path(hc, w):  # 512 x 128 @ 128 x 8192 on a Zen 4: 148 against mm's 86 GFLOP/s
                    logits = linear(hc, w, b)                                # (n, V)
                else:
                    logits = torch.mm(hc, w.t()).add_(b)                     # (n, V); addmm's bias copy costs more
                target = logits[rows, yc]                                    # the label's logit
                top = logits.amax(-1)[:yc.size(0)]
                hits = target >= top
                # a tie at the top is argmax's, the first tied token: bf16 logits tie (2% of the rows
                # near the unigram plateau), and >= counted the label a hit in every tie (training
                # mlm_acc 1,530 hits in 13,575 where argmax of the same logits has 1,515). Hit rows only.
                tied = hits.nonzero().flatten()
                if tied.numel():
                    earlier = (logits[tied] == top[tied, None]) & (
                        torch.arange(logits.size(1), device=h.device) < yc[tied, None])
                    hits[tied[earlier.any(-1)]] = False
                hit[i:i + chunk] = hits
                grad = logits.softmax(-1)                                    # (n, V)
                if samples is not None:
                    samples[i:i + chunk] = sample_rows(grad[:yc.size(0)], sampler)
                grad[yc.size(0):] = 0                                        # padding rows
                p = grad[rows, yc].float()                                   # p(label)
                lost = p == 0
                if lost.any():  # underflow (a label logit ~90 below the top): those rows' loss exactly
                    loss += (torch.logsumexp(logits[:yc.size(0)][lost].float(), -1) - target[lost].float()).sum()
                    p = p[~lost]
                loss -= p.log().sum()
                grad[rows, yc] -= 1                                          # d loss / d logits
                db += grad.sum(0, dtype=torch.float32).to(db.dtype)
                dh[i:i + chunk] = grad @ w                                   # (n, H)
                dw += (grad.t() @ hc).to(dw.dtype)                           # (V, H)
        ctx.save_for_backward(dh, dw, db)
        ctx.denominator = denominator
        return loss / denominator, hit

    @staticmethod
    def backward(ctx, grad_loss, _grad_hit):
        dh, dw, db = ctx.saved_tensors
        scale = grad_loss / ctx.denominator
        return dh * scale, dw * scale, db * scale, None, None, None, None, None
