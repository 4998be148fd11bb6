"""Dropout with its masks drawn in bulk on a CPU.

torch's dropout on a CPU draws its mask one element at a time (about 10 ns each): with dropout
0.1 the masks took a fifth of a tiny-BERT pretraining step. Here the mask comes from numpy's
SFC64 generator, 16 random bits per element in bulk, parts of 2^20 elements on a thread each
(numpy releases the GIL; torch's threads are idle meanwhile), seeded from torch's generator so
that torch.manual_seed and a checkpoint's RNG state still decide every mask, whatever the thread
count. On other devices, and in the REFERENCE backend, torch's own dropout runs.
"""
from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .backend import current

MASK_PART = 1 << 20
_mask_threads: ThreadPoolExecutor | None = None


def _fill_keep(out: np.ndarray, seed: int, part: int, threshold: int) -> None:
    n = out.size
    bits = np.random.Generator(np.random.SFC64([seed, part])).bit_generator.random_raw((n + 3) // 4)
    np.greater_equal(bits.view(np.int16)[:n], threshold, out=out)  # numpy's compare: 4x torch's on int16


def keep_mask(shape, p: float) -> torch.Tensor:
    """A bool tensor of `shape`, each element True with probability 1 - p (to within 2^-17:
    16 bits per element, twice as fast as 32 for a 4 M-element mask, 4.1 against 9.6 ms; on two
    threads 1.6 against 3.4 ms for a 2 M-element mask)."""
    global _mask_threads
    with torch.profiler.record_function("bertkit::keep_mask"):  # named in profiles
        n = math.prod(shape)
        seed = int(torch.randint(0, 2**62, ()))  # from torch's default generator
        threshold = round(p * 2**16) - 2**15
        keep = np.empty(n, dtype=np.bool_)
        starts = range(0, n, MASK_PART)
        fill = lambda i: _fill_keep(keep[i:i + MASK_PART], seed, i // MASK_PART, threshold)  # noqa: E731
        if len(starts) > 1 and torch.get_num_threads() > 1:
            if _mask_threads is None:
                _mask_threads = ThreadPoolExecutor(torch.get_num_threads(), thread_name_prefix="bertkit-mask")
            list(_mask_threads.map(fill, starts))
        else:
            for i in starts:
                fill(i)
        return torch.from_numpy(keep).view(shape)


def _forget_mask_threads():  # a forked child has the pool but not its threads
    global _mask_threads
    _mask_threads = None


os.register_at_fork(after_in_child=_forget_mask_threads)


class _MaskedScale(torch.autograd.Function):
    """x * keep / (1 - p), and the same scaling of the gradient. The scaled mask is saved in x's
    dtype rather than as bool: building it again in the backward cost more than its memory (one
    fp32 4 M-element dropout, forward and backward: 11.4 against 15.3 ms)."""

    @staticmethod
    def forward(ctx, x, keep, scale: float):
        m = keep.view(torch.uint8).to(x.dtype).mul_(scale)  # from uint8: a vectorised cast, unlike bool's
        ctx.save_for_backward(m)
        return x * m

    @staticmethod
    def backward(ctx, grad):
        m, = ctx.saved_tensors
        return grad * m, None, None


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """Inverted dropout as F.dropout computes it, with bulk-drawn masks on a CPU."""
    if not training or p == 0:
        return x
    if x.device.type != "cpu" or p >= 1 or not current().bulk_dropout:
        return F.dropout(x, p, training)
    return _MaskedScale.apply(x, keep_mask(x.shape, p), 1.0 / (1.0 - p))


class Dropout(nn.Dropout):
    def forward(self, x):
        return dropout(x, self.p, self.training)
